"""Resume and stop as HF's Trainer does, in tidal-rl, tidal-sft and tidal-sweep, on the shipped tiny
model datasets/models/add (a few seconds of CPU in all):

1. extension: a run of K steps continued with --resume --max-steps N (or HF's spelling
   --resume-from-checkpoint PATH) gives every /steps column (wall-clock timings aside),
   every /tokens /seqs /prompts row and the final weights bit for bit equal to an uninterrupted
   run of N steps (constant learning rate: the schedule is recomputed from the new total, which
   under constant changes nothing); under linear the steps after K follow the N-step schedule.
2. refusal: --resume with another learning rate and seed exits 1 and names exactly those two
   options, each with both values (nothing else of the ~40 settings), and leaves the run as it was;
   a --max-steps below the steps done is refused.
3. SIGINT mid-run: the tool finishes the step in flight, checkpoints it, exits 130 and prints the
   command that continues; that command finishes the run equal to the uninterrupted one (tidal-rl
   and tidal-sft). tidal-sweep forwards a SIGINT to its running runs, waits for their checkpoints,
   exits 130 with the command that continues the sweep, and that command finishes every run;
   a larger max-steps in the sweep file then extends the finished runs.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"h5py / numpy / safetensors missing ({e}): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, check, continue_command, failures, interrupt  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
tmp = tempfile.mkdtemp(prefix="tidal-resume-")
MODEL = "datasets/models/add"
RL = [os.path.join(BIN, "tidal-rl"), "--model-path", MODEL, "--dataset-path", "datasets/tasks/add/train.jsonl",
      "--num-generations", "4", "--per-device-batch-size", "4", "--max-completion-length", "40",
      "--learning-rate", "1e-3", "--dtype", "bf16", "--log-completions", "2"]
SFT = [os.path.join(BIN, "tidal-sft"), "--model-path", MODEL, "--dataset-path", "datasets/tasks/add",
       "--per-device-batch-size", "4", "--learning-rate", "1e-3", "--lr-scheduler", "constant",
       "--eval-max-samples", "4", "--eval-steps", "5"]


def sh(*args, ok=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=ENV)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit("failed: " + " ".join(map(str, args)))
    return p


def steps(path):
    with h5py.File(path, "r") as f:
        return {k: f["steps"][k][:] for k in f["steps"]}


def same_steps(a, b, timing=("seconds",)):
    """the /steps columns that differ (wall-clock timings are not compared)"""
    sa, sb = steps(a), steps(b)
    keys = [k for k in sa if k not in timing and not k.startswith("time_")]
    return [k for k in keys if k not in sb or not np.array_equal(sa[k], sb[k], equal_nan=True)], len(sa[keys[0]])


def same_groups(a, b):
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        return [f"{g}/{k}" for g in ("tokens", "seqs", "prompts") for k in fa[g]
                if not np.array_equal(fa[g][k][:], fb[g][k][:], equal_nan=True)]


def same_weights(a, b):
    wa, wb = load_file(a), load_file(b)
    return sorted(wa) == sorted(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)


def rl_same(a, b, what):
    bad, n = same_steps(os.path.join(a, "rl.h5"), os.path.join(b, "rl.h5"))
    gd = same_groups(os.path.join(a, "rl.h5"), os.path.join(b, "rl.h5"))
    w = same_weights(os.path.join(a, "model", "model.safetensors"), os.path.join(b, "model", "model.safetensors"))
    check(not bad and not gd and w and n == N, f"{what}: {n} /steps rows, /tokens /seqs /prompts and weights equal "
          f"the uninterrupted run's (differing: {bad + gd}{'' if w else ' weights'})")


def progress_at(step):
    """ready() for interrupt: a progress line of step `step` or later is on stderr"""
    def ready(lines):
        return any(f"step {k}/" in ln for ln in lines for k in range(step, 100))
    return ready


# ---- tidal-rl
N, K = 6, 3
full, part = os.path.join(tmp, "rl-full"), os.path.join(tmp, "rl-part")
sh(*RL, "-q", "--output-dir", full, "--max-steps", N)
sh(*RL, "-q", "--output-dir", part, "--max-steps", K)
check(os.path.isdir(os.path.join(part, f"checkpoint-{K}")), "tidal-rl keeps the last step's checkpoint (no --save-steps)")

# 2. refusals first, on the finished K-step run
p = sh(*RL, "--output-dir", part, "--max-steps", N, "--resume", "--learning-rate", "3e-3", "--seed", "7", ok=False)
named = sorted(ln.strip() for ln in p.stderr.splitlines() if ln.startswith("  --"))
check(p.returncode == 1 and named == ["--learning-rate: run has 0.001, command gives 0.003",
                                      "--seed: run has 42, command gives 7"],
      f"tidal-rl --resume with another lr and seed: exit {p.returncode}, names just those two ({named})")
check(len(steps(os.path.join(part, "rl.h5"))["reward"]) == K, "the refused resume left the run as it was")
p = sh(*RL, "--output-dir", part, "--max-steps", 2, "--resume", ok=False)
check(p.returncode == 1 and "--max-steps 3 or more" in p.stderr, "tidal-rl --resume below the steps done is refused")
p = sh(*RL, "--output-dir", part, "--max-steps", N, "--resume-from-checkpoint", os.path.join(part, "checkpoint-1"), ok=False)
check(p.returncode == 1 and "checkpoint-3" in p.stderr, "--resume-from-checkpoint of a checkpoint not kept names the one kept")

# 1. extension with HF's spelling
p = sh(*RL, "--output-dir", part, "--max-steps", N, "--resume-from-checkpoint", os.path.join(part, f"checkpoint-{K}"))
check(f"resuming {part}/rl.h5 at step {K} of {N}" in p.stderr, "tidal-rl extends the finished run from its last step")
rl_same(full, part, f"tidal-rl {K} steps + --resume --max-steps {N}")
with h5py.File(os.path.join(part, "rl.h5"), "r") as f:
    check(int(f.attrs["max_steps"]) == N and json.loads(f.attrs["rl_config"])["max_steps"] == N and int(f.attrs["finished"]) == 1,
          "the extended run file records the new total and is finished")

# 3. SIGINT, then the printed command
stopped = os.path.join(tmp, "rl-stopped")
for attempt in range(3):   # a loaded machine may let the run end before the signal: try again
    shutil.rmtree(stopped, ignore_errors=True)
    rc, err, sent = interrupt([*RL, "--output-dir", stopped, "--max-steps", N], progress_at(2), env=ENV)
    if sent and rc != 0:
        break
with h5py.File(os.path.join(stopped, "rl.h5"), "r") as f:
    done = len(f["steps/reward"])
    ck = int(f.attrs["checkpoint_step"])
cmd = continue_command(err)
check(rc == 130 and "stopping after the step in flight" in err and 2 <= done < N and ck == done and cmd is not None
      and "--resume" in cmd, f"tidal-rl SIGINT: exit {rc}, step {done} of {N} checkpointed, the command that continues "
      f"printed ({err.strip().splitlines()[-1][:100] if err.strip() else ''})")
if cmd:
    sh(*cmd)
    rl_same(full, stopped, "tidal-rl SIGINT + the printed command")

# a second SIGINT stops at once; --resume still ends as the uninterrupted run
twice = os.path.join(tmp, "rl-twice")
rc, err, sent = interrupt([*RL, "--output-dir", twice, "--max-steps", N], progress_at(2), times=2, env=ENV)
if sent and rc != 0:
    check(rc == -signal.SIGINT, f"tidal-rl: a second SIGINT stops at once (killed by SIGINT, got {rc})")
    sh(*RL, "-q", "--output-dir", twice, "--max-steps", N, "--resume")
    rl_same(full, twice, "tidal-rl after two SIGINTs + --resume")

# ---- tidal-sft: extension, refusal, SIGINT (eval every 5 steps: the K-step run's final
# evaluation falls on a step the N-step run evaluates too, so every /steps row can match)
N, K = 20, 10
sfull, spart, sstop = (os.path.join(tmp, x) for x in ("sft-full", "sft-part", "sft-stopped"))
sh(*SFT, "--output-dir", sfull, "--max-steps", N)
sh(*SFT, "--output-dir", spart, "--max-steps", K)
p = sh(*SFT, "--output-dir", spart, "--max-steps", N, "--resume", "--learning-rate", "2e-3", "--adam-beta2", "0.99", ok=False)
named = sorted(ln.strip() for ln in p.stderr.splitlines() if ln.startswith("  --"))
check(p.returncode == 1 and named == ["--adam-beta2: run has 0.999, command gives 0.99",
                                      "--learning-rate: run has 0.001, command gives 0.002"],
      f"tidal-sft --resume with another lr and beta2: exit {p.returncode}, names just those two ({named})")
p = sh(*SFT, "--output-dir", spart, "--max-steps", N, "--resume")
check(f"resuming from {spart}/checkpoint-{K} (step {K} of {N})" in p.stderr, "tidal-sft extends the finished run")


def sft_same(a, b, what):
    bad, n = same_steps(os.path.join(a, "sft.h5"), os.path.join(b, "sft.h5"))
    w = same_weights(os.path.join(a, "model.safetensors"), os.path.join(b, "model.safetensors"))
    check(not bad and w and n == N, f"{what}: {n} /steps rows and the weights equal the uninterrupted run's "
          f"(differing: {bad}{'' if w else ' weights'})")


sft_same(sfull, spart, f"tidal-sft {K} steps + --resume --max-steps {N}")
p = sh(*SFT, "--output-dir", spart, "--max-steps", N, "--resume-from-checkpoint", os.path.join(spart, f"checkpoint-{K}"))
check(f"resuming from {spart}/checkpoint-{K}" in p.stderr, "tidal-sft --resume-from-checkpoint PATH: from that checkpoint")
sft_same(sfull, spart, f"tidal-sft the finished run again from --resume-from-checkpoint checkpoint-{K}")
# a decaying schedule is recomputed from the new total, as HF's Trainer does: the steps done keep
# the K-step run's learning rates, the rest are the N-step run's
lin = [a if a != "constant" else "linear" for a in SFT]
lfull, lpart = os.path.join(tmp, "lin-full"), os.path.join(tmp, "lin-part")
sh(*lin, "--output-dir", lfull, "--max-steps", N)
sh(*lin, "--output-dir", lpart, "--max-steps", K)
lr_k = steps(os.path.join(lpart, "sft.h5"))["lr"]
sh(*lin, "--output-dir", lpart, "--max-steps", N, "--resume")
lr_n, lr_ext = steps(os.path.join(lfull, "sft.h5"))["lr"], steps(os.path.join(lpart, "sft.h5"))["lr"]
check(np.array_equal(lr_ext[:K], lr_k) and np.array_equal(lr_ext[K:], lr_n[K:]) and lr_k[-1] < lr_n[K - 1],
      f"linear schedule extended: steps 1-{K} keep the {K}-step schedule, steps {K + 1}-{N} follow the {N}-step one")
for attempt in range(3):
    shutil.rmtree(sstop, ignore_errors=True)
    rc, err, sent = interrupt([*SFT, "--output-dir", sstop, "--max-steps", N], progress_at(1), env=ENV)
    if sent and rc != 0:
        break
cmd = continue_command(err)
ckpts = [d for d in os.listdir(sstop) if d.startswith("checkpoint-")] if os.path.isdir(sstop) else []
check(rc == 130 and cmd is not None and "--resume" in cmd and len(ckpts) == 1 and not os.path.exists(os.path.join(sstop, "model.safetensors")),
      f"tidal-sft SIGINT: exit {rc}, {ckpts} written, the command that continues printed")
if cmd:
    sh(*cmd)
    sft_same(sfull, sstop, "tidal-sft SIGINT + the printed command")

# ---- tidal-sweep: a SIGINT to the sweep reaches its runs, which checkpoint; the printed command continues
sw = os.path.join(tmp, "sweep")
conf = {"tool": RL[0], "output_dir": sw,
        "args": {"model-path": MODEL, "dataset-path": "datasets/tasks/add/train.jsonl", "num-generations": 4,
                 "per-device-batch-size": 4, "max-completion-length": 40, "learning-rate": 1e-3, "dtype": "bf16",
                 "max-steps": 8},
        "grid": [{"axis": "seed", "seed": True, "values": {"s1": {"seed": 1}, "s2": {"seed": 2}}}]}
cpath = os.path.join(tmp, "sweep.json")
json.dump(conf, open(cpath, "w"))


def both_stepping(lines):   # each run has written a /steps row (the sweep's own stderr says nothing of it)
    def rows(run):
        try:
            with h5py.File(os.path.join(sw, run, "rl.h5"), "r") as f:
                return len(f["steps/reward"])
        except Exception:   # not there yet, or read between a commit's writes
            return 0
    return rows("s1") >= 1 and rows("s2") >= 1


rc, err, sent = interrupt([os.path.join(BIN, "tidal-sweep"), cpath, "--workers", "2", "--no-report"], both_stepping, env=ENV)
cmd = continue_command(err)
if sent and rc != 0:
    logs = "".join(open(os.path.join(sw, r, "log.txt")).read() for r in ("s1", "s2"))
    check(rc == 130 and "stopped, its checkpoint saved" in err and cmd is not None and logs.count("to continue, run:") >= 1,
          f"tidal-sweep SIGINT: exit {rc}, the runs checkpointed, the command that continues printed")
    p = sh(*cmd)
    fin = []
    for r in ("s1", "s2"):
        with h5py.File(os.path.join(sw, r, "rl.h5"), "r") as f:
            fin.append((int(f.attrs["finished"]), len(f["steps/reward"])))
    check("(resume)" in p.stderr and fin == [(1, 8), (1, 8)], f"the printed sweep command finishes every run ({fin})")
    conf["args"]["max-steps"] = 10   # a larger total: the finished runs are extended, not skipped
    json.dump(conf, open(cpath, "w"))
    p = sh(os.path.join(BIN, "tidal-sweep"), cpath, "--workers", "2", "--no-report")
    rows = []
    for r in ("s1", "s2"):
        with h5py.File(os.path.join(sw, r, "rl.h5"), "r") as f:
            rows.append(len(f["steps/reward"]))
    check("0 finished (skipped), 2 to run" in p.stderr and rows == [10, 10],
          f"tidal-sweep with a larger max-steps extends its finished runs ({rows} rows)")
else:
    check(rc == 0, f"tidal-sweep ended before the signal (exit {rc})")

shutil.rmtree(tmp, ignore_errors=True)
print("test_resume: %s" % ("FAILED: %d problems" % len(failures) if failures else "ok"))
sys.exit(1 if failures else 0)
