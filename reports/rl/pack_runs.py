"""Copies every run's /steps and root attributes (the figures and tables need nothing else) from
build/rl/<sweep>/<run>/rl.h5 to reports/rl/runs/<sweep>/<run>/rl.h5, small enough to commit
(the /tokens sample stays in build/). `tidal-sweep CONFIG --report-only` reads them once the
config's output_dir points at reports/rl/runs/<sweep>. Usage: .venv/bin/python reports/rl/pack_runs.py
[SRC DST] (default build/rl reports/rl/runs; the LoRA experiment: build/rl/lora reports/rl/lora/runs)"""
import glob
import os
import sys

import h5py

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
n = size = skipped = 0
SRC, DST = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("build/rl", "reports/rl/runs")
for src in sorted(glob.glob(os.path.join(ROOT, SRC, "*", "*", "rl.h5"))):
    sweep, run = src.split(os.sep)[-3], src.split(os.sep)[-2]
    dst = os.path.join(ROOT, DST, sweep, run, "rl.h5")
    with h5py.File(src, "r", locking=False) as a:
        done = bool(a.attrs.get("finished", 0))
    if not done:   # a run still being written (a resumable grid): packed once it has finished
        skipped += 1
        continue
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with h5py.File(src, "r") as a, h5py.File(dst + ".tmp", "w") as b:
        for k, v in a.attrs.items():
            b.attrs[k] = v
        b.attrs["packed_from"] = os.path.relpath(src, ROOT) + " (/steps and attributes only)"
        for k in a["steps"]:
            b.create_dataset("steps/" + k, data=a["steps"][k][:], compression="gzip", shuffle=True)
    os.replace(dst + ".tmp", dst)
    n += 1
    size += os.path.getsize(dst)
print(f"{n} runs, {size / 1e6:.1f} MB in {DST}/" + (f"; {skipped} unfinished runs left out" if skipped else ""))
