#!/usr/bin/env python3
"""Tiny random-weight mixture-of-experts checkpoints (config.json + model.safetensors) for the
MoE tests: Mixtral, Qwen2-MoE and Qwen3-MoE, in transformers 4's per-expert layout or in
transformers 5's fused one, stored in float32 or bfloat16.

    python make_moe_checkpoints.py OUTDIR       # every arch x variant x layout x storage

make(outdir, arch, layout, storage, seed, variant=None) writes one directory. The weights depend on
(arch, variant, seed) only, not on the layout, so a per-expert and a fused checkpoint of the same
seed hold the same numbers (bfloat16: rounded to nearest even from the same float32 draw).

Shapes: hidden 64, 4 heads, 2 KV heads, head_dim 16, vocab 128 (lm_head untied), 3 layers, 8
experts, expert intermediate 32, rms_norm_eps 1e-6, rope_theta 10000, 512 positions. Weights
N(0, 0.1), routers N(0, ROUTER_STD = 0.25), norms 1 + 0.1 N(0, 1). The router's input is
RMS-normalised (norm ~ sqrt(64) = 8), so N(0, 0.5) would give router logits of std ~4: top-1 then
takes ~75% of the probability and the k-th expert a median ~4% (measured on qwen3_moe "b"), which
leaves the non-top experts nearly unchecked; with 0.25 top-1 takes a median ~50% and the k-th ~11%,
and the routing still varies token to token (the top-k margins: median ~3e-2, 1st percentile
~4e-4).
  mixtral        top-2, always renormalised (Mixtral has no norm_topk_prob); its intermediate_size
                 is the experts' size (32).
  qwen2_moe      top-2, norm_topk_prob false (Qwen1.5-MoE), q/k/v biases, shared expert (48) with
                 its sigmoid gate, dense intermediate 96, decoder_sparse_step 1, mlp_only_layers
                 [1]: layers 0 and 2 sparse, 1 dense.
  qwen3_moe "a"  top-2, norm_topk_prob true, q_norm/k_norm, no biases, dense intermediate 96,
                 mlp_only_layers [0]: layers 1, 2 sparse.
  qwen3_moe "b"  top-3 (summation order matters with k > 2), norm_topk_prob false, 4 layers,
                 decoder_sparse_step 2: layers 1 and 3 sparse, 0 and 2 dense.

Layouts
-------
"per-expert" (transformers 4, and what transformers 5's save_pretrained writes by default):
  Mixtral and Qwen2-MoE are built with transformers 4.46 itself (MixtralForCausalLM,
  Qwen2MoeForCausalLM), given these weights (load_state_dict, strict) and saved with
  save_pretrained(safe_serialization=True):
    mixtral    model.layers.{l}.block_sparse_moe.gate.weight [E, H]
               model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight [I, H] (gate), .w3 [I, H] (up),
               .w2 [H, I] (down)
    qwen2_moe  model.layers.{l}.mlp.gate.weight [E, H], mlp.experts.{e}.{gate,up,down}_proj.weight,
               mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight [1, H]
  Qwen3-MoE is not in transformers 4.46: its config.json and safetensors are written by hand with
  the names of transformers >= 4.51 (Qwen3MoeForCausalLM): mlp.gate.weight,
  mlp.experts.{e}.{gate,up,down}_proj.weight, self_attn.q_norm.weight / k_norm.weight [head_dim],
  config keys num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
  decoder_sparse_step, mlp_only_layers, head_dim, rope_theta, torch_dtype.

"fused" (transformers 5's runtime layout), per MoE layer:
    model.layers.{l}.mlp.gate.weight          [E, H]       the router
    model.layers.{l}.mlp.experts.gate_up_proj [E, 2I, H]   expert e: rows 0..I-1 gate, I..2I-1 up
    model.layers.{l}.mlp.experts.down_proj    [E, H, I]
  Qwen2-MoE's shared expert keeps its names (mlp.shared_expert.*, mlp.shared_expert_gate.weight).

What transformers 5 does, and where it says so (huggingface/transformers, main branch, read
through stored copies of the repository's files; commits named where the store gave them):
  * src/transformers/conversion_mapping.py (commit 000c33fdfde12e1ffafbfcdb3c926df5727a00b6,
    _build_checkpoint_conversion_mapping): "mixtral":
    WeightRenaming(".block_sparse_moe.gate", ".mlp.gate"); block_sparse_moe.experts.*.w1.weight and
    .w3.weight -> mlp.experts.gate_up_proj by MergeModulelist(dim=0) then Concatenate(dim=1) (so
    [E, I, H] gates then [E, I, H] ups along dim 1: gate rows first); .w2.weight ->
    mlp.experts.down_proj by MergeModulelist(dim=0). "qwen2_moe": mlp.experts.*.gate_proj / up_proj
    -> mlp.experts.gate_up_proj (same two operations), down_proj -> mlp.experts.down_proj;
    "qwen3_moe" = a copy of qwen2_moe's. No rule touches shared_expert / shared_expert_gate.
    So in v5 Mixtral's block is `mlp` (block_sparse_moe is renamed), and its router is mlp.gate.
  * src/transformers/models/mixtral/modeling_mixtral.py, main L61-L135 (as quoted, with its URL, by a
    third-party snapshot dated 2026-05-03; the store's own copies of that file were 4.x versions):
    MixtralExperts.gate_up_proj = Parameter(empty(num_experts, 2 * intermediate_dim, hidden_dim)),
    down_proj = Parameter(empty(num_experts, hidden_dim, intermediate_dim)); forward:
    `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`; MixtralTopKRouter.weight
    [num_experts, hidden]: softmax(logits.float()), topk, renormalise.
  * src/transformers/models/qwen2_moe/modular_qwen2_moe.py (commit 001f85b38fb4...):
    Qwen2MoeExperts(MixtralExperts) with intermediate_dim = moe_intermediate_size;
    Qwen2MoeTopKRouter.weight; Qwen2MoeSparseMoeBlock keeps shared_expert (Qwen2MoeMLP) and
    shared_expert_gate (Linear(hidden, 1)); attention biases from config.qkv_bias.
    qwen3_moe/modular_qwen3_moe.py (commit 00eb11666852...): Qwen3MoeExperts(Qwen2MoeExperts),
    Qwen3MoeTopKRouter(Qwen2MoeTopKRouter), no shared expert.
  * Saving: https://huggingface.co/docs/transformers/main/en/weightconverter ("Operations are fully
    reversible. Saving reverses the conversions"), and docs fusion_mapping.md: "By default,
    save_pretrained uses the reverse conversion path to restore the original checkpoint layout.
    Pass save_original_format=False to keep the converted runtime layout instead." So the fused
    tensors reach disk from save_pretrained(save_original_format=False) and from models published
    fused (vllm-project/vllm PR 36997: "checkpoints released after Transformers v5 or re-saved with
    save_original_format=False"); a default v5 save of these three archs is per-expert.
  * Config keys v5 writes (configuration_*.py at commit 008e574391258935f3ecc3035c882e73bbcac419,
    configuration_utils.py there: to_json_string(use_diff=True), sort_keys=True, to_dict() is
    self.__dict__): "dtype" instead of "torch_dtype"; "rope_parameters": {"rope_theta",
    "rope_type"} instead of "rope_theta"; MixtralConfig has head_dim: int | None = None (written as
    null), sliding_window None; Qwen2MoeConfig has qkv_bias: bool = True, layer_types, and
    __post_init__ sets `sliding_window = sliding_window if use_sliding_window else 0` (written as
    0); Qwen3MoeConfig declares attribute_map = {"num_experts": "num_local_experts"}, and since
    PreTrainedConfig.__setattr__ stores a mapped attribute under its target name, a v5 save of a
    Qwen3-MoE writes "num_local_experts", not "num_experts". The fused checkpoints here carry such a
    v5 config (v5_config below); the per-expert ones a transformers 4 config.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
LAYOUTS = ("per-expert", "fused")
STORAGES = ("f32", "bf16")
VARIANTS = {"mixtral": (None,), "qwen2_moe": (None,), "qwen3_moe": ("a", "b")}
DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}
DTYPE_NAME = {"f32": "float32", "bf16": "bfloat16"}
ROUTER_STD = 0.25
HF_ARCH = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def hparams(arch, variant=None):
    """The shapes and MoE settings of one tiny model."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}")
    if variant not in VARIANTS[arch]:
        raise ValueError(f"{arch}: unknown variant {variant!r} (have {VARIANTS[arch]})")
    hp = dict(arch=arch, variant=variant, vocab=128, hidden=64, heads=4, kv_heads=2, head_dim=16, layers=3,
              experts=8, top_k=2, moe_inter=32, dense_inter=96, shared_inter=0, norm_topk_prob=True,
              decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=False, qk_norm=False, eps=1e-6,
              theta=10000.0, max_pos=512)
    if arch == "qwen2_moe":
        hp.update(shared_inter=48, norm_topk_prob=False, mlp_only_layers=[1], qkv_bias=True)
    elif arch == "qwen3_moe":
        hp.update(qk_norm=True)
        if variant == "a":
            hp.update(norm_topk_prob=True, mlp_only_layers=[0])
        else:
            hp.update(top_k=3, norm_topk_prob=False, layers=4, decoder_sparse_step=2)
    return hp


def sparse_layers(hp):
    """transformers' rule: layer l is an MoE layer iff l is not in mlp_only_layers and
    (l + 1) % decoder_sparse_step == 0 (Mixtral: every layer)."""
    return [l not in hp["mlp_only_layers"] and (l + 1) % hp["decoder_sparse_step"] == 0
            for l in range(hp["layers"])]


def random_weights(hp, seed):
    """{transformers 4 per-expert name: float32 tensor}; the draw order is fixed."""
    g = torch.Generator().manual_seed(int(seed))
    V, H, NH, NKV, HD = hp["vocab"], hp["hidden"], hp["heads"], hp["kv_heads"], hp["head_dim"]
    E, I, ID, IS = hp["experts"], hp["moe_inter"], hp["dense_inter"], hp["shared_inter"]
    w = {}

    def rnd(name, *shape, std=0.1):
        w[name] = torch.randn(*shape, generator=g, dtype=torch.float32) * std

    def norm(name, n):
        w[name] = 1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float32)

    rnd("model.embed_tokens.weight", V, H)
    mixtral = hp["arch"] == "mixtral"
    for l, sparse in enumerate(sparse_layers(hp)):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        rnd(p + "self_attn.q_proj.weight", NH * HD, H)
        rnd(p + "self_attn.k_proj.weight", NKV * HD, H)
        rnd(p + "self_attn.v_proj.weight", NKV * HD, H)
        rnd(p + "self_attn.o_proj.weight", H, NH * HD)
        if hp["qkv_bias"]:
            rnd(p + "self_attn.q_proj.bias", NH * HD)
            rnd(p + "self_attn.k_proj.bias", NKV * HD)
            rnd(p + "self_attn.v_proj.bias", NKV * HD)
        if hp["qk_norm"]:
            norm(p + "self_attn.q_norm.weight", HD)
            norm(p + "self_attn.k_norm.weight", HD)
        if not sparse:
            rnd(p + "mlp.gate_proj.weight", ID, H)
            rnd(p + "mlp.up_proj.weight", ID, H)
            rnd(p + "mlp.down_proj.weight", H, ID)
            continue
        blk = p + ("block_sparse_moe." if mixtral else "mlp.")
        rnd(blk + "gate.weight", E, H, std=ROUTER_STD)
        for e in range(E):
            if mixtral:
                rnd(blk + f"experts.{e}.w1.weight", I, H)
                rnd(blk + f"experts.{e}.w3.weight", I, H)
                rnd(blk + f"experts.{e}.w2.weight", H, I)
            else:
                rnd(blk + f"experts.{e}.gate_proj.weight", I, H)
                rnd(blk + f"experts.{e}.up_proj.weight", I, H)
                rnd(blk + f"experts.{e}.down_proj.weight", H, I)
        if IS:
            rnd(blk + "shared_expert.gate_proj.weight", IS, H)
            rnd(blk + "shared_expert.up_proj.weight", IS, H)
            rnd(blk + "shared_expert.down_proj.weight", H, IS)
            rnd(blk + "shared_expert_gate.weight", 1, H)
    norm("model.norm.weight", H)
    rnd("lm_head.weight", V, H)
    return w


def fuse(w, hp):
    """transformers 5's layout of the same tensors: per MoE layer mlp.gate.weight,
    mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up rows), mlp.experts.down_proj [E, H, I]."""
    mixtral = hp["arch"] == "mixtral"
    out = {}
    E = hp["experts"]
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for l, sparse in enumerate(sparse_layers(hp)):
        if not sparse:
            continue
        blk = f"model.layers.{l}." + ("block_sparse_moe." if mixtral else "mlp.")
        new = f"model.layers.{l}.mlp."
        stack = [torch.stack([w.pop(blk + f"experts.{e}.{n}.weight") for e in range(E)]) for n in names]
        out[new + "experts.gate_up_proj"] = torch.cat([stack[0], stack[1]], dim=1).contiguous()
        out[new + "experts.down_proj"] = stack[2].contiguous()
        out[new + "gate.weight"] = w.pop(blk + "gate.weight")
    out.update(w)   # attention, norms, dense MLPs, the shared expert: names unchanged
    return out


def _common_config(hp):
    return {
        "vocab_size": hp["vocab"], "hidden_size": hp["hidden"], "num_hidden_layers": hp["layers"],
        "num_attention_heads": hp["heads"], "num_key_value_heads": hp["kv_heads"], "hidden_act": "silu",
        "max_position_embeddings": hp["max_pos"], "initializer_range": 0.02, "rms_norm_eps": hp["eps"],
        "use_cache": True, "tie_word_embeddings": False, "attention_dropout": 0.0,
        "num_experts_per_tok": hp["top_k"], "output_router_logits": False, "router_aux_loss_coef": 0.001,
    }


def hf4_kwargs(hp):
    """Keyword arguments of transformers 4.46's MixtralConfig / Qwen2MoeConfig."""
    c = _common_config(hp)
    c.update(rope_theta=hp["theta"])
    if hp["arch"] == "mixtral":
        c.update(intermediate_size=hp["moe_inter"], num_local_experts=hp["experts"], sliding_window=None,
                 router_jitter_noise=0.0, bos_token_id=1, eos_token_id=2)
    else:
        c.update(intermediate_size=hp["dense_inter"], num_experts=hp["experts"], moe_intermediate_size=hp["moe_inter"],
                 shared_expert_intermediate_size=hp["shared_inter"], norm_topk_prob=hp["norm_topk_prob"],
                 decoder_sparse_step=hp["decoder_sparse_step"], mlp_only_layers=list(hp["mlp_only_layers"]),
                 use_sliding_window=False, max_window_layers=hp["layers"])
    return c


def qwen3_hf4_config(hp, storage):
    """config.json as transformers 4.51-4.57 writes a Qwen3MoeConfig."""
    c = _common_config(hp)
    c.update(architectures=[HF_ARCH["qwen3_moe"]], model_type="qwen3_moe", torch_dtype=DTYPE_NAME[storage],
             transformers_version="4.51.0", intermediate_size=hp["dense_inter"], head_dim=hp["head_dim"],
             rope_theta=hp["theta"], rope_scaling=None, attention_bias=False, use_sliding_window=False,
             sliding_window=None, max_window_layers=hp["layers"], decoder_sparse_step=hp["decoder_sparse_step"],
             moe_intermediate_size=hp["moe_inter"], num_experts=hp["experts"], norm_topk_prob=hp["norm_topk_prob"],
             mlp_only_layers=list(hp["mlp_only_layers"]), bos_token_id=None, eos_token_id=None)
    return c


def v5_config(hp, storage):
    """config.json as transformers 5 writes it (see the module docstring for the sources): "dtype",
    "rope_parameters", Mixtral's head_dim null, Qwen2-MoE's qkv_bias / layer_types / sliding_window 0,
    Qwen3-MoE's num_experts stored as "num_local_experts"."""
    arch = hp["arch"]
    c = _common_config(hp)
    c.update(architectures=[HF_ARCH[arch]], model_type=arch, dtype=DTYPE_NAME[storage],
             transformers_version="5.0.0", rope_parameters={"rope_theta": hp["theta"], "rope_type": "default"})
    if arch == "mixtral":
        c.update(intermediate_size=hp["moe_inter"], num_local_experts=hp["experts"], head_dim=None,
                 sliding_window=None, router_jitter_noise=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    elif arch == "qwen2_moe":
        c.update(intermediate_size=hp["dense_inter"], num_experts=hp["experts"], moe_intermediate_size=hp["moe_inter"],
                 shared_expert_intermediate_size=hp["shared_inter"], norm_topk_prob=hp["norm_topk_prob"],
                 decoder_sparse_step=hp["decoder_sparse_step"], mlp_only_layers=list(hp["mlp_only_layers"]),
                 use_sliding_window=False, sliding_window=0, max_window_layers=28, qkv_bias=True,
                 layer_types=["full_attention"] * hp["layers"], bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)
    else:
        c.update(intermediate_size=hp["dense_inter"], num_local_experts=hp["experts"],
                 moe_intermediate_size=hp["moe_inter"], norm_topk_prob=hp["norm_topk_prob"],
                 decoder_sparse_step=hp["decoder_sparse_step"], mlp_only_layers=list(hp["mlp_only_layers"]),
                 head_dim=hp["head_dim"], attention_bias=False, use_sliding_window=False, sliding_window=None,
                 bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return dict(sorted(c.items()))


def _write_config(outdir, cfg):
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def _save_with_transformers(outdir, hp, w, storage):
    """Builds the model with transformers 4.46, gives it w (strict: the names must be HF's own) and
    saves it with save_pretrained (per-expert hub layout). Without transformers: the same names and
    transformers 4's config keys, written by hand."""
    try:
        import transformers
    except ImportError:
        cfg = hf4_kwargs(hp)
        cfg.update(architectures=[HF_ARCH[hp["arch"]]], model_type=hp["arch"], torch_dtype=DTYPE_NAME[storage],
                   transformers_version="4.46.3")
        _write_config(outdir, dict(sorted(cfg.items())))
        save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(outdir, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    if hp["arch"] == "mixtral":
        cfg = transformers.MixtralConfig(**hf4_kwargs(hp))
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2MoeConfig(**hf4_kwargs(hp))
        model = transformers.Qwen2MoeForCausalLM(cfg)
    have = set(model.state_dict())
    if have != set(w):
        raise RuntimeError(f"{hp['arch']}: names differ from transformers': only ours {sorted(set(w) - have)[:5]}, "
                           f"only transformers' {sorted(have - set(w))[:5]}")
    model.load_state_dict({k: v.float() for k, v in w.items()}, strict=True)
    model = model.to(DTYPE[storage])
    model.config.torch_dtype = DTYPE[storage]
    model.save_pretrained(outdir, safe_serialization=True)


def make(outdir, arch, layout="per-expert", storage="f32", seed=0, variant=None):
    """Writes one checkpoint directory (config.json + model.safetensors) and returns its path.
    arch: mixtral | qwen2_moe | qwen3_moe; layout: per-expert | fused; storage: f32 | bf16;
    variant: qwen3_moe only, "a" (default) or "b" (see the module docstring)."""
    if arch == "qwen3_moe" and variant is None:
        variant = "a"
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    if storage not in STORAGES:
        raise ValueError(f"unknown storage {storage!r}")
    hp = hparams(arch, variant)
    w = {k: v.to(DTYPE[storage]) for k, v in random_weights(hp, seed).items()}
    os.makedirs(outdir, exist_ok=True)
    if layout == "per-expert" and arch in ("mixtral", "qwen2_moe"):
        _save_with_transformers(outdir, hp, w, storage)
        return outdir
    if layout == "per-expert":
        _write_config(outdir, qwen3_hf4_config(hp, storage))
    else:
        _write_config(outdir, v5_config(hp, storage))
        w = fuse(w, hp)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(outdir, "model.safetensors"),
              metadata={"format": "pt"})
    return outdir


# ---- helpers for the bad-input checks

def patch_config(d, **kv):
    """Sets (value not None) or removes (None) config.json keys."""
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    for k, v in kv.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    _write_config(d, c)


def edit_tensors(d, drop=(), replace=None):
    """Rewrites model.safetensors without the tensors named in drop and with replace's
    {name: tensor} put in."""
    p = os.path.join(d, "model.safetensors")
    t = load_file(p)
    for k in drop:
        del t[k]
    t.update(replace or {})
    save_file({k: v.contiguous() for k, v in t.items()}, p, metadata={"format": "pt"})


def main(argv):
    if len(argv) != 2:
        print("usage: make_moe_checkpoints.py OUTDIR", file=sys.stderr)
        return 2
    for arch in ARCHS:
        for variant in VARIANTS[arch]:
            for layout in LAYOUTS:
                for storage in STORAGES:
                    name = "-".join(x for x in (arch, variant, layout, storage) if x)
                    print(make(os.path.join(argv[1], name), arch, layout, storage, seed=1, variant=variant))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
