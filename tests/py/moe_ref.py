"""Independent float64 reference forward of Hugging Face's mixture-of-experts decoders (Mixtral,
Qwen2-MoE, Qwen3-MoE), written from the conventions of transformers' modeling code (4.46's
modeling_mixtral.py / modeling_qwen2_moe.py, and Qwen3-MoE's modular_qwen3_moe.py), not from
tidal: token embedding, RMSNorm, rotate-half RoPE, grouped-query eager attention (causal), and per
layer either the dense SwiGLU MLP or the sparse MoE block:

    router logits  = h @ W_gate^T                                  [T, E]
    p              = softmax(logits)                               (float64 here; HF: fp32)
    top-k          = the k largest p, largest first; equal p: the lower expert first
    weights        = p[top-k], divided by their sum when norm_topk_prob (Mixtral: always)
    moe(h)         = sum_j weights_j * down_e(silu(gate_e(h)) * up_e(h)),  e = top-k[j]
    Qwen2-MoE adds sigmoid(h @ w_shared_gate^T) * shared_expert(h).

A layer is sparse iff it is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0
(Mixtral: every layer). Reads transformers 4's per-expert tensors and transformers 5's fused ones
(mlp.experts.gate_up_proj [E, 2I, H]: gate rows then up rows; mlp.experts.down_proj [E, H, I];
router mlp.gate.weight), float32 / bfloat16 / float16 storage widened to float64, and both config
generations ("torch_dtype" / "dtype", "rope_theta" / "rope_parameters", Qwen3-MoE's "num_experts"
or v5's "num_local_experts"). Every tensor of the checkpoint must be used, once.

API: cfg, weights = load(dir); logprobs, routing = forward(cfg, weights, ids)
  logprobs [T, V] float64 numpy (row t: log-softmax of the logits at position t, predicting t+1)
  routing  one entry per MoE layer, in layer order: (experts int64 [T, K] in top-k order,
           probs float64 [T, E] router softmax); topk_margin(probs, k) gives the k-th minus the
           (k+1)-th largest probability (what /routing/margin_a records for path A).
Needs torch and safetensors.
"""
import json
import os

import numpy as np
import torch

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
_BY_CLASS = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}


def _read_tensors(d):
    from safetensors.torch import load_file
    idx = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    t = {}
    for fn in files:
        for k, v in load_file(os.path.join(d, fn)).items():
            if k in t:
                raise ValueError(f"{d}: tensor {k} in two shards")
            t[k] = v.to(torch.float64)
    return t


def _arch(raw):
    a = raw.get("model_type")
    if a in ARCHS:
        return a
    for name in raw.get("architectures") or []:
        if name in _BY_CLASS:
            return _BY_CLASS[name]
    raise ValueError(f"not a Mixtral / Qwen2-MoE / Qwen3-MoE config (model_type {a!r})")


def normalize_config(raw):
    """The settings the forward needs, from a transformers 4 or 5 config.json."""
    arch = _arch(raw)
    H, NH = raw["hidden_size"], raw["num_attention_heads"]
    rp = raw.get("rope_parameters")
    theta = raw.get("rope_theta")
    if isinstance(rp, dict) and "rope_theta" in rp:
        if rp.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rp.get('rope_type')!r}: only default RoPE here")
        theta = rp["rope_theta"]
    if raw.get("rope_scaling"):
        raise ValueError("rope_scaling: only default RoPE here")
    if theta is None:
        theta = 1e6 if arch == "mixtral" else 10000.0
    if arch == "mixtral":
        E = raw.get("num_local_experts", raw.get("num_experts", 8))
    else:
        E = raw.get("num_experts", raw.get("num_local_experts"))
    for k in ("n_group", "topk_group", "scoring_func", "routed_scaling_factor", "e_score_correction_bias"):
        if raw.get(k) not in (None, "softmax", 1.0):
            raise ValueError(f"{k}: a router this reference does not model")
    if raw.get("use_sliding_window") or (arch == "mixtral" and raw.get("sliding_window")):
        raise ValueError("sliding-window attention: not modelled here")
    c = dict(arch=arch, V=raw["vocab_size"], H=H, NH=NH, NKV=raw.get("num_key_value_heads") or NH,
             HD=raw.get("head_dim") or H // NH, L=raw["num_hidden_layers"], eps=raw.get("rms_norm_eps", 1e-6),
             theta=float(theta), E=E, K=raw.get("num_experts_per_tok"),
             tie=bool(raw.get("tie_word_embeddings", False)))
    if arch == "mixtral":
        c.update(norm_topk=True, sparse=[True] * c["L"], qkv_bias=False, qk_norm=False,
                 moe_inter=raw["intermediate_size"], dense_inter=0, shared_inter=0)
    else:
        step = raw.get("decoder_sparse_step", 1)
        mlp_only = raw.get("mlp_only_layers") or []
        c.update(norm_topk=bool(raw.get("norm_topk_prob", False)),
                 sparse=[l not in mlp_only and E > 0 and (l + 1) % step == 0 for l in range(c["L"])],
                 qkv_bias=bool(raw.get("qkv_bias", True)) if arch == "qwen2_moe"
                 else bool(raw.get("attention_bias", False)),
                 qk_norm=arch == "qwen3_moe", moe_inter=raw["moe_intermediate_size"],
                 dense_inter=raw["intermediate_size"],
                 shared_inter=raw.get("shared_expert_intermediate_size", 0) if arch == "qwen2_moe" else 0)
    if not (isinstance(c["E"], int) and isinstance(c["K"], int) and 1 <= c["K"] <= c["E"]):
        raise ValueError(f"num_experts {c['E']!r}, num_experts_per_tok {c['K']!r}")
    return c


def load(d):
    """(cfg, weights) of a checkpoint directory: cfg from normalize_config, weights a dict of
    float64 tensors in one canonical form (layers[l] with attention, norms and either "mlp" or
    "moe" = {router [E,H], gate [E,I,H], up [E,I,H], down [E,H,I], shared..."})."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = normalize_config(json.load(f))
    t = _read_tensors(d)
    used = set()

    def take(name, shape):
        if name not in t:
            raise KeyError(f"{d}: tensor {name} missing")
        if tuple(t[name].shape) != tuple(shape):
            raise ValueError(f"{d}: {name} has shape {tuple(t[name].shape)}, expected {tuple(shape)}")
        if name in used:
            raise ValueError(f"{d}: {name} used twice")
        used.add(name)
        return t[name]

    V, H, NH, NKV, HD, E = cfg["V"], cfg["H"], cfg["NH"], cfg["NKV"], cfg["HD"], cfg["E"]
    I, ID, IS = cfg["moe_inter"], cfg["dense_inter"], cfg["shared_inter"]
    mixtral = cfg["arch"] == "mixtral"
    w = {"embed": take("model.embed_tokens.weight", (V, H)), "norm": take("model.norm.weight", (H,))}
    w["lm_head"] = w["embed"] if cfg["tie"] else take("lm_head.weight", (V, H))
    w["layers"] = []
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        ly = {"in_norm": take(p + "input_layernorm.weight", (H,)),
              "post_norm": take(p + "post_attention_layernorm.weight", (H,)),
              "q": take(a + "q_proj.weight", (NH * HD, H)), "k": take(a + "k_proj.weight", (NKV * HD, H)),
              "v": take(a + "v_proj.weight", (NKV * HD, H)), "o": take(a + "o_proj.weight", (H, NH * HD))}
        if cfg["qkv_bias"]:
            ly.update(q_b=take(a + "q_proj.bias", (NH * HD,)), k_b=take(a + "k_proj.bias", (NKV * HD,)),
                      v_b=take(a + "v_proj.bias", (NKV * HD,)))
        if cfg["qk_norm"]:
            ly.update(q_norm=take(a + "q_norm.weight", (HD,)), k_norm=take(a + "k_norm.weight", (HD,)))
        if not cfg["sparse"][l]:
            ly["mlp"] = {"gate": take(p + "mlp.gate_proj.weight", (ID, H)),
                         "up": take(p + "mlp.up_proj.weight", (ID, H)),
                         "down": take(p + "mlp.down_proj.weight", (H, ID))}
            w["layers"].append(ly)
            continue
        moe = {}
        if p + "mlp.experts.gate_up_proj" in t:          # transformers 5, fused
            gu = take(p + "mlp.experts.gate_up_proj", (E, 2 * I, H))
            moe.update(gate=gu[:, :I], up=gu[:, I:], down=take(p + "mlp.experts.down_proj", (E, H, I)),
                       router=take(p + "mlp.gate.weight", (E, H)))
        else:                                             # transformers 4, per expert
            blk = p + ("block_sparse_moe." if mixtral else "mlp.")
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            moe.update(gate=torch.stack([take(blk + f"experts.{e}.{names[0]}.weight", (I, H)) for e in range(E)]),
                       up=torch.stack([take(blk + f"experts.{e}.{names[1]}.weight", (I, H)) for e in range(E)]),
                       down=torch.stack([take(blk + f"experts.{e}.{names[2]}.weight", (H, I)) for e in range(E)]),
                       router=take(blk + "gate.weight", (E, H)))
        if IS:
            s = p + "mlp.shared_expert."
            moe["shared"] = {"gate": take(s + "gate_proj.weight", (IS, H)), "up": take(s + "up_proj.weight", (IS, H)),
                             "down": take(s + "down_proj.weight", (H, IS))}
            moe["shared_gate"] = take(p + "mlp.shared_expert_gate.weight", (1, H))
        ly["moe"] = moe
        w["layers"].append(ly)
    left = sorted(set(t) - used)
    if left:
        raise ValueError(f"{d}: tensors not used by the {cfg['arch']} forward: {left[:6]}")
    return cfg, w


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def swiglu(x, gate, up, down):
    return torch.nn.functional.silu(x @ gate.T) * (x @ up.T) @ down.T


def topk_order(p, k):
    """Indices of the k largest entries of each row of p, largest first; equal values: the lower
    index first (a stable sort of -p)."""
    order = torch.sort(-p, dim=-1, stable=True).indices
    return order[..., :k]


def topk_margin(probs, k):
    """k-th minus (k+1)-th largest probability per row (NaN when k == E)."""
    s = np.sort(np.asarray(probs), axis=-1)[..., ::-1]
    if k >= s.shape[-1]:
        return np.full(s.shape[:-1], np.nan)
    return s[..., k - 1] - s[..., k]


def moe_block(cfg, m, h):
    """h [T, H] -> (out [T, H], experts [T, K], probs [T, E])."""
    probs = torch.softmax(h @ m["router"].T, dim=-1)
    idx = topk_order(probs, cfg["K"])
    wts = probs.gather(-1, idx)
    if cfg["norm_topk"]:
        wts = wts / wts.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for j in range(cfg["K"]):
        for e in idx[:, j].unique().tolist():
            rows = (idx[:, j] == e).nonzero()[:, 0]
            out[rows] += wts[rows, j, None] * swiglu(h[rows], m["gate"][e], m["up"][e], m["down"][e])
    if "shared" in m:
        s = m["shared"]
        out = out + torch.sigmoid(h @ m["shared_gate"].T) * swiglu(h, s["gate"], s["up"], s["down"])
    return out, idx, probs


@torch.no_grad()
def forward(cfg, w, ids):
    """ids (sequence of T token ids) -> (logprobs [T, V] float64, routing per MoE layer)."""
    ids = torch.as_tensor(list(ids), dtype=torch.int64)
    T = ids.shape[0]
    NH, NKV, HD, eps = cfg["NH"], cfg["NKV"], cfg["HD"], cfg["eps"]
    inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]          # [T, 1, HD]
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), diagonal=1)
    g = NH // NKV
    x = w["embed"][ids]
    routing = []
    for ly in w["layers"]:
        h = rms_norm(x, ly["in_norm"], eps)
        q = (h @ ly["q"].T + ly.get("q_b", 0)).view(T, NH, HD)
        k = (h @ ly["k"].T + ly.get("k_b", 0)).view(T, NKV, HD)
        v = (h @ ly["v"].T + ly.get("v_b", 0)).view(T, NKV, HD)
        if cfg["qk_norm"]:
            q = rms_norm(q, ly["q_norm"], eps)
            k = rms_norm(k, ly["k_norm"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # [heads, T, HD]
        k = k.repeat_interleave(g, dim=0)      # head i reads KV head i // g (HF repeat_kv)
        v = v.repeat_interleave(g, dim=0)
        att = torch.softmax(q @ k.transpose(1, 2) * HD ** -0.5 + mask, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(T, NH * HD)
        x = x + o @ ly["o"].T
        h = rms_norm(x, ly["post_norm"], eps)
        if "moe" in ly:
            out, idx, probs = moe_block(cfg, ly["moe"], h)
            routing.append((idx.numpy().copy(), probs.numpy().copy()))
        else:
            m = ly["mlp"]
            out = swiglu(h, m["gate"], m["up"], m["down"])
        x = x + out
    x = rms_norm(x, w["norm"], eps)
    return torch.log_softmax(x @ w["lm_head"].T, dim=-1).numpy(), routing
