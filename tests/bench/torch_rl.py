"""The PyTorch peer of the RL bench (tests/bench/rl.sh): one GRPO step on the shapes tidal-rl ran
— generate B completions of T tokens with a KV cache (tests/py/llama_ref.py, multinomial sampling
at temperature 1 from the fp32 softmax), pi_old as tidal-rl takes it (the update's own log-probs,
detached, as TRL does with one update per batch, LoRA or not), then forward + backward of the policy-gradient loss (-A logp
over the response tokens) and torch.optim.AdamW with clip_grad_norm_(1.0) — in fp32, or with the matmuls under
torch.autocast("cpu", bfloat16). Prints `steps_per_s X` and `rollout_tokens_per_s X` (generated
tokens / generation seconds) after --steps steps (one warm-up step first).
With --lora-r R: PEFT's LoRA written out (lora_A, lora_B on --lora-targets, default PEFT's
q_proj,v_proj; y = x W^T + (x A^T) B^T * alpha / r, only A and B trained, the base frozen), and
the generation on merged weights W + (alpha / r) B A made once per step (TRL's merge before it
hands the policy to the engine): the cheapest way PyTorch runs the LoRA grids' step.

  torch_rl.py --model DIR --batch B --prompt-len P --response-len T [--dtype float32|bfloat16]
              [--lora-r R --lora-alpha A --lora-targets q_proj,v_proj]
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
ap.add_argument("--lora-r", type=int, default=0)
ap.add_argument("--lora-alpha", type=float, default=16)
ap.add_argument("--lora-targets", default="q_proj,v_proj")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.set_flush_denormal(True)   # a fair peer: fp32 denormals would slow its CPU kernels
torch.manual_seed(0)
cfg, w = llama_ref.load_checkpoint(a.model, torch.float32)
lora = {}   # module name -> (A (r, in), B (out, r))
if a.lora_r:
    targets = a.lora_targets.split(",")
    for name in list(w):
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        if mod and any(mod.endswith("." + t) for t in targets):
            out_f, in_f = w[name].shape
            A = torch.empty(a.lora_r, in_f)
            torch.nn.init.kaiming_uniform_(A, a=5 ** 0.5)   # PEFT's lora_A init
            lora[mod] = (A.requires_grad_(True), torch.zeros(out_f, a.lora_r).requires_grad_(True))
    params = [t for ab in lora.values() for t in ab]
else:
    params = [v.requires_grad_(True) for v in w.values()]
model = llama_ref.Model(cfg, w, torch.float32)
scaling = a.lora_alpha / max(a.lora_r, 1)
base_lin = model.lin


def lin_lora(x, name):
    y = base_lin(x, name)
    if name in lora:
        A, B = lora[name]
        y = y + torch.nn.functional.linear(torch.nn.functional.linear(x, A), B) * scaling
    return y


opt = torch.optim.AdamW(params, lr=1e-6)
B, P, T, V = a.batch, a.prompt_len, a.response_len, cfg["vocab_size"]
ac = dict(device_type="cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")


def step():
    prompts = torch.randint(4, V, (B, P))
    t0 = time.perf_counter()
    if lora:                                            # the engine gets W + s B A (merged)
        with torch.no_grad():
            merged = {n + ".weight": w[n + ".weight"] + scaling * (B @ A) for n, (A, B) in lora.items()}
        model.w = {**w, **merged}
        model.lin = base_lin
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
    if lora:                                            # the trainer: frozen base + adapter
        model.w = w
        model.lin = lin_lora
    adv = torch.randn(B, 1)
    opt.zero_grad(set_to_none=True)
    with torch.autocast(**ac):                          # the update
        lp = model.logsoftmax(model.forward(seq[:, :-1])).float().gather(2, seq[:, 1:, None])[:, P - 1:, 0]
    old = lp.detach()   # TRL with one update per batch: old_per_token_logps = per_token_logps.detach()
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
