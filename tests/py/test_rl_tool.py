"""tidal-rl and tidal-sweep end to end on a tiny model (a few seconds of CPU each):

1. bad input: an unknown flag, an unknown correction name, a batch not divisible by
   --num-generations, contradictory flags (exit 2, the flag named); a dataset line without the
   field the reward needs (exit 1, file:line); an existing run without --resume (exit 1, the
   file untouched); --resume with another configuration (exit 1, both named).
2. resume after SIGKILL: a run killed after its first checkpoint and continued with --resume
   gives every /steps column (timing aside) and every /tokens /seqs /prompts row bit for bit
   equal to an uninterrupted run's.
3. controls: --exact-match has kl, k3_kl, chi2 and max |dlogp| exactly 0 and ESS 1 on every step;
   --learning-rate 0 leaves the weights exactly as they were (model/ equals the start) while the
   bf16 paths still disagree (mismatch > 0).
4. the run file: /steps holds every documented metric (verl/TRL names), fp16 steps carry the
   loss scale (65536), the collapse configuration and the run configuration are attributes,
   tidal-report reads the /tokens sample; LoRA runs train an adapter (model/adapter_config.json).
5. tidal-sweep: a 2 x 2 grid with 2 workers finishes every run; run again it skips them all; a
   run killed mid-way is continued with --resume; the report (PNGs, table.md) is written;
   --emit slurm / condor write job arrays of the grid's size with a report step after them.
The model is a tidal-init tiny Qwen2 (C=64, L=2) with tidal's character vocabulary, given 150
SFT steps (lr 1e-2) on addition by tests/helpers/rl_base_sft so that rewards vary within groups.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy missing: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, BUILD, check, failures  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
tmp = tempfile.mkdtemp(prefix="tidal-rl-tool-")
RL = os.path.join(BIN, "tidal-rl")
SWEEP = os.path.join(BIN, "tidal-sweep")
DATA = "datasets/tasks/add/train.jsonl"


# tests/helpers/rl_base_sft is a one-shot test driver whose buffers end with the process: under
# check-asan its leak report is off (tidal-rl itself stays leak-checked).
HELPER_ENV = dict(ENV, ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))


def sh(*args, ok=True):
    helper = os.sep + "helpers" + os.sep in str(args[0])
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=HELPER_ENV if helper else ENV)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit("failed: " + " ".join(map(str, args)))
    return p


# ---- the tiny base model
init = os.path.join(tmp, "init")
sh(os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4",
   "--num-kv-heads", "2", "--intermediate-size", "128", "--vocab-size", "100", "--seed", "3", "-o", init)
sh(os.path.join(BIN, "tidal-tokenize"), "--write-char-vocab", init)
c = json.load(open(os.path.join(init, "config.json")))
c.update(bos_token_id=1, eos_token_id=2)
json.dump(c, open(os.path.join(init, "config.json"), "w"))
base = os.path.join(tmp, "base")
os.makedirs(base)
sh(os.path.join(BUILD, "tests", "helpers", "rl_base_sft"), "--model", init, "--dataset-path", DATA, "--output-dir", base,
   "--max-steps", "150", "--batch", "16", "--lr", "1e-2")

COMMON = ["--model-path", base, "--dataset-path", DATA, "--num-generations", "4", "--per-device-batch-size", "4",
          "--gradient-accumulation-steps", "2", "--max-completion-length", "40", "--learning-rate", "1e-3", "-q"]


def rl(out, *extra, ok=True):
    return sh(RL, *COMMON, "--output-dir", out, *extra, ok=ok)


def steps(out):
    f = h5py.File(os.path.join(out, "rl.h5"), "r")
    return f, {k: f["steps"][k][:] for k in f["steps"]}


# ---- 1. bad input
def bad(args, code, *words, what):
    p = sh(RL, *args, ok=False)
    msg = p.stderr
    check(p.returncode == code and all(w in msg for w in words), f"{what}: exit {p.returncode}, '{msg.strip()[:120]}'")


out0 = os.path.join(tmp, "bad")
bad(COMMON + ["--output-dir", out0, "--num-generation", "4"], 2, "--num-generation", what="unknown flag")
bad(COMMON + ["--output-dir", out0, "--is-correction", "tis"], 2, "tis", "token-tis", what="unknown correction name")
bad(COMMON + ["--output-dir", out0, "--num-generations", "3"], 2, "not divisible", "--num-generations",
    what="batch not divisible by G")
bad(COMMON + ["--output-dir", out0, "--dtype", "bf16", "--train-recipe", "fp16-train"], 2, "--dtype",
    what="--dtype with --train-recipe")
bad(COMMON + ["--output-dir", out0, "--exact-match", "--rollout-logit-noise", "0.1"], 2, "contradict",
    what="--exact-match with --rollout-logit-noise")
bad(COMMON + ["--output-dir", out0, "--is-cap", "2"], 2, "--is-correction none", what="--is-cap without a correction")
bad(COMMON + ["--output-dir", out0, "--dual-clip", "0.5"], 2, "--dual-clip", what="dual clip <= 1")
lines = open(DATA).read().splitlines()
rec = json.loads(lines[2])
del rec["answer"]
badset = os.path.join(tmp, "bad.jsonl")
open(badset, "w").write("\n".join(lines[:2] + [json.dumps(rec)] + lines[3:6]) + "\n")
p = sh(RL, *[a if a != DATA else badset for a in COMMON], "--output-dir", out0, ok=False)
check(p.returncode == 1 and f"{badset}:3" in p.stderr and "answer" in p.stderr,
      f"dataset line without 'answer': exit 1 naming file:line ({p.stderr.strip()[:120]})")

# ---- 2. resume after SIGKILL equals an uninterrupted run
full, killed = os.path.join(tmp, "full"), os.path.join(tmp, "killed")
ARGS = ["--max-steps", "6", "--save-steps", "2", "--dtype", "fp16", "--is-correction", "token-tis", "--log-completions", "3"]
rl(full, *ARGS)
for attempt in range(3):   # a loaded machine may let the run finish before the kill: try again
    shutil.rmtree(killed, ignore_errors=True)
    pr = subprocess.Popen([RL, *COMMON, "--output-dir", killed, *ARGS], env=ENV, stderr=subprocess.DEVNULL)
    ck = os.path.join(killed, "checkpoint-2", "trainer_state.bin")
    t0 = time.time()

    def named():   # the run file names the checkpoint (committed after the folder is renamed whole)
        try:
            with h5py.File(os.path.join(killed, "rl.h5"), "r") as f:
                return int(f.attrs["checkpoint_step"]) >= 2
        except Exception:   # read between a commit's writes: try again
            return False
    while not (os.path.exists(ck) and named()) and pr.poll() is None and time.time() - t0 < 120:
        time.sleep(0.01)
    pr.send_signal(signal.SIGKILL)
    pr.wait()
    f = h5py.File(os.path.join(killed, "rl.h5"), "r")
    n_at_kill, fin, ckpt = len(f["steps/reward"]), int(f.attrs["finished"]), int(f.attrs["checkpoint_step"])
    f.close()
    if not fin:
        break
check(not fin and ckpt >= 2 and ckpt <= n_at_kill < 6,
      f"killed after checkpoint-{ckpt} with {n_at_kill} of 6 steps written")
p = rl(killed, *ARGS, ok=False)
check(p.returncode == 1 and "--resume" in p.stderr, "an existing run is not replaced without --resume")
rl(killed, *ARGS, "--resume")
fa, sa = steps(full)
fb, sb = steps(killed)
diff = [k for k in sa if not k.startswith("time") and not np.array_equal(sa[k], sb[k], equal_nan=True)]
check(len(sa["reward"]) == 6 and not diff, f"resumed /steps equal the uninterrupted run's (differing: {diff})")
gd = [f"{g}/{k}" for g in ("tokens", "seqs", "prompts") for k in fa[g] if not np.array_equal(fa[g][k][:], fb[g][k][:], equal_nan=True)]
check(not gd and len(fa["seqs/batch"]) == 18, f"resumed /tokens /seqs /prompts equal (differing: {gd})")
check(np.all(sa["loss_scale"] == 65536.0) and fa.attrs["recipe_a_name"] == "fp16-train",
      "fp16 steps carry GradScaler's loss scale 65536")
cfg = json.loads(fa.attrs["rl_config"])
ccfg = json.loads(fa.attrs["collapse_config"])
check(cfg["is_correction"] == "token-tis" and cfg["is_cap"] == 2.0 and ccfg["hold"] == 10 and ccfg["drop_abs"] == 0.3,
      "the run and collapse configurations are recorded (token-tis cap 2; hold 10, drop_abs 0.3)")
names = ["reward", "reward_std", "accuracy", "frac_reward_zero_std", "entropy", "grad_norm", "loss_scale", "skipped",
         "pg_clipfrac", "ppo_kl", "response_length_mean", "response_length_clip_ratio", "rollout_corr_kl", "kl", "k3_kl", "chi2_token",
         "chi2_seq", "logp_diff_mean", "logp_diff_max", "probs_diff_mean", "probs_diff_max", "probs_pearson",
         "ppl_ratio", "rollout_is_mean", "rollout_is_min", "rollout_is_max", "rollout_is_eff_sample_size",
         "rollout_is_clipped_fraction", "rollout_rs_masked_fraction", "nonfinite", "time_rollout", "time_update",
         "collapse_fired"]
check(all(n in sa for n in names), f"/steps has the documented metrics (missing: {[n for n in names if n not in sa]})")
check(np.all(sa["ppo_kl"] == 0) and np.all(sa["pg_clipfrac"] == 0),
      "one optimiser step per generation batch: pi_theta == pi_old bit for bit (ppo_kl 0, no clipping)")
check(np.any(sa["reward_std"] > 0), "rewards vary within the batch (the tiny base model learnt something)")
p = sh(os.path.join(BIN, "tidal-export"), os.path.join(full, "rl.h5"), "--group", "steps", ok=False)
hdr = p.stdout.split("\n", 1)[0].split(",") if p.returncode == 0 else []
check(hdr == sorted(sa) and len(hdr) > 64,
      f"tidal-export --group steps gives every one of /steps' {len(sa)} columns (it gave {len(hdr)}: a fixed cap of 64 once dropped time_update)")
fa.close()
fb.close()
p = sh(os.path.join(BIN, "tidal-report"), os.path.join(full, "rl.h5"), ok=False)
check(p.returncode == 0 and "fp16-train" in p.stdout, "tidal-report reads the run's /tokens sample")

# ---- 3. controls
em = os.path.join(tmp, "exact")
rl(em, "--max-steps", "3", "--train-recipe", "bf16-train", "--exact-match")
f, s = steps(em)
check(all(np.all(s[k] == 0) for k in ("rollout_corr_kl", "k3_kl", "logp_diff_max", "probs_diff_max")) and np.all(s["chi2_token"] == 0)
      and np.all(s["rollout_is_eff_sample_size"] == 1), "exact-match control: mismatch exactly 0 on every step")
f.close()
z = os.path.join(tmp, "lr0")
rl(z, "--max-steps", "2", "--dtype", "bf16", "--learning-rate", "0")
from safetensors.numpy import load_file  # noqa: E402
wa, wb = load_file(os.path.join(base, "model.safetensors")), load_file(os.path.join(z, "model", "model.safetensors"))
f, s = steps(z)
check(all(np.array_equal(wa[k], wb[k]) for k in wa) and np.all(s["logp_diff_mean"] > 0),
      "lr = 0 control: weights unchanged, bf16 mismatch measured (> 0)")
f.close()
lo = os.path.join(tmp, "lora")
rl(lo, "--max-steps", "2", "--lora-r", "2", "--lora-alpha", "4", "--dtype", "bf16")
acfg = json.load(open(os.path.join(lo, "model", "adapter_config.json")))
check(acfg["r"] == 2 and acfg["lora_alpha"] == 4, "LoRA: the trained adapter is saved (PEFT adapter_config.json)")

# ---- 5. tidal-sweep
sw = os.path.join(tmp, "sweep")
conf = {"tool": RL, "output_dir": sw, "report_dir": os.path.join(sw, "report"),
        "args": {"model-path": base, "dataset-path": DATA, "num-generations": 4, "per-device-batch-size": 4,
                 "gradient-accumulation-steps": 2, "max-completion-length": 40, "learning-rate": 1e-3,
                 "max-steps": 4, "save-steps": 1, "quiet": True, "eval-steps": 2, "eval-max-samples": 4},
        "grid": [{"axis": "recipe", "values": {"bf16": {"dtype": "bf16"}, "fp8roll": {"rollout-recipe": "fp8-rollout"}}},
                 {"axis": "seed", "seed": True, "values": {"s1": {"seed": 1}, "s2": {"seed": 2}}}],
        "runs": [{"name": "exact", "args": {"exact-match": True}}]}
cpath = os.path.join(tmp, "sweep.json")
json.dump(conf, open(cpath, "w"))
p = sh(SWEEP, cpath, "--list")
check(p.stdout.split()[0::3] == ["bf16-s1", "bf16-s2", "fp8roll-s1", "fp8roll-s2", "exact-s1", "exact-s2"],
      "the grid expands recipes x seeds, the control crosses the seeds")
# an unfinished run: the first configuration killed after a checkpoint
dry = sh(SWEEP, cpath, "--dry-run").stdout.splitlines()
os.makedirs(os.path.join(sw, "bf16-s1"), exist_ok=True)
pr = subprocess.Popen(dry[0], shell=True, env=ENV, stderr=subprocess.DEVNULL, start_new_session=True)
ck = os.path.join(sw, "bf16-s1", "checkpoint-1", "trainer_state.bin")
t0 = time.time()
while not os.path.exists(ck) and pr.poll() is None and time.time() - t0 < 120:
    time.sleep(0.02)
os.killpg(pr.pid, signal.SIGKILL)
pr.wait()
dry = sh(SWEEP, cpath, "--dry-run").stdout.splitlines()
check(dry[0].endswith("--resume") and "bf16-s1" in dry[0], "a killed run is continued with --resume")
p = sh(SWEEP, cpath, "--workers", "2")
check("6 to run" in p.stderr and os.path.exists(os.path.join(sw, "report", "reward.png")) and
      os.path.exists(os.path.join(sw, "report", "mismatch.png")) and "| bf16 |" in open(os.path.join(sw, "report", "table.md")).read(),
      "tidal-sweep runs the grid with 2 workers and writes the report (PNGs, table.md)")
seedfigs = [f for f in ("eval_seeds-bf16.png", "eval_seeds-fp8roll.png", "eval_seeds-exact.png", "survival.png")
            if os.path.exists(os.path.join(sw, "report", f))]
check(len(seedfigs) == 4, f"with clean evaluations the report draws every seed per configuration and the survival "
      f"curve ({seedfigs})")
check(not os.path.exists(os.path.join(sw, "report", "routing_flips.png")),
      "a dense grid's report has no routing-flip figure (drawn only where a run has MoE routing flips)")
p = sh(SWEEP, cpath, "--workers", "2")
check("6 finished (skipped), 0 to run" in p.stderr, "run again: every finished run is skipped")
for kind, files in (("slurm", ["jobs.txt", "sweep.sbatch", "report.sbatch", "submit.sh"]),
                    ("condor", ["jobs.txt", "task.sh", "sweep.sub", "report.sub", "sweep.dag"])):
    sh(SWEEP, cpath, "--emit", kind)
    ok = all(os.path.exists(os.path.join(sw, x)) for x in files)
    jobs = open(os.path.join(sw, "jobs.txt")).read().splitlines()
    if kind == "slurm":
        ok = ok and "#SBATCH --array=0-5" in open(os.path.join(sw, "sweep.sbatch")).read() and \
            "--dependency=afterany" in open(os.path.join(sw, "submit.sh")).read()
    else:
        ok = ok and "queue 6" in open(os.path.join(sw, "sweep.sub")).read() and \
            "PARENT grid CHILD report" in open(os.path.join(sw, "sweep.dag")).read()
    check(ok and len(jobs) == 6 and all("--resume" in j for j in jobs), f"--emit {kind}: a 6-task job array and a report step")
p = sh(SWEEP, cpath, "--emit", "pbs", ok=False)
check(p.returncode == 2 and "slurm|condor" in p.stderr, "--emit pbs is a usage error naming the choices")
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
