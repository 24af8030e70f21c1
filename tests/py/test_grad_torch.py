"""tidal's training step against PyTorch autograd and torch.optim (Debian's torch 1.13, CPU).

Every check recomputes from files tidal wrote: the gradient dump of the first step
(td_trainer_dump_grads via tests/helpers/train_probe --dump-grads: fp32 gradients under HF
names, the batch as right-padded int64 input_ids and loss_mask, 1 where token t is a target
predicted from t-1) and the checkpoints saved after each step (--trace). The torch model is
tests/py/llama_ref.py (written from transformers' modeling code, not from tidal).

1. fp32 gradients, every tensor, five tiny models (tidal-init --preset tiny: C=64 L=2 NH=4 NKV=2
   HD=16 F=176 V=512): llama untied and tied, mistral, qwen2 (q/k/v biases), qwen3 (q/k-norm,
   tied); batch of 4 sequences (5, 12, 20, 70 tokens: the 70 crosses attention's 64-row
   blocks) with holes in the loss mask. Reference: autograd in float64 on the same weights.
   Tolerance: max |g_tidal - g_ref| <= 1e-4 * max |g_ref| per tensor. tidal computes in fp32
   (relative rounding ~6e-8 per operation, a few hundred terms per dot product): measured
   ~1e-6; anything structurally wrong is O(1). The fp32 loss within 1e-5 relative.
2. LoRA (qwen2, r=1 on all seven projections; r=4 on q/v with alpha 8): the second step's
   A/B gradients (B no longer zero) against autograd through W x + b + scale B A x on the
   adapter tidal saved after the first step (PEFT format, read back here), same tolerance;
   the adapter's adapter_config.json says what PEFT expects.
3. Mixed precision (qwen2, qwen3 tied): relative Frobenius error ||g - g_ref|| / ||g_ref|| of
   every tensor against the float64 reference:
     bf16-train   <= 3x the error of PyTorch's own bf16 autocast (torch.autocast("cpu",
                  bfloat16), fp32 master weights) on the same tensor, and <= 16 u_bf16 (u = 2^-9).
                  tidal's bf16-train also rounds the residual stream and norm outputs to bf16
                  (HF with the model in bf16), which autocast keeps in fp32: measured 1-2x.
     fp16-train   <= 16 u_fp16 (u = 2^-11), with dynamic loss scaling (init 2^16).
     fp8-unified  <= 4 u_e4m3 (u = 2^-4): FP8 forward, dgrad and wgrad GEMMs (1x128 / 128x128);
                  and larger than bf16-train's on average (the backward really is in FP8).
4. AdamW + clipping + schedule (llama, 6 steps, lr 1e-2, betas (0.9, 0.95), weight decay 0.1 on
   matrices and embeddings only as HF Trainer, max_grad_norm 0.5 so clipping acts, cosine with
   warmup_ratio 0.34): each step replayed with torch.nn.utils.clip_grad_norm_,
   torch.optim.AdamW and LambdaLR on tidal's own gradients of that step; the pre-clip norm
   tidal reports equals clip_grad_norm_'s return (rel 1e-5: fp32 norms of norms vs a double
   sum), the parameters after each step agree to 1e-6 absolute (same fp32 operations; FMA
   contraction may differ by an ulp per step).
5. Schedules: the learning rate tidal uses at each of 10 steps with warmup_ratio 0.25 equals
   transformers' get_scheduler lambdas (constant, constant_with_warmup, linear, cosine),
   reimplemented here from transformers/optimization.py; rel 1e-9.
6. GradScaler: fp16-train from a scale of 2^40 (every gradient overflows fp16) with
   growth_interval 2: the scale sequence equals torch.cuda.amp.GradScaler.update's rule
   (_amp_update_scale_, reimplemented: torch 1.13 has no CPU GradScaler) given the overflow
   flags; overflowing steps change no parameter; the first step overflows and a later one
   does not.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
except ImportError:
    print("torch or safetensors not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import llama_ref  # noqa: E402
from tidal_check import BIN, BUILD, check, failures  # noqa: E402

PROBE = os.path.join(BUILD, "tests", "helpers", "train_probe")
torch.set_num_threads(2)
tmp = tempfile.mkdtemp(prefix="tidal-grad-")


def init_model(name, arch, tie):
    d = os.path.join(tmp, name)
    subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", arch, "--preset", "tiny",
                    "--tie" if tie else "--no-tie", "--init-std", "0.05", "--embed-std", "0.3",
                    "--seed", "3", "-o", d], check=True, capture_output=True)
    return d


def probe(model, *args):
    p = subprocess.run([PROBE, "--model", model, "--batch", BATCH, *args], capture_output=True,
                       text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit("train_probe failed: " + " ".join(args))
    steps = []
    for line in p.stdout.splitlines():
        f = line.split()
        if f and f[0] == "step":
            steps.append({f[i]: float(f[i + 1]) for i in range(2, len(f), 2)})
    return steps


random.seed(1)
LENS = [5, 12, 20, 70]
batch = {"tokens": [[random.randrange(512) for _ in range(n)] for n in LENS],
         "mask": [[int(random.random() < 0.75) for _ in range(n - 1)] for n in LENS]}
BATCH = os.path.join(tmp, "batch.json")
json.dump(batch, open(BATCH, "w"))


class LoraModel(llama_ref.Model):
    """llama_ref's forward with PEFT's LoRA branch: y = W x + b + scale * B (A x)."""

    def __init__(self, cfg, w, dtype, ad, scale):
        super().__init__(cfg, w, dtype)
        self.ad, self.scale = ad, scale

    def lin(self, x, name):
        y = super().lin(x, name)
        key = "base_model.model." + name
        if key + ".lora_A.weight" in self.ad:
            a, b = self.ad[key + ".lora_A.weight"], self.ad[key + ".lora_B.weight"]
            y = y + self.scale * torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)
        return y


def autograd(model_dir, dump, dtype=torch.float64, autocast=None, adapter=None):
    """loss and gradients of the mean token cross-entropy over the dump's loss_mask"""
    cfg, w = llama_ref.load_checkpoint(model_dir, dtype)
    ids, mask = dump["input_ids"], dump["loss_mask"]
    if adapter:
        acfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
        ad = {k: v.to(dtype).requires_grad_(True)
              for k, v in load_file(os.path.join(adapter, "adapter_model.safetensors")).items()}
        m = LoraModel(cfg, w, dtype, ad, acfg["lora_alpha"] / acfg["r"])
        leaves = ad
    else:
        for v in w.values():
            v.requires_grad_(True)
        m = llama_ref.Model(cfg, w, dtype)
        leaves = w
    total = 0
    for b in range(ids.shape[0]):
        row = ids[b]
        if autocast is not None:
            with torch.autocast("cpu", dtype=autocast):
                logits = torch.nn.functional.linear(m.forward(row[None, :]), m.lm_head)
            lp = torch.log_softmax(logits.float(), -1)[0]
        else:
            lp = m.logsoftmax(m.forward(row[None, :]))[0]
        sel = lp[:-1].gather(1, row[1:, None])[:, 0]
        total = total - (sel * mask[b, 1:].to(lp.dtype)).sum()
    loss = total / mask.sum()
    loss.backward()
    return loss.item(), {k: v.grad.double() for k, v in leaves.items() if v.grad is not None}


def rel_max(g, r):
    return ((g - r).abs().max() / max(r.abs().max().item(), 1e-30)).item()


def rel_fro(g, r):
    return ((g - r).norm() / max(r.norm().item(), 1e-30)).item()


# ---- 1. fp32 gradients of every tensor, five models
MODELS = {}
for name, arch, tie in [("llama", "llama", 0), ("llama-tied", "llama", 1), ("mistral", "mistral", 0),
                        ("qwen2", "qwen2", 0), ("qwen3-tied", "qwen3", 1)]:
    d = MODELS[name] = init_model(name, arch, tie)
    dump_path = os.path.join(tmp, name + "-fp32.safetensors")
    steps = probe(d, "--dump-grads", dump_path)
    dump = load_file(dump_path)
    ref_loss, ref = autograd(d, dump)
    names = [k for k in dump if k not in ("input_ids", "loss_mask")]
    check(sorted(names) == sorted(ref), f"{name}: dump holds every trainable tensor ({len(names)})")
    check(dump["input_ids"].dtype == torch.int64 and list(dump["input_ids"].shape) == [4, 70],
          f"{name}: input_ids int64 (4, 70) right-padded")
    check(int(dump["loss_mask"].sum()) == sum(map(sum, batch["mask"])), f"{name}: loss_mask counts the batch's targets")
    check(abs(steps[0]["loss"] - ref_loss) <= 1e-5 * abs(ref_loss),
          f"{name}: fp32 loss {steps[0]['loss']:.7f} vs autograd {ref_loss:.7f}")
    errs = {k: rel_max(dump[k].double(), ref[k]) for k in ref}
    worst = max(errs, key=errs.get)
    classes = {}
    for k, e in errs.items():
        c = k.split(".")[-2] if k.startswith("model.layers") else k.split(".")[-2] if "." in k else k
        classes[c] = max(classes.get(c, 0), e)
    print(f"  {name} fp32 max rel err by tensor class: " +
          " ".join(f"{c}={e:.1e}" for c, e in sorted(classes.items())))
    check(errs[worst] <= 1e-4, f"{name}: fp32 gradients within 1e-4 of autograd (worst {worst}: {errs[worst]:.2e})")

# ---- 2. LoRA gradients on the second step
for tag, args in [("r1-all", ["--lora-r", "1", "--lora-alpha", "2", "--lora-modules",
                              "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]),
                  ("r4-qv", ["--lora-r", "4", "--lora-alpha", "8"])]:
    trace = os.path.join(tmp, "lora-" + tag)
    probe(MODELS["qwen2"], "--steps", "2", "--lr", "1e-2", "--trace", trace, *args)
    adapter = os.path.join(trace, "step_0")
    acfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    check(acfg["peft_type"] == "LORA" and acfg["r"] == int(args[1]) and acfg["lora_dropout"] == 0,
          f"lora {tag}: adapter_config.json as PEFT writes it (r={acfg['r']}, alpha={acfg['lora_alpha']})")
    dump = load_file(os.path.join(trace, "grads_1.safetensors"))
    _, ref = autograd(MODELS["qwen2"], dump, adapter=adapter)
    nb = sum(1 for k in ref if "lora_B" in k)
    check(nb == (14 if tag == "r1-all" else 4) and all(ref[k].abs().max() > 0 for k in ref),
          f"lora {tag}: {len(ref)} A/B tensors, all with non-zero gradients")
    worst = max(rel_max(dump[k].double(), ref[k]) for k in ref)
    check(worst <= 1e-4, f"lora {tag}: A/B gradients within 1e-4 of autograd (worst {worst:.2e})")

# ---- 3. mixed precision
U = {"bf16": 2.0 ** -9, "fp16": 2.0 ** -11, "e4m3": 2.0 ** -4}
for name in ["qwen2", "qwen3-tied"]:
    d = MODELS[name]
    dump32 = load_file(os.path.join(tmp, name + "-fp32.safetensors"))
    _, ref = autograd(d, dump32)
    _, ac = autograd(d, dump32, dtype=torch.float32, autocast=torch.bfloat16)
    mean_err = {}
    for rec in ["bf16-train", "fp16-train", "fp8-unified"]:
        path = os.path.join(tmp, f"{name}-{rec}.safetensors")
        probe(d, "--recipe", rec, "--dump-grads", path)
        g = load_file(path)
        errs = {k: rel_fro(g[k].double(), ref[k]) for k in ref}
        mean_err[rec] = sum(errs.values()) / len(errs)
        worst = max(errs, key=errs.get)
        if rec == "bf16-train":
            ratio = {k: errs[k] / max(rel_fro(ac[k], ref[k]), 1e-12) for k in ref}
            wr = max(ratio, key=ratio.get)
            print(f"  {name} bf16-train: worst {errs[worst]:.2e} ({worst}); autocast worst "
                  f"{max(rel_fro(ac[k], ref[k]) for k in ref):.2e}; worst ratio {ratio[wr]:.2f} ({wr})")
            check(ratio[wr] <= 3.0 and errs[worst] <= 16 * U["bf16"],
                  f"{name} bf16-train: gradients within 3x torch bf16 autocast's error and 16 u_bf16")
        elif rec == "fp16-train":
            print(f"  {name} fp16-train: worst {errs[worst]:.2e} ({worst})")
            check(errs[worst] <= 16 * U["fp16"], f"{name} fp16-train (loss scaled): gradients within 16 u_fp16")
        else:
            print(f"  {name} fp8-unified: worst {errs[worst]:.2e} ({worst})")
            check(errs[worst] <= 4 * U["e4m3"], f"{name} fp8-unified: gradients within 4 u_e4m3")
    check(mean_err["fp8-unified"] > 2 * mean_err["bf16-train"],
          f"{name}: fp8-unified gradients are FP8's (mean err {mean_err['fp8-unified']:.2e} > 2x bf16's {mean_err['bf16-train']:.2e})")


# ---- 4. AdamW, clipping, schedule replayed in torch
def hf_lambda(kind, step, warm, total):
    """transformers/optimization.py: get_*_schedule_with_warmup lr_lambda (num_cycles 0.5)"""
    if kind == "constant":
        return 1.0
    if step < warm:
        return float(step) / float(max(1, warm))
    if kind == "constant_with_warmup":
        return 1.0
    if kind == "linear":
        return max(0.0, float(total - step) / float(max(1, total - warm)))
    progress = float(step - warm) / float(max(1, total - warm))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


d = MODELS["llama"]
trace = os.path.join(tmp, "adamw")
NSTEP, LR, WD, CLIP = 6, 1e-2, 0.1, 0.5
steps = probe(d, "--steps", str(NSTEP), "--lr", str(LR), "--weight-decay", str(WD), "--beta1", "0.9",
              "--beta2", "0.95", "--max-grad-norm", str(CLIP), "--lr-scheduler", "cosine",
              "--warmup-ratio", "0.34", "--trace", trace)
_, w = llama_ref.load_checkpoint(d, torch.float32)
params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
decay = [v for k, v in params.items() if k.endswith("proj.weight") or "embed" in k or "lm_head" in k]
no_decay = [v for k, v in params.items() if not (k.endswith("proj.weight") or "embed" in k or "lm_head" in k)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=LR, betas=(0.9, 0.95), eps=1e-8)
warm = math.ceil(0.34 * NSTEP)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: hf_lambda("cosine", s, warm, NSTEP))
worst_p = worst_n = worst_lr = 0.0
for k in range(NSTEP):
    g = load_file(os.path.join(trace, f"grads_{k}.safetensors"))
    for n, p in params.items():
        p.grad = g[n].clone()
    norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP).item()
    worst_n = max(worst_n, abs(norm - steps[k]["grad_norm"]) / norm)
    worst_lr = max(worst_lr, abs(sched.get_last_lr()[0] - steps[k]["lr"]) / LR)
    opt.step()
    sched.step()
    tw = load_file(os.path.join(trace, f"step_{k}", "model.safetensors"))
    worst_p = max(worst_p, max((tw[n] - p.detach()).abs().max().item() for n, p in params.items()))
print(f"  adamw: max |param diff| {worst_p:.2e}, grad-norm rel diff {worst_n:.2e}, lr rel diff {worst_lr:.2e}; "
      f"grad norms {[round(s['grad_norm'], 3) for s in steps]}")
check(all(s["grad_norm"] > CLIP for s in steps), "adamw: clipping active on every step (pre-clip norm > max_grad_norm)")
check(worst_n <= 1e-5, "adamw: reported pre-clip norm equals torch clip_grad_norm_'s")
check(worst_lr <= 1e-9, "adamw: learning rate equals LambdaLR with HF's cosine lambda")
check(worst_p <= 1e-6, "adamw: parameters after each step equal torch.optim.AdamW's within 1e-6")

# ---- 5. schedules
for kind in ["constant", "constant_with_warmup", "linear", "cosine"]:
    steps = probe(MODELS["llama-tied"], "--steps", "10", "--lr", "1e-3", "--lr-scheduler", kind,
                  "--warmup-ratio", "0.25")
    want = [1e-3 * hf_lambda(kind, k, math.ceil(0.25 * 10), 10) for k in range(10)]
    got = [s["lr"] for s in steps]
    check(all(abs(a - b) <= 1e-9 * 1e-3 for a, b in zip(got, want)), f"schedule {kind}: lr per step as HF get_scheduler")

# ---- 6. GradScaler
trace = os.path.join(tmp, "scaler")
steps = probe(MODELS["qwen2"], "--recipe", "fp16-train", "--steps", "24", "--lr", "1e-3",
              "--init-scale", str(2.0 ** 40), "--growth-interval", "2", "--trace", trace)
scale, tracker, ok = 2.0 ** 40, 0, True
for s in steps:
    ok &= s["loss_scale"] == scale
    if s["skipped"]:
        scale, tracker = scale * 0.5, 0
    else:
        tracker += 1
        if tracker == 2:
            scale, tracker = scale * 2.0, 0
print(f"  scaler: scales {[s['loss_scale'] for s in steps]}, skipped {[int(s['skipped']) for s in steps]}")
check(ok, "scaler: loss-scale sequence follows GradScaler.update (backoff 0.5, growth 2 every 2 good steps)")
check(steps[0]["skipped"] == 1 and any(s["skipped"] == 0 for s in steps) and
      any(a["loss_scale"] < b["loss_scale"] for a, b in zip(steps, steps[1:])),
      "scaler: overflow at 2^40 skipped, later steps taken, growth seen")
_, w0 = llama_ref.load_checkpoint(MODELS["qwen2"], torch.float32)
same = all(torch.equal(load_file(os.path.join(trace, "step_0", "model.safetensors"))[k], w0[k]) for k in w0)
check(same, "scaler: a skipped step leaves every parameter unchanged")

shutil.rmtree(tmp)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
