#!/usr/bin/env python3
"""PyTorch + transformers peer of one tidal-rl GRPO step on the GPU (issue 27's step-time table,
tests/gpu/run.sh stage `rl`): the same checkpoint, dtype and shapes, the three phases timed apart.

  rollout  `--completions` sequences (prompts of `--prompt-len` random tokens, `--num-generations`
           copies of each), sampled at temperature 1 by model.generate with the KV cache, exactly
           `--response-len` new tokens each (min_new_tokens = max_new_tokens: lengths fixed so
           that both sides decode the same number of tokens)
  pi_old   the log-probs of the response tokens, no gradient, in micro-batches
  update   the GRPO loss (PPO-clip of exp(logp - old) with group-normalised random rewards,
           token-mean) forward and backward per micro-batch, gradient clipping at 1, one AdamW
           step; --gradient-checkpointing recomputes activations as TRL's flag does

The trained weights are fp32 masters under bf16/fp16 autocast (TRL's GRPOTrainer with bf16=True
on a model loaded in fp32) unless --pure (weights and AdamW in --dtype). Prints, as the C benches:
  case rollout seconds S tokens_per_s X
  case pi_old seconds S tokens_per_s X
  case update seconds S tokens_per_s X
  case step seconds S
  peak_memory_gib G

  grpo_bench.py --model DIR [--dtype bf16] [--completions 64] [--num-generations 8]
                [--prompt-len 128] [--response-len 1024] [--micro-batch 8]
                [--gradient-checkpointing] [--device cuda] [--attn sdpa] [--seed 0]
"""
import argparse
import time

import torch

from hf_load import DT, load


def sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def token_logps(model, ids, plen, dtype, dev):
    """log p(token t | < t) of the response tokens (positions plen..) of ids, fp32."""
    with torch.autocast(device_type=dev.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
        logits = model(ids).logits[:, plen - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, plen:, None])[..., 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=DT, default="bf16")
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--pure", action="store_true", help="weights and AdamW in --dtype (no fp32 masters)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dt, dev = DT[a.dtype], a.device
    torch.manual_seed(a.seed)
    model = load(a.model, dt if a.pure else torch.float32, a.attn, dev).to(dev)
    V = model.config.vocab_size
    eos = model.generation_config.eos_token_id
    gen = model if a.pure or dt == torch.float32 else load(a.model, dt, a.attn, dev).to(dev)  # the engine's copy
    gen.eval()
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    P, R, B, G = a.prompt_len, a.response_len, a.completions, a.num_generations

    # rollout
    prompts = torch.randint(0, V, (B // G, P)).repeat_interleave(G, 0).to(dev)
    sync(dev)
    t0 = time.perf_counter()
    with torch.no_grad():
        seq = gen.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                           top_p=1.0, top_k=0, max_new_tokens=R, min_new_tokens=R, pad_token_id=0,
                           eos_token_id=eos)
    sync(dev)
    t_roll = time.perf_counter() - t0
    assert seq.shape == (B, P + R), seq.shape

    # pi_old
    model.eval()
    t0 = time.perf_counter()
    old = []
    with torch.no_grad():
        for i in range(0, B, a.micro_batch):
            old.append(token_logps(model, seq[i:i + a.micro_batch], P, dt, dev))
    old = torch.cat(old)
    sync(dev)
    t_old = time.perf_counter() - t0

    # update
    rewards = torch.rand(B // G, G, device=dev)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(B, 1)
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    t0 = time.perf_counter()
    for i in range(0, B, a.micro_batch):
        logp = token_logps(model, seq[i:i + a.micro_batch], P, dt, dev)
        ratio = torch.exp(logp - old[i:i + a.micro_batch])
        A = adv[i:i + a.micro_batch]
        loss = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A).mean() * (logp.shape[0] / B)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(dev)
    t_upd = time.perf_counter() - t0

    ntok = B * R
    print(f"case rollout seconds {t_roll:.3f} tokens_per_s {ntok / t_roll:.1f}")
    print(f"case pi_old seconds {t_old:.3f} tokens_per_s {ntok / t_old:.1f}")
    print(f"case update seconds {t_upd:.3f} tokens_per_s {ntok / t_upd:.1f}")
    print(f"case step seconds {t_roll + t_old + t_upd:.3f}")
    if dev.startswith("cuda"):
        print(f"peak_memory_gib {torch.cuda.max_memory_allocated() / 2**30:.2f}")


if __name__ == "__main__":
    main()
