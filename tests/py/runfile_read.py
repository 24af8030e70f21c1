"""Reading a tidal run file's /steps columns and root attributes with h5py where the python has
it, else through tidal-export (--group steps, --attr NAME): the GPU machine's python
(tests/gpu/run.sh) has torch, transformers and numpy but maybe not h5py, and the scripts it runs
must not lose their results to a missing import. numpy is required either way (transformers
depends on it).

  steps(path)          {column: numpy array} of /steps (sft.h5, rl.h5)
  group(path, g)       the same of group g: tokens, seqs, progress or steps (tidal-export's groups)
  attrs(path, names)   {name: value} of the named root attributes that exist: strings as str,
                       numbers as numbers with h5py but as their text through tidal-export
                       (callers convert with int() / float(), which take both)
  BACKEND              "h5py" or "tidal-export"
"""
import csv
import io
import os
import subprocess

import numpy as np

try:   # TIDAL_RUNFILE_READER=tidal-export: as if h5py were missing (tests/gpu/run.sh's rehearsal)
    if os.environ.get("TIDAL_RUNFILE_READER") == "tidal-export":
        raise ImportError("TIDAL_RUNFILE_READER=tidal-export")
    import h5py
    BACKEND = "h5py"
except ImportError:
    h5py = None
    BACKEND = "tidal-export"


def _export():
    return os.path.join(os.environ.get("BUILD", "build"), "bin", "tidal-export")


def steps(path):
    return group(path, "steps")


def group(path, g):
    if h5py:
        with h5py.File(path, "r") as f:
            return {k: f[g][k][:] for k in f[g] if f[g][k].ndim == 1}
    p = subprocess.run([_export(), path, "--group", g], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"tidal-export {path} --group {g}: {p.stderr.strip()}")
    rows = list(csv.reader(io.StringIO(p.stdout)))
    cols = list(zip(*rows[1:])) if len(rows) > 1 else [() for _ in rows[0]]
    return {name: np.array([float(x) for x in col]) for name, col in zip(rows[0], cols)}


def attrs(path, names):
    out = {}
    if h5py:
        with h5py.File(path, "r") as f:
            for k in names:
                if k in f.attrs:
                    v = f.attrs[k]
                    out[k] = v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)
        return out
    for k in names:
        p = subprocess.run([_export(), path, "--attr", k], capture_output=True, text=True)
        if p.returncode == 0:
            out[k] = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
    return out
