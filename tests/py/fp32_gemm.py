"""What torch's fp32 CPU matmul computes, told apart from what tidal computes, for checks that compare
tidal with a framework's own fp32 products (PEFT's `weight_B @ weight_A`).

torch's CPU matmul calls the installed BLAS, and the BLAS picks a kernel for the CPU it finds at run
time: OpenBLAS's Haswell / SkylakeX / Zen kernels accumulate with fused multiply-adds (an fma chain
over k), while its Prescott kernel (what Debian's OpenBLAS 0.3.21 falls back to on CPUs it does not
recognise, such as recent Xeons with AVX-512 BF16/FP16) rounds each product and then each sum. The
two differ in the last bit of a good share of the elements (issue 40: 2,375 of 6,144 for a 64x4 by
4x96 product). tidal keeps one machine-independent order, the fma chain (td_lora_fold_delta; the
CUDA kernels use the same), so a check of bit-identity with the framework holds only where the BLAS
runs that order. These functions give both orders exactly in numpy and say which one torch ran:

  fma_chain(b, a)   acc = +0; for k: acc = fma(b[:, k], a[k, :], acc)   (fp32, correctly rounded fma)
  mul_add(b, a)     acc = +0; for k: acc = fl(acc + fl(b[:, k] * a[k, :]))
  torch_gemm_kind() 'fma' | 'mul-add' | 'other', from a probe product on random operands
  blas_core()       the BLAS core torch runs (OpenBLAS's openblas_get_corename), or None
"""
import ctypes
import ctypes.util
import os

import numpy as np


def _fma32(x, y, z):
    """fl32(x * y + z) correctly rounded, for float32 arrays: the product is exact in float64 (24 + 24
    bits), the float64 sum s rounds once and TwoSum gives its exact error e; rounding s to float32 is
    then right unless s lies exactly on a float32 midpoint, where the sign of e decides."""
    p = x.astype(np.float64) * y.astype(np.float64)
    z = z.astype(np.float64)
    s = p + z
    bb = s - p
    e = (p - (s - bb)) + (z - bb)            # TwoSum: s + e == p + z exactly
    f = s.astype(np.float32)
    fd = f.astype(np.float64)
    other = np.where(s > fd, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf)))
    mid = (s != fd) & ((fd + other.astype(np.float64)) * 0.5 == s)   # s exactly halfway between f and other
    # at a midpoint s rounded to even (f); the exact value p + z lies beyond s on e's side
    up = mid & (((e > 0) & (other > f)) | ((e < 0) & (other < f)))
    return np.where(up, other, f).astype(np.float32)


def fma_chain(b, a):
    """(N x r) @ (r x K) in fp32 as tidal computes it: an fma chain over k from +0."""
    b = np.asarray(b, np.float32)
    a = np.asarray(a, np.float32)
    acc = np.zeros((b.shape[0], a.shape[1]), np.float32)
    for k in range(b.shape[1]):
        acc = _fma32(b[:, k:k + 1], a[k:k + 1, :], acc)
    return acc


def mul_add(b, a):
    """(N x r) @ (r x K) in fp32 with each product and each sum rounded (OpenBLAS's Prescott kernel)."""
    b = np.asarray(b, np.float32)
    a = np.asarray(a, np.float32)
    acc = np.zeros((b.shape[0], a.shape[1]), np.float32)
    for k in range(b.shape[1]):
        acc = (acc + (b[:, k:k + 1] * a[k:k + 1, :]).astype(np.float32)).astype(np.float32)
    return acc


def torch_gemm_kind(n=64, r=4, k=96, seed=0):
    """Which arithmetic torch's fp32 matmul runs on this machine for a rank-r product (PEFT's shape)."""
    import torch
    g = np.random.default_rng(seed)
    b = (g.standard_normal((n, r)) * 1e-3).astype(np.float32)
    a = (g.standard_normal((r, k)) * 0.1).astype(np.float32)
    t = (torch.from_numpy(b) @ torch.from_numpy(a)).numpy()
    if np.array_equal(t.view(np.uint32), fma_chain(b, a).view(np.uint32)):
        return "fma"
    if np.array_equal(t.view(np.uint32), mul_add(b, a).view(np.uint32)):
        return "mul-add"
    return "other"


def blas_core():
    """OpenBLAS's core name as the library torch loaded reports it (None when it is not OpenBLAS)."""
    try:
        import torch  # noqa: F401  (loads the BLAS torch links)
    except ImportError:
        pass
    for name in ("openblas", "openblasp", "openblas64_"):
        path = ctypes.util.find_library(name)
        for cand in filter(None, (path, f"lib{name}.so.0")):
            try:
                lib = ctypes.CDLL(cand, mode=os.RTLD_NOLOAD if hasattr(os, "RTLD_NOLOAD") else 0)
            except OSError:
                continue
            fn = getattr(lib, "openblas_get_corename", None)
            if fn:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None
