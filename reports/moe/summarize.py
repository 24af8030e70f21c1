"""The table of reports/moe/README.md from the run files and --json summaries reports/moe/make.sh wrote.
Usage: .venv/bin/python reports/moe/summarize.py OUT_DIR   (h5py and numpy only)

Per model and preset pair (A = training path, B = inference path), over every scored token:
  mean |dlogp|, p99 |dlogp|, max |dlogp|     the mismatch
  flips                                      share of (token, MoE layer) decisions whose expert set differs
  tokens flipped                             share of tokens with a flip in at least one MoE layer
  share of sum |dlogp| on flipped tokens     how much of the mismatch the flipped tokens carry
  |dlogp| flipped / unflipped                their mean |dlogp| against the others'
With --routing-replay r3 (A takes B's experts) the flips are what A's own router would have chosen.
"""
import glob
import json
import os
import sys

import h5py
import numpy as np

OUT = sys.argv[1]
rows = []
for js in sorted(glob.glob(os.path.join(OUT, "*.json"))):
    name = os.path.basename(js)[:-5]
    model, ra, rb, rr = name.split("--")
    with h5py.File(os.path.join(OUT, name + ".h5"), "r") as f:
        d = np.abs(f["tokens/dlogp"][:])
        fl = f["routing/flip"][:] if "routing" in f else None
    r = {"model": model, "pair": f"{ra} vs {rb}", "replay": rr if model != "add" else "—", "n": len(d),
         "mean": d.mean(), "p99": np.quantile(d, 0.99), "max": d.max()}
    if fl is not None:
        any_f = (fl == 2).any(1)
        routed = (fl >= 0).any(1)
        r.update(flips=float((fl == 2).sum() / max((fl >= 0).sum(), 1)), tok=float(any_f[routed].mean()),
                 share=float(d[any_f].sum() / d.sum()) if d.sum() > 0 else float("nan"),
                 ratio=float(d[any_f].mean() / d[~any_f].mean()) if any_f.any() and (~any_f).any() and d[~any_f].mean() > 0
                 else float("nan"))
    rows.append(r)
order = {"add": 0, "add-moe": 1}
rows.sort(key=lambda r: (r["pair"], order[r["model"]], r["replay"]))
print("| pair (A vs B) | model | replay | tokens | mean \\|Δlogp\\| | p99 | max | flips | tokens flipped | "
      "share of Σ\\|Δlogp\\| on flipped tokens | \\|Δlogp\\| flipped / unflipped |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    moe = "flips" in r
    f = lambda k, fmt: (fmt % r[k]) if moe and np.isfinite(r[k]) else "—"
    print(f"| {r['pair']} | {r['model']} | {r['replay']} | {r['n']} | {r['mean']:.2e} | {r['p99']:.2e} | {r['max']:.2e} | "
          f"{f('flips', '%.4f')} | {f('tok', '%.3f')} | {f('share', '%.2f')} | {f('ratio', '%.1f')} |")
