"""LoRA on a mixture of experts' experts, against PEFT itself (peft as installed, transformers 4's
per-expert nn.Linear modules).

Tiny random Qwen2-MoE (8 experts, top-3, a sigmoid-gated shared expert, layer 1 dense through
mlp_only_layers), Mixtral (8 experts, top-2) and OLMoE (8 experts, top-3, q/k norm over the whole
projection) made by transformers itself (OLMoE's log-probs are thereby checked against transformers'
own OlmoeForCausalLM too).
1. PEFT's own adapters: get_peft_model with init_lora_weights=False (B non-zero) on attention and the
   experts' projections (Qwen2-MoE: q_proj, v_proj, gate_proj, up_proj, down_proj, which PEFT's suffix
   match puts on every expert, the shared expert and the dense layer's MLP; Mixtral: q_proj, o_proj,
   w1, w3, w2), saved by save_pretrained. Replayed sequences through tidal-diff (fp32 on both paths)
   with the adapter unmerged (--lora) and merged (--lora-merge-a): every token's log-prob within 1e-5
   of PEFT's model in float64 (fp32 against float64; the adapter moves log-probs by far more).
2. The other direction: tidal-init --lora-for writes a random adapter on all seven kinds of projection
   (every expert's included) in PEFT's names; PeftModel.from_pretrained loads it with no missing and no
   unexpected key, and its forward agrees with tidal's unmerged one as above.
3. Refused, naming what: an adapter_config "all-linear" on an MoE (PEFT would also adapt the router,
   mlp.gate), a target that matches the router, a "target_parameters" adapter (transformers 5's fused
   experts), an unmerged expert adapter under vLLM's fused_moe recipe (vllm-bf16).
The MoE LoRA gradients against autograd are test_grad_moe.py's. Skips (exit 77) without torch, peft,
transformers, h5py or safetensors.
"""
import json
import os
import random
import sys
import tempfile

try:
    import h5py
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                              Qwen2MoeForCausalLM)
except Exception as e:  # noqa: BLE001 - any import failure: a helper is missing
    print(f"torch/peft/transformers/h5py unavailable ({type(e).__name__}): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import moe_random  # noqa: E402
from tidal_check import check, failures, run  # noqa: E402

torch.set_num_threads(2)
tmp = tempfile.mkdtemp(prefix="tidal-lora-moe-")
V = 128
TOL = 1e-5


def make(name, cls, cfg, seed):
    return moe_random.make(os.path.join(tmp, name), cls, cfg, seed)


random.seed(3)
SEQS = [([random.randrange(V) for _ in range(p)], [random.randrange(V) for _ in range(q)])
        for p, q in [(4, 9), (7, 16), (3, 30), (11, 5)]]
ROLLOUTS = os.path.join(tmp, "rollouts.jsonl")
with open(ROLLOUTS, "w") as f:
    for p, q in SEQS:
        f.write(json.dumps({"prompt_ids": p, "response_ids": q, "rollout_logprobs": [-1.0] * len(q)}) + "\n")
PROMPTS = os.path.join(tmp, "prompts.jsonl")   # token prompts: path B generates
with open(PROMPTS, "w") as f:
    for p, _ in SEQS:
        f.write(json.dumps({"tokens": p}) + "\n")
REPLAY = ["--prompts", ROLLOUTS, "--recipe-a", "fp32", "--recipe-b", "fp32", "--batch", "2"]


def peft_logp(model):
    """float64 log-probs of every response token, in the run file's order."""
    out = []
    with torch.no_grad():
        for p, q in SEQS:
            ids = torch.tensor([p + q])
            lp = torch.log_softmax(model(ids).logits[0].double(), -1)
            out += [lp[len(p) - 1 + j, t].item() for j, t in enumerate(q)]
    return torch.tensor(out, dtype=torch.float64)


def tidal_logp(model_dir, *extra):
    out = os.path.join(tmp, f"run{random.randrange(1 << 30)}.h5")
    run("tidal-diff", "--model", model_dir, *REPLAY, *extra, "-o", out)
    with h5py.File(out) as f:
        return torch.tensor(f["tokens/logp_a"][:], dtype=torch.float64)


def peft_model(d, cls, adapter):
    """PEFT's model of an adapter on the base, both in float64 (the fp32 file's values exactly)."""
    base = cls.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager")
    m = PeftModel.from_pretrained(base, adapter)
    m.eval()
    return m


MODELS = [
    ("qwen2_moe", Qwen2MoeForCausalLM, Qwen2MoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False,
        max_position_embeddings=512, tie_word_embeddings=False),
     ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], "mlp.gate"),
    ("mixtral", MixtralForCausalLM, MixtralConfig(
        vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
        tie_word_embeddings=False, sliding_window=None),
     ["q_proj", "o_proj", "w1", "w3", "w2"], "block_sparse_moe.gate"),
    ("olmoe", OlmoeForCausalLM, OlmoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, max_position_embeddings=512,
        tie_word_embeddings=False, pad_token_id=None, eos_token_id=2),
     ["k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], "mlp.gate"),
]
for i, (name, cls, cfg, targets, router) in enumerate(MODELS):
    d = make(name, cls, cfg, 20 + i)
    base_lp = tidal_logp(d)
    # 1. PEFT's adapter, random B, saved by PEFT (fp32, as a trainer saves it)
    torch.manual_seed(30 + i)
    pm = get_peft_model(cls.from_pretrained(d, torch_dtype=torch.float32),
                        LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.mul_(0.3)
    ad = os.path.join(tmp, name + "-peft")
    pm.save_pretrained(ad)
    keys = [k for k, _ in pm.named_parameters() if "lora_A" in k]
    experts = sum(".experts." in k for k in keys)
    ref = peft_logp(peft_model(d, cls, ad))
    moved = (ref - base_lp).abs().max().item()
    check(experts >= 8 * 3 and moved > 1e-2, f"{name}: PEFT's adapter ({len(keys)} pairs, {experts} on experts) moves "
          f"log-probs (max {moved:.3f})")
    for mode, extra in [("unmerged", []), ("merged", ["--lora-merge-a"])]:
        lp = tidal_logp(d, "--lora", ad, *extra)
        err = (lp - ref).abs().max().item()
        check(len(lp) == len(ref) and err <= TOL,
              f"{name}: PEFT adapter on {', '.join(targets)}, tidal {mode}: max |dlogp| {err:.2e} <= {TOL} "
              f"against PEFT's model in float64 ({len(lp)} tokens)")
    # 2. tidal's adapter, PEFT's loader
    tad = os.path.join(tmp, name + "-tidal")
    run("tidal-init", "--lora-for", d, "--rank", "2", "--alpha", "4", "--lora-std", "0.1", "--seed", "5", "-o", tad)
    from safetensors.torch import load_file
    sd = load_file(os.path.join(tad, "adapter_model.safetensors"))
    loaded = peft_model(d, cls, tad)
    want = sorted(k.replace(".default", "") for k, _ in loaded.named_parameters() if "lora_" in k)
    check(sorted(sd) == want and any(".experts.7." in k for k in sd),
          f"{name}: tidal-init --lora-for writes PEFT's names ({len(sd)} tensors, every expert's): PeftModel loads "
          f"them with nothing missing or unexpected")
    ref2 = peft_logp(loaded)
    lp2 = tidal_logp(d, "--lora", tad)
    err2 = (lp2 - ref2).abs().max().item()
    check(err2 <= TOL and (ref2 - base_lp).abs().max().item() > 1e-2,
          f"{name}: tidal's own adapter, run by PEFT and by tidal: max |dlogp| {err2:.2e} <= {TOL}")
    # 3. refusals
    for what, patch in [("all-linear", {"target_modules": "all-linear"}),
                        ("a target on the router", {"target_modules": ["q_proj", "gate"]}),
                        ("target_parameters", {"target_parameters": ["mlp.experts.gate_up_proj"]})]:
        bad = os.path.join(tmp, f"{name}-bad-{what.split()[0]}")
        os.makedirs(bad, exist_ok=True)
        c = json.load(open(os.path.join(ad, "adapter_config.json")))
        c.update(patch)
        json.dump(c, open(os.path.join(bad, "adapter_config.json"), "w"))
        os.link(os.path.join(ad, "adapter_model.safetensors"), os.path.join(bad, "adapter_model.safetensors"))
        p = run("tidal-diff", "--model", d, *REPLAY, "--lora", bad, "-o", os.path.join(tmp, "never.h5"), ok=False)
        key = "target_parameters" if what == "target_parameters" else router
        check(p.returncode == 1 and key in p.stderr and "adapter_config.json" in p.stderr,
              f"{name}: {what} refused, naming {key} ({p.stderr.strip()[-150:]})")
    gen = ["--prompts", PROMPTS, "--max-new-tokens", "4", "--recipe-a", "fp32", "--recipe-b", "vllm-bf16", "--lora", ad]
    p = run("tidal-diff", "--model", d, *gen, "--lora-sync", "adapter", "-o", os.path.join(tmp, name + "-y.h5"), ok=False)
    check(p.returncode == 1 and "fused_moe" in p.stderr and "experts." in p.stderr,
          f"{name}: an unmerged expert adapter under vllm-bf16 (fused_moe) refused ({p.stderr.strip()[-150:]})")
    p = run("tidal-diff", "--model", d, *gen, "--lora-merge-b", "-o", os.path.join(tmp, name + "-z.h5"), ok=False)
    check(p.returncode == 0, f"{name}: the same adapter merged into vllm-bf16's weights runs ({p.stderr.strip()[-100:]})")

sys.exit(1 if failures else 0)
