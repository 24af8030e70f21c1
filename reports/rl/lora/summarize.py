"""The per-cell table and the counts of reports/rl/lora/README.md section 3, from the packed run
files (reports/rl/lora/runs/grid/*/rl.h5, written by tidal-rl and packed by reports/rl/pack_runs.py).
Usage: .venv/bin/python reports/rl/lora/summarize.py [RUNS_DIR]      (h5py and numpy only)

Per cell (dtype x sync, and the full fine-tuning row), over its seeds:
  final clean accuracy   mean of the last two `eval_accuracy` evaluations (the trainer's greedy
                         accuracy on 200 test records); "dead" = below 0.005 (no right answer)
  reward_drop at step    the collapse detector's first confirmed reward drop (attribute
                         first_reward_drop; "—" when it never fired)
  base drift max         `base_drift_max` at the last step (mean ± sd over seeds)
  mismatch               `logp_diff_mean` at step 0 (mean over seeds) -> mean of the last 10 steps
Then the dead counts by dtype and by sync kind, and one-sided Fisher exact tests of the two
comparisons the README states (bf16 weight syncs against the bf16 adapter sync; bf16 against fp16).
"""
import glob
import math
import os
import re
import sys

import h5py
import numpy as np

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "runs", "grid")
DEAD = 0.005
CELLS = [(d, s) for d in ("bf16", "fp16", "fp32") for s in ("mu", "merged", "adapter")] + [("full", "bf16")]
SYNC = {"mu": "merge-unmerge", "merged": "merged", "adapter": "adapter", "bf16": "full fine-tuning, lr 2e-4"}


def load(path):
    with h5py.File(path, "r") as f:
        s = {k: f["steps"][k][:] for k in f["steps"]}
        a = dict(f.attrs)
    return s, a


def final_clean(s):
    ev = s["eval_accuracy"]
    ev = ev[np.isfinite(ev)]
    return float(ev[-2:].mean()) if len(ev) else float("nan")


def runs_of(dtype, sync):
    out = []
    for p in sorted(glob.glob(os.path.join(RUNS, "*", "rl.h5"))):
        name = os.path.basename(os.path.dirname(p))
        m = re.fullmatch(r"s(\d+)-(\w+)-(\w+)", name) or re.fullmatch(r"(full)-(bf16)-s(\d+)", name)
        if not m:
            continue
        if m.group(1) == "full":
            d, sy, seed = "full", "bf16", int(m.group(3))
        else:
            seed, d, sy = int(m.group(1)), m.group(2), m.group(3)
        if (d, sy) != (dtype, sync):
            continue
        s, a = load(p)
        if int(a.get("steps_done", 0)) < int(a.get("max_steps", 1)):
            continue   # unfinished: not counted
        out.append((seed, s, a))
    return out


def fisher_one_sided(a, b, c, d):
    """P(X >= a) for the 2x2 table [[a, b], [c, d]] with fixed margins (hypergeometric)."""
    n1, n2, k = a + b, c + d, a + c
    tot = math.comb(n1 + n2, k)
    return sum(math.comb(n1, x) * math.comb(n2, k - x) for x in range(a, min(n1, k) + 1)) / tot


def fmt_sd(x, fmt):
    if not len(x):
        return "—"
    if np.all(np.asarray(x) == 0):
        return "0"
    return (fmt % np.mean(x)) + (" ± " + fmt % np.std(x, ddof=1) if len(x) > 1 else "")


print("| configuration | runs | final clean accuracy, mean ± sd (per seed) | dead | reward_drop at step |"
      " base drift max at the end | mean \\|Δlogp\\| step 0 → last 10 |")
print("|---|---|---|---|---|---|---|")
dead = {}
for d, sy in CELLS:
    rs = runs_of(d, sy)
    if not rs:
        continue
    acc = [final_clean(s) for _, s, _ in rs]
    nd = sum(x < DEAD for x in acc)
    dead[(d, sy)] = (nd, len(rs))
    drops = " / ".join(str(int(a["first_reward_drop"])) if int(a.get("first_reward_drop", -1)) >= 0 else "—"
                       for _, _, a in rs)
    drift = [float(s["base_drift_max"][-1]) for _, s, _ in rs if "base_drift_max" in s and np.isfinite(s["base_drift_max"][-1])]
    m0 = np.mean([s["logp_diff_mean"][0] for _, s, _ in rs])
    m1 = np.mean([np.nanmean(s["logp_diff_mean"][-10:]) for _, s, _ in rs])
    label = f"{d} `{SYNC[sy]}`" if d != "full" else f"bf16 {SYNC[sy]}"
    print(f"| {label} | {len(rs)} | {np.mean(acc):.2f} ± {np.std(acc, ddof=1) if len(acc) > 1 else 0:.2f} "
          f"({' / '.join('%.2f' % x for x in acc)}) | {nd} of {len(rs)} | {drops} | {fmt_sd(drift, '%.1e')} | "
          f"{m0:.1e} → {m1:.1e} |")


def tot(keys):
    n = [dead[k] for k in keys if k in dead]
    return sum(x for x, _ in n), sum(y for _, y in n)


print()
lora = [k for k in dead if k[0] != "full"]
for d in ("bf16", "fp16", "fp32"):
    a, n = tot([k for k in lora if k[0] == d])
    print(f"- {d} LoRA runs dead: {a} of {n}")
a1, n1 = tot([("bf16", "mu"), ("bf16", "merged")])
a2, n2 = tot([("bf16", "adapter")])
if n1 and n2:
    print(f"- bf16 weight syncs (merge-unmerge, merged) dead {a1} of {n1} against the bf16 adapter sync {a2} of {n2}:"
          f" one-sided Fisher exact p = {fisher_one_sided(a1, n1 - a1, a2, n2 - a2):.2f}")
b, nb = tot([k for k in lora if k[0] == "bf16"])
f16, nf = tot([k for k in lora if k[0] == "fp16"])
if nb and nf:
    print(f"- bf16 LoRA dead {b} of {nb} against fp16 LoRA {f16} of {nf}:"
          f" one-sided Fisher exact p = {fisher_one_sided(b, nb - b, f16, nf - f16):.2f}")
