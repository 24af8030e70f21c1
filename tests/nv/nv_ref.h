/* NVIDIA's own host conversions (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h), named by tidal's
 * format enum: the reference every tidal format test compares against. Host code, nvcc only. */
#ifndef TIDAL_TEST_NV_REF_H
#define TIDAL_TEST_NV_REF_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "tidal/formats.h"
#include "../format_inputs.h"

/* ---- NVIDIA's conversions, as tidal's format enum names them ---- */

static inline uint32_t nv_encode(td_format f, float x, td_saturation sat, td_scale_rounding rnd)
{
    __nv_saturation_t s = sat == TD_SATFINITE ? __NV_SATFINITE : __NV_NOSAT;
    switch (f) {
    case TD_BF16: { __nv_bfloat16_raw r = __float2bfloat16(x); return r.x; }
    case TD_F16:  { __half_raw r = __float2half_rn(x); return r.x; }
    case TD_E4M3: return __nv_cvt_float_to_fp8(x, s, __NV_E4M3);
    case TD_E5M2: return __nv_cvt_float_to_fp8(x, s, __NV_E5M2);
    case TD_E8M0: return __nv_cvt_float_to_e8m0(x, s, rnd == TD_ROUND_UP ? cudaRoundPosInf : cudaRoundZero);
    default: return 0;
    }
}

static inline uint32_t nv_decode_bits(td_format f, uint32_t c)
{
    float y = 0.0f;
    switch (f) {
    case TD_BF16: { __nv_bfloat16_raw r; r.x = (unsigned short)c; y = __bfloat162float(__nv_bfloat16(r)); break; }
    case TD_F16:  { __half_raw r; r.x = (unsigned short)c; y = __half2float(__half(r)); break; }
    case TD_E4M3: y = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3))); break;
    case TD_E5M2: y = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E5M2))); break;
    case TD_E8M0: y = __bfloat162float(__nv_bfloat16(__nv_cvt_e8m0_to_bf16raw((__nv_fp8_storage_t)c))); break;
    default: break;
    }
    return ti_f32_bits(y);
}

#endif
