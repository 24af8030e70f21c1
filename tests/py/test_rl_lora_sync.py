"""tidal-rl --lora-sync / --model-dtype end to end on the shipped add model (LoRA rank 1, alpha 2,
lr 1e-3 so that each step's update reaches the bf16 ulp of the weights; a few seconds per run):

1. usage: --lora-sync or --model-dtype without --lora-r, an unknown sync or dtype: exit 2, the flag
   named; --model-dtype accepts HF's spellings (bfloat16) and rl_config records the short names.
2. merge-unmerge (TRL GRPOTrainer's PEFT cycle): with the base in bf16 the drift of the frozen
   weights is 0 at step 0 (B = 0), nonzero from step 1 and growing (max, mean, share changed);
   fp16 drifts less than bf16; fp32 stays at the fp32 rounding level (max < 1e-6, nonzero).
3. merged and adapter syncs never move the base (drift exactly 0); merge_* columns are finite for
   merged, nan for adapter; full fine-tuning writes nan drift.
4. adapter vs merged with the same recipe on both paths (bf16-train: the only difference left is
   the sync): the mean |logp_trainer - logp_engine| of the adapter sync is below half the merged
   sync's (measured ~13x below at lr 1e-5 when written).
5. --resume after SIGKILL of a merge-unmerge bf16 run with --eval-steps 2: every /steps column
   (timing aside; the drift, merge and eval columns included) and the /tokens /seqs /prompts rows
   equal the uninterrupted run's bit for bit (the drifted base travels in
   checkpoint-K/lora_base.safetensors); eval_* are written at steps 0, 2, 4 and nan between, and
   step 0's greedy accuracy is the shipped model's test-split solve rate measured by the same
   greedy evaluation with fp32 masters (datasets/models/add/eval.json: within 0.1, the recipe
   and the 30 records differ).
6. tidal-diff --lora-sync on the adapter the merged run of 4 trained (12 prompts, same recipe on
   both paths): the share of tokens whose log-prob differs between the paths is smaller with
   the adapter than merged (a mean over ~300 tokens is ruled by single bf16 logit-ulp flips of
   0.06, so the share is the robust measure here), lora_mode_b recorded as "adapter";
   merge-unmerge refused (exit 2: it needs tidal-rl's training history).
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
from tidal_check import BIN, check, failures  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
tmp = tempfile.mkdtemp(prefix="tidal-rl-lora-")
RL = os.path.join(BIN, "tidal-rl")
COMMON = ["--model-path", "datasets/models/add", "--dataset-path", "datasets/tasks/add/train.jsonl",
          "--num-generations", "4", "--per-device-batch-size", "8", "--max-completion-length", "48",
          "--lora-r", "1", "--lora-alpha", "2", "-q"]


def rl(out, *extra, ok=True, common=COMMON):
    p = subprocess.run([RL, *common, "--output-dir", out, *extra], capture_output=True, text=True, env=ENV)
    if ok and p.returncode:
        print(p.stderr)
        raise SystemExit("tidal-rl failed")
    return p


def steps(out):
    with h5py.File(os.path.join(out, "rl.h5"), "r") as f:
        return {k: f["steps"][k][:] for k in f["steps"]}, json.loads(f.attrs["rl_config"])


# ---- 1. usage
def bad(args, *words, what):
    p = rl(os.path.join(tmp, "bad"), *args, ok=False, common=[a for a in COMMON if a not in ("--lora-r", "1", "--lora-alpha", "2")])
    check(p.returncode == 2 and all(w in p.stderr for w in words), f"{what}: exit {p.returncode}, '{p.stderr.strip()[:100]}'")


bad(["--lora-sync", "adapter"], "--lora-sync", "--lora-r", what="--lora-sync without --lora-r")
bad(["--model-dtype", "bf16"], "--model-dtype", "--lora-r", what="--model-dtype without --lora-r")
bad(["--lora-r", "1", "--lora-sync", "vllm"], "--lora-sync", what="unknown --lora-sync")
bad(["--lora-r", "1", "--model-dtype", "fp8"], "--model-dtype", what="--model-dtype fp8")

# ---- 2. merge-unmerge drift by model dtype
LR = ["--learning-rate", "1e-3", "--dtype", "bf16", "--max-steps", "10"]
d = {}
for dt, spelled in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "fp32")):
    out = os.path.join(tmp, "mu-" + dt)
    rl(out, *LR, "--lora-sync", "merge-unmerge", "--model-dtype", spelled)
    d[dt], cfg = steps(out)
    check(cfg["lora_sync"] == "merge-unmerge" and cfg["model_dtype"] == dt, f"rl_config records lora_sync and model_dtype {dt}")
    mx = d[dt]["base_drift_max"]
    print(f"   merge-unmerge {dt}: base_drift_max by step {[f'{v:.2e}' for v in mx]}; "
          f"share changed at the end {d[dt]['base_drift_frac'][-1]:.3f}")
b = d["bf16"]
check(b["base_drift_max"][0] == 0 and b["base_drift_max"][1] > 0 and b["base_drift_max"][-1] > b["base_drift_max"][1]
      and b["base_drift_mean"][-1] > b["base_drift_mean"][1] and b["base_drift_frac"][-1] > b["base_drift_frac"][1] > 0,
      "bf16 base: drift 0 at step 0, nonzero from step 1, growing (max, mean, share changed)")
check(0 < d["fp16"]["base_drift_max"][-1] < b["base_drift_max"][-1], "fp16 base drifts less than bf16")
check(0 < d["fp32"]["base_drift_max"][-1] < 1e-6, f"fp32 base: drift at the fp32 rounding level "
      f"({d['fp32']['base_drift_max'][-1]:.2e})")
check(np.all(np.isfinite(b["merge_survival"])) and np.all(b["merge_changed_frac"][1:] > 0), "merge-unmerge: merge_* recorded")

# ---- 3. merged / adapter / full fine-tuning
for sync in ("merged", "adapter"):
    rl(os.path.join(tmp, sync), *LR, "--lora-sync", sync, "--model-dtype", "bf16")
    s, cfg = steps(os.path.join(tmp, sync))
    check(np.all(s["base_drift_max"] == 0) and np.all(s["base_drift_frac"] == 0), f"{sync}: the base never moves")
    fin = np.isfinite(s["merge_survival"])
    check(fin.all() if sync == "merged" else not fin.any(), f"{sync}: merge_* {'finite' if sync == 'merged' else 'nan'}")
full = os.path.join(tmp, "full")
rl(full, "--max-steps", "2", "--dtype", "bf16", common=[a for a in COMMON if a not in ("--lora-r", "1", "--lora-alpha", "2")])
s, cfg = steps(full)
check(np.all(np.isnan(s["base_drift_max"])) and "lora_sync" not in cfg, "full fine-tuning: drift nan, no lora_sync key")

# ---- 4. adapter below merged when only the sync differs
SAME = ["--learning-rate", "1e-5", "--train-recipe", "bf16-train", "--rollout-recipe", "bf16-train", "--max-steps", "12",
        "--model-dtype", "bf16"]
mm = {}
for sync in ("merged", "adapter"):
    out = os.path.join(tmp, "same-" + sync)
    rl(out, *SAME, "--lora-sync", sync)
    mm[sync] = float(np.mean(steps(out)[0]["logp_diff_mean"]))
check(mm["adapter"] < 0.5 * mm["merged"], f"same recipe both paths: adapter mismatch {mm['adapter']:.2e} below merged "
      f"{mm['merged']:.2e} (mean |dlogp| over steps)")

# ---- 5. resume after SIGKILL
ARGS = [*LR[:-2], "--max-steps", "6", "--save-steps", "2", "--lora-sync", "merge-unmerge", "--model-dtype", "bf16",
        "--log-completions", "2", "--eval-steps", "2", "--eval-max-samples", "30"]
ref, killed = os.path.join(tmp, "ref"), os.path.join(tmp, "killed")
rl(ref, *ARGS)
for attempt in range(3):
    shutil.rmtree(killed, ignore_errors=True)
    pr = subprocess.Popen([RL, *COMMON, "--output-dir", killed, *ARGS], env=ENV, stderr=subprocess.DEVNULL)
    ck = os.path.join(killed, "checkpoint-2", "trainer_state.bin")
    t0 = time.time()
    while not os.path.exists(ck) and pr.poll() is None and time.time() - t0 < 120:
        time.sleep(0.01)
    time.sleep(0.05)   # let the checkpoint's files and attribute land (the kill may still hit mid-step)
    pr.send_signal(signal.SIGKILL)
    pr.wait()
    with h5py.File(os.path.join(killed, "rl.h5"), "r") as f:
        fin, ckpt = int(f.attrs["finished"]), int(f.attrs["checkpoint_step"])
    if not fin and ckpt >= 2:
        break
check(not fin and ckpt >= 2 and os.path.exists(os.path.join(killed, f"checkpoint-{ckpt}", "lora_base.safetensors")),
      f"killed after checkpoint-{ckpt}, which holds lora_base.safetensors")
rl(killed, *ARGS, "--resume")
sa, sb = steps(ref)[0], steps(killed)[0]
diff = [k for k in sa if not k.startswith("time") and not np.array_equal(sa[k], sb[k], equal_nan=True)]
check(len(sa["reward"]) == 6 and not diff and sa["base_drift_max"][-1] > 0,
      f"resumed merge-unmerge /steps equal the uninterrupted run's, drift columns included (differing: {diff})")
with h5py.File(os.path.join(ref, "rl.h5"), "r") as fa, h5py.File(os.path.join(killed, "rl.h5"), "r") as fb:
    gd = [f"{g}/{k}" for g in ("tokens", "seqs", "prompts") for k in fa[g]
          if not np.array_equal(fa[g][k][:], fb[g][k][:], equal_nan=True)]
check(not gd, f"resumed /tokens /seqs /prompts equal (differing: {gd})")
ev = sa["eval_accuracy"]
ref_acc = json.load(open("datasets/models/add/eval.json"))
ref_acc = ref_acc.get("eval_accuracy", ref_acc.get("accuracy"))
check(np.all(np.isfinite(ev[[0, 2, 4]])) and np.all(np.isnan(ev[[1, 3, 5]])) and abs(ev[0] - ref_acc) < 0.1,
      f"--eval-steps 2: eval_accuracy at steps 0, 2, 4 ({ev[[0, 2, 4]]}), nan between; step 0 near the model's "
      f"solve rate {ref_acc}")
bad(["--eval-dataset-path", "x.jsonl"], "--eval-steps", what="--eval-dataset-path without --eval-steps")

# ---- 6. tidal-diff --lora-sync
prompts = os.path.join(tmp, "prompts.jsonl")
open(prompts, "w").write("".join(open("datasets/models/prompts-add.jsonl").readlines()[:12]))
dm = {}
for sync in ("merged", "adapter"):
    out = os.path.join(tmp, f"diff-{sync}.h5")
    p = subprocess.run([os.path.join(BIN, "tidal-diff"), "--model", "datasets/models/add", "--prompts", prompts, "--lora",
                        os.path.join(tmp, "same-merged", "model"), "--lora-sync", sync, "--recipe-a", "bf16-train",
                        "--recipe-b", "bf16-train", "--max-new-tokens", "24", "-o", out], capture_output=True, text=True, env=ENV)
    check(p.returncode == 0, f"tidal-diff --lora-sync {sync} runs (exit {p.returncode})")
    with h5py.File(out, "r") as f:
        dl = np.abs(f["tokens/logp_b"][:] - f["tokens/logp_a"][:])
        dm[sync] = (float(np.mean(dl > 0)), float(np.mean(dl)))
        mode = f.attrs["lora_mode_b"]
        mode = mode.decode() if isinstance(mode, bytes) else mode
    check(mode == sync, f"tidal-diff records lora_mode_b {mode}")
check(dm["adapter"][0] < dm["merged"][0], f"tidal-diff, same recipe: tokens whose log-prob differs: adapter "
      f"{dm['adapter'][0]:.3f} below merged {dm['merged'][0]:.3f} (mean |dlogp| {dm['adapter'][1]:.2e}, "
      f"{dm['merged'][1]:.2e})")
p = subprocess.run([os.path.join(BIN, "tidal-diff"), "--model", "datasets/models/add", "--prompts", prompts, "--lora",
                    os.path.join(tmp, "same-merged", "model"), "--lora-sync", "merge-unmerge", "-o",
                    os.path.join(tmp, "no.h5")], capture_output=True, text=True, env=ENV)
check(p.returncode == 2 and "tidal-rl" in p.stderr, "tidal-diff --lora-sync merge-unmerge refused (exit 2, points to tidal-rl)")

shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
