#!/usr/bin/env python3
"""PyTorch peer of tools/tidal-bench-model: the same Llama-family forward (tests/py/llama_ref.py,
fp32, eager HF-style attention, preallocated KV cache), on the CPU with 2 threads, on the same
checkpoint and shapes. Prints "case NAME tokens_per_s X seconds S" lines like the C bench.

  torch_model.py --model DIR [--tf-batch 2] [--tf-len 512] [--prompt 32] [--steps 32]
                 [--decode-batch 16] [--threads 2] [--only CASE]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
import llama_ref  # noqa: E402


def decode(model, B, prompt, steps, V, gen):
    """Prefill B slots with `prompt` tokens, then `steps` batched decode steps producing the
    full log-softmax rows; returns the seconds of the decode steps."""
    cache = model.new_cache(B, prompt + steps)
    ids = torch.randint(0, V, (B, prompt), generator=gen)
    model.logsoftmax(model.forward(ids, 0, cache)[:, -1])
    t0 = time.perf_counter()
    for k in range(steps):
        ids = torch.randint(0, V, (B, 1), generator=gen)
        rows = model.logsoftmax(model.forward(ids, prompt + k, cache)[:, -1])
    dt = time.perf_counter() - t0
    assert rows.shape == (B, V)
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tf-batch", type=int, default=2)
    ap.add_argument("--tf-len", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg, w = llama_ref.load_checkpoint(a.model, torch.float32)
    model = llama_ref.Model(cfg, w, torch.float32)
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        if a.only in (None, "tf"):
            ids = torch.randint(0, V, (a.tf_batch, a.tf_len), generator=gen)
            model.logsoftmax(model.forward(ids[:1, :16]))   # warm-up
            t0 = time.perf_counter()
            lp = model.logsoftmax(model.forward(ids))
            nxt = lp[:, :-1].gather(2, ids[:, 1:, None])
            dt = time.perf_counter() - t0
            assert nxt.shape == (a.tf_batch, a.tf_len - 1, 1)
            print("case tf tokens_per_s %.3f seconds %.3f" % (a.tf_batch * a.tf_len / dt, dt))
            del lp, nxt
        if a.only in (None, "decode1"):
            decode(model, 1, 4, 2, V, gen)   # warm-up
            dt = decode(model, 1, a.prompt, a.steps, V, gen)
            print("case decode1 tokens_per_s %.3f seconds %.3f" % (a.steps / dt, dt))
        if a.only in (None, "decodeB"):
            B = a.decode_batch
            dt = decode(model, B, a.prompt, a.steps, V, gen)
            print("case decode%d tokens_per_s %.3f seconds %.3f" % (B, B * a.steps / dt, dt))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
