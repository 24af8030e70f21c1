"""reports/postmortem: tidal-postmortem's verdicts on reports/rl/lora's 50 grid runs (run.sh curves)
against what that report knows: which runs ended dead (final clean accuracy, the mean of the last two
evaluations, below 0.005: reports/rl/lora section 3's rule) and where the detector confirmed each drop.
    .venv/bin/python reports/postmortem/summarize.py > reports/postmortem/grid.md"""
import json
import os
import sys

import h5py
import numpy as np

G = "reports/rl/lora/runs/grid"
rows, tally = [], {}
for n in sorted(os.listdir(G)):
    p = os.path.join("build/postmortem/grid", n + ".json")
    if not os.path.exists(p):
        sys.exit(f"{p} missing: run reports/postmortem/run.sh curves first")
    j = json.load(open(p))
    with h5py.File(os.path.join(G, n, "rl.h5"), "r") as f:
        ev = f["steps/eval_accuracy"][:]
        ck = int(f.attrs["collapse_step"])
    ev = ev[np.isfinite(ev)]
    final = float(ev[-2:].mean())
    dead = final < 0.005
    v = {h["hypothesis"]: h["reading"] for h in j["verdict"]}
    arm = n.split("-", 1)[1] if n.startswith("s") else "full-bf16"
    rows.append((n, arm, dead, final, j["reward_drop_step"], j["reward_drop_confirmed_step"], ck, v,
                 [(e["event"], e["step"]) for e in j["events"] if e["before_onset"] and e["event"] not in ("reward_drop", "reward_dip")],
                 [e["step"] for e in j["events"] if e["event"] == "reward_dip"]))
    for h, r in v.items():
        tally.setdefault(h, {}).setdefault((dead, r), 0)
        tally[h][(dead, r)] += 1

print("| run | dead | final clean acc | collapse onset | collapse confirmed | detector's first mark (run file) | dips | mismatch | entropy | learning_rate | truncation | dead_groups | precursors before the onset |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for n, arm, dead, final, on, conf, ck, v, pre, dips in rows:
    print(f"| {n} | {'yes' if dead else 'no'} | {final:.3f} | {on if on is not None else '—'} | {conf if conf is not None else '—'} | "
          f"{ck + 1 if ck >= 0 else '—'} | {', '.join(map(str, dips)) or '—'} | {v['mismatch']} | {v['entropy']} | {v['learning_rate']} | "
          f"{v['truncation']} | {v['dead_groups']} | {', '.join('%s@%d' % e for e in pre) or '—'} |")
print()
both = sum(1 for r in rows if r[2] and r[4] is not None)
dead_only = sum(1 for r in rows if r[2] and r[4] is None)
col_only = sum(1 for r in rows if not r[2] and r[4] is not None)
neither = sum(1 for r in rows if not r[2] and r[4] is None)
print(f"Ended collapsed (the rollout reward's final EMA below its best by the detector's margin) against dead (clean accuracy): "
      f"both {both}, dead only {dead_only}, collapsed only {col_only}, neither {neither}.")
first = sum(1 for r in rows if r[6] >= 0 and r[4] is not None and r[4] <= r[6] + 1 <= (r[5] or 0))
print(f"The detector's first mark (the run file's collapse_step) falls inside the final collapse in {first} of "
      f"{sum(1 for r in rows if r[4] is not None)} collapsed runs; in the others it marked an earlier dip the reward recovered from.")
nd = sum(r[2] for r in rows)
print(f"Dead: {nd} of {len(rows)}. Readings by outcome (dead / alive):")
print()
print("| hypothesis | " + " | ".join(f"{r} (dead / alive)" for r in ("supported", "mixed", "against", "no data")) + " |")
print("|---|---|---|---|---|")
for h in ("mismatch", "entropy", "learning_rate", "truncation", "dead_groups", "adapter_rounding"):
    t = tally.get(h, {})
    print(f"| {h} | " + " | ".join(f"{t.get((True, r), 0)} / {t.get((False, r), 0)}" for r in ("supported", "mixed", "against", "no data")) + " |")
