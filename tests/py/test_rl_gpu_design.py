"""reports/rl/gpu: the GPU collapse experiment's design is ready to run (issue 27, item 5), checked
on the CPU in seconds:

1. reports/rl/gpu/grid.json expands to 9 runs, 3 arms (bf16, fp16, exact-match) x 3 seeds, every
   run on --device cuda with the sanity test's settings (lr 1e-6 constant, beta 0, Dr.GRPO,
   temperature 1, 64 completions per step).
2. its job arrays ask for a GPU per task: --emit slurm writes `#SBATCH --gres=gpu:1` and a 9-task
   array, --emit condor `request_gpus = 1` with an executable path that exists.
3. the same arguments run: the grid with the shipped add model in place of the 1.5B checkpoint,
   countdown records from prepare_data.py, datasets/rewards/math_boxed.py as the reward, tiny
   lengths and 2 steps, on the CPU (--device dropped): every arm finishes, /steps has
   reward_correct and the clean eval_accuracy, and the exact-match arm's mismatch is 0.
4. --eval-steps on the user's own records (scored by --reward-command): eval_reward is the
   command's mean reward, eval_accuracy the share of completions with a reward of at least 1.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy missing: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, BUILD, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SWEEP = os.path.join(BIN, "tidal-sweep")
GRID = json.load(open(os.path.join(ROOT, "reports", "rl", "gpu", "grid.json")))
tmp = tempfile.mkdtemp(prefix="tidal-gpu-design-")
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", BUILD=BUILD)


def sh(*args, ok=True):
    p = subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"command failed: {' '.join(args)}")
    return p


def write_grid(g, name):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(g, f)
    return path


# 1. the grid
a = GRID["args"]
lst = sh(SWEEP, os.path.join(ROOT, "reports", "rl", "gpu", "grid.json"), "--list").stdout.split()
names = lst[0::3]
check(sorted(names) == sorted(f"s{s}-{p}" for s in (1, 2, 3) for p in ("bf16", "fp16", "em")),
      f"9 runs: bf16, fp16, exact-match x 3 seeds ({names})")
check(a["device"] == "cuda" and a["learning-rate"] == 1e-6 and a["beta"] == 0 and
      a["loss-type"] == "dr_grpo" and a["scale-rewards"] == "none" and a["temperature"] == 1 and
      a["num-generations"] * 0 + a["per-device-batch-size"] * a["gradient-accumulation-steps"] == 64,
      "the sanity test's settings: lr 1e-6, beta 0, Dr.GRPO, T 1, 64 completions per step, on cuda")

# 2. job arrays with a GPU per task
g = json.loads(json.dumps(GRID))
g["output_dir"] = os.path.join(tmp, "emit")
cpath = write_grid(g, "emit.json")
sh(SWEEP, cpath, "--emit", "slurm")
sb = open(os.path.join(tmp, "emit", "sweep.sbatch")).read()
check("#SBATCH --gres=gpu:1" in sb and "#SBATCH --array=0-8" in sb, "--emit slurm: 9 tasks, a GPU each")
sh(SWEEP, cpath, "--emit", "condor")
sub = open(os.path.join(tmp, "emit", "sweep.sub")).read()
exe = [l.split("=", 1)[1].strip() for l in sub.splitlines() if l.startswith("executable")][0]
check("request_gpus = 1" in sub and "queue 9" in sub and os.path.exists(exe),
      f"--emit condor: 9 tasks, a GPU each, executable {exe} exists")

# 3. the same arguments on the CPU with the tiny model
data = os.path.join(tmp, "data")
sh(sys.executable, "reports/rl/gpu/prepare_data.py", "--countdown", "48", "--test-size", "8", "-o", data)
g = json.loads(json.dumps(GRID))
g["tool"] = os.path.join(BIN, "tidal-rl")
g["output_dir"] = os.path.join(tmp, "runs")
g["report_dir"] = os.path.join(tmp, "report")
g["grid"] = [ax for ax in g["grid"] if not ax.get("seed")]
del g["args"]["device"]
g["args"].update({"model-path": "datasets/models/add", "dataset-path": os.path.join(data, "train.jsonl"),
                  "per-device-batch-size": 4, "gradient-accumulation-steps": 1, "num-generations": 2,
                  "max-seq-length": 320, "max-completion-length": 8, "max-steps": 2, "save-steps": 1,
                  "eval-steps": 1, "eval-max-samples": 4})
cpath = write_grid(g, "cpu.json")
p = sh(SWEEP, cpath, "--workers", "2", ok=False)
check(p.returncode == 0, f"the design's arguments run on the CPU, 3 arms x 2 steps ({p.stderr.strip()[-300:]})")
for arm in ("bf16", "fp16", "em"):
    path = os.path.join(tmp, "runs", arm, "rl.h5")
    if not os.path.exists(path):
        check(False, f"{arm}: rl.h5 written")
        continue
    with h5py.File(path, "r") as f:
        s = f["steps"]
        cols = s.dtype.names if hasattr(s, "dtype") and s.dtype.names else list(s.keys())
        ok = "reward_correct" in cols and "eval_accuracy" in cols
        check(ok and len(s["step"][:] if "step" in cols else s[cols[0]][:]) == 2,
              f"{arm}: 2 steps with reward_correct and eval_accuracy in /steps")
        if arm == "em" and "logp_diff_mean" in cols:
            check(np.all(np.asarray(s["logp_diff_mean"][:]) == 0), "exact-match arm: mismatch exactly 0")

# 4. the clean evaluation of own records (--eval-steps with --reward-command): eval_reward is the
# command's mean reward, eval_accuracy the share with reward >= 1
for cmd, want in (("while read l; do echo 0.5; done", (0.5, 0.0)), ("while read l; do echo 1; done", (1.0, 1.0))):
    out = os.path.join(tmp, "own-eval")
    p = sh(os.path.join(BIN, "tidal-rl"), "--model-path", "datasets/models/add", "--dataset-path",
           os.path.join(data, "train.jsonl"), "--reward-command", cmd, "--num-generations", "2",
           "--per-device-batch-size", "4", "--max-seq-length", "320", "--max-completion-length", "4",
           "--max-steps", "1", "--eval-steps", "1", "--eval-max-samples", "3", "--quiet",
           "--overwrite-output-dir", "-o", out, ok=False)
    got = None
    if p.returncode == 0:
        with h5py.File(os.path.join(out, "rl.h5"), "r") as f:
            got = (float(f["steps"]["eval_reward"][0]), float(f["steps"]["eval_accuracy"][0]))
    check(got == want, f"own-record evaluation with a reward of {want[0]}: eval_reward, eval_accuracy {want} "
          f"(got {got}; {p.stderr.strip()[-200:]})")

if not failures:
    shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
