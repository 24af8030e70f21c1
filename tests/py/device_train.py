"""Shared by tests/py/test_device_sft.py and test_device_rl.py: tidal-sft / tidal-rl with
--device cuda against the same tools on the CPU (issue 27).

The device tools are build/sim/bin/tidal-sft and tidal-rl by default (linked with the CUDA backend
compiled against tests/cudasim, a CPU simulator of CUDA: tests/cudasim/sim.mk); with
DEVICE_BIN=build/bin (tests/gpu/run.sh stage rl) the real CUDA build on a GPU. The CPU runs are
BUILD/bin's. Run files are read with h5py, or without it through tidal-export
(tests/py/runfile_read.py: the GPU machine's python may lack h5py). A script importing this exits
77 (skip) when the device tools are not built or numpy is missing."""
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)
import runfile_read  # noqa: E402

from tidal_check import BIN, BUILD, check  # noqa: E402

DEVBIN = os.environ.get("DEVICE_BIN", os.path.join(BUILD, "sim", "bin"))
for _tool in ["tidal-sft", "tidal-rl"]:
    if not os.access(os.path.join(DEVBIN, _tool), os.X_OK):
        print(f"skip: {DEVBIN}/{_tool} not built (make tests builds it: tests/cudasim/sim.mk)")
        sys.exit(77)
SIM = "DEVICE_BIN" not in os.environ   # the simulated device (its cuBLASLt model sums exactly)
# bf16 / fp16 recipes: the bound on the simulator, and on a GPU, whose cuBLASLt kernels sum in an
# order of their own, so more bf16 / fp16 roundings of activations and gradients go the other way
LOW_TOL = 1e-3 if SIM else 1e-2
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
# On the simulator, host code that touches device memory faults (CUDASIM_DEVICE_GUARD=1): the
# device runs must keep every device buffer on the device side of the seam.
GUARD = True
tmp = tempfile.mkdtemp(prefix="tidal-devtrain-")


def sh(*args, env=None, ok=True):
    """Runs a command; with ok a failure stops the script (its output printed)."""
    t0 = time.time()
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env or ENV)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"command failed (exit {p.returncode}): {' '.join(map(str, args))}")
    p.seconds = time.time() - t0
    return p


def cpu(tool, *args, ok=True):
    return sh(os.path.join(BIN, tool), *args, ok=ok)


def device(tool, *args, ok=True):
    """DEVBIN/tool ... --device cuda (on the simulator under CUDASIM_DEVICE_GUARD, see GUARD)."""
    env = dict(ENV, CUDASIM_DEVICE_GUARD="1") if SIM and GUARD else ENV
    return sh(os.path.join(DEVBIN, tool), *args, "--device", "cuda", ok=ok, env=env)


def steps(path):
    """/steps columns and the root attributes the checks read (device) of a run file."""
    return runfile_read.steps(path), runfile_read.attrs(path, ["device"])


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-12)))


def close(a, b, cols, tol, what):
    """Checks columns cols of /steps a (CPU) and b (device) within tol relative; prints each."""
    worst = {k: rel(a[k], b[k]) for k in cols}
    print(f"  {what}: max relative difference " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    check(len(a["loss"]) == len(b["loss"]) > 0 and all(v <= tol for v in worst.values()),
          f"{what}: {', '.join(cols)} within {tol:g} relative of the CPU's")


def pair(tool, runfile, name, common, *extra):
    """tool on the CPU and on the device with the same arguments; the two runs' (steps, attrs)."""
    c, g = os.path.join(tmp, name + "-cpu"), os.path.join(tmp, name + "-dev")
    pc = cpu(tool, *common, "-o", c, *extra)
    pg = device(tool, *common, "-o", g, *extra)
    print(f"{tool} {name}: CPU {pc.seconds:.1f} s, device {pg.seconds:.1f} s")
    return steps(os.path.join(c, runfile)), steps(os.path.join(g, runfile))


def device_attrs(ca, ga, runfile):
    print(f"device attributes: CPU {ca.get('device')!r}, device tool {ga.get('device')!r}")
    check(ca.get("device") == "cpu" and str(ga.get("device", "")).startswith("cuda:0 ("),
          f"{runfile} records the device: 'cpu' and 'cuda:0 (...)'")
