"""Independent PyTorch reference of the Hugging Face Llama-family forward (Llama 2/3, Mistral,
Qwen2, Qwen3), written from the conventions of transformers' modeling_llama / modeling_qwen2 /
modeling_qwen3 (not from tidal): eager attention, rotate-half RoPE, RMSNorm in fp32 or fp64,
repeat_kv for GQA, SwiGLU MLP, tied lm_head. Used by make_golden.py (float64) and by
tests/bench/torch_model.py (float32, the bench peer). Needs torch and safetensors only.
"""
import json
import math
import os

import torch


def load_checkpoint(d, dtype):
    """config dict + {name: tensor in dtype} from a directory with config.json and
    model.safetensors (one shard, or an index of shards)."""
    from safetensors.torch import load_file
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for fn in files:
        for k, v in load_file(os.path.join(d, fn)).items():
            w[k] = v.to(dtype)
    return cfg, w


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def inv_freq(cfg, dtype):
    """HF default rope init, then _compute_llama3_parameters when rope_scaling is llama3."""
    hd = head_dim(cfg)
    base = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor = rs["factor"]
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / f
        f_l = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - low) / (high - low)
        smoothed = (1 - smooth) * f_l / factor + smooth * f_l
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        f = torch.where(medium, smoothed, f_l)
    return f.to(dtype)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model:
    """The forward over (B, T) token ids at positions pos0..pos0+T-1, with an optional
    preallocated KV cache (L, B, NKV, Tmax, HD) for incremental decoding."""

    def __init__(self, cfg, w, dtype):
        self.cfg, self.w, self.dtype = cfg, w, dtype
        self.C = cfg["hidden_size"]
        self.NH = cfg["num_attention_heads"]
        self.NKV = cfg.get("num_key_value_heads", self.NH)
        self.HD = head_dim(cfg)
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.inv_freq = inv_freq(cfg, dtype)
        self.lm_head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") \
            else w["lm_head.weight"]
        self.qk_norm = "model.layers.0.self_attn.q_norm.weight" in w

    def rope(self, pos):
        freqs = pos.to(self.dtype)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def lin(self, x, name):
        return torch.nn.functional.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def forward(self, ids, pos0=0, cache=None):
        """ids (B, T) -> final hidden states (B, T, C). With cache=(K, V) the new keys/values
        are written at pos0.. and attention reads 0..pos0+T-1."""
        B, T = ids.shape
        NH, NKV, HD = self.NH, self.NKV, self.HD
        x = self.w["model.embed_tokens.weight"][ids]
        cos, sin = self.rope(torch.arange(pos0, pos0 + T))
        S = pos0 + T
        # causal mask over the S visible keys: query t (position pos0+t) sees keys <= pos0+t
        mask = torch.full((T, S), float("-inf"), dtype=self.dtype)
        mask = torch.triu(mask, diagonal=pos0 + 1)
        for l in range(self.L):
            p = "model.layers.%d." % l
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = self.lin(h, p + "self_attn.q_proj").view(B, T, NH, HD)
            k = self.lin(h, p + "self_attn.k_proj").view(B, T, NKV, HD)
            v = self.lin(h, p + "self_attn.v_proj").view(B, T, NKV, HD)
            if self.qk_norm:
                q = rms_norm(q, self.w[p + "self_attn.q_norm.weight"], self.eps)
                k = rms_norm(k, self.w[p + "self_attn.k_norm.weight"], self.eps)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache is not None:
                cache[0][l, :B, :, pos0:S] = k
                cache[1][l, :B, :, pos0:S] = v
                k, v = cache[0][l, :B, :, :S], cache[1][l, :B, :, :S]
            g = NH // NKV
            k = k[:, :, None].expand(B, NKV, g, S, HD).reshape(B, NH, S, HD)
            v = v[:, :, None].expand(B, NKV, g, S, HD).reshape(B, NH, S, HD)
            att = torch.matmul(q, k.transpose(2, 3)) * (HD ** -0.5) + mask
            att = torch.softmax(att, dim=-1)
            o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, NH * HD)
            x = x + self.lin(o, p + "self_attn.o_proj")
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate = self.lin(h, p + "mlp.gate_proj")
            up = self.lin(h, p + "mlp.up_proj")
            x = x + self.lin(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    def logsoftmax(self, h):
        return torch.log_softmax(torch.nn.functional.linear(h, self.lm_head), dim=-1)

    def new_cache(self, B, Tmax):
        shape = (self.L, B, self.NKV, Tmax, self.HD)
        return (torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
