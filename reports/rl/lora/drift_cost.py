"""What the merge/unmerge drift costs, separated from what the adapter learned (README section 4).

For every finished `merge-unmerge` run of the grid (build/rl/lora/grid/sN-DTYPE-mu), builds two
checkpoints from the run's own files and scores them with tidal-rl's clean evaluation (greedy,
the run's training recipe, 200 test records, --learning-rate 0: the step-0 evaluation):

  drifted base     the shipped base with its adapted matrices replaced by the run's frozen base
                   as the merge/unmerge cycle left it (checkpoint-900/lora_base.safetensors):
                   what the drift alone did to the model, no adapter
  pristine+adapter the final adapter (model/adapter_model.safetensors, step 1000) merged in fp32
                   into the pristine base (W + alpha/r * B @ A), rounded once by the recipe:
                   what a user who serves TRL's saved adapter on the original checkpoint gets

and, once per dtype, the pristine base itself. The run's own last evaluation (drifted base +
adapter as the trainer computes them) comes from its rl.h5. Checkpoints are written in fp32
(every value they hold is exact in fp32) under build/rl/lora/driftcost/.
Usage: .venv/bin/python reports/rl/lora/drift_cost.py [BIN]   (BIN: tools, default build/bin)
Prints a Markdown table. Needs torch and safetensors (the test venv's)."""
import glob
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")
BASE = os.path.join(ROOT, "datasets", "models", "add")
GRID = os.path.join(ROOT, "build", "rl", "lora", "grid")
OUT = os.path.join(ROOT, "build", "rl", "lora", "driftcost")
DATA = os.path.join(ROOT, "datasets", "tasks", "add", "train.jsonl")


def write_model(dst, tensors):
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(BASE):
        if f.endswith(".json") and f != "eval.json":
            shutil.copy(os.path.join(BASE, f), dst)
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, os.path.join(dst, "model.safetensors"))


def clean_accuracy(model, dtype, out):
    h5 = os.path.join(out, "rl.h5")
    if not os.path.exists(h5):
        cmd = [os.path.join(BIN, "tidal-rl"), "--model-path", model, "--dataset-path", DATA, "--dtype", dtype,
               "--learning-rate", "0", "--max-steps", "1", "--num-generations", "8", "--per-device-batch-size", "16",
               "--max-completion-length", "48", "--eval-steps", "1", "--eval-max-samples", "200", "--seed", "1",
               "-q", "--overwrite-output-dir", "--output-dir", out]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    with h5py.File(h5, "r") as f:
        return float(f["steps"]["eval_accuracy"][0])


def last_eval(run):
    with h5py.File(os.path.join(run, "rl.h5"), "r") as f:
        ev = f["steps"]["eval_accuracy"][:]
        drift = float(f["steps"]["base_drift_max"][-1])
    ev = ev[np.isfinite(ev)]
    return float(ev[-1]), drift


base = load_file(os.path.join(BASE, "model.safetensors"))
rows, pristine = [], {}
for run in sorted(glob.glob(os.path.join(GRID, "s*-*-mu"))):
    name = os.path.basename(run)
    dtype = name.split("-")[1]
    if dtype not in ("bf16", "fp16"):   # fp32: drift at fp32 rounding (1e-6), nothing to take apart
        continue
    ckpt = sorted(glob.glob(os.path.join(run, "checkpoint-*", "lora_base.safetensors")),
                  key=lambda p: int(p.split("checkpoint-")[1].split(os.sep)[0]))
    adapter = os.path.join(run, "model", "adapter_model.safetensors")
    if not ckpt or not os.path.exists(adapter):
        continue
    if dtype not in pristine:
        pristine[dtype] = clean_accuracy(BASE, dtype, os.path.join(OUT, f"pristine-{dtype}"))
    step = int(ckpt[-1].split("checkpoint-")[1].split(os.sep)[0])
    drifted = dict(base)
    lb = load_file(ckpt[-1])
    drifted.update(lb)
    d = os.path.join(OUT, name, "drifted-base")
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        write_model(d, drifted)
    acc_drift = clean_accuracy(d, dtype, os.path.join(OUT, name, "eval-drifted-base"))
    cfg = json.load(open(os.path.join(run, "model", "adapter_config.json")))
    scale = cfg["lora_alpha"] / cfg["r"]
    ad = load_file(adapter)
    merged = dict(base)
    for k in lb:
        stem = "base_model.model." + k[: -len(".weight")]
        A, B = ad[stem + ".lora_A.weight"].float(), ad[stem + ".lora_B.weight"].float()
        merged[k] = base[k].float() + scale * (B @ A)
    m = os.path.join(OUT, name, "pristine-adapter")
    if not os.path.exists(os.path.join(m, "model.safetensors")):
        write_model(m, merged)
    acc_pa = clean_accuracy(m, dtype, os.path.join(OUT, name, "eval-pristine-adapter"))
    acc_run, drift = last_eval(run)
    db = max(float((lb[k].float() - base[k].float()).abs().max()) for k in lb)
    rows.append(f"| {name} | {drift:.2g} | {acc_run:.2f} | {acc_drift:.2f} (drift at step {step}: {db:.2g}) | {acc_pa:.2f} |")

print("| run | base drift max at step 1000 | the run's policy at the end (drifted base + adapter) |"
      " drifted base alone | final adapter on the pristine base |")
print("|---|---|---|---|---|")
for dtype, a in pristine.items():
    print(f"| pristine base, {dtype} recipe | 0 | — | {a:.2f} | — |")
print("\n".join(rows))
