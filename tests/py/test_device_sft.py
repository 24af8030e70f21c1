"""tidal-sft --device cuda against tidal-sft on the CPU (issue 27): the training step on the
device (every forward and backward op there, activations, their gradients and the weight
gradients in device buffers; per micro-batch only the rows' target log-probs and top tokens
come back), the optimiser step, checkpoints and --resume. Device tools and how they are chosen:
tests/py/device_train.py (the simulator's by default; DEVICE_BIN=build/bin on a GPU).

Model: a tiny tidal-init Qwen2 (C 32, 2 layers, V 100, untied), data datasets/tasks/add, 2
sequences per micro-batch, 2 micro-batches per step, a warmup step then a constant lr, weight
decay, clipping at 1, a checkpoint every 2 steps, greedy evaluation of 2 test records (12
tokens) after the last step; kept small so the simulated device runs in seconds. Checked, per /steps column of sft.h5 (reports/SCHEMA.md):
1. fp32 recipe, 3 steps (a checkpoint at 2): loss and grad_norm within 1e-4 relative of the CPU's; token_accuracy,
   target_tokens and the greedy evaluation (eval_accuracy) equal. Why 1e-4 (the project's fp32
   standard): every op is fp32, but the device's GEMMs sum in another order (the simulated
   cuBLASLt in k order, the CPU in its fixed tiles), ~1e-7 relative per GEMM, and AdamW moves
   each weight by ~lr whatever its gradient's size, which carries such differences into the
   next steps' weights. Measured on the simulator: loss 3.3e-9, grad_norm 1.0e-8 (this model's
   sums are short).
2. bf16-train (bf16 activations and GEMM operands, fp32 masters), 2 steps: loss and grad_norm
   within 1e-3 relative (1e-2 on a GPU), token accuracy within 0.02. Why looser: where the two
   devices' fp32 sums differ in the last bit, a bf16 rounding (2^-8 relative) can go either way;
   the simulator's cuBLASLt model sums exactly, a GPU's kernels in an order of their own, so
   more roundings flip there. Measured on the simulator: loss 8e-10, grad_norm 0 (2 steps;
   1.7e-6 and 4.3e-6 with 4 sequences per micro-batch and 3 steps).
3. fp16-train (loss scaling, GradScaler semantics), 2 steps: the same loss scales and skipped
   steps, loss and grad_norm within the bound of 2. Measured: loss 2.5e-9, grad_norm 2.5e-8.
4. LoRA r 4 on q_proj, v_proj, down_proj, fp32, 2 steps: the unmerged adapter's forward and its A/B
   gradients on the device: loss and grad_norm within 1e-4 relative (as 1). Measured: loss
   3.3e-9, grad_norm 5.0e-8.
5. On the device: 2 steps with a checkpoint, then --resume to 3 steps, against the 3 straight
   steps of 1: /steps loss, grad_norm and lr equal bit for bit; --resume of that run on the
   CPU is refused, naming both devices, as tidal-diff's (the masters, moments
   and scaler state downloaded for saving and loaded back continue exactly).
7. Preparing the recipe's weights on the device from the device masters (the default) against the
   host preparation from downloaded masters (TIDAL_PREPARE_ON_HOST=1, the path before), both on the
   device: every /steps column but the wall clock's bit for bit equal (the same rounding functions:
   tests/cudasim/test_prepare_sim.cpp), for bf16-train (3 steps, a checkpoint, the greedy
   evaluation on the trainer's model; its saved model, checkpoint model and optimizer state
   tensor for tensor; and 2 steps + --resume to 3 equal to it bit for bit),
   fp16-train (loss scaling) and LoRA bf16-train (the adapter
   re-rounded on the device, the base kept). Bytes device -> host per optimiser step
   (TIDAL_STEP_D2H=1, td_device_d2h_bytes): full fine-tuning's are exactly the masters' 4 bytes a
   parameter fewer, and under 1 byte a parameter (measured: 872 bytes a step against 101,352, 25,120
   parameters). LoRA still brings its adapter down each step (host readers: merges, saves): equal.
6. The run file's device attribute: "cpu" and "cuda:0 (...)". Refusals: --device tpu is a usage
   error (exit 2, the one message of every --device tool); on a machine without a GPU the CPU
   build's --device cuda exits 1 saying why and what to do, and writes no run file.
Exit 0 pass, 1 fail, 77 skip (device tools not built, or numpy missing; without h5py the run
files are read through tidal-export: tests/py/runfile_read.py).
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_train import (DEVBIN, LOW_TOL, SIM, close, cpu, device, device_attrs, np, pair, prep_d2h,  # noqa: E402
                          prep_identical, prep_pair, steps, tmp)
from tidal_check import check, failures, run  # noqa: E402

MODEL = os.path.join(tmp, "init")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2",
    "--num-kv-heads", "1", "--head-dim", "16", "--intermediate-size", "64", "--vocab-size", "100", "--no-tie",
    "--seed", "3", "-o", MODEL)
run("tidal-tokenize", "--write-char-vocab", MODEL)
SFT = ["--model-path", MODEL, "--dataset-path", "datasets/tasks/add", "--learning-rate", "3e-3",
       "--per-device-batch-size", "2", "--gradient-accumulation-steps", "2", "--lr-scheduler", "constant_with_warmup",
       "--warmup-steps", "1", "--weight-decay", "0.01", "--seed", "5", "--eval-max-samples", "2",
       "--max-new-tokens", "12", "--save-steps", "2"]


def st_tensors(path):
    """A safetensors file's tensors as raw bytes by name (the header's metadata left out)."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}


def sft_pair(name, *extra):
    return pair("tidal-sft", "sft.h5", name, SFT, *extra)


# 6. refusals
p = cpu("tidal-sft", *SFT, "-o", os.path.join(tmp, "bad"), "--device", "tpu", ok=False)
check(p.returncode == 2 and "tidal-sft: --device: expected cpu, cuda or cuda:N, got 'tpu'" in p.stderr,
      "tidal-sft --device tpu: usage error (exit 2) naming the option and the accepted names")
if SIM:   # the simulator: this machine has no GPU for the CPU build
    out = os.path.join(tmp, "nogpu")
    p = cpu("tidal-sft", *SFT, "-o", out, "--device", "cuda", ok=False)
    why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    print(f"  the CPU build with --device cuda says: {why}")
    check(p.returncode == 1 and ("built without CUDA" in why or "no CUDA device can be used here" in why)
          and "--device cpu" in why and not os.path.exists(os.path.join(out, "sft.h5")),
          "tidal-sft --device cuda without a GPU: exit 1, why and what to do, no run file")

# 1. fp32; 6. the device attribute
(c, ca), (g, ga) = sft_pair("fp32", "--max-steps", "3")
device_attrs(ca, ga, "sft.h5")
close(c, g, ["loss", "grad_norm"], 1e-4, "fp32, 3 steps")
check(np.array_equal(c["token_accuracy"], g["token_accuracy"]) and np.array_equal(c["target_tokens"], g["target_tokens"])
      and np.array_equal(c["eval_accuracy"], g["eval_accuracy"], equal_nan=True),
      "fp32: token accuracy, target counts and the greedy evaluation equal")

# 2. bf16-train
(c, _), (g, _) = sft_pair("bf16", "--max-steps", "2", "--recipe", "bf16-train")
close(c, g, ["loss", "grad_norm"], LOW_TOL, "bf16-train, 2 steps")
check(float(np.max(np.abs(c["token_accuracy"] - g["token_accuracy"]))) <= 0.02, "bf16-train: token accuracy within 0.02")

# 3. fp16-train: loss scaling
(c, _), (g, _) = sft_pair("fp16", "--max-steps", "2", "--recipe", "fp16-train")
print(f"  fp16-train loss scales: CPU {list(c['loss_scale'])}, device {list(g['loss_scale'])}")
check(np.array_equal(c["loss_scale"], g["loss_scale"]) and np.array_equal(c["skipped"], g["skipped"]),
      "fp16-train: the same loss scales and skipped steps (GradScaler)")
close(c, g, ["loss", "grad_norm"], LOW_TOL, "fp16-train, 2 steps")

# 4. LoRA
(c, _), (g, _) = sft_pair("lora", "--max-steps", "2", "--lora-r", "4", "--lora-alpha", "8",
                          "--lora-target-modules", "q_proj,v_proj,down_proj")
close(c, g, ["loss", "grad_norm"], 1e-4, "LoRA r 4 fp32, 2 steps")

# 5. checkpoint and --resume on the device, against the straight run of 1
part = os.path.join(tmp, "part")
device("tidal-sft", *SFT, "-o", part, "--max-steps", "2")
device("tidal-sft", *SFT, "-o", part, "--max-steps", "3", "--resume")
s, _ = steps(os.path.join(tmp, "fp32-dev", "sft.h5"))
r, _ = steps(os.path.join(part, "sft.h5"))
print(f"  resume: straight loss {list(s['loss'])}, resumed {list(r['loss'])}")
check(len(s["loss"]) == len(r["loss"]) == 3 and all(np.array_equal(s[k], r[k]) for k in ["loss", "grad_norm", "lr"]),
      "on the device: 2 steps, a checkpoint, --resume to 3 equals 3 straight steps bit for bit")
p = cpu("tidal-sft", *SFT, "-o", part, "--max-steps", "4", "--resume", ok=False)
check(p.returncode == 1 and "--resume on another device (the file was made on cuda:0 (" in p.stderr
      and "this run is on cpu" in p.stderr, "the device's run resumed on the CPU: refused (exit 1), both devices named")

# 7. the weights prepared on the device against the host preparation
(d, dd), (h, hd) = prep_pair("tidal-sft", "sft.h5", "prep-bf16", SFT, "--max-steps", "3", "--recipe", "bf16-train")
prep_identical(d, h, "bf16-train, 3 steps")
prep_d2h(dd, hd, "bf16-train")
same = []   # the masters written by checkpoints and the final save come down when asked
for f in ["model.safetensors", os.path.join("checkpoint-2", "model.safetensors"), os.path.join("checkpoint-2", "optimizer.safetensors")]:
    a, b = st_tensors(os.path.join(tmp, "prep-bf16-prep-dev", f)), st_tensors(os.path.join(tmp, "prep-bf16-prep-host", f))
    same.append(len(a) > 0 and a == b)
check(all(same), "bf16-train: the final model, checkpoint-2's model and optimizer state: every tensor bit-identical")
part = os.path.join(tmp, "part-bf16")   # --resume from a checkpoint whose weights were prepared on the device
device("tidal-sft", *SFT, "-o", part, "--max-steps", "2", "--recipe", "bf16-train")
device("tidal-sft", *SFT, "-o", part, "--max-steps", "3", "--recipe", "bf16-train", "--resume")
r, _ = steps(os.path.join(part, "sft.h5"))
check(len(r["loss"]) == 3 and all(np.array_equal(d[k], r[k]) for k in ["loss", "grad_norm", "lr", "token_accuracy"]),
      "bf16-train on the device: 2 steps, a checkpoint, --resume to 3 equals the 3 straight steps bit for bit")
(d, dd), (h, hd) = prep_pair("tidal-sft", "sft.h5", "prep-fp16", SFT, "--max-steps", "2", "--recipe", "fp16-train")
prep_identical(d, h, "fp16-train, 2 steps")
prep_d2h(dd, hd, "fp16-train")
(d, dd), (h, hd) = prep_pair("tidal-sft", "sft.h5", "prep-lora", SFT, "--max-steps", "2", "--recipe", "bf16-train",
                             "--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "q_proj,v_proj,down_proj")
prep_identical(d, h, "LoRA r 4 bf16-train, 2 steps")
print(f"  LoRA: bytes device -> host per step {dd['step']} and {hd['step']} ({dd['nparams']} adapter parameters)")
check(dd["step"] == hd["step"], "LoRA: the same bytes device -> host (the adapter comes down either way)")

print(f"device tools: {DEVBIN}")
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
