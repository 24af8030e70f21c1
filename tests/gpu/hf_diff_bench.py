#!/usr/bin/env python3
"""transformers peer of a whole `tidal-diff --device cuda` run (tests/bench/gpu.sh,
gpu-diff-vs-transformers): the same checkpoint and prompts ({"tokens": [...]} JSONL), the work a
diff does with transformers alone on the same GPU:
  path B  model.generate, sampling at temperature 1, exactly --max-new-tokens tokens per prompt
          (min_new_tokens = max_new_tokens), the log-prob of each sampled token from the scores
  path A  one teacher-forced forward over prompt + response, log_softmax, the same tokens' log-probs
  then the per-token |logp_A - logp_B| and its mean, as the diff records.
--batch prompts at a time. Prints, as tidal-diff's summary does:
  throughput X scored tokens/s (N tokens in S s, both paths, model loading excluded)
  mean_abs_dlogp D

  hf_diff_bench.py --model DIR --prompts FILE [--max-new-tokens 64] [--batch 8] [--dtype bf16]
                   [--attn sdpa] [--device cuda]
"""
import argparse
import json
import time

import torch

from hf_load import DT, load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", choices=DT, default="bf16")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    m = load(a.model, DT[a.dtype], a.attn, a.device)
    m = m.to(a.device).eval()
    prompts = [json.loads(l)["tokens"] for l in open(a.prompts) if l.strip()]
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    R, n_tok, dsum = a.max_new_tokens, 0, 0.0
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(prompts), a.batch):
            group = prompts[i:i + a.batch]
            P = max(len(p) for p in group)   # left padding, as generate wants
            ids = torch.tensor([[0] * (P - len(p)) + p for p in group], device=a.device)
            mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in group], device=a.device)
            out = m.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=R, min_new_tokens=R, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
            seq = out.sequences
            resp = seq[:, P:]
            lb = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
            lb = lb.gather(-1, resp[..., None])[..., 0]
            full_mask = torch.cat([mask, torch.ones_like(resp)], 1)
            logits = m(seq, attention_mask=full_mask).logits[:, P - 1:-1]
            la = torch.log_softmax(logits.float(), -1).gather(-1, resp[..., None])[..., 0]
            dsum += (la - lb).abs().sum().item()
            n_tok += resp.numel()
    sync()
    s = time.perf_counter() - t0
    print(f"throughput {n_tok / s:.1f} scored tokens/s ({n_tok} tokens in {s:.2f} s, both paths, "
          "model loading excluded)")
    print(f"mean_abs_dlogp {dsum / max(n_tok, 1):.4e}")


if __name__ == "__main__":
    main()
