#!/usr/bin/env python3
"""tidal-init's mixtures of experts, end to end.

1. The MoE flags write the config.json they say (--num-experts, --num-experts-per-tok,
   --moe-intermediate-size, --shared-expert-intermediate-size, --decoder-sparse-step,
   --mlp-only-layers, --norm-topk-prob / --no-norm-topk-prob; Mixtral's --num-local-experts
   spelling), and the wrong ones are usage errors (exit 2) naming the flag.
2. The MoE presets write config.json alone under --config-only (no weights: tens of GB), with the
   published values (tests/fixtures/configs/hf4/ holds the files they follow).
3. With transformers (4.46 here: Mixtral, Qwen2-MoE and OLMoE; Qwen3-MoE needs >= 4.51), tidal-init's
   random Mixtral, Qwen2-MoE and OLMoE load into transformers' own classes with no missing, unexpected
   or mismatched tensor, every tensor bit-identical to the file, and their routing is neither
   uniform nor one-hot: with routers N(0, (2/sqrt(C))^2) the top expert takes a median ~50% of
   the probability over 8 experts (required: 0.3..0.9; routers of std 0.02 would give ~0.15).
   Without transformers, part 3 is skipped and the rest still decides the exit status.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
tmp = tempfile.mkdtemp(prefix="tidal-init-moe-")


def cfg_of(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


# ---- 1. flags ----
d = os.path.join(tmp, "q3")
p = run("tidal-init", "--arch", "qwen3_moe", "--hidden-size", "64", "--num-layers", "4", "--num-heads", "4",
        "--num-kv-heads", "2", "--head-dim", "16", "--intermediate-size", "96", "--vocab-size", "128",
        "--num-experts", "6", "--num-experts-per-tok", "2", "--moe-intermediate-size", "24",
        "--decoder-sparse-step", "2", "--mlp-only-layers", "3", "--norm-topk-prob", "-o", d)
c = cfg_of(d)
check(c["architectures"] == ["Qwen3MoeForCausalLM"] and c["num_experts"] == 6 and c["num_experts_per_tok"] == 2
      and c["moe_intermediate_size"] == 24 and c["decoder_sparse_step"] == 2 and c["mlp_only_layers"] == [3]
      and c["norm_topk_prob"] is True, "qwen3_moe from flags: config.json holds E, K, FE, step, mlp_only_layers, norm")
check("E=6 K=2 FE=24 on 1 of 4 layers" in p.stderr, "tidal-init reports the expert shape: " + p.stderr.strip().splitlines()[-1])

d = os.path.join(tmp, "q2")
run("tidal-init", "--arch", "qwen2_moe", "--preset", "tiny", "--num-experts", "4", "--shared-expert-intermediate-size",
    "32", "--no-norm-topk-prob", "-o", d)
c = cfg_of(d)
check(c["num_experts"] == 4 and c["num_experts_per_tok"] == 2 and c["moe_intermediate_size"] == 32
      and c["shared_expert_intermediate_size"] == 32 and c["norm_topk_prob"] is False,
      "qwen2_moe: --preset tiny with flags over it")

d = os.path.join(tmp, "mx")
run("tidal-init", "--arch", "mixtral", "--preset", "tiny", "--num-local-experts", "4", "--intermediate-size", "48",
    "-o", d)
c = cfg_of(d)
check(c["num_local_experts"] == 4 and c["intermediate_size"] == 48 and "num_experts" not in c
      and "moe_intermediate_size" not in c, "mixtral: --num-local-experts, experts as wide as --intermediate-size")

bad = [
    (["--preset", "tiny", "--num-experts", "4"], "--num-experts", "dense architecture"),
    (["--arch", "qwen3_moe", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4", "--intermediate-size", "96",
      "--vocab-size", "128"], "--num-experts", "--moe-intermediate-size FE"),
    (["--arch", "qwen3_moe", "--preset", "tiny", "--num-experts-per-tok", "9"], "--num-experts-per-tok",
     "9 exceeds the 8 experts"),
    (["--arch", "mixtral", "--preset", "tiny", "--moe-intermediate-size", "8"], "--moe-intermediate-size",
     "not a Mixtral setting"),
    (["--arch", "mixtral", "--preset", "tiny", "--no-norm-topk-prob"], "--no-norm-topk-prob", "always renormalises"),
    (["--arch", "olmoe", "--preset", "tiny", "--moe-intermediate-size", "8"], "--moe-intermediate-size",
     "not an OLMoE setting"),
    (["--arch", "qwen3_moe", "--preset", "tiny", "--shared-expert-intermediate-size", "8"],
     "--shared-expert-intermediate-size", "Qwen2-MoE's alone"),
    (["--arch", "qwen3_moe", "--preset", "tiny", "--mlp-only-layers", "0,1"], "--mlp-only-layers", "no layer of the 2"),
    (["--arch", "qwen3_moe", "--preset", "tiny", "--mlp-only-layers", "7"], "--mlp-only-layers", "layer 7"),
    (["--arch", "qwen3_moe", "--preset", "tiny", "--num-experts", "0"], "--num-experts", "'0'"),
    (["--arch", "deepseek_v3", "--preset", "tiny"], "--arch", "qwen2_moe, qwen3_moe, mixtral"),
]
for args, flag, why in bad:
    never = os.path.join(tmp, "never")
    p = run("tidal-init", *args, "-o", never, ok=False)
    check(p.returncode == 2 and ("tidal-init: " + flag + ":") in p.stderr and why in p.stderr
          and not os.path.exists(os.path.join(never, "config.json")),
          "refused (exit 2) naming %s: %s" % (flag, p.stderr.splitlines()[0] if p.stderr else "(nothing)"))

# ---- 2. presets, config only ----
published = {"qwen3-30b-a3b": "qwen3-30b-a3b.json", "qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b.json",
             "mixtral-8x7b": "mixtral-8x7b-v0.1.json"}
keys = ["architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps",
        "tie_word_embeddings", "bos_token_id", "eos_token_id", "num_experts", "num_local_experts",
        "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
        "router_aux_loss_coef"]
for preset, fname in published.items():
    d = os.path.join(tmp, preset)
    run("tidal-init", "--preset", preset, "--dtype", "bf16", "--config-only", "-o", d)
    with open(os.path.join(ROOT, "tests", "fixtures", "configs", "hf4", fname)) as f:
        pub = json.load(f)
    c = cfg_of(d)
    diff = [k for k in keys if pub.get(k) != c.get(k)]
    check(not diff and os.listdir(d) == ["config.json"] and c["torch_dtype"] == "bfloat16",
          "--preset %s --config-only: config.json alone, as the published %s%s"
          % (preset, fname, " (differs: %s)" % diff if diff else ""))

# ---- 3. transformers loads tidal-init's MoE checkpoints ----
try:
    import torch
    import transformers
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001 - any import failure: helper missing
    print("skip part 3: transformers unavailable (%s)" % e.__class__.__name__)
    transformers = None

if transformers is not None:
    for arch in ["mixtral", "qwen2_moe", "olmoe"]:
        d = os.path.join(tmp, "hf-" + arch)
        run("tidal-init", "--arch", arch, "--preset", "tiny", "--num-layers", "3", "--seed", "4", "-o", d)
        m, info = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, output_loading_info=True,
                                                       attn_implementation="eager")
        m.eval()
        info = {k: v for k, v in info.items() if v}   # missing / unexpected / mismatched keys, error messages
        check(not info, "%s: transformers %s loads every tensor (%s)" % (arch, transformers.__version__, info or "clean"))
        st = load_file(os.path.join(d, "model.safetensors"))
        sd = m.state_dict()
        same = all(k in sd and tuple(sd[k].shape) == v.shape and bool((sd[k].numpy() == v).all()) for k, v in st.items())
        check(same and len(st) == len([k for k in sd if "rotary" not in k]),
              "%s: %d tensors, each in transformers' state dict bit for bit" % (arch, len(st)))
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 512, (1, 64), generator=g)
        with torch.no_grad():
            out = m(ids, output_router_logits=True)
        top1 = torch.cat([torch.softmax(r.float(), -1).max(-1).values for r in out.router_logits])
        med = top1.median().item()
        check(0.3 < med < 0.9 and torch.isfinite(out.logits).all().item(),
              "%s: routing neither uniform nor one-hot: median top-1 probability %.3f of 8 experts" % (arch, med))

shutil.rmtree(tmp)
print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
