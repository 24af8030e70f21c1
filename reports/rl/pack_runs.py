"""Copies every run's /steps and root attributes (the figures and tables need nothing else) from
build/rl/<sweep>/<run>/rl.h5 to reports/rl/runs/<sweep>/<run>/rl.h5, small enough to commit
(the /tokens sample stays in build/). `tidal-sweep CONFIG --report-only` reads them once the
config's output_dir points at reports/rl/runs/<sweep>. The float64 columns are stored as float32
(7 significant digits, more than any table or figure prints; accuracy, reward and eval_* stay
float64, see KEEP64; a third smaller), in HDF5's newest file format of this HDF5 (libver="latest":
1.10's compact object headers and single-chunk indexes, which HDF5 >= 1.10 and tidal read; half the
bytes of the 1.8 format, whose per-dataset B-trees outweighed the data), so that the tree a
GPU call carries stays under its 64 MiB with the pack, tests/gpu/pack.sh); build/'s run files keep
the full precision. `--repack`: convert already packed files under DST in place. Usage: .venv/bin/python reports/rl/pack_runs.py
[SRC DST] (default build/rl reports/rl/runs; the LoRA experiment: build/rl/lora reports/rl/lora/runs)"""
import glob
import os
import sys

import h5py
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
n = size = skipped = 0
REPACK = "--repack" in sys.argv
args = [a for a in sys.argv[1:] if a != "--repack"]
SRC, DST = (args[0], args[1]) if len(args) > 1 else ("build/rl", "reports/rl/runs")


# columns kept in float64: shares of k / N (accuracy, reward) whose float32 roundings would move
# values that sit on a printed digit or a threshold (0.005 = 1 of 200 is 0.00499999988 in float32)
KEEP64 = {"accuracy", "reward", "step", "epoch"}


def copy(a, b, note):
    for k, v in a.attrs.items():
        b.attrs[k] = v
    b.attrs["packed_from"] = note
    for k in a["steps"]:
        x = a["steps"][k][:]
        if x.dtype == np.float64 and k not in KEEP64 and not k.startswith("eval_"):
            x = x.astype(np.float32)
        b.create_dataset("steps/" + k, data=x, compression="gzip", compression_opts=9, shuffle=True)


if REPACK:
    for dst in sorted(glob.glob(os.path.join(ROOT, DST, "**", "rl.h5"), recursive=True)):
        with h5py.File(dst, "r") as a, h5py.File(dst + ".tmp", "w", libver="latest") as b:
            note = str(a.attrs.get("packed_from", ""))
            copy(a, b, note if "float32" in note else note.replace(" only)", " only, float64 columns as float32)"))
        os.replace(dst + ".tmp", dst)
        n += 1
        size += os.path.getsize(dst)
    print(f"{n} runs repacked, {size / 1e6:.1f} MB in {DST}/")
    sys.exit(0)
for src in sorted(glob.glob(os.path.join(ROOT, SRC, "*", "*", "rl.h5"))):
    sweep, run = src.split(os.sep)[-3], src.split(os.sep)[-2]
    dst = os.path.join(ROOT, DST, sweep, run, "rl.h5")
    with h5py.File(src, "r", locking=False) as a:
        done = bool(a.attrs.get("finished", 0))
    if not done:   # a run still being written (a resumable grid): packed once it has finished
        skipped += 1
        continue
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with h5py.File(src, "r") as a, h5py.File(dst + ".tmp", "w", libver="latest") as b:
        copy(a, b, os.path.relpath(src, ROOT) + " (/steps and attributes only, float64 columns as float32)")
    os.replace(dst + ".tmp", dst)
    n += 1
    size += os.path.getsize(dst)
print(f"{n} runs, {size / 1e6:.1f} MB in {DST}/" + (f"; {skipped} unfinished runs left out" if skipped else ""))
