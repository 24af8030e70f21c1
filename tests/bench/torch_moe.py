#!/usr/bin/env python3
"""PyTorch peer of tools/tidal-bench-model on a mixture of experts: transformers' own eager MoE model
(MixtralForCausalLM: router, softmax top-k, the experts' loop with index_add_), fp32, 2 threads, the
same checkpoint and shapes; decode through its KV cache (past_key_values). Also writes the bench's
checkpoint (--make DIR: a Mixtral-shaped random model saved by transformers). Prints
"case NAME tokens_per_s X seconds S" lines like the C bench.

  torch_moe.py --make DIR
  torch_moe.py --model DIR [--tf-batch 2] [--tf-len 512] [--prompt 32] [--steps 16] [--decode-batch 16]
  torch_moe.py --model DIR --train BATCH.json [--seconds S]

--train: the training step of tests/bench/train.sh's peer on this model (the batch file of
tests/helpers/train_probe: tokens and a loss mask): forward in fp32, mean token cross-entropy over
the mask, autograd backward through the experts and the router, clip_grad_norm_(1.0),
torch.optim.AdamW; prints "tokens_per_s X" after --seconds of steps (one warm-up step first).
"""
import argparse
import sys
import time

import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM


def make(d):
    torch.manual_seed(1)
    cfg = MixtralConfig(vocab_size=8192, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=2048, tie_word_embeddings=False, sliding_window=None)
    m = MixtralForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("block_sparse_moe.gate.weight"):
                p.normal_(0, 0.3)   # routing spread over the experts, as a trained router's
    m.save_pretrained(d, safe_serialization=True)


def decode(model, B, prompt, steps, V, gen):
    ids = torch.randint(0, V, (B, prompt), generator=gen)
    out = model(ids, use_cache=True)
    cache = out.past_key_values
    torch.log_softmax(out.logits[:, -1], -1)
    t0 = time.perf_counter()
    for _ in range(steps):
        ids = torch.randint(0, V, (B, 1), generator=gen)
        out = model(ids, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows = torch.log_softmax(out.logits[:, -1], -1)
    dt = time.perf_counter() - t0
    assert rows.shape == (B, V)
    return dt


def train(a):
    import json
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager")
    model.train()
    b = json.load(open(a.train))
    seqs = [torch.tensor(t)[None] for t in b["tokens"]]
    masks = [torch.tensor(m, dtype=torch.float32) for m in b["mask"]]
    nmask = float(sum(m.sum() for m in masks))
    total = sum(len(t) for t in b["tokens"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = 0
        for ids, m in zip(seqs, masks):
            lp = torch.log_softmax(model(ids).logits[0], -1)
            loss = loss - (lp[:-1].gather(1, ids[0, 1:, None])[:, 0] * m).sum()
        loss = loss / nmask
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    step()   # warm-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        step()
        n += 1
    print("tokens_per_s %.3f" % (n * total / (time.perf_counter() - t0)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make")
    ap.add_argument("--model")
    ap.add_argument("--tf-batch", type=int, default=2)
    ap.add_argument("--tf-len", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--decode-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train")
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    if a.make:
        make(a.make)
        return
    torch.set_num_threads(a.threads)
    if a.train:
        train(a)
        return
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager").eval()
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        ids = torch.randint(0, V, (a.tf_batch, a.tf_len), generator=gen)
        model(ids[:1, :16])   # warm-up
        t0 = time.perf_counter()
        lp = torch.log_softmax(model(ids).logits, -1)
        nxt = lp[:, :-1].gather(2, ids[:, 1:, None])
        dt = time.perf_counter() - t0
        assert nxt.shape == (a.tf_batch, a.tf_len - 1, 1)
        print("case tf tokens_per_s %.3f seconds %.3f" % (a.tf_batch * a.tf_len / dt, dt))
        del lp, nxt
        decode(model, 1, 4, 2, V, gen)   # warm-up
        dt = decode(model, 1, a.prompt, a.steps, V, gen)
        print("case decode1 tokens_per_s %.3f seconds %.3f" % (a.steps / dt, dt))
        B = a.decode_batch
        dt = decode(model, B, a.prompt, a.steps, V, gen)
        print("case decode%d tokens_per_s %.3f seconds %.3f" % (B, B * a.steps / dt, dt))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
