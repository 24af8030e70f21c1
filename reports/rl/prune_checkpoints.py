"""Disk hygiene for the long sweeps: in each finished tidal-rl run under the given folders
(rl.h5 says steps_done = max_steps), every checkpoint-N/ but the last is removed: the run's result is
its rl.h5 (packed into reports/ by pack_runs.py) and nothing resumes a finished run. Unfinished runs
are left whole (tidal-sweep resumes them from their last checkpoint). An MoE grid run keeps 10
checkpoints of 68 MB each otherwise (issue 35's 55 runs: 37 GB).
Usage: .venv/bin/python reports/rl/prune_checkpoints.py DIR...      (prints what it freed)"""
import glob
import os
import shutil
import sys

import h5py

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")


def finished(path):
    try:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
    except OSError:
        return False   # being written, or damaged: not touched
    return int(a.get("max_steps", 0)) > 0 and int(a.get("steps_done", 0)) >= int(a.get("max_steps", 0))


def main(dirs):
    runs = freed = 0
    for top in dirs:
        for f in glob.glob(os.path.join(top, "**", "rl.h5"), recursive=True):
            if not finished(f):
                continue
            d = os.path.dirname(f)
            cks = sorted(glob.glob(os.path.join(d, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1])
                         if p.rsplit("-", 1)[1].isdigit() else -1)
            for c in cks[:-1]:
                for root, _, files in os.walk(c):
                    freed += sum(os.path.getsize(os.path.join(root, x)) for x in files)
                shutil.rmtree(c)
                runs += 1
    print(f"prune_checkpoints: {runs} checkpoints of finished runs removed, {freed >> 20} MiB freed")


if __name__ == "__main__":
    main(sys.argv[1:] or ["build/rl"])
