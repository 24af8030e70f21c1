"""The PyTorch peer of the training bench (tests/bench/train.sh): the same training step as
tidal's train_probe on the same checkpoint and batch — forward (tests/py/llama_ref.py, fp32
master weights), mean token cross-entropy over the loss mask, autograd backward,
clip_grad_norm_(1.0), torch.optim.AdamW — in fp32, or under torch.autocast("cpu", bfloat16 or
float16) (--dtype bfloat16|float16: PyTorch's mixed precision on the CPU). Prints `tokens_per_s X` after
--seconds of steps (one warm-up step first).
--lora R: the LoRA step as TRL runs it instead: transformers' AutoModelForCausalLM of the checkpoint
(its weights in --dtype, frozen), PEFT's get_peft_model with LoraConfig(r=R, lora_alpha=2R,
target_modules="all-linear", no dropout; PEFT keeps the adapters in fp32), AdamW on the adapters,
the same loss, clipping and autocast.

  torch_train.py --model DIR --batch FILE.json --dtype float32|bfloat16|float16 [--lora R] [--seconds S] [--threads N]
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "py"))
import llama_ref  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", required=True)
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
ap.add_argument("--seconds", type=float, default=10.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--lora", type=int, default=0)
a = ap.parse_args()
torch.set_num_threads(a.threads)

if a.lora:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=getattr(torch, a.dtype))
    peft_model = get_peft_model(hf, LoraConfig(r=a.lora, lora_alpha=2 * a.lora, target_modules="all-linear",
                                               lora_dropout=0.0))
    params = [p for p in peft_model.parameters() if p.requires_grad]

    def logits_of(ids):
        return peft_model(input_ids=ids).logits
else:
    cfg, w = llama_ref.load_checkpoint(a.model, torch.float32)
    params = [v.requires_grad_(True) for v in w.values()]
    model = llama_ref.Model(cfg, w, torch.float32)

    def logits_of(ids):
        return torch.nn.functional.linear(model.forward(ids), model.lm_head)
b = json.load(open(a.batch))
seqs = [torch.tensor(t) for t in b["tokens"]]
masks = [torch.tensor(m, dtype=torch.float32) for m in b["mask"]]
total_tokens = sum(len(t) for t in b["tokens"])
nmask = float(sum(m.sum() for m in masks))
opt = torch.optim.AdamW(params, lr=1e-5)


# equal lengths run as one (B, T) batch, the way a trainer would; else one sequence at a time
groups = [(torch.stack(seqs), torch.stack(masks))] if len({len(s) for s in seqs}) == 1 else \
    [(s[None, :], m[None, :]) for s, m in zip(seqs, masks)]


def step():
    opt.zero_grad(set_to_none=True)
    loss = 0
    for ids, m in groups:
        # fp32 runs outside autocast: PyTorch 1.13's CPU autocast refuses any dtype but bfloat16
        # at __enter__ even with enabled=False
        ctx = contextlib.nullcontext() if a.dtype == "float32" else torch.autocast("cpu", dtype=getattr(torch, a.dtype))
        with ctx:
            logits = logits_of(ids)
        lp = torch.log_softmax(logits.float(), -1)
        loss = loss - (lp[:, :-1].gather(2, ids[:, 1:, None])[..., 0] * m).sum()
    (loss / nmask).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


step()
t0 = time.perf_counter()
n = 0
while True:
    step()
    n += 1
    t = time.perf_counter() - t0
    if t >= a.seconds:
        break
print(f"tokens_per_s {n * total_tokens / t:.3f}")
