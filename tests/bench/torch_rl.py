"""The PyTorch peer of the RL bench (tests/bench/rl.sh): one GRPO step on the shapes tidal-rl ran
— generate B completions of T tokens with a KV cache (tests/py/llama_ref.py, multinomial sampling
at temperature 1 from the fp32 softmax), recompute every response token's log-prob without
gradient (pi_old), then forward + backward of the policy-gradient loss (-A logp over the response
tokens) and torch.optim.AdamW with clip_grad_norm_(1.0) — in fp32, or with the matmuls under
torch.autocast("cpu", bfloat16). Prints `steps_per_s X` and `rollout_tokens_per_s X` (generated
tokens / generation seconds) after --steps steps (one warm-up step first).

  torch_rl.py --model DIR --batch B --prompt-len P --response-len T [--dtype float32|bfloat16]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "py"))
import llama_ref  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--prompt-len", type=int, default=9)
ap.add_argument("--response-len", type=int, default=32)
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.set_flush_denormal(True)   # a fair peer: fp32 denormals would slow its CPU kernels
torch.manual_seed(0)
cfg, w = llama_ref.load_checkpoint(a.model, torch.float32)
params = [v.requires_grad_(True) for v in w.values()]
model = llama_ref.Model(cfg, w, torch.float32)
opt = torch.optim.AdamW(params, lr=1e-6)
B, P, T, V = a.batch, a.prompt_len, a.response_len, cfg["vocab_size"]
ac = dict(device_type="cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")


def step():
    prompts = torch.randint(4, V, (B, P))
    t0 = time.perf_counter()
    with torch.no_grad(), torch.autocast(**ac):        # generate: prefill, then T-1 decode steps
        cache = model.new_cache(B, P + T)
        h = model.forward(prompts, 0, cache)
        ids = [prompts]
        nxt = torch.multinomial(torch.softmax(model.logsoftmax(h[:, -1]).float(), -1), 1)
        for t in range(T - 1):
            ids.append(nxt)
            h = model.forward(nxt, P + t, cache)
            nxt = torch.multinomial(torch.softmax(model.logsoftmax(h[:, -1]).float(), -1), 1)
        ids.append(nxt)
        seq = torch.cat(ids, 1)
    t1 = time.perf_counter()
    with torch.no_grad(), torch.autocast(**ac):        # pi_old
        old = model.logsoftmax(model.forward(seq[:, :-1])).float().gather(2, seq[:, 1:, None])[:, P - 1:, 0]
    adv = torch.randn(B, 1)
    opt.zero_grad(set_to_none=True)
    with torch.autocast(**ac):                          # the update
        lp = model.logsoftmax(model.forward(seq[:, :-1])).float().gather(2, seq[:, 1:, None])[:, P - 1:, 0]
    loss = -(adv * torch.exp(lp - old)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return t1 - t0, time.perf_counter() - t0


step()
gen = total = 0.0
for _ in range(a.steps):
    g, t = step()
    gen += g
    total += t
print(f"steps_per_s {a.steps / total:.4f}")
print(f"rollout_tokens_per_s {a.steps * B * T / gen:.1f}")
