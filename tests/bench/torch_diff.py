#!/usr/bin/env python3
"""PyTorch peer of one tidal-diff batch job, on the CPU: the same checkpoint and the same work
in the given dtype (float32 or bfloat16):
  inference path: prefill B prompts of P tokens, then G decode steps with the KV cache, the
                  full log-softmax rows kept, the next tokens drawn from them;
  training path:  teacher-forced forward over the B sequences (P + G tokens), log-softmax rows;
  metrics:        full-vocabulary KL(B||A) at every generated position.
Prints "case diff-DTYPE tokens_per_s X seconds S" (tokens = B * G scored tokens), like
tidal-diff's throughput line.

  torch_diff.py --model DIR --dtype float32|bfloat16 [--batch 4] [--prompt 32] [--gen 32] [--threads 2]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
import llama_ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    cfg, w = llama_ref.load_checkpoint(a.model, dtype)
    model = llama_ref.Model(cfg, w, dtype)
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    B, P, G = a.batch, a.prompt, a.gen
    with torch.inference_mode():
        model.logsoftmax(model.forward(torch.zeros((1, 4), dtype=torch.long)))   # warm-up
        t0 = time.perf_counter()
        ids = torch.randint(0, V, (B, P), generator=gen)
        cache = model.new_cache(B, P + G)
        rows_b = []
        lp = model.logsoftmax(model.forward(ids, 0, cache)[:, -1]).float()
        seq = ids
        for k in range(G):
            rows_b.append(lp)
            nxt = torch.multinomial(lp.exp(), 1, generator=gen)
            seq = torch.cat([seq, nxt], dim=1)
            if k + 1 < G:
                lp = model.logsoftmax(model.forward(nxt, P + k, cache)[:, -1]).float()
        lb = torch.stack(rows_b, dim=1)                       # (B, G, V)
        la = model.logsoftmax(model.forward(seq[:, :-1])).float()[:, P - 1:]   # (B, G, V)
        kl = (lb.exp() * (lb - la)).sum(-1)
        dt = time.perf_counter() - t0
        assert kl.shape == (B, G)
    print("case diff-%s tokens_per_s %.3f seconds %.3f" % (a.dtype, B * G / dt, dt))


if __name__ == "__main__":
    main()
