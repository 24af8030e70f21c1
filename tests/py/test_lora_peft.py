"""tidal's PEFT merge/unmerge arithmetic (tidal-rl --lora-sync merge-unmerge) against PEFT itself.

A PEFT LoRA on one torch nn.Linear (64 x 96, no bias) whose weight is held in bf16, fp16 or fp32
(the model loaded with that torch_dtype; the adapter fp32, PEFT's autocast_adapter_dtype, TRL's
default), A and B set to fixed random values (B ~ 1e-3, so that delta = scale B A lands near the
bf16 ulp of the weights and the roundings matter). PEFT's own model.merge_adapter() then
model.unmerge_adapter() run k times (1, 10, 100), as TRL's GRPOTrainer does around every weight
sync, with a new B before each cycle (training changes the adapter between syncs); tests/helpers/lora_peft_cycle runs tidal's td_lora_peft_* on the same weights and adapter.
Required: the drifted weight after k cycles and the weights of the last merge (what the engine
loads) are bit-identical to PEFT's, for bf16, fp16 and fp32, ranks 1 and 4 (alpha 2 and 8). The
unmerge form follows the installed PEFT (>= 0.16 rounds delta to the weight's dtype before
subtracting, PR #2433; older versions subtract the fp32 delta); the other form must differ in
bf16 (the test can tell them apart). The drift itself is printed and checked to be what the
issue reports: nonzero after one bf16 cycle and growing with k; in fp32 at the fp32 rounding level
(< 1e-6), not zero.
Skips (exit 77) when torch or peft cannot be imported.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import peft
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
except Exception as e:  # ImportError, or a peft that does not run on this torch
    print(f"torch/peft/safetensors unavailable ({type(e).__name__}: {e}): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BUILD, check, failures  # noqa: E402

HELPER = os.path.join(BUILD, "tests", "helpers", "lora_peft_cycle")
tmp = tempfile.mkdtemp(prefix="tidal-lora-peft-")
ver = tuple(int(x) for x in peft.__version__.split(".")[:2])
FORM = "rounded" if ver >= (0, 16) else "fp32"
print(f"peft {peft.__version__}: unmerge form '{FORM}', torch {torch.__version__}")
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.proj(x)


def bits(t):
    return t.detach().float().contiguous().numpy().view(np.uint32)


def tidal(path, dtype, k, scale, form):
    out = os.path.join(tmp, "out.safetensors")
    p = subprocess.run([HELPER, "--input", path, "--output", out, "--dtype", dtype, "--cycles", str(k),
                        "--scale", repr(scale), "--unmerge", form], capture_output=True, text=True)
    if p.returncode:
        print(p.stderr)
        raise SystemExit("lora_peft_cycle failed")
    t = load_file(out)
    return t["weight"], t["merged"]


for rank, alpha in ((1, 2), (4, 8)):
    for dtype in ("bf16", "fp16", "fp32"):
        drift = []
        for k in (1, 10, 100):
            torch.manual_seed(7 + rank)
            m = One()
            with torch.no_grad():
                m.proj.weight.copy_(torch.randn(64, 96) * 0.05)
            m = m.to(DT[dtype])
            pm = get_peft_model(m, LoraConfig(r=rank, lora_alpha=alpha, target_modules=["proj"]))
            layer = pm.base_model.model.proj
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            bs = torch.randn(k, 64, rank) * 1e-3
            with torch.no_grad():
                a.copy_(torch.randn(rank, 96) * 0.1)
            assert a.dtype == torch.float32 and b.dtype == torch.float32
            w0 = layer.base_layer.weight.detach().clone()
            path = os.path.join(tmp, "in.safetensors")
            save_file({"weight": w0.contiguous(), "lora_A": a.detach().clone(), "lora_B": bs.contiguous()}, path)
            merged = None
            for j in range(k):
                with torch.no_grad():
                    b.copy_(bs[j])
                pm.merge_adapter()
                merged = layer.base_layer.weight.detach().clone()
                pm.unmerge_adapter()
            wk = layer.base_layer.weight.detach()
            tw, tm = tidal(path, dtype, k, alpha / rank, FORM)
            same_w = np.array_equal(bits(wk), bits(tw))
            same_m = np.array_equal(bits(merged), bits(tm))
            d = (wk.float() - w0.float()).abs()
            drift.append(float(d.max()))
            nbad = int((bits(wk) != bits(tw)).sum())
            check(same_w and same_m, f"r={rank} {dtype} k={k}: tidal's drifted weight and last merge bit-identical to "
                  f"PEFT's (max |drift| {float(d.max()):.3e}, {100 * float((d > 0).float().mean()):.1f} % changed; "
                  f"{nbad} weights differ)")
            if dtype == "bf16" and k == 10:
                ow, _ = tidal(path, dtype, k, alpha / rank, "fp32" if FORM == "rounded" else "rounded")
                check(not np.array_equal(bits(ow), bits(wk)),
                      f"r={rank} bf16: the other unmerge form gives other bits (the test tells the forms apart)")
        if dtype == "fp32":
            check(0 < drift[-1] < 1e-6, f"r={rank} fp32: drift at the fp32 rounding level, not zero ({drift})")
        else:
            check(drift[0] > 0 and drift[2] > drift[0], f"r={rank} {dtype}: drift nonzero after one cycle and growing "
                  f"({drift})")

sys.exit(1 if failures else 0)
