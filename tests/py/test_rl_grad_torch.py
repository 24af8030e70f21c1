"""The gradient of tidal-rl's loss through the trainer against torch autograd (torch 1.13, CPU).

A tiny random Qwen2-shaped model (tidal-init --preset tiny: C=64 L=2 V=512, q/k/v biases); four
sequences (two prompts x G = 2 completions, ragged lengths, prompt tokens outside the loss, one
completion masked as truncated). tests/helpers/rl_probe runs td_trainer_accumulate with the same
per-token loss tidal-rl uses (td_rl_seq_loss after td_rl_prepare) and dumps the fp32 gradients of
every parameter. Here the policy's log-probs come from tests/py/llama_ref.py (written from
transformers' modeling code) in float64, and the loss is written with torch ops the way TRL's
GRPOTrainer._compute_loss writes it:
  coef_1 = exp(logp - old); coef_2 = clamp(coef_1, 1 - eps, 1 + eps_high)
  per_token_loss = -min(coef_1 A, coef_2 A);  verl dual clip: min(that, -A c) where A < 0
  per_token_loss *= is_weight (token-TIS: clamp(exp(old - mu), max=2), detached)
  per_token_loss += beta (exp(ref - logp) - (ref - logp) - 1)
  loss_type grpo: mean over each micro-batch's sequences of the token mean, / accumulation steps
old, mu and ref are the constants rl_probe used (pi_old = the policy's own log-probs shifted by
chosen offsets, so that some tokens sit outside the clip range on both sides and the dual clip
acts). Tolerance as tests/py/test_grad_torch.py: max |g_tidal - g_ref| <= 1e-4 max |g_ref| per
tensor (fp32 against float64), the loss within 1e-5 relative.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
except ImportError:
    print("torch or safetensors not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import llama_ref  # noqa: E402
from tidal_check import BIN, BUILD, check, failures  # noqa: E402

PROBE = os.path.join(BUILD, "tests", "helpers", "rl_probe")
# The probe drivers in tests/helpers are one-shot test programs whose buffers end with the process;
# under check-asan their leak report is switched off (the library code they call is leak-checked
# through tidal-rl itself in test_rl_tool.py).
HELPER_ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE",
                  ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))
torch.set_num_threads(2)
tmp = tempfile.mkdtemp(prefix="tidal-rl-grad-")
model = os.path.join(tmp, "tiny")
subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--preset", "tiny", "--no-tie", "--init-std", "0.05",
                "--embed-std", "0.3", "--seed", "5", "-o", model], check=True, capture_output=True)

random.seed(3)
plen = [4, 4, 7, 7]
rlen = [6, 9, 5, 11]
prompts = [[random.randrange(512) for _ in range(4)], [random.randrange(512) for _ in range(7)]]
tokens = [prompts[s // 2] + [random.randrange(512) for _ in range(rlen[s])] for s in range(4)]
N = sum(rlen)
mask = [1.0] * N
for t in range(sum(rlen[:1]), sum(rlen[:2])):
    mask[t] = 0.0                                   # completion 1: truncated and masked
cfg = {"policy_loss": "ppo", "epsilon": 0.2, "epsilon_high": 0.28, "dual_clip": 3.0, "loss_type": "grpo",
       "beta": 0.04, "is": "token-tis", "is_cap": 2.0, "scale": "group", "G": 2, "micro": 2, "ga": 2,
       "max_completion_length": 16}
inp = {"cfg": cfg, "tokens": tokens, "plen": plen, "reward": [1.0, 0.0, 0.25, 0.75], "mask": mask,
       "old_delta": [random.choice([-0.6, -0.05, 0.05, 0.6, 1.5]) for _ in range(N)],
       "mu_delta": [random.gauss(0, 0.6) for _ in range(N)],
       "ref_delta": [random.gauss(0, 0.3) for _ in range(N)]}
json.dump(inp, open(os.path.join(tmp, "in.json"), "w"))
dump_path = os.path.join(tmp, "grads.safetensors")
p = subprocess.run([PROBE, "grad", os.path.join(tmp, "in.json"), model, dump_path], capture_output=True, text=True,
                   env=HELPER_ENV)
if p.returncode:
    print(p.stdout, p.stderr)
    raise SystemExit("rl_probe grad failed")
out = json.loads(p.stdout)
dump = load_file(dump_path)

# ---- the reference: autograd through llama_ref in float64
mcfg, w = llama_ref.load_checkpoint(model, torch.float64)
for v in w.values():
    v.requires_grad_(True)
m = llama_ref.Model(mcfg, w, torch.float64)
old, mu, ref = (torch.tensor(out[k], dtype=torch.float64) for k in ("old", "mu", "ref"))
mk = torch.tensor(mask, dtype=torch.float64)
r = torch.tensor(inp["reward"], dtype=torch.float64).view(-1, 2)
adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
logps = []
for s in range(4):
    row = torch.tensor(tokens[s])
    lp = m.logsoftmax(m.forward(row[None, :]))[0]
    logps.append(lp[:-1].gather(1, row[1:, None])[:, 0][plen[s] - 1:])
logp = torch.cat(logps)
check(float((logp.detach() - torch.tensor(out["logp"], dtype=torch.float64)).abs().max()) < 1e-4,
      "tidal's fp32 response log-probs equal llama_ref's float64 ones within 1e-4")
A = torch.cat([adv[s].expand(rlen[s]) for s in range(4)])
coef_1 = torch.exp(logp - old)
coef_2 = torch.clamp(coef_1, 1 - cfg["epsilon"], 1 + cfg["epsilon_high"])
per_token_loss = -torch.min(coef_1 * A, coef_2 * A)
per_token_loss = torch.where(A < 0, torch.min(per_token_loss, -A * cfg["dual_clip"]), per_token_loss)
is_w = torch.clamp(torch.exp(old - mu), max=cfg["is_cap"])        # TRL token_truncate, detached
per_token_loss = per_token_loss * is_w
kl = torch.exp(ref - logp) - (ref - logp) - 1
per_token_loss = per_token_loss + cfg["beta"] * kl
offs = [0]
for n in rlen:
    offs.append(offs[-1] + n)
loss = 0
for s0 in (0, 2):                                                   # micro-batches of 2, GA = 2
    seq_means = [(per_token_loss[offs[s]:offs[s + 1]] * mk[offs[s]:offs[s + 1]]).sum() /
                 mk[offs[s]:offs[s + 1]].sum().clamp(min=1.0) for s in (s0, s0 + 1)]
    loss = loss + torch.stack(seq_means).mean() / 2
loss.backward()
clipped = int(((coef_1.detach() < 0.8) | (coef_1.detach() > 1.28)).sum())
check(clipped >= 5, f"the batch exercises the clip ({clipped} tokens outside [0.8, 1.28])")
check(abs(out["loss"] - loss.item()) <= 1e-5 * abs(loss.item()),
      f"loss {out['loss']:.8f} vs autograd {loss.item():.8f}")
errs = {k: float((dump[k].double() - w[k].grad).abs().max() / max(float(w[k].grad.abs().max()), 1e-30))
        for k in w if w[k].grad is not None and k in dump}
worst = max(errs, key=errs.get)
check(len(errs) == len([k for k in dump if k not in ("input_ids", "loss_mask")]),
      f"every trained tensor compared ({len(errs)})")
check(errs[worst] <= 1e-4, f"RL-loss gradients within 1e-4 of autograd (worst {worst}: {errs[worst]:.1e})")
sys.exit(1 if failures else 0)
