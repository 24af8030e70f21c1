#!/usr/bin/env python3
"""transformers peer of `tidal-bench-model --device cuda` (tests/bench/gpu.sh): the same
checkpoint, dtype and shapes with AutoModelForCausalLM on the GPU. Prints the C bench's lines,
"case NAME tokens_per_s X seconds S", best of --rounds:
  tf         teacher-forced log-probs (log_softmax over the vocabulary, gathered) of
             tf-batch x tf-len random tokens
  decodeB    B slots: prefill `prompt` random tokens, then `steps` decode steps with the KV cache,
             each producing the full log-softmax rows (B = 1 and --decode-batch)

  hf_bench.py --model DIR [--dtype bf16] [--attn eager|sdpa] [--tf-batch 2] [--tf-len 512]
              [--prompt 32] [--steps 32] [--decode-batch 64] [--rounds 3] [--device cuda]
(--device cpu: tests/gpu/run.sh's rehearsal without a GPU, where only the script's logic counts)
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


DEV = "cuda"


def sync():
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


def load(path, dtype, attn):
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    except TypeError:   # transformers 4.x spells it torch_dtype
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation=attn)
    return m.to(DEV).eval()


@torch.no_grad()
def teacher(m, B, T, V, gen):
    ids = torch.randint(0, V, (B, T), generator=gen).to(DEV)
    sync()
    t0 = time.perf_counter()
    logits = m(ids).logits
    lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])
    sync()
    assert lp.shape == (B, T - 1, 1)
    return time.perf_counter() - t0


@torch.no_grad()
def decode(m, B, prompt, steps, V, gen):
    ids = torch.randint(0, V, (B, prompt), generator=gen).to(DEV)
    out = m(ids, use_cache=True)
    past = out.past_key_values
    torch.log_softmax(out.logits[:, -1].float(), -1)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = torch.randint(0, V, (B, 1), generator=gen).to(DEV)
        out = m(nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        rows = torch.log_softmax(out.logits[:, -1].float(), -1)
    sync()
    assert rows.shape == (B, V)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--tf-batch", type=int, default=2)
    ap.add_argument("--tf-len", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    global DEV
    DEV = a.device
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    m = load(a.model, dtype, a.attn)
    V = m.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    teacher(m, 1, 16, V, gen)   # warm-up
    decode(m, 1, 4, 2, V, gen)
    best = {}
    for _ in range(a.rounds):
        for name, f in [("tf", lambda: teacher(m, a.tf_batch, a.tf_len, V, gen)),
                        ("decode1", lambda: decode(m, 1, a.prompt, a.steps, V, gen)),
                        (f"decode{a.decode_batch}", lambda: decode(m, a.decode_batch, a.prompt, a.steps, V, gen))]:
            dt = f()
            n = a.tf_batch * a.tf_len if name == "tf" else (1 if name == "decode1" else a.decode_batch) * a.steps
            if name not in best or n / dt > best[name][0]:
                best[name] = (n / dt, dt)
    for name, (tps, dt) in best.items():
        print(f"case {name} tokens_per_s {tps:.3f} seconds {dt:.3f}")


if __name__ == "__main__":
    main()
