#!/usr/bin/env python3
"""tidal-sft end to end, checked from the files it writes:
  1. a run's /steps (h5py): one row per step, the lr column against transformers' cosine lambda
     (recomputed here), evaluation exactly at --eval-steps and the last step;
  2. --dump-grads: loss_mask is 1 exactly on the completion characters and the EOS of each record
     (decoded with HF `tokenizers`), and the mean token cross-entropy over it, recomputed by
     llama_ref (an independent fp64 forward), equals the first /steps loss;
  3. SIGKILL in the middle of a run, then --resume: the final weights are bit-identical to an
     uninterrupted run's and /steps holds the same rows;
  4. transformers (when installed: 4.46 on Debian's torch) loads the saved checkpoint and its fp32
     log-probs match tidal-logprobs' within 1e-4;
  5. --eval-only agrees with the run's final evaluation; LoRA rank 1 writes a PEFT adapter; an
     fp16 recipe records GradScaler's scale;
  6. bad input: a broken JSONL line and an unknown task (file:line), a tokenizer larger than the
     model's vocabulary, a LoRA target that does not exist (exit 2), an output folder holding a
     run (refused, untouched), --resume with nothing to resume.
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, check, failures, run  # noqa: E402

try:
    import h5py
    import torch
    from safetensors.torch import load_file
    import llama_ref
except Exception as e:  # noqa: BLE001
    print("skip: h5py / torch / safetensors unavailable (%s)" % e)
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="tidal-sft-")
DATA = "datasets/tasks/add"
MODEL = os.path.join(tmp, "init")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2",
    "--num-kv-heads", "1", "--head-dim", "16", "--intermediate-size", "64", "--vocab-size", "100", "--no-tie",
    "--seed", "3", "-o", MODEL)
run("tidal-tokenize", "--write-char-vocab", MODEL)

COMMON = ["--model-path", MODEL, "--dataset-path", DATA, "--learning-rate", "3e-3", "--per-device-batch-size", "4",
          "--gradient-accumulation-steps", "2", "--lr-scheduler", "cosine", "--warmup-ratio", "0.1",
          "--weight-decay", "0.01", "--seed", "5", "--eval-max-samples", "8"]


def sft(out, *extra, ok=True):
    return run("tidal-sft", *COMMON, "--output-dir", out, *extra, ok=ok)


def steps(path):
    with h5py.File(path, "r") as f:
        return {k: f["steps"][k][:] for k in f["steps"]}, dict(f.attrs)


# ---- 1. a run and its /steps
A = os.path.join(tmp, "A")
N = 40
sft(A, "--max-steps", str(N), "--eval-steps", "16", "--save-steps", "10", "--dump-grads", os.path.join(tmp, "g.st"))
for f in ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "trainer_state.json", "sft.h5"]:
    check(os.path.exists(os.path.join(A, f)), f"final output holds {f}")
check(sorted(d for d in os.listdir(A) if d.startswith("checkpoint-")) == ["checkpoint-10", "checkpoint-20",
                                                                        "checkpoint-30", f"checkpoint-{N}"],
      "checkpoints every --save-steps before the end, and the last step's (what --resume extends)")
check(os.path.exists(os.path.join(A, "checkpoint-20", "optimizer.safetensors")), "a checkpoint holds the optimiser state")
st, attrs = steps(os.path.join(A, "sft.h5"))
want = ["epoch", "eval_accuracy", "eval_reward", "grad_norm", "loss", "loss_scale", "lr", "seconds", "skipped",
        "skipped_total", "step", "target_tokens", "token_accuracy"]
check(sorted(st) == want, f"/steps columns {sorted(st)}")
check(list(st["step"]) == list(range(1, N + 1)), "/steps: one row per optimiser step")
warm = math.ceil(0.1 * N)


def cosine(k):   # transformers.get_cosine_schedule_with_warmup's lambda
    if k < warm:
        return k / max(1, warm)
    p = (k - warm) / max(1, N - warm)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * p)))


check(np.allclose(st["lr"], [3e-3 * cosine(k) for k in range(N)], rtol=1e-12, atol=0),
      "lr column follows HF's cosine schedule with warmup_ratio")
evald = [int(s) for s, a in zip(st["step"], st["eval_accuracy"]) if not math.isnan(a)]
check(evald == [16, 32, 40], f"evaluations at --eval-steps and the last step ({evald})")
check(np.all(st["loss_scale"] == 1.0) and not st["skipped"].any(), "fp32: no loss scaling, nothing skipped")
check(st["loss"][-1] < st["loss"][0], f"loss falls ({st['loss'][0]:.3f} -> {st['loss'][-1]:.3f})")
check(attrs.get("command_line", b"").find(b"--max-steps") >= 0 if isinstance(attrs.get("command_line"), bytes)
      else "--max-steps" in attrs.get("command_line", ""), "run file records the command line")
meta = json.load(open(os.path.join(A, "config.json")))
check(meta["eos_token_id"] == 2 and meta["bos_token_id"] == 1, "config.json carries the tokenizer's bos/eos")

# ---- 2. the gradient dump: the loss mask and the loss, against an independent forward
g = load_file(os.path.join(tmp, "g.st"))
ids, mask = g["input_ids"], g["loss_mask"]
check(list(ids.shape) == [8, ids.shape[1]], "dump: B x GA sequences of the first step")
try:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    records = [json.loads(line) for line in open(os.path.join(DATA, "train.jsonl"))]
    by_prompt = {r["prompt"]: r["completion"] for r in records}
    good = 0
    for b in range(ids.shape[0]):
        row = [int(x) for x in ids[b]]
        m = [int(x) for x in mask[b]]
        first = m.index(1)
        prompt = tok.decode(row[1:first], skip_special_tokens=False)
        target = tok.decode([t for t, k in zip(row, m) if k], skip_special_tokens=False)
        good += row[0] == 1 and by_prompt.get(prompt) is not None and target == by_prompt[prompt] + "<eos>"
    check(good == ids.shape[0], f"loss_mask = completion + <eos> of a training record, after <bos> + prompt ({good}/8)")
except ImportError:
    print("skip: tokenizers unavailable for the loss-mask decode")
cfg, w = llama_ref.load_checkpoint(MODEL, torch.float64)
ref = llama_ref.Model(cfg, w, torch.float64)
tot = 0.0
for b in range(ids.shape[0]):
    lp = ref.logsoftmax(ref.forward(ids[b][None, :]))[0]
    tot -= float((lp[:-1].gather(1, ids[b, 1:, None])[:, 0] * mask[b, 1:].double()).sum())
ref_loss = tot / float(mask.sum())
check(abs(ref_loss - st["loss"][0]) < 1e-5,
      f"first step's loss = mean CE over loss_mask (llama_ref fp64 {ref_loss:.6f}, tidal {st['loss'][0]:.6f})")
check(int(mask.sum()) == int(st["target_tokens"][0]), "target_tokens = loss_mask's count")

# ---- 3. SIGKILL, then --resume: the same final weights
B = os.path.join(tmp, "B")
cmd = [os.path.join(BIN, "tidal-sft"), *COMMON, "--output-dir", B, "--max-steps", str(N), "--eval-steps", "16",
       "--save-steps", "10"]
killed = False
for attempt in range(3):
    shutil.rmtree(B, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while p.poll() is None and not os.path.exists(os.path.join(B, "checkpoint-20")):
        time.sleep(0.002)
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait()
        killed = not os.path.exists(os.path.join(B, "model.safetensors"))
        if killed:
            break
    else:
        p.wait()
check(killed, "a run was SIGKILLed after checkpoint-20 and before its end")
r = run("tidal-sft", *COMMON, "--output-dir", B, "--max-steps", str(N), "--eval-steps", "16", "--save-steps", "10",
        "--resume", "--per-device-eval-batch-size", "3")
check("resuming from" in r.stderr, "--resume continues from a checkpoint")
wa, wb = load_file(os.path.join(A, "model.safetensors")), load_file(os.path.join(B, "model.safetensors"))
check(sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa),
      "resumed after SIGKILL: final weights bit-identical to the uninterrupted run")
sb, _ = steps(os.path.join(B, "sft.h5"))
check(list(sb["step"]) == list(range(1, N + 1)), "resumed /steps: one row per step, no duplicates")
same = all(np.array_equal(st[k], sb[k], equal_nan=True) for k in want if k != "seconds")
check(same, "resumed /steps rows equal the uninterrupted run's (loss, grad_norm, lr, eval ...)")
r = run("tidal-sft", *COMMON, "--output-dir", B, "--max-steps", str(N), "--resume")
check("nothing to resume" in r.stderr, "--resume of a finished run does nothing")

# ---- 4. transformers loads the checkpoint: log-probs as tidal's fp32 within 1e-4
try:
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001
    print("skip: transformers unavailable (%s): checkpoint not cross-checked" % e.__class__.__name__)
    AutoModelForCausalLM = None
if AutoModelForCausalLM is not None:
    hf = AutoModelForCausalLM.from_pretrained(A, torch_dtype=torch.float32, attn_implementation="eager").eval()
    seq = [int(x) for x in ids[0]][: int(mask[0].nonzero().max()) + 1]
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([seq])).logits[0].float(), -1)
    hf_lp = lp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0].numpy()
    out = run("tidal-logprobs", "--model", A, "--tokens", ",".join(map(str, seq))).stdout.split("\n")
    td_lp = np.array([float(line.split()[2]) for line in out if line.strip() and not line.startswith("#")])
    d = float(np.abs(td_lp - hf_lp).max())
    check(len(td_lp) == len(hf_lp) and d <= 1e-4, f"transformers fp32 vs tidal fp32 log-probs: max|d| {d:.2e} (<= 1e-4)")

# ---- 5. --eval-only, LoRA rank 1, fp16 loss scaling
r = run("tidal-sft", "--model-path", A, "--dataset-path", DATA, "--eval-only", "--eval-max-samples", "8",
        "--completions", os.path.join(tmp, "c.jsonl"))
ev = json.loads(r.stdout)
check(ev["eval_records"] == 8 and abs(ev["eval_accuracy"] - st["eval_accuracy"][-1]) < 1e-12 and
      abs(ev["eval_reward"] - st["eval_reward"][-1]) < 1e-12,
      f"--eval-only on the saved model = the run's last evaluation ({ev['eval_reward']:.4f})")
lines = [json.loads(line) for line in open(os.path.join(tmp, "c.jsonl"))]
check(len(lines) == 8 and all({"id", "completion", "reward", "exact"} <= set(x) for x in lines),
      "--completions: one JSON line per record")
L = os.path.join(tmp, "L")
sft(L, "--max-steps", "4", "--lora-r", "1", "--lora-alpha", "8", "--lora-target-modules", "q_proj,down_proj")
acfg = json.load(open(os.path.join(L, "adapter_config.json")))
check(acfg["r"] == 1 and sorted(acfg["target_modules"]) == ["down_proj", "q_proj"] and
      os.path.exists(os.path.join(L, "adapter_model.safetensors")), "LoRA rank 1: a PEFT adapter")
F = os.path.join(tmp, "F")
sft(F, "--max-steps", "3", "--recipe", "fp16-train")
sf, _ = steps(os.path.join(F, "sft.h5"))
check(sf["loss_scale"][0] == 65536.0, "fp16 recipe: GradScaler's initial scale 2^16 recorded")

# ---- 6. bad input
bad = os.path.join(tmp, "bad")
os.makedirs(bad)
src = open(os.path.join(DATA, "train.jsonl")).read().split("\n")
open(os.path.join(bad, "train.jsonl"), "w").write("\n".join(src[:2] + ['{"prompt": "1+1\\n", "completion'] + src[3:]))
r = run("tidal-sft", "--model-path", MODEL, "--dataset-path", os.path.join(bad, "train.jsonl"), "-o",
        os.path.join(tmp, "X1"), ok=False)
check(r.returncode == 1 and "train.jsonl:3" in r.stderr, f"broken JSONL line named by file:line ({r.stderr.strip()[:120]})")
unk = src[4].replace('"task":"add"', '"task":"mul"')
open(os.path.join(bad, "train.jsonl"), "w").write("\n".join(src[:4] + [unk] + src[5:]))
r = run("tidal-sft", "--model-path", MODEL, "--dataset-path", os.path.join(bad, "train.jsonl"), "-o",
        os.path.join(tmp, "X2"), ok=False)
check(r.returncode == 1 and "train.jsonl:5" in r.stderr and "mul" in r.stderr,
      f"unknown task named with its line ({r.stderr.strip()[:120]})")
small = os.path.join(tmp, "small")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2",
    "--intermediate-size", "64", "--vocab-size", "50", "--seed", "1", "-o", small)
r = run("tidal-sft", "--model-path", small, "--tokenizer-path", MODEL, "--dataset-path", DATA, "-o",
        os.path.join(tmp, "X3"), ok=False)
check(r.returncode == 1 and "does not match" in r.stderr, f"tokenizer/vocab mismatch refused ({r.stderr.strip()[:120]})")
r = run("tidal-sft", *COMMON, "-o", os.path.join(tmp, "X4"), "--lora-r", "2", "--lora-target-modules", "q_proj,qkv_proj",
        ok=False)
check(r.returncode == 2 and "qkv_proj" in r.stderr, "a LoRA target the model lacks: usage error naming it")
before = open(os.path.join(A, "model.safetensors"), "rb").read()
r = sft(A, "--max-steps", "2", ok=False)
check(r.returncode == 1 and "--overwrite-output-dir" in r.stderr and
      open(os.path.join(A, "model.safetensors"), "rb").read() == before,
      "an output folder holding a run is refused and left as it was")
r = sft(os.path.join(tmp, "X5"), "--max-steps", "2", "--resume", ok=False)
check(r.returncode == 1 and "no checkpoint" in r.stderr, "--resume with nothing to resume: a clear error")
r = run("tidal-sft", "--model-path", MODEL, ok=False)
check(r.returncode == 2, "missing --dataset-path: usage error")

shutil.rmtree(tmp)
sys.exit(1 if failures else 0)
