/* tidal — vector forms of the format rows (formats_f16c.c), internal to src/numerics. */
#ifndef TIDAL_NUMERICS_FORMATS_SIMD_H
#define TIDAL_NUMERICS_FORMATS_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define TD_HAVE_F16C_PATH 1
void td_f16_encode_row_f16c(const float *x, uint16_t *codes, size_t n);
void td_f16_decode_row_f16c(const uint16_t *codes, float *y, size_t n);
void td_f16_round_row_f16c(const float *x, float *y, size_t n);
void td_f16_round_row_avx512(const float *x, float *y, size_t n);
void td_bf16_round_row_avx2(const float *x, float *y, size_t n);
void td_bf16_round_row_avx512(const float *x, float *y, size_t n);
void td_bf16_encode_row_avx2(const float *x, uint16_t *codes, size_t n);
void td_bf16_encode_row_avx512(const float *x, uint16_t *codes, size_t n);
void td_fp8_decode_scaled_row_f16c(int e5m2, const uint8_t *codes, float scale, const float *lut,
                                   float *y, size_t n);
void td_fp8_round_row_avx2(int e5m2, const float *x, float *y, size_t n, int sat);
void td_fp8_encode_row_avx2(int e5m2, const float *x, uint8_t *codes, size_t n, int sat);
/* the scalar rows (formats.c): the vector rows' fallback for blocks they do not take */
void td_fp8_round_row_scalar(int e5m2, const float *x, float *y, size_t n, int sat);
void td_fp8_round_row_avx512(int e5m2, const float *x, float *y, size_t n, int sat);
void td_fp8_fake_quant_row_avx512(int e5m2, const float *x, float *y, size_t n, int sat, float mul,
                                  float div, float scale);
void td_fp8_fake_quant_row_avx2(int e5m2, const float *x, float *y, size_t n, int sat, float mul,
                                float div, float scale);
/* the same with a factor per element: y[i] = round(x[i] * f[i]) * scale[i], or x[i] / f[i] (by_div) */
void td_fp8_fake_quant_row_each_avx2(int e5m2, const float *x, float *y, size_t n, int sat, int by_div,
                                     const float *f, const float *scale);
void td_fp8_encode_row_scalar(int e5m2, const float *x, uint8_t *codes, size_t n, int sat);
void td_fp8_encode_row_avx512(int e5m2, const float *x, uint8_t *codes, size_t n, int sat);
void td_fp8_decode_scaled_row_avx512(int e5m2, const uint8_t *codes, float scale, const float *lut,
                                     float *y, size_t n);
#else
#define TD_HAVE_F16C_PATH 0
#endif

/* 1 when the CPU has F16C and AVX2: the rows of fp16 take the vector forms */
int td_cpu_has_f16c(void);

#endif
