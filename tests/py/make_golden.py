#!/usr/bin/env python3
"""Writes tests/fixtures/<arch>/: a tiny random HF checkpoint (config.json + model.safetensors)
for each of llama, mistral, qwen2, qwen3, and golden.json with per-position next-token
log-probs (and the last position's full log-softmax row) of a few fixed token sequences,
computed in float64 by llama_ref.py (an independent PyTorch implementation of the HF forward).

  .venv/bin/python tests/py/make_golden.py [OUTDIR]      (default tests/fixtures)

What each fixture exercises:
  llama    Llama-3 style: rope_scaling llama3 (original_max_position_embeddings 64 so the low,
           medium and high frequency bands all occur within 48 positions), untied lm_head
  mistral  weights stored as BF16 (the model converts instead of mapping), untied
  qwen2    q/k/v biases, tied embeddings, rope_theta 1e6
  qwen3    per-head q/k RMSNorm, head_dim 16 with NH*HD = 64 != C = 32, tied embeddings
Weights are drawn with scales that make the distributions peaked (log-probs spread over
several nats), so a wrong op shows up in the numbers.

Cross-checked against transformers 4.46.3 itself (tests/py/test_model_transformers.py, skipped
when transformers is absent): llama, mistral, qwen2 agree with golden.json within 2.5e-6 (the
gap is transformers' fp32 RoPE cos/sin inside its float64 model).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

C, F, L, NH, NKV, V = 32, 64, 2, 4, 2, 128
LENGTHS = [7, 23, 48]

ARCHS = {
    "llama": dict(cls="LlamaForCausalLM", mt="llama", hd=8, tie=False, bias=False, qkn=False,
                  theta=10000.0, dtype="float32",
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64}),
    "mistral": dict(cls="MistralForCausalLM", mt="mistral", hd=8, tie=False, bias=False,
                    qkn=False, theta=10000.0, dtype="bfloat16", rope_scaling=None),
    "qwen2": dict(cls="Qwen2ForCausalLM", mt="qwen2", hd=8, tie=True, bias=True, qkn=False,
                  theta=1000000.0, dtype="float32", rope_scaling=None),
    "qwen3": dict(cls="Qwen3ForCausalLM", mt="qwen3", hd=16, tie=True, bias=False, qkn=True,
                  theta=1000000.0, dtype="float32", rope_scaling=None),
}


def make_config(a):
    cfg = {
        "architectures": [a["cls"]], "model_type": a["mt"], "vocab_size": V,
        "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": a["hd"],
        "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": a["theta"], "rope_scaling": a["rope_scaling"],
        "tie_word_embeddings": a["tie"], "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": a["dtype"],
    }
    if a["mt"] == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    if a["mt"] in ("mistral", "qwen2", "qwen3"):
        cfg["sliding_window"] = None
    if a["mt"] == "qwen3":
        cfg["attention_bias"] = False
    return cfg


def make_weights(a, gen):
    hd = a["hd"]
    QD, KVD = NH * hd, NKV * hd

    def randn(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    # tied: the embedding is also the lm_head, so its scale sets the logits' spread
    w = {"model.embed_tokens.weight": randn(V, C, std=0.45 if a["tie"] else 1.0)}
    for l in range(L):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1.0 + randn(C, std=0.2)
        w[p + "self_attn.q_proj.weight"] = randn(QD, C, std=1.5 / C ** 0.5)
        w[p + "self_attn.k_proj.weight"] = randn(KVD, C, std=1.5 / C ** 0.5)
        w[p + "self_attn.v_proj.weight"] = randn(KVD, C, std=1.0 / C ** 0.5)
        if a["bias"]:
            w[p + "self_attn.q_proj.bias"] = randn(QD, std=0.5)
            w[p + "self_attn.k_proj.bias"] = randn(KVD, std=0.5)
            w[p + "self_attn.v_proj.bias"] = randn(KVD, std=0.5)
        if a["qkn"]:
            w[p + "self_attn.q_norm.weight"] = 1.0 + randn(hd, std=0.3)
            w[p + "self_attn.k_norm.weight"] = 1.0 + randn(hd, std=0.3)
        w[p + "self_attn.o_proj.weight"] = randn(C, QD, std=1.0 / QD ** 0.5)
        w[p + "post_attention_layernorm.weight"] = 1.0 + randn(C, std=0.2)
        w[p + "mlp.gate_proj.weight"] = randn(F, C, std=1.0 / C ** 0.5)
        w[p + "mlp.up_proj.weight"] = randn(F, C, std=1.0 / C ** 0.5)
        w[p + "mlp.down_proj.weight"] = randn(C, F, std=1.0 / F ** 0.5)
    w["model.norm.weight"] = 1.0 + randn(C, std=0.2)
    if not a["tie"]:
        w["lm_head.weight"] = randn(V, C, std=2.5 / C ** 0.5)
    store = torch.bfloat16 if a["dtype"] == "bfloat16" else torch.float32
    return {k: v.to(store).contiguous() for k, v in w.items()}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
    for i, (name, a) in enumerate(sorted(ARCHS.items())):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        gen = torch.Generator().manual_seed(1000 + i)
        cfg = make_config(a)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        save_file(make_weights(a, gen), os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        # the reference reads back exactly what was stored, in float64
        cfg2, w = llama_ref.load_checkpoint(d, torch.float64)
        model = llama_ref.Model(cfg2, w, torch.float64)
        seqs, logps, last_rows = [], [], []
        for T in LENGTHS:
            ids = torch.randint(0, V, (1, T), generator=gen)
            with torch.no_grad():
                lp = model.logsoftmax(model.forward(ids))[0]   # (T, V)
            nxt = lp[:-1].gather(1, ids[0, 1:, None])[:, 0]
            seqs.append(ids[0].tolist())
            logps.append(nxt.tolist())
            last_rows.append(lp[-1].tolist())
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump({"reference": "tests/py/llama_ref.py float64", "sequences": seqs,
                       "logprobs": logps, "last_row": last_rows}, f)
        flat = torch.tensor([x for s in logps for x in s])
        print("%s: %d sequences, log-probs in [%.3f, %.3f], mean %.3f" %
              (name, len(seqs), flat.min(), flat.max(), flat.mean()))


if __name__ == "__main__":
    main()
