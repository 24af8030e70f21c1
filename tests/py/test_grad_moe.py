"""tidal's mixture-of-experts backward against transformers' own MoE models in float64 autograd.

Tiny random Mixtral (8 experts, top-2, renormalised), Qwen2-MoE (8 experts, top-3, not
renormalised, a sigmoid-gated shared expert, layer 1 dense through mlp_only_layers) and OLMoE (8
experts, top-3, not renormalised; q_norm / k_norm over the whole projection) made by
transformers 4.46 itself (save_pretrained: the hub's per-expert layout); the same models in
transformers 5's fused layout (gate_up_proj [E, 2 FE, C], down_proj [E, C, FE]) must give the same
gradients bit for bit. tests/helpers/train_probe runs tidal's first training step in fp32 and dumps
every gradient; the reference is the model's own forward (eager attention) in float64, loss the mean
token cross-entropy over the batch's loss mask, as test_grad_torch.py does for dense models.
Required: the loss within 1e-5 relative; every tensor's gradient (router, every expert's gate, up
and down, the shared expert and its gate, attention, norms, embedding, lm_head) within 1e-4 of the
reference's largest entry (fp32 against float64: measured ~4e-6; a wrong term is O(1)). Then
bf16-train: the median tensor's relative Frobenius error against float64 <= 2x that of the same
model held in bf16 by transformers (autograd, what a TRL user trains) and <= 16 u_bf16 (u = 2^-9)
or the peer's own median where that is larger (OLMoE, top-3 unrenormalised: the peer's 5.3e-2);
not every tensor, because bf16 rounding flips some routing decisions and an expert that sees other
rows has a gradient that differs O(1/rows): the MoE mismatch itself, printed.
With the load-balancing loss on (train_probe --output-router-logits 1, coefficient AUX_COEF): the
reference is transformers' own loss as a Trainer computes it, model(input_ids, attention_mask,
labels, output_router_logits=True).loss on the right-padded batch (mean cross-entropy over the
labels + router_aux_loss_coef * load_balancing_loss_func over the unpadded tokens of every MoE
layer), float64 autograd: aux_loss and the total loss within 1e-5 relative, every gradient within
1e-4 of the reference's largest entry as above; and the aux term must move the routers' gradients
(by more than 1e-2 relative: the check sees it).
LoRA on every projection (r 4, alpha 8: q/k/v/o_proj and each expert's gate, up and down, the
shared expert's and a dense layer's MLP; Mixtral's w1, w3, w2): two steps (lr 1e-2, so that B is
non-zero at the second); the adapter after the first, saved as PEFT saves it, loads with peft's
PeftModel.from_pretrained onto transformers' model in float64 (every tensor PEFT expects there, no
other), and the second step's A/B gradients (PEFT's names) are within 1e-4 of that model's autograd,
every one non-zero.
Skips (exit 77) without torch, safetensors or transformers.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                              Qwen2MoeConfig, Qwen2MoeForCausalLM)
except Exception as e:  # noqa: BLE001 - any import failure: the helper is missing
    print(f"torch/safetensors/transformers unavailable ({type(e).__name__}): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import moe_random  # noqa: E402
from tidal_check import BUILD, check, failures  # noqa: E402

PROBE = os.path.join(BUILD, "tests", "helpers", "train_probe")
torch.set_num_threads(2)
tmp = tempfile.mkdtemp(prefix="tidal-grad-moe-")
V = 128


def make(name, cls, cfg, seed):
    return moe_random.make(os.path.join(tmp, name), cls, cfg, seed)


def fuse(src, name, mixtral):
    """transformers 5's layout of the same weights: per layer mlp.experts.gate_up_proj / down_proj."""
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    w = load_file(os.path.join(src, "model.safetensors"))
    out, E = {}, cfg["num_local_experts" if mixtral else "num_experts"]
    blk = "block_sparse_moe" if mixtral else "mlp"
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for k, v in w.items():
        if ".experts." in k:
            continue
        out[k.replace("block_sparse_moe.gate", "mlp.gate")] = v
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}.{blk}.experts"
        if f"{pre}.0.{names[0]}.weight" not in w:
            continue
        out[f"model.layers.{l}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([w[f"{pre}.{e}.{names[0]}.weight"], w[f"{pre}.{e}.{names[1]}.weight"]]) for e in range(E)]).contiguous()
        out[f"model.layers.{l}.mlp.experts.down_proj"] = torch.stack(
            [w[f"{pre}.{e}.{names[2]}.weight"] for e in range(E)]).contiguous()
    save_file(out, os.path.join(d, "model.safetensors"))
    return d


random.seed(1)
LENS = [5, 12, 20, 70]
batch = {"tokens": [[random.randrange(V) for _ in range(n)] for n in LENS],
         "mask": [[int(random.random() < 0.75) for _ in range(n - 1)] for n in LENS]}
BATCH = os.path.join(tmp, "batch.json")
json.dump(batch, open(BATCH, "w"))


def probe_line(model, dump, *args):
    p = subprocess.run([PROBE, "--model", model, "--batch", BATCH, "--dump-grads", dump, *args], capture_output=True,
                       text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit("train_probe failed")
    return p.stdout.split()   # "step 0 loss X grad_norm ... [aux_loss A]"


def probe(model, dump, *args):
    return float(probe_line(model, dump, *args)[3])


AUX_COEF = 0.5   # large, so that the auxiliary term is a visible share of the routers' gradients


def autograd_aux(d, dump):
    """transformers' loss with output_router_logits on, on the padded batch, float64 autograd."""
    m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager",
                                             router_aux_loss_coef=AUX_COEF)
    m.train()
    ids, mask = dump["input_ids"], dump["loss_mask"]
    am = torch.zeros_like(ids)
    for b, n in enumerate(LENS):
        am[b, :n] = 1
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    out = m(input_ids=ids, attention_mask=am, labels=labels, output_router_logits=True)
    out.loss.backward()
    return out.loss.item(), out.aux_loss.item(), {k: v.grad.double() for k, v in m.named_parameters()}


def autograd(d, dump, dtype=torch.float64, adapter=None):
    m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=dtype, attn_implementation="eager")
    if adapter:   # PEFT's own model of the adapter tidal saved
        from peft import PeftModel
        m = PeftModel.from_pretrained(m, adapter, is_trainable=True)
    m.train()   # what a trainer runs (no jitter: router_jitter_noise 0)
    ids, mask = dump["input_ids"], dump["loss_mask"]
    total = 0
    for b, n in enumerate(LENS):
        row = ids[b, :n]
        lp = torch.log_softmax(m(row[None]).logits[0].double(), -1)
        total = total - (lp[:-1].gather(1, row[1:, None])[:, 0] * mask[b, 1:n].double()).sum()
    loss = total / mask.sum()
    loss.backward()
    return loss.item(), {k.replace(".default", ""): v.grad.double() for k, v in m.named_parameters() if v.grad is not None}


MODELS = [
    ("mixtral", MixtralForCausalLM, MixtralConfig(
        vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
        tie_word_embeddings=False, sliding_window=None), True),
    ("qwen2_moe", Qwen2MoeForCausalLM, Qwen2MoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False,
        max_position_embeddings=512, tie_word_embeddings=False), False),
    # OLMoE: q/k norm over the whole projection, experts of width intermediate_size, not renormalised
    ("olmoe", OlmoeForCausalLM, OlmoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
        max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=None, eos_token_id=2), False),
]
for i, (name, cls, cfg, mixtral) in enumerate(MODELS):
    d = make(name, cls, cfg, 10 + i)
    dump_path = os.path.join(tmp, name + "-fp32.safetensors")
    loss = probe(d, dump_path)
    dump = load_file(dump_path)
    ref_loss, ref = autograd(d, dump)
    check(abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), f"{name}: fp32 loss {loss:.7f} vs transformers float64 {ref_loss:.7f}")
    names = [k for k in dump if k not in ("input_ids", "loss_mask")]
    check(sorted(names) == sorted(ref), f"{name}: the dump holds every tensor of the model ({len(names)})")
    errs = {k: ((dump[k].double() - ref[k]).abs().max() / max(ref[k].abs().max().item(), 1e-30)).item()
            for k in ref if k in dump}
    worst = max(errs, key=errs.get)
    kinds = sorted({k.split(".")[-2] for k in errs})
    check(errs[worst] <= 1e-4, f"{name}: fp32 gradients of {len(errs)} tensors ({', '.join(kinds)}) within 1e-4 of "
          f"float64 autograd; worst {errs[worst]:.2e} ({worst})")
    # the load-balancing loss on: transformers' loss with output_router_logits, padded batch
    adump_path = os.path.join(tmp, name + "-aux.safetensors")
    words = probe_line(d, adump_path, "--output-router-logits", "1", "--router-aux-loss-coef", str(AUX_COEF))
    ce, aux = float(words[3]), float(words[words.index("aux_loss") + 1])
    adump = load_file(adump_path)
    aref_loss, aref_aux, aref = autograd_aux(d, adump)
    check(abs(aux - aref_aux) <= 1e-5 * abs(aref_aux) and abs(ce + AUX_COEF * aux - aref_loss) <= 1e-5 * abs(aref_loss),
          f"{name}: aux_loss {aux:.7f} vs transformers' {aref_aux:.7f}; loss + {AUX_COEF} aux {ce + AUX_COEF * aux:.7f} vs "
          f"transformers' output_router_logits loss {aref_loss:.7f} (float64, padded batch)")
    aerrs = {k: ((adump[k].double() - aref[k]).abs().max() / max(aref[k].abs().max().item(), 1e-30)).item()
             for k in aref if k in adump}
    aworst = max(aerrs, key=aerrs.get)
    check(len(aerrs) == len(errs) and aerrs[aworst] <= 1e-4,
          f"{name}: with the aux loss, fp32 gradients of {len(aerrs)} tensors within 1e-4 of float64 autograd; worst "
          f"{aerrs[aworst]:.2e} ({aworst})")
    routers = [k for k in aref if k.endswith("gate.weight") and "experts" not in k and "shared" not in k]
    moved = min(((aref[k] - ref[k]).norm() / ref[k].norm()).item() for k in routers)
    check(moved > 1e-2, f"{name}: the aux term moves every router's gradient (least {moved:.2e} relative, {len(routers)} "
          f"routers): the comparison sees it")
    # LoRA on every projection, the experts' included: PEFT's own model of the adapter after step 1,
    # step 2's gradients
    trace = os.path.join(tmp, name + "-lora")
    mods = "q_proj,k_proj,v_proj,o_proj," + ("w1,w3,w2" if mixtral else "gate_proj,up_proj,down_proj")
    probe_line(d, os.path.join(tmp, name + "-lora0.safetensors"), "--lora-r", "4", "--lora-alpha", "8", "--lora-modules",
               mods, "--steps", "2", "--trace", trace, "--lr", "1e-2")
    ldump = load_file(os.path.join(trace, "grads_1.safetensors"))
    try:
        _, lref = autograd(d, ldump, adapter=os.path.join(trace, "step_0"))
    except ImportError:
        lref = None
        print("peft unavailable: the LoRA check skipped")
    if lref is not None:
        lk = [k for k in ldump if "lora_" in k]
        lerr = {k: ((ldump[k].double() - lref[k]).abs().max() / max(lref[k].abs().max().item(), 1e-30)).item()
                for k in lk if k in lref}
        lw = max(lerr, key=lerr.get) if lerr else None
        nexp = sum(".experts." in k for k in lk)
        check(len(lerr) == len(lk) == len(lref) and nexp >= 2 * 3 * 8 and all(lref[k].abs().max() > 0 for k in lk)
              and lerr[lw] <= 1e-4,
              f"{name}: LoRA on {mods}: {len(lerr)} A/B gradients ({nexp} on experts; PEFT's names, the adapter loaded "
              f"by peft) within 1e-4 of float64 autograd; worst {lerr[lw] if lw else float('nan'):.2e} ({lw})")
    fd = fuse(d, name + "-fused", mixtral)
    fdump_path = os.path.join(tmp, name + "-fused.safetensors")
    probe(fd, fdump_path)
    fdump = load_file(fdump_path)
    same = all(torch.equal(fdump[k], dump[k]) for k in dump)
    check(same and sorted(fdump) == sorted(dump), f"{name}: transformers 5's fused layout gives the same gradients bit for bit")
    bdump_path = os.path.join(tmp, name + "-bf16.safetensors")
    probe(d, bdump_path, "--recipe", "bf16-train")
    bdump = load_file(bdump_path)
    rel = {k: ((bdump[k].double() - ref[k]).norm() / max(ref[k].norm().item(), 1e-30)).item() for k in ref if k in bdump}
    bw = max(rel, key=rel.get)
    med = sorted(rel.values())[len(rel) // 2]
    # the peer: transformers' own model held in bf16 (what a TRL user trains), autograd
    _, hf16 = autograd(d, dump, torch.bfloat16)
    hrel = sorted(((hf16[k] - ref[k]).norm() / max(ref[k].norm().item(), 1e-30)).item() for k in ref)
    hmed = hrel[len(hrel) // 2]
    # bf16 rounding moves some router decisions (the MoE mismatch itself): an expert that then sees
    # another set of rows has an O(1/rows) different gradient, so a bound on every tensor says
    # nothing about a correct bf16 backward; the median tensor against the peer's does
    check(med <= 2 * hmed and med <= max(16 * 2 ** -9, hmed),
          f"{name}: bf16-train gradients: median relative Frobenius error {med:.2e} <= 2x transformers-in-bf16's "
          f"{hmed:.2e} and <= max(16 u_bf16, the peer's) (worst {rel[bw]:.2e}, {bw}; the peer's worst {hrel[-1]:.2e}: routing flips "
          f"under bf16 change which rows an expert sees)")

sys.exit(1 if failures else 0)
