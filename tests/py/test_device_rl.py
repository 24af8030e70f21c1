"""tidal-rl --device cuda against tidal-rl on the CPU (issue 27): rollouts (the KV-cache session
and sampling loop), pi_old (the teacher-forced forward) and the update (the trainer's forward
and backward, its gradients in device buffers) on the device. Device tools and how they are
chosen: tests/py/device_train.py (the simulator's by default; DEVICE_BIN=build/bin on a GPU).

Model: a tiny tidal-init Qwen2 (C 64, 2 layers, V 100) taught the add task's format by
tests/helpers/rl_base_sft on the CPU (so completions end and rewards vary, as
tests/py/test_rl_tool.py does); datasets/tasks/add, 2 prompts x 2 completions per step in 2
micro-batches, completions up to 40 tokens, lr 1e-3, 2 steps, seed 3 (step 1 has a non-zero
gradient in every build; step 2's rewards depend on the build: the sanitizer build's omp simd sums
are not vectorised, so its base model differs in the last bits after 150 SFT steps and its step 2
may draw only wrong answers, a zero advantage). Checked, per /steps column of rl.h5 (reports/SCHEMA.md):
1. fp32 train and rollout recipes: the same completions (response_length_mean, reward,
   accuracy equal), loss, grad_norm, entropy, training_ppl and rollout_ppl within 1e-4 relative
   of the CPU's (the project's fp32 standard; why: tests/py/test_device_sft.py 1). Not compared:
   the train/rollout mismatch columns (logp_diff_*, rollout_is_*, chi2_*, k3_kl ...), which
   under fp32 are each device's own decode against its own teacher forcing at fp32 noise
   (~1e-7; the simulator's decode equals its teacher forcing bit for bit, the CPU's does not).
   Measured on the simulator: grad_norm 4.8e-6, entropy 4.2e-7, the perplexities 7.4e-7, loss
   equal (the loss of on-policy data is the advantages' sum: ratio 1 on both devices).
2. bf16-train / bf16-infer: when the sampled completions are the same (a bf16 ulp flip between
   the devices could change a sampled token; then only finiteness is checked, and the script
   says so), loss and grad_norm within 1e-3 relative (1e-2 on a GPU: test_device_sft.py 2),
   and the mismatch itself (logp_diff_mean, probs_diff_mean) within 2x of the CPU's: the
   quantity tidal studies must not depend on the device. Measured: the same completions;
   grad_norm 2.2e-8; the mismatch 6e-6 relative at step 1, 7 % at step 2 (the weights after one
   bf16 step differ by the GEMMs' orders, and the mismatch is itself a difference of two bf16
   paths).
3. LoRA r 4, fp32, --lora-sync merge-unmerge (the engine's own copy of the base, on the device):
   the same completions, loss and grad_norm within 1e-4 relative. Measured: grad_norm 1.3e-7.
5. The recipes' weights prepared on the device from the trainer's device masters (the default:
   the trainer's and the rollout session's and pi_old's) against the host preparation from
   downloaded masters (TIDAL_PREPARE_ON_HOST=1): every /steps column but the wall-clock ones
   (time_*) bit for bit equal, for bf16-train / bf16-infer full fine-tuning and LoRA r 4 bf16 with
   --lora-sync adapter (vLLM's B scaled in the lora dtype, on the device); full fine-tuning's
   optimiser step brings down exactly the masters' 4 bytes a parameter fewer (under 1 byte a
   parameter: measured 2,792 against 351,208 bytes, 87,104 parameters), and the weight sync before
   each rollout nothing (TIDAL_STEP_D2H=1 lines). bf16-train / fp8-rollout and fp8-unified-train /
   fp8-unified-infer too, whose FP8 matrices are quantised on the device (be->prepare_fp8; the
   trainer's fp32 view of fp8-unified-train fake-quantised there): bit-identical, the sync bringing
   nothing down (before be->prepare_fp8 the fp8-rollout sync brought down 294,912 bytes, the 73,728
   GEMM weights' masters), fp8-unified-train's optimiser step exactly the masters' bytes fewer than
   the host path (2,792 against 351,208). LoRA syncs that change the
   engine's weights, on the device since the adapter and the base are there: --lora-sync merged
   (bf16 r 4, fp16 r 1: the fold W + scale B A and its merge statistics, be->lora_fold) and
   --lora-sync merge-unmerge with the base in bf16 (r 4) and fp16 (r 1) (PEFT's merge and unmerge,
   the merge statistics and the base drift, be->lora_peft_sync / lora_drift): every /steps column
   bit for bit, each weight sync bringing down only the statistics (4 doubles per adapted matrix
   merged, 7 merge-unmerge: 128 and 224 bytes for the 4 matrices, whatever the model's size); and
   the bf16 merge-unmerge run's drifted base (device memory) through a checkpoint: 2 steps (the
   base drifted at step 2's sync), then --resume to 3, equals 3 straight steps bit for bit.
4. rl.h5's device attribute: "cpu" and "cuda:0 (...)"; --device tpu is a usage error (exit 2);
   --resume of the device's run on the CPU is refused (exit 1), naming both devices.
Exit 0 pass, 1 fail, 77 skip (device tools not built, or numpy missing; without h5py the run
files are read through tidal-export: tests/py/runfile_read.py).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_train import (DEVBIN, ENV, LOW_TOL, close, cpu, device, device_attrs, np, pair, prep_d2h,  # noqa: E402
                          prep_identical, prep_pair, runfile_read, sh, tmp)
from tidal_check import BUILD, check, failures, run  # noqa: E402

init = os.path.join(tmp, "init")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4",
    "--num-kv-heads", "2", "--intermediate-size", "128", "--vocab-size", "100", "--seed", "3", "-o", init)
run("tidal-tokenize", "--write-char-vocab", init)
cfg = json.load(open(os.path.join(init, "config.json")))
cfg.update(bos_token_id=1, eos_token_id=2)
json.dump(cfg, open(os.path.join(init, "config.json"), "w"))
base = os.path.join(tmp, "base")
os.makedirs(base)
sh(os.path.join(BUILD, "tests", "helpers", "rl_base_sft"), "--model", init, "--dataset-path",
   "datasets/tasks/add/train.jsonl", "--output-dir", base, "--max-steps", "150", "--batch", "16", "--lr", "1e-2",
   env=dict(ENV, ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")))
RL = ["--model-path", base, "--dataset-path", "datasets/tasks/add/train.jsonl", "--num-generations", "2",
      "--per-device-batch-size", "2", "--gradient-accumulation-steps", "2", "--max-completion-length", "40",
      "--learning-rate", "1e-3", "--max-steps", "2", "--seed", "3", "-q"]
SAME = ["response_length_mean", "reward", "accuracy"]


def rl_pair(name, *extra):
    return pair("tidal-rl", "rl.h5", name, RL, *extra)


def same_completions(c, g):
    return all(np.array_equal(c[k], g[k]) for k in SAME)


# 4. refusal
p = cpu("tidal-rl", *RL, "-o", os.path.join(tmp, "bad"), "--device", "tpu", ok=False)
check(p.returncode == 2 and "tidal-rl: --device: expected cpu, cuda or cuda:N, got 'tpu'" in p.stderr,
      "tidal-rl --device tpu: usage error (exit 2) naming the option and the accepted names")

# 1. fp32; 4. the device attribute
(c, ca), (g, ga) = rl_pair("fp32", "--train-recipe", "fp32", "--rollout-recipe", "fp32")
device_attrs(ca, ga, "rl.h5")
print(f"  fp32 rewards: CPU {list(c['reward'])}, device {list(g['reward'])}; grad_norm CPU {list(c['grad_norm'])}")
check(same_completions(c, g) and bool(np.any(c["grad_norm"] > 0)),
      "fp32: the same completions (lengths, rewards, accuracy), a non-zero gradient (not a comparison of zeros)")
close(c, g, ["loss", "grad_norm", "entropy", "training_ppl", "rollout_ppl"], 1e-4, "fp32, 2 steps")

# 2. bf16-train / bf16-infer
(c, _), (g, _) = rl_pair("bf16", "--train-recipe", "bf16-train", "--rollout-recipe", "bf16-infer")
if same_completions(c, g):
    close(c, g, ["loss", "grad_norm"], LOW_TOL, "bf16-train / bf16-infer, 2 steps")
    for k in ["logp_diff_mean", "probs_diff_mean"]:
        r = g[k] / np.maximum(c[k], 1e-30)
        print(f"  {k}: CPU {list(c[k])}, device {list(g[k])}")
        check(bool(np.all((r >= 0.5) & (r <= 2.0))), f"bf16: {k} (the mismatch) within 2x of the CPU's")
else:
    print("  bf16: the sampled completions differ between the devices (a bf16 ulp flip): compared no further")
    check(all(math.isfinite(x) for x in list(g["loss"]) + list(g["grad_norm"])),
          "bf16 on the device: finite loss and gradient norm")

# 3. LoRA with the engine's own base copy
(c, _), (g, _) = rl_pair("lora", "--train-recipe", "fp32", "--rollout-recipe", "fp32", "--lora-r", "4",
                         "--lora-alpha", "8", "--lora-sync", "merge-unmerge")
check(same_completions(c, g), "LoRA merge-unmerge fp32: the same completions")
p = cpu("tidal-rl", *RL, "-o", os.path.join(tmp, "lora-dev"), "--train-recipe", "fp32", "--rollout-recipe", "fp32",
        "--lora-r", "4", "--lora-alpha", "8", "--lora-sync", "merge-unmerge", "--max-steps", "3", "--resume", ok=False)
check(p.returncode == 1 and "--resume on another device (the file was made on cuda:0 (" in p.stderr,
      "the device's run resumed on the CPU: refused (exit 1), both devices named")
close(c, g, ["loss", "grad_norm"], 1e-4, "LoRA merge-unmerge fp32, 2 steps")

# 5. the weights prepared on the device against the host preparation
(d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", "prep-bf16", RL, "--train-recipe", "bf16-train",
                             "--rollout-recipe", "bf16-infer")
prep_identical(d, h, "bf16-train / bf16-infer, 2 steps")
prep_d2h(dd, hd, "bf16-train / bf16-infer")
print(f"  weight sync before each rollout: {dd['sync']} bytes device -> host")
check(len(dd["sync"]) == 2 and not any(dd["sync"]), "the rollout weights' sync brings nothing down")
(d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", "prep-lora", RL, "--train-recipe", "bf16-train",
                             "--rollout-recipe", "bf16-infer", "--lora-r", "4", "--lora-alpha", "8",
                             "--lora-sync", "adapter")
prep_identical(d, h, "LoRA r 4 bf16, --lora-sync adapter, 2 steps")
# a merged adapter (--lora-sync merged): the fold W + scale B A and its merge statistics on the device
for name, rec, r in [("prep-merged-bf16", "bf16", "4"), ("prep-merged-fp16", "fp16", "1")]:
    (d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", name, RL, "--train-recipe", f"{rec}-train",
                                 "--rollout-recipe", f"{rec}-infer", "--lora-r", r, "--lora-alpha", str(2 * int(r)),
                                 "--lora-sync", "merged")
    prep_identical(d, h, f"LoRA r {r} {rec}, --lora-sync merged, 2 steps")
    print(f"  merged {rec} r {r}: merge_survival {list(d['merge_survival'])}, weight sync {dd['sync']} bytes "
          f"device -> host (host preparation {hd['sync']}; {dd['nparams']} adapter parameters)")
    check(bool(np.all((d["merge_survival"] > 0) & np.isfinite(d["merge_survival"]))),
          f"merged {rec}: a finite, non-zero merge survival (not a comparison of empty merges)")
    # 2 layers x q, v (the default modules): 4 adapted matrices, 4 doubles each
    check(len(dd["sync"]) == 2 and all(s == 4 * 4 * 8 for s in dd["sync"]),
          f"merged {rec}: each weight sync brings down the fold's 4 sums per adapted matrix (128 bytes), "
          f"nothing parameter-sized")
# --lora-sync merge-unmerge (PEFT's merge and unmerge in the base's dtype, the drift): on the device
for name, dt, r in [("prep-mu-bf16", "bf16", "4"), ("prep-mu-fp16", "fp16", "1")]:
    (d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", name, RL, "--train-recipe", f"{dt}-train",
                                 "--rollout-recipe", f"{dt}-infer", "--lora-r", r, "--lora-alpha", str(2 * int(r)),
                                 "--lora-sync", "merge-unmerge", "--model-dtype", dt)
    prep_identical(d, h, f"LoRA r {r} {dt} base, --lora-sync merge-unmerge, 2 steps")
    print(f"  merge-unmerge {dt} r {r}: merge_survival {list(d['merge_survival'])}, base_drift_max "
          f"{list(d['base_drift_max'])}, base_drift_frac {list(d['base_drift_frac'])}; weight sync {dd['sync']} bytes "
          f"device -> host (host preparation {hd['sync']})")
    check(bool(np.all(np.isfinite(d["merge_survival"]))) and d["base_drift_frac"][-1] > 0,
          f"merge-unmerge {dt}: finite merge statistics and a drifted base (not a comparison of empty syncs)")
    # 4 adapted matrices: the merge's 4 sums and the drift's 3 statistics, 8 bytes each
    check(len(dd["sync"]) == 2 and all(s == 4 * 7 * 8 for s in dd["sync"]),
          f"merge-unmerge {dt}: each weight sync brings down 7 doubles per adapted matrix (224 bytes), nothing "
          f"parameter-sized")
    if dt == "bf16":   # the drifted base (device memory) through a checkpoint and --resume
        part = os.path.join(tmp, "mu-part")
        MU = ["--train-recipe", "bf16-train", "--rollout-recipe", "bf16-infer", "--lora-r", r, "--lora-alpha",
              str(2 * int(r)), "--lora-sync", "merge-unmerge", "--model-dtype", dt]
        straight = os.path.join(tmp, "mu-straight")
        device("tidal-rl", *RL, "-o", straight, *MU, "--max-steps", "3")
        device("tidal-rl", *RL, "-o", part, *MU, "--max-steps", "2")
        device("tidal-rl", *RL, "-o", part, *MU, "--max-steps", "3", "--resume")
        ss = runfile_read.steps(os.path.join(straight, "rl.h5"))
        rs = runfile_read.steps(os.path.join(part, "rl.h5"))
        cols = sorted(k for k in ss if k != "seconds" and not k.startswith("time_"))
        diff = [k for k in cols if k not in rs or not np.array_equal(np.asarray(rs[k]), np.asarray(ss[k]), equal_nan=True)]
        print(f"  merge-unmerge bf16, 2 steps + --resume to 3 against 3 straight steps: differing {diff or 'none'}; "
              f"base_drift_frac {list(ss['base_drift_frac'])}")
        check(len(rs["loss"]) == 3 and not diff and ss["base_drift_frac"][1] > 0,
              "merge-unmerge on the device: 2 steps, a checkpoint (the drifted base downloaded), --resume to 3 "
              "(uploaded) equals 3 straight steps bit for bit, drift columns included")
(d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", "prep-fp8", RL, "--train-recipe", "bf16-train",
                             "--rollout-recipe", "fp8-rollout")
prep_identical(d, h, "bf16-train / fp8-rollout, 2 steps")
prep_d2h(dd, hd, "bf16-train / fp8-rollout")
print(f"  fp8-rollout weight sync: {dd['sync']} bytes device -> host (host preparation {hd['sync']})")
check(len(dd["sync"]) == 2 and not any(dd["sync"]),
      "fp8-rollout: the FP8 matrices quantised on the device, the sync brings nothing down (before be->prepare_fp8: "
      "294,912 bytes, their masters)")
# the unified FP8 flow: the trainer's fp32 view of its FP8 matrices (fake-quantised) on the device too
(d, dd), (h, hd) = prep_pair("tidal-rl", "rl.h5", "prep-fp8u", RL, "--train-recipe", "fp8-unified-train",
                             "--rollout-recipe", "fp8-unified-infer")
prep_identical(d, h, "fp8-unified-train / fp8-unified-infer, 2 steps")
prep_d2h(dd, hd, "fp8-unified-train / fp8-unified-infer")
print(f"  fp8-unified weight sync: {dd['sync']} bytes device -> host (host preparation {hd['sync']})")
check(len(dd["sync"]) == 2 and not any(dd["sync"]), "fp8-unified: the sync brings nothing down")

print(f"device tools: {DEVBIN}")
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
