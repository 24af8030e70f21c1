"""tidal-rl's loss pieces against an independent numpy implementation of TRL's and verl's formulas.

On seeded synthetic tensors (groups of G completions of ragged lengths, rollout log-probs mu,
pi_old, current log-probs pi_theta != pi_old so the clip acts, a reference policy, rewards with
zero-std groups and a loss mask with truncated completions) every combination of
  IS correction (none, token-tis, token-mis, seq-tis, seq-mis, geometric, icepop; lower caps too)
  x masked-token semantics (keep = TRL, drop = verl)
  x loss_type (grpo, bnpo, dr_grpo, dapo) x scale_rewards (group, batch, none)
  x policy loss (PPO-clip with epsilon_high != epsilon, with and without verl's dual clip; PG)
  x beta (0 and 0.04)
is computed by tests/helpers/rl_probe (the C functions tidal-rl calls) and by the numpy code below,
written from the formulas in TRL's grpo_trainer.py (advantages: (r - mean_g) / (std_g + 1e-4),
torch.std unbiased; per_token_loss = -min(coef_1 A, clamp(coef_1) A) * is_weight + beta * k3;
the four loss_type normalisers; vllm_importance_sampling_* token/sequence truncate/mask) and
verl's core_algos.py (dual clip with clip_ratio_c; rejection masks that leave response_mask).
The loss is also differentiated numerically (central differences in float64 of the numpy loss)
and compared with tidal's dL/dlogp.

Tolerances: tidal stores the IS weights, masks and dL/dlogp as float32 and sums in double: 1e-5
relative (float32 rounding ~6e-8 per value, a few operations each), advantages and normalisers
1e-9 (double throughout). The numerical derivative: 1e-4 relative to the largest (its truncation
error at h = 1e-6 in float64 is ~1e-9, the float32 storage of dlogp ~1e-7).
"""
import itertools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BUILD, check, failures  # noqa: E402

PROBE = os.path.join(BUILD, "tests", "helpers", "rl_probe")
# The probe drivers in tests/helpers are one-shot test programs whose buffers end with the process;
# under check-asan their leak report is switched off (the library code they call is leak-checked
# through tidal-rl itself in test_rl_tool.py).
HELPER_ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE",
                  ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))
tmp = tempfile.mkdtemp(prefix="tidal-rl-loss-")
CLAMP = 20.0


# ---------------------------------------------------------------- the reference (numpy)
def advantages(r, G, scale):
    g = r.reshape(-1, G)
    mean = g.mean(1, keepdims=True)
    if scale == "group":
        std = g.std(1, ddof=1, keepdims=True)                 # torch.std: unbiased
        a = (g - mean) / (std + 1e-4)
    elif scale == "batch":
        a = (g - mean) / (r.std(ddof=1) + 1e-4)
    else:
        a = g - mean
    zero_std = int(sum(np.all(row == row[0]) for row in g))
    return a.reshape(-1), zero_std


def is_weights(cfg, off, old, mu, mask):
    """TRL vllm_importance_sampling_* (token/sequence x truncate/mask), verl geometric/IcePop"""
    mode, hi, lo = cfg["is"], cfg.get("is_cap", 0) or np.inf, cfg.get("is_cap_low", 0)
    d = np.clip(old.astype(np.float64) - mu.astype(np.float64), -CLAMP, CLAMP)
    w = np.ones_like(d)
    masked = np.zeros_like(d, dtype=bool)
    for s in range(len(off) - 1):
        sl = slice(off[s], off[s + 1])
        ms = mask[sl] != 0
        if mode in ("seq-tis", "seq-mis", "geometric"):
            lw = (old[sl][ms].astype(np.float64) - mu[sl][ms]).sum()
            if mode == "geometric":
                lw = lw / max(ms.sum(), 1) if ms.sum() else 0.0
            rho = np.exp(np.clip(lw, -CLAMP, CLAMP))
            if mode == "seq-tis":
                w[sl] = min(max(rho, lo), hi)
            else:
                bad = rho < lo or rho > hi
                w[sl] = 0.0 if bad else rho
                masked[sl] = bad
        elif mode != "none":
            rho = np.exp(d[sl])
            if mode == "token-tis":
                w[sl] = np.clip(rho, lo, hi)
            else:                                               # token-mis, icepop
                bad = (rho < lo) | (rho > hi)
                w[sl] = np.where(bad, 0.0, rho)
                masked[sl] = bad
    return w, masked


def loss_np(cfg, off, logp, old, mu, ref, mask, r):
    G, MB, GA, L = cfg["G"], cfg["micro"], cfg["ga"], cfg["max_completion_length"]
    B = len(off) - 1
    adv, zs = advantages(r, G, cfg["scale"])
    w, masked = is_weights(cfg, off, old, mu, mask)
    m = mask.astype(np.float64).copy()
    if cfg.get("drop"):
        m[masked] = 0.0                                         # verl: rejected tokens leave response_mask
    ratio = np.exp(np.clip(logp - old, -CLAMP, CLAMP))
    A = np.concatenate([np.full(off[s + 1] - off[s], adv[s]) for s in range(B)])
    if cfg["policy_loss"] == "pg":
        pg = -A * ratio
    else:
        eps, eh = cfg["epsilon"], cfg["epsilon_high"]
        pg = np.maximum(-A * ratio, -A * np.clip(ratio, 1 - eps, 1 + eh))
        if cfg.get("dual_clip", 0) > 1:
            pg = np.where(A < 0, np.minimum(pg, -A * cfg["dual_clip"]), pg)
    per_tok = pg * w
    if cfg.get("beta", 0) > 0:
        dd = np.clip(ref - logp, -CLAMP, CLAMP)
        per_tok = per_tok + cfg["beta"] * (np.exp(dd) - dd - 1)
    total = 0.0
    lt = cfg["loss_type"]
    for s0 in range(0, B, MB):
        s1 = min(s0 + MB, B)
        sl = slice(off[s0], off[s1])
        if lt == "grpo":
            terms = [(per_tok[off[s]:off[s + 1]] * m[off[s]:off[s + 1]]).sum() / max(m[off[s]:off[s + 1]].sum(), 1.0)
                     for s in range(s0, s1)]
            total += np.mean(terms) / GA
        elif lt == "bnpo":
            total += (per_tok[sl] * m[sl]).sum() / max(m[sl].sum(), 1.0) / GA
        elif lt == "dr_grpo":
            total += (per_tok[sl] * m[sl]).sum() / ((s1 - s0) * L) / GA
        else:                                                   # dapo: the whole batch's tokens
            total += (per_tok[sl] * m[sl]).sum() / max(m.sum(), 1.0)
    return total, adv, zs, w, m


# ---------------------------------------------------------------- synthetic batches
rng = np.random.default_rng(7)
G, MB, GA = 4, 4, 2
B = MB * GA
lens = rng.integers(3, 12, B)
off = np.concatenate([[0], np.cumsum(lens)]).astype(int)
N = int(off[-1])
mu = np.log(rng.uniform(0.02, 1.0, N)).astype(np.float32)
# pi_old - mu: mostly small, a few big (so caps and masks act)
old = (mu + rng.normal(0, 0.15, N) + (rng.random(N) < 0.08) * rng.normal(0, 1.5, N)).astype(np.float32)
logp = (old + rng.normal(0, 0.2, N)).astype(np.float32)          # the clip acts on |ratio - 1| > 0.2
ref = (logp + rng.normal(0, 0.3, N)).astype(np.float32)
mask = np.ones(N, np.float32)
mask[off[3]:off[4]] = 0                                          # a truncated, masked completion
reward = rng.choice([0.0, 0.25, 0.5, 1.0], B)
reward[4:8] = 0.5                                                # a zero-std group


def probe(cfg):
    inp = {"cfg": cfg, "off": off.tolist(), "old": old.tolist(), "mu": mu.tolist(), "mask": mask.tolist(),
           "reward": reward.tolist(), "logp": logp.tolist(), "ref": ref.tolist()}
    path = os.path.join(tmp, "in.json")
    json.dump(inp, open(path, "w"))
    p = subprocess.run([PROBE, "loss", path], capture_output=True, text=True, env=HELPER_ENV)
    if p.returncode:
        raise SystemExit(f"rl_probe failed: {p.stderr}")
    return json.loads(p.stdout)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


IS = [("none", {}), ("token-tis", {"is_cap": 2.0}), ("token-tis", {"is_cap": 1.5, "is_cap_low": 0.5}),
      ("token-mis", {"is_cap": 2.0}), ("seq-tis", {"is_cap": 3.0}), ("seq-mis", {"is_cap": 3.0}),
      ("seq-mis", {"is_cap": 3.0, "is_cap_low": 0.3}), ("geometric", {"is_cap": 1.05, "is_cap_low": 0.95}),
      ("icepop", {"is_cap": 5.0, "is_cap_low": 0.5})]
POLICY = [{"policy_loss": "ppo", "epsilon": 0.2, "epsilon_high": 0.28},
          {"policy_loss": "ppo", "epsilon": 0.2, "epsilon_high": 0.2, "dual_clip": 3.0},
          {"policy_loss": "pg", "epsilon": 0.2, "epsilon_high": 0.2}]
n_cases = worst_loss = worst_grad = worst_fd = 0.0
bad = []
for (mode, caps), drop, lt, scale, pol, beta in itertools.product(
        IS, [0, 1], ["grpo", "bnpo", "dr_grpo", "dapo"], ["group", "batch", "none"], POLICY, [0.0, 0.04]):
    if mode == "none" and drop:
        continue
    if (scale != "group" or pol is not POLICY[0]) and (beta or lt not in ("dapo", "grpo")):
        continue                                                 # keep the product small: ~500 cases
    cfg = {"is": mode, **caps, "drop": drop, "loss_type": lt, "scale": scale, "beta": beta, "G": G,
           "micro": MB, "ga": GA, "max_completion_length": 16, **pol}
    out = probe(cfg)
    ref_loss, adv, zs, w, m = loss_np(cfg, off, logp.astype(np.float64), old.astype(np.float64),
                                      mu.astype(np.float64), ref.astype(np.float64), mask, reward)
    n_cases += 1
    e_adv = rel(out["adv"], adv) if np.any(adv) else float(np.max(np.abs(out["adv"])))
    e_w, e_m = rel(out["w"], w), float(np.max(np.abs(np.asarray(out["m"]) - m)))
    e_l = abs(out["loss"] - ref_loss) / max(abs(ref_loss), 1e-12)
    # central differences of the numpy loss in float64
    h = 1e-6
    fd = np.zeros(N)
    lp64 = logp.astype(np.float64)
    for t in range(N):
        a, b = lp64.copy(), lp64.copy()
        a[t] += h
        b[t] -= h
        fd[t] = (loss_np(cfg, off, a, old, mu, ref, mask, reward)[0] - loss_np(cfg, off, b, old, mu, ref, mask, reward)[0]) / (2 * h)
    e_g = rel(out["dlogp"], fd)
    worst_loss, worst_grad = max(worst_loss, e_l), max(worst_grad, e_g)
    ok = e_adv <= 1e-9 and e_w <= 1e-5 and e_m == 0 and e_l <= 1e-5 and e_g <= 1e-4 and out["zero_std"] == zs
    if not ok:
        bad.append((cfg, e_adv, e_w, e_m, e_l, e_g, out["zero_std"], zs))
for b_ in bad[:5]:
    print("  mismatch:", b_)
check(not bad, f"{int(n_cases)} configurations: advantages, IS weights, masks, loss and dL/dlogp equal the numpy "
      f"TRL/verl formulas (worst loss rel {worst_loss:.1e}, worst dlogp vs central differences {worst_grad:.1e})")

# specific facts, stated on their own
out = probe({"is": "token-tis", "is_cap": 2.0, "loss_type": "dapo", "G": G, "micro": MB, "ga": GA,
             "policy_loss": "ppo", "epsilon": 0.2, "epsilon_high": 0.2, "max_completion_length": 16})
check(out["zero_std"] == 1 and all(abs(a) < 1e-12 for a in out["adv"][4:8]),
      "a group with equal rewards is counted (frac_reward_zero_std) and gets advantage 0")
check(all(v == 0 for v in out["m"][off[3]:off[4]]) and all(d == 0 for d in out["dlogp"][off[3]:off[4]]),
      "a masked (truncated) completion has no loss and no gradient")
adv_mask = probe({"is": "none", "G": G, "micro": MB, "ga": GA, "loss_type": "dapo", "max_completion_length": 16})
mask_all = mask.copy()
mask_all[:] = 1
check(abs(adv_mask["adv"][3] - advantages(reward, G, "group")[0][3]) < 1e-12,
      "the masked completion's reward still enters its group's mean and std (TRL mask_truncated_completions)")
k = probe({"is": "seq-mis", "is_cap": 1.2, "is_cap_low": 0.8, "drop": 0, "G": G, "micro": MB, "ga": GA, "loss_type": "dapo",
           "max_completion_length": 16, "beta": 0.04})
kd = probe({"is": "seq-mis", "is_cap": 1.2, "is_cap_low": 0.8, "drop": 1, "G": G, "micro": MB, "ga": GA, "loss_type": "dapo",
            "max_completion_length": 16, "beta": 0.04})
check(k["n_seq_masked"] >= 1 and sum(k["m"]) > sum(kd["m"]),
      f"seq-mis masks {k['n_seq_masked']} sequences; keep (TRL) leaves them in the normaliser, drop (verl) "
      f"removes {int(sum(k['m']) - sum(kd['m']))} tokens from it")
sys.exit(1 if failures else 0)
