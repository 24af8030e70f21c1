"""tidal-cast against ml_dtypes (an independent, non-NVIDIA implementation of the formats).

ml_dtypes converts without saturation (float8_e4m3fn overflow -> NaN, float8_e5m2 -> Inf),
so FP8 is compared with tidal-cast --no-saturate. NaN codes are compared as NaN-ness only:
ml_dtypes keeps sign and payload bits of NaN inputs where NVIDIA (and tidal) emit one
canonical NaN. Everything else must match bit for bit. Exit 77 (skip) without ml_dtypes."""
import os
import subprocess
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:
    print("ml_dtypes not installed: skipped")
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
CAST = os.path.join(BUILD, "bin", "tidal-cast")
N = 400_000

rng = np.random.default_rng(20261121)
bits = rng.integers(0, 2**32, size=N, dtype=np.uint64).astype(np.uint32)
x = bits.view(np.float32)
# add values around every fp8 / fp16 rounding point of interest: dense grid of small magnitudes
grid = np.concatenate([np.linspace(-500, 500, 20001, dtype=np.float32),
                       np.linspace(-70000, 70000, 20001, dtype=np.float32),
                       (np.arange(-4096, 4096, dtype=np.float32) * np.float32(2.0**-12))])
x = np.concatenate([x, grid]).astype(np.float32)
text = "\n".join(("nan" if np.isnan(v) else float(v).hex()) for v in x) + "\n"

FORMATS = [
    ("bf16", ml_dtypes.bfloat16, np.uint16, []),
    ("fp16", np.float16, np.uint16, []),
    ("e4m3", ml_dtypes.float8_e4m3fn, np.uint8, ["--no-saturate"]),
    ("e5m2", ml_dtypes.float8_e5m2, np.uint8, ["--no-saturate"]),
]

failed = False
for name, dtype, utype, flags in FORMATS:
    out = subprocess.run([CAST, "--format", name, *flags], input=text.encode(),
                         capture_output=True, check=True).stdout.decode().split("\n")
    codes = np.array([int(line.split()[0], 16) for line in out if line], dtype=np.uint64)
    values = np.array([float(line.split()[1]) for line in out if line], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(dtype)
    ref_codes = ref.view(utype).astype(np.uint64)
    ref_vals = ref.astype(np.float32)
    ref_nan = np.isnan(ref_vals)
    same = np.where(ref_nan, np.isnan(values),
                    (codes == ref_codes) & (values.view(np.uint32) == ref_vals.view(np.uint32)))
    n_ok = int(same.sum())
    print(f"{name} {' '.join(flags) or 'rn'}: {n_ok}/{len(x)} identical to ml_dtypes {ml_dtypes.__version__}")
    if n_ok != len(x):
        bad = np.nonzero(~same)[0][:5]
        for i in bad:
            print(f"  MISMATCH x={float(x[i]).hex()} tidal 0x{int(codes[i]):x} ml_dtypes 0x{int(ref_codes[i]):x}")
        failed = True

sys.exit(1 if failed else 0)
