"""Shared by tests/py/test_device_sft.py and test_device_rl.py: tidal-sft / tidal-rl with
--device cuda against the same tools on the CPU (issue 27).

The device tools are build/sim/bin/tidal-sft and tidal-rl by default (linked with the CUDA backend
compiled against tests/cudasim, a CPU simulator of CUDA: tests/cudasim/sim.mk); with
DEVICE_BIN=build/bin (tests/gpu/run.sh stage rl) the real CUDA build on a GPU. The CPU runs are
BUILD/bin's. Run files are read with h5py, or without it through tidal-export
(tests/py/runfile_read.py: the GPU machine's python may lack h5py). A script importing this exits
77 (skip) when the device tools are not built or numpy is missing."""
import os
import re
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


STEP_D2H = re.compile(r"tidal: optimiser step (\d+): (\d+) bytes device -> host \((\d+) parameters; weights prepared on "
                      r"the (device|host)\)")
SYNC_D2H = re.compile(r"tidal: weight sync before step (\d+): (\d+) bytes device -> host")


def prep_pair(tool, runfile, name, common, *extra):
    """tool on the device twice with the same arguments: the recipe's weights prepared on the device
    from the device masters (the default) and on the host from downloaded masters
    (TIDAL_PREPARE_ON_HOST=1, the path before), both under TIDAL_STEP_D2H=1. Returns per run
    (steps, d2h): d2h the stderr's bytes device -> host of each optimiser step (the step and the
    weights' preparation), of each RL weight sync, and the trained parameter count."""
    out = []
    for mode, host in [("prep-dev", "0"), ("prep-host", "1")]:
        d = os.path.join(tmp, f"{name}-{mode}")
        env = dict(ENV, TIDAL_PREPARE_ON_HOST=host, TIDAL_STEP_D2H="1")
        if SIM and GUARD:
            env["CUDASIM_DEVICE_GUARD"] = "1"
        p = sh(os.path.join(DEVBIN, tool), *common, "-o", d, *extra, "--device", "cuda", env=env)
        st = [m.groups() for m in STEP_D2H.finditer(p.stderr)]
        check(len(st) > 0 and all(s[3] == ("host" if host == "1" else "device") for s in st),
              f"{tool} {name} ({mode}): each optimiser step logs its bytes to the host, prepared where asked")
        d2h = {"step": [int(s[1]) for s in st], "nparams": int(st[0][2]) if st else 0,
               "sync": [int(m.group(2)) for m in SYNC_D2H.finditer(p.stderr)]}
        out.append((runfile_read.steps(os.path.join(d, runfile)), d2h))
    return out


def prep_identical(dev, host, what):
    """Every /steps column but the wall-clock ones (seconds, time_*) bit for bit equal between the two
    preparations."""
    cols = sorted(k for k in host if k != "seconds" and not k.startswith("time_"))
    diff = [k for k in cols if k not in dev or not np.array_equal(np.asarray(dev[k]), np.asarray(host[k]), equal_nan=True)]
    print(f"  {what}: {len(cols)} /steps columns compared, differing: {diff or 'none'}")
    check(len(dev["loss"]) > 0 and not diff,
          f"{what}: /steps bit-identical with the weights prepared on the device and on the host")


def prep_d2h(dd, hd, what):
    """Full fine-tuning: the masters (4 bytes a parameter) no longer come down at each optimiser step.
    The device preparation's step brings down only the gradient norm's partial sums (a bound of its
    own, not of the parameter count: below one byte a parameter here, where the masters are 4)."""
    n = dd["nparams"]
    print(f"  {what}: bytes device -> host per optimiser step, weights prepared on the device {dd['step']}, "
          f"on the host {hd['step']} ({n} parameters, {4 * n} bytes of masters)")
    check(len(dd["step"]) == len(hd["step"]) > 0 and all(h - d == 4 * n for d, h in zip(dd["step"], hd["step"]))
          and all(d < n for d in dd["step"]),
          f"{what}: each step downloads exactly the masters' {4 * n} bytes less than with host preparation, "
          f"and under one byte a parameter")


def device_attrs(ca, ga, runfile):
    print(f"device attributes: CPU {ca.get('device')!r}, device tool {ga.get('device')!r}")
    check(ca.get("device") == "cpu" and str(ga.get("device", "")).startswith("cuda:0 ("),
          f"{runfile} records the device: 'cpu' and 'cuda:0 (...)'")
