/* tidal — the number formats of formats.h on the device: fp16/fp8 through the CPU's own bit
 * arithmetic (src/numerics/narrow.h, __host__ __device__ under nvcc), bf16 as formats.h's
 * td_bf16_bits_rne, so a kernel rounds exactly as the CPU emulation does (tests/cudasim/test_round_sim.cpp checks fp32 patterns of every class
 * against td_round; tests/nv checks formats.c against NVIDIA's host functions). No fast-math:
 * the subnormal path needs IEEE adds with denormals (nvcc's default -ftz=false). */
#ifndef TIDAL_CUDA_ROUND_CUH
#define TIDAL_CUDA_ROUND_CUH

#include <stdint.h>

#include "../../numerics/narrow.h"

#ifndef __CUDACC__
#ifndef __host__
#define __host__
#define __device__
#endif
#endif

#define TDC_HD __host__ __device__ static inline

TDC_HD uint32_t tdc_bits(float x) { union { float f; uint32_t u; } v; v.f = x; return v.u; }
TDC_HD float tdc_float(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }

/* bf16: round to nearest even, NaN -> 0x7FFF, overflow carries to Inf (td_bf16_bits_rne) */
TDC_HD uint16_t tdc_bf16_enc(float x)
{
    uint32_t u = tdc_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
TDC_HD float tdc_bf16_dec(uint16_t h) { return tdc_float((uint32_t)h << 16); }

/* fp16 / e4m3 / e5m2: the CPU's own encoder and decoder (src/numerics/narrow.h) */
TDC_HD uint32_t tdc_narrow_enc(float x, int M, int BIAS, uint32_t SIGN, uint32_t MAXC, uint32_t NANC,
                               uint32_t OVF, int saturate)
{
    return td_narrow_encode(tdc_bits(x), M, BIAS, SIGN, MAXC, NANC, OVF, saturate);
}
TDC_HD float tdc_narrow_dec(uint32_t code, int BITS, int M, int BIAS, int HAS_INF)
{
    return td_narrow_decode(code, BITS, M, BIAS, HAS_INF);
}

TDC_HD uint16_t tdc_f16_enc(float x) { return (uint16_t)tdc_narrow_enc(x, 10, 15, 0x8000u, 0x7BFFu, 0x7FFFu, 0x7C00u, 0); }
TDC_HD float tdc_f16_dec(uint16_t c) { return tdc_narrow_dec(c, 16, 10, 15, 1); }
/* fp8 encoders saturate (TD_SATFINITE: what the GPU kernels do) */
TDC_HD uint8_t tdc_e4m3_enc(float x) { return (uint8_t)tdc_narrow_enc(x, 3, 7, 0x80u, 0x7Eu, 0x7Fu, 0x7Fu, 1); }
TDC_HD float tdc_e4m3_dec(uint8_t c) { return tdc_narrow_dec(c, 8, 3, 7, 0); }
TDC_HD uint8_t tdc_e5m2_enc(float x) { return (uint8_t)tdc_narrow_enc(x, 2, 15, 0x80u, 0x7Bu, 0x7Fu, 0x7Cu, 1); }
TDC_HD float tdc_e5m2_dec(uint8_t c) { return tdc_narrow_dec(c, 8, 2, 15, 1); }

/* td_round(f, x) with f a td_format code: 0 fp32, 1 bf16, 2 fp16, 3 e4m3, 4 e5m2 */
TDC_HD float tdc_round(int f, float x)
{
    switch (f) {
    case 1: return tdc_bf16_dec(tdc_bf16_enc(x));
    case 2: return tdc_f16_dec(tdc_f16_enc(x));
    case 3: return tdc_e4m3_dec(tdc_e4m3_enc(x));
    case 4: return tdc_e5m2_dec(tdc_e5m2_enc(x));
    default: return x;
    }
}

#endif
