"""tests/gpu/run.sh rehearsed without a GPU (TIDAL_GPU_REHEARSAL=1: the CUDA simulator's tools and
test programs, tiny shapes), so that an edit which breaks a GPU stage's script is caught here and
not in the few minutes a GPU is lent for. The cheap stages, in one call:
  check (test_round_sim only, test_device.py, test_vs_transformers.py), memory, attn-bench (77 on
  the simulator: listed as skipped), bench, rl-bench
Checked: run.sh exits 0; $OUT/summary.md has a row per stage, ok or skipped; env.log names the
python and its modules; $OUT holds no more than the device tool returns (8 files under 16 MiB),
run.log every stage's log, results.tar.gz their results; each stage's results parse: check's
test program exit line and test_device.py's "0 failure(s)", memory.md's ok lines, bench's
gpu-tf-vs-cublas / decode / diff lines with numbers for tidal, rl-bench.md's four phase rows with
tidal's seconds (rl.h5 read through tidal-export, as where the python has no h5py).
Then the time limits: bench under a 3 s limit is killed and listed as TIMED OUT, the next stage
still runs, and run.sh exits 1; a budget too small for any stage lists it as not run; an unknown
stage is a usage error (exit 2). With nvcc: `make -n` of tests/gpu/pack.sh's targets builds every
program run.sh starts (the real-CUDA ones cannot run here).
The long stages (rl: the simulator's test_device_sft/rl, which make check runs anyway;
fidelity: 32 simulated diffs) are rehearsed by hand: TIDAL_GPU_REHEARSAL=1 tests/gpu/run.sh rl fidelity.
Exit 0 pass, 1 fail, 77 skip (the simulator's tools not built, or numpy missing)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BUILD, check, failures  # noqa: E402

try:
    import numpy  # noqa: F401
except ImportError:
    print("skip: numpy missing (the GPU stages' python needs it)")
    sys.exit(77)
for need in ["sim/bin/tidal-rl", "sim/bin/tidal-diff", "sim/test_round_sim", "tests/helpers/rl_base_sft",
             "bin/tidal-export"]:
    if not os.access(os.path.join(BUILD, need), os.X_OK):
        print(f"skip: {BUILD}/{need} not built (make tests)")
        sys.exit(77)
if not shutil.which("timeout"):
    print("skip: GNU timeout missing")
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="tidal-gpu-rehearsal-")
ENV = dict(os.environ, TIDAL_GPU_REHEARSAL="1", TIDAL_REHEARSAL_FROM=BUILD, OMP_WAIT_POLICY="PASSIVE",
           TIDAL_GPU_CHECK="test_round_sim")


def run_sh(out, *stages, **env):
    p = subprocess.run(["bash", "tests/gpu/run.sh", *stages], env=dict(ENV, OUT=out, **env),
                       capture_output=True, text=True)
    return p


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def rows(summary):
    """{stage: (status, seconds)} from summary.md's table."""
    out = {}
    for ln in summary.splitlines():
        m = re.match(r"\| (\S+) \| ([^|]+) \| (\d+) \|", ln)
        if m and m.group(1) != "stage":
            out[m.group(1)] = (m.group(2).strip(), int(m.group(3)))
    return out


# 1. the cheap stages
out = os.path.join(tmp, "out")
stages = ["check", "memory", "attn-bench", "bench", "rl-bench"]
p = run_sh(out, *stages)
summary = read(os.path.join(out, "summary.md"))
print(summary)
if p.returncode:
    print(p.stderr[-6000:])
check(p.returncode == 0, f"run.sh {' '.join(stages)} in rehearsal: exit 0 (got {p.returncode})")
r = rows(summary)
for s in stages:
    want = "skipped (exit 77)" if s == "attn-bench" else "ok"
    check(r.get(s, ("missing",))[0] == want, f"summary.md: {s} {want} (got {r.get(s, ('missing',))[0]})")
env = read(os.path.join(out, "env.log"))
check("cudasim rehearsal" in env and "python: " in env and re.search(r"numpy \S+", env) is not None,
      "env.log names the GPU, the python and its numpy")
check(re.search(r"libraries: tools [^ ;]*/rehearsal-build/lib[:;]", env) is not None
      and "rehearsal-build/lib" not in env.split("; python ", 1)[-1].splitlines()[0],
      "the pack's lib/ is first on the tools' library path, not on python's")

work = os.path.join(out, "rehearsal-build", "gpu-work")   # the stages' OUT (run.sh: WORK)
back = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs
              if not os.path.relpath(d, out).startswith("rehearsal-build"))
print("OUT holds", back)
check(len(back) <= 8 and all(os.path.getsize(os.path.join(out, f)) < 16 << 20 for f in back)
      and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in back)
      and {"summary.md", "env.log", "run.log", "results.tar.gz", "bench-lines.txt"} <= set(back),
      "OUT holds what the device tool returns: at most 8 files under 16 MiB, plain names; summary, logs, results")
q = subprocess.run(["tar", "tzf", os.path.join(out, "results.tar.gz")], capture_output=True, text=True)
check(all(f"./{f}" in q.stdout.split() for f in ["check.log", "memory.md", "rl-bench.md", "memory.log"]),
      "results.tar.gz holds the stages' logs and result files")
run_log = read(os.path.join(out, "run.log"))
check(all(f"### {s}: " in run_log for s in stages), "run.log holds every stage's log")
log = read(os.path.join(work, "check.log"))
check(re.search(r"=== \S+/gpu/test_round_sim: exit 0", log) is not None and "NVIDIA GPU present" in log
      and "0 failure(s)" in log, "check: test_round_sim ran (exit 0); test_device.py took the GPU path, 0 failures")
check("skip: torch/transformers unavailable" in log or "failure(s)" in log.split("test_vs_transformers.py")[-1],
      "check: test_vs_transformers.py ran or said why it skipped")

mem = read(os.path.join(work, "memory.md"))
check(mem.count("- ok ") >= 5 and "- FAIL" not in mem,
      f"memory.md: the plan's bounds and the 8B plan, every line ok ({mem.count('- ok ')} ok)")

bench = read(os.path.join(out, "bench-lines.txt"))
num = r"[0-9.]+(e-?[0-9]+)?"
for name in ["gpu-tf-vs-cublas", "gpu-decode1-vs-hbm", "gpu-decode2-vs-hbm", "gpu-tf-vs-transformers",
             "gpu-diff-vs-transformers"]:
    check(re.search(rf"^bench: {name} tidal={num} peer=\S+ ratio=\S+$", bench, re.M) is not None,
          f"bench: the {name} line with tidal's figure")
for ph in ["rollout", "pi_old", "update", "step"]:
    check(re.search(rf"^bench: gpu-grpo-tiny-8-{ph} tidal={num} ", bench, re.M) is not None,
          f"rl-bench: the {ph} line with tidal's seconds")
rl = read(os.path.join(work, "rl-bench.md"))
check(len(re.findall(r"^\| tiny \| 8 \(tidal's mean [0-9]+\) \| \S+ \| [0-9.]+ \|", rl, re.M)) == 4,
      "rl-bench.md: four phase rows with tidal's seconds")
check(os.path.exists(os.path.join(work, "rl-bench-tiny-8.rl.h5"))
      and not os.path.exists(os.path.join(work, "rl-bench-tiny-8", "checkpoint-2")),
      "rl-bench: rl.h5 copied to the results, tidal-rl's checkpoint kept out of them")

# the run file reader without h5py (tidal-export) against h5py, on rl-bench's rl.h5
rlh5 = os.path.join(work, "rl-bench-tiny-8.rl.h5")
try:
    import h5py  # noqa: F401
    have_h5py = True
except ImportError:
    have_h5py = False
if have_h5py and os.path.exists(rlh5):
    code = ("import json, sys; sys.path.insert(0, 'tests/py'); import runfile_read as r; "
            "s = r.steps(sys.argv[1]); a = r.attrs(sys.argv[1], ['device', 'seed', 'nosuch']); "
            "print(r.BACKEND, json.dumps({k: [float(x) for x in v] for k, v in s.items()}), json.dumps({k: str(v) for k, v in a.items()}))")
    res = {}
    for reader in ["h5py", "tidal-export"]:
        q = subprocess.run([sys.executable, "-c", code, rlh5], capture_output=True, text=True,
                           env=dict(os.environ, TIDAL_RUNFILE_READER=reader))
        res[reader] = q.stdout.split(" ", 1)
    h, t = res["h5py"], res["tidal-export"]
    check(len(h) == 2 and len(t) == 2 and h[0] == "h5py" and t[0] == "tidal-export" and h[1] == t[1]
          and '"time_update"' in t[1] and '"device": "cuda:0 (' in t[1],
          "runfile_read: /steps and root attributes through tidal-export equal h5py's (every column, bit for bit)")
tx = os.path.join(BUILD, "bin", "tidal-export")
q = subprocess.run([tx, rlh5, "--attr", "nosuch"], capture_output=True, text=True)
check(q.returncode == 1 and "no root attribute 'nosuch'" in q.stderr, "tidal-export --attr of an absent attribute: exit 1, says so")
q = subprocess.run([tx, rlh5, "--group", "stepz"], capture_output=True, text=True)
check(q.returncode == 2, "tidal-export --group stepz: usage error (exit 2)")

# 1b. stages side by side (A+B), the 8B diff and the profile, tiny
out4 = os.path.join(tmp, "side")
p = run_sh(out4, "memory+init-8b", "diff-8b8k", "profile")
summary4 = read(os.path.join(out4, "summary.md"))
print(summary4)
if p.returncode:
    print(p.stderr[-4000:])
r = rows(summary4)
check(p.returncode == 0 and all(r.get(s, ("missing",))[0] == "ok" for s in ["memory", "init-8b", "diff-8b8k", "profile"]),
      f"run.sh memory+init-8b diff-8b8k profile: each stage its own row, ok ({r})")
w4 = os.path.join(out4, "rehearsal-build", "gpu-work")
run_log4 = read(os.path.join(out4, "run.log"))
check(all(f"### {s}: ok" in run_log4 for s in ["memory", "init-8b", "diff-8b8k", "profile"])
      and "beside memory init-8b" in read(os.path.join(w4, "init-8b.log")),
      "run.log holds each side-by-side stage's own log, which says what ran beside it")
d8 = read(os.path.join(w4, "diff-8b8k.md"))
check("exit status 0" in d8 and "GPU memory: tidal held at most" in d8 and '"mean_abs_dlogp"' in d8,
      "diff-8b8k.md: exit 0, the GPU memory line, tidal-diff's summary")
prof = read(os.path.join(w4, "profile.md"))
cases = re.findall(r"^## (\S+) \(exit 0,", prof, re.M)
check(cases == ["tf", "decode1", "decode64", "diff", "diff-8b", "rl"] and prof.count("not in any op") == 6
      and "cublasLtMatmul" in prof,
      f"profile.md: the six cases, each with TIDAL_CUDA_PROFILE's table ({cases})")

# 2. limits and budget
out2 = os.path.join(tmp, "limits")
p = run_sh(out2, "bench", "attn-bench", TIDAL_GPU_LIMITS="bench=3")
r = rows(read(os.path.join(out2, "summary.md")))
print(read(os.path.join(out2, "summary.md")))
check(p.returncode == 1 and r.get("bench", ("",))[0].startswith("TIMED OUT") and r["bench"][1] <= 20
      and r.get("attn-bench", ("",))[0] == "skipped (exit 77)",
      "a stage past its limit is killed, listed as TIMED OUT, the next stage runs, exit 1")
check("killed after 3 s" in read(os.path.join(out2, "run.log")), "the killed stage's log says so")
out3 = os.path.join(tmp, "budget")
p = run_sh(out3, "memory", TIDAL_GPU_BUDGET_S="10")
r = rows(read(os.path.join(out3, "summary.md")))
check(p.returncode == 1 and r.get("memory", ("",))[0].startswith("not run (budget"),
      "a budget too small for a stage: listed as not run, exit 1")
p = run_sh(os.path.join(tmp, "bad"), "nosuchstage")
check(p.returncode == 2 and "unknown stage 'nosuchstage'" in p.stderr, "an unknown stage: usage error (exit 2)")

# 3. what pack.sh builds covers what run.sh starts
if shutil.which("nvcc"):
    b = os.path.join(tmp, "bg")
    p = subprocess.run(["make", "-n", "--no-print-directory", f"BUILD={b}", "CUDA=1", "all", "gpu-tests",
                        f"{b}/tests/helpers/rl_base_sft"], capture_output=True, text=True)
    built = set(re.findall(r"-o (\S+)", p.stdout))
    pack = read("tests/gpu/pack.sh")
    progs = re.findall(r"(?:bin|gpu|tests/helpers)/[a-z_-]+", pack.split("what tests/gpu/run.sh's stages start")[1]
                       .split("done")[0])
    missing = [q for q in progs if os.path.join(b, q) not in built]
    check(p.returncode == 0 and len(progs) >= 12 and not missing,
          f"make -n of pack.sh's targets builds the {len(progs)} programs run.sh starts (missing: {missing})")
    stage_tools = set(re.findall(r"\$BUILD/bin/(tidal-[a-z-]+)|\"\$B/(tidal-[a-z-]+)|/bin/(tidal-[a-z-]+)",
                                 "".join(read(f) for f in ["tests/gpu/run.sh", "tests/bench/gpu.sh", "tests/gpu/rl_bench.sh",
                                                           "reports/gpu/fidelity.sh", "tests/gpu/diff_8b8k.sh",
                                                           "tests/gpu/profile.sh"])))
    named = {t for g in stage_tools for t in g if t}
    check(all(f"bin/{t}" in progs for t in named), f"pack.sh checks every tool the stage scripts start ({sorted(named)})")
else:
    print("nvcc not found: pack.sh's targets not checked")

shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
