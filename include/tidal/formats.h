/* tidal — number formats: BF16, FP16, FP8 E4M3 / E5M2 and E8M0 scale bytes.
 *
 * Semantics are those of NVIDIA's own conversions, bit for bit (tests/nv/ checks them against
 * cuda_bf16.h, cuda_fp16.h and cuda_fp8.h):
 *   encode  round to nearest, ties to even, from fp32; subnormals kept (no flush to zero);
 *           signed zeros kept; every NaN becomes the one canonical NaN code of the format
 *           (bf16 0x7FFF, fp16 0x7FFF, e4m3 0x7F, e5m2 0x7F: the sign is dropped).
 *   bf16 / fp16   overflow rounds to Inf (there is no saturating form: __float2bfloat16,
 *           __float2half_rn).
 *   e4m3    no Inf; 0x7F / 0xFF are NaN; max finite 448. SATFINITE clamps every overflow and
 *           ±Inf to ±448; NOSAT gives NaN for |x| > 464 (464 itself ties to even = 448) and
 *           for ±Inf, and that overflow NaN keeps the sign (0x7F / 0xFF), unlike NaN inputs.                                     (__nv_cvt_float_to_fp8, __NV_E4M3)
 *   e5m2    IEEE-like, Inf = 0x7C, max finite 57344. SATFINITE clamps overflow and ±Inf to
 *           ±57344; NOSAT gives ±Inf from |x| >= 61440.   (__nv_cvt_float_to_fp8, __NV_E5M2)
 *   e8m0    unsigned power-of-two scale 2^(code-127), 0xFF = NaN. Encoding takes |x| and
 *           rounds toward zero or up (the two modes NVIDIA offers); results below 2^-127 clip
 *           to code 0; above 2^127 SATFINITE gives 0xFE, NOSAT gives NaN.
 *                                                        (__nv_cvt_float_to_e8m0)
 *   decode  exact for every finite code; NaN codes decode to the fp32 NaN NVIDIA returns
 *           (0x7FFFFFFF for fp16 / e4m3 / e5m2, the widened bits for bf16, 0x7FFF0000 for e8m0).
 *
 * Three forms, as in ggml: scalar (td_f32_to_bf16 ...), row (td_format_encode_row ...) and a
 * generic reference (td_encode_ref / td_decode_ref, written from the definition of the
 * format, slow and obvious). The fast forms are tested bit for bit against the reference.
 * Formats are runtime data: an enum plus a traits table.
 */
#ifndef TIDAL_FORMATS_H
#define TIDAL_FORMATS_H

#include "tidal/common.h"

#include <stdbool.h>
#include <string.h>

TD_BEGIN_DECLS

typedef enum {
    TD_F32 = 0,
    TD_BF16,
    TD_F16,
    TD_E4M3,
    TD_E5M2,
    TD_E8M0,
    TD_FORMAT_COUNT
} td_format;

/* Saturation for FP8 (and E8M0) encoding, as __NV_SATFINITE / __NV_NOSAT. */
typedef enum { TD_SATFINITE = 0, TD_NOSAT = 1 } td_saturation;

/* Rounding for E8M0 scale encoding, as cudaRoundZero / cudaRoundPosInf. */
typedef enum { TD_ROUND_ZERO = 0, TD_ROUND_UP = 1 } td_scale_rounding;

/* 16-bit formats are single-field structs so they cannot be mixed up with integers. */
typedef struct { uint16_t bits; } td_bf16;
typedef struct { uint16_t bits; } td_f16;

typedef struct {
    const char *name;        /* "bf16", "fp16", "e4m3", ... (also accepted: aliases below) */
    const char *alias;       /* "float16", "fp8-e4m3", ...                                  */
    int storage_bits;        /* 32, 16 or 8                                                 */
    int exp_bits, man_bits;  /* field widths (e8m0: 8, 0)                                   */
    int bias;                /* exponent bias                                               */
    bool has_sign;           /* e8m0 is unsigned                                            */
    bool has_inf;            /* e4m3 and e8m0 have none                                     */
    uint32_t nan_code;       /* the canonical NaN that encoding produces                    */
    uint32_t max_code;       /* largest finite positive code                                */
    float max_finite;        /* decoded max_code                                            */
    float min_normal;        /* smallest positive normal                                    */
    float min_subnormal;     /* smallest positive value                                     */
} td_format_traits;

const td_format_traits *td_format_info(td_format f);
/* Parses "bf16", "fp16", "e4m3", "e5m2", "e8m0", "fp32" and the aliases; -1 if unknown. */
int td_format_from_name(const char *name);

/* ---- scalar fast forms ---- */
td_bf16 td_f32_to_bf16(float x);
float   td_bf16_to_f32(td_bf16 h);
td_f16  td_f32_to_f16(float x);
float   td_f16_to_f32(td_f16 h);
uint8_t td_f32_to_e4m3(float x, td_saturation sat);
float   td_e4m3_to_f32(uint8_t code);
uint8_t td_f32_to_e5m2(float x, td_saturation sat);
float   td_e5m2_to_f32(uint8_t code);
uint8_t td_f32_to_e8m0(float x, td_saturation sat, td_scale_rounding rnd);
float   td_e8m0_to_f32(uint8_t code);

/* Generic over the traits table: code of x in format f (sat ignored by bf16/fp16/f32;
 * e8m0 rounds up, the MXFP8 convention). */
uint32_t td_encode(td_format f, float x, td_saturation sat);
float    td_decode(td_format f, uint32_t code);

/* ---- reference forms: written from the definition, used to test the fast forms ---- */
uint32_t td_encode_ref(td_format f, float x, td_saturation sat);
uint32_t td_encode_e8m0_ref(float x, td_saturation sat, td_scale_rounding rnd);
float    td_decode_ref(td_format f, uint32_t code);

/* ---- row forms: n values; codes stored in storage_bits-wide elements. Rows of 256 Ki values and
 * more, called outside a parallel region, run on the OpenMP threads (each value on its own: the
 * same bits at any thread count). ---- */
void td_encode_row(td_format f, const float *x, void *codes, size_t n, td_saturation sat);
void td_decode_row(td_format f, const void *codes, float *y, size_t n);
/* Round each value to the nearest value of format f and back, in place or out of place:
 * y[i] = decode(encode(x[i])). The workhorse of emulated precision. */
void td_round_row(td_format f, const float *x, float *y, size_t n, td_saturation sat);

/* y[i] = expf(x[i]): the C library's expf, its bits, 8 (AVX2) or 16 (AVX-512) lanes at a time
 * where a vector form of glibc's algorithm agrees with it on this machine (src/numerics/expf_row.c,
 * checked once; td_expf_row_vector says whether), else element by element (td_expf_row_scalar).
 * In place is fine. */
void td_expf_row(const float *x, float *y, size_t n);
void td_expf_row_scalar(const float *x, float *y, size_t n);
int  td_expf_row_vector(void);

/* y[i] = exp(x[i]) in double: the C library's exp, its bits, 4 lanes at a time (AVX2 + FMA)
 * where a vector form of glibc's algorithm agrees with it on this machine (src/numerics/exp_row.c,
 * checked once; td_exp_row_vector says whether), else element by element. In place is fine. */
void td_exp_row(const double *x, double *y, size_t n);
void td_exp_row_scalar(const double *x, double *y, size_t n);
/* y[i] = expm1(x[i]) in double, the same way (the same check and switch) */
void td_expm1_row(const double *x, double *y, size_t n);
void td_expm1_row_scalar(const double *x, double *y, size_t n);
int  td_exp_row_vector(void);

/* A float row's exponentials less a shift (its max), a block at a time: y[i] = exp((double)x[i] - c)
 * by td_exp_row for i < n = min(left, TD_EXP_ROW_BLOCK); returns n. y holds TD_EXP_ROW_BLOCK
 * (callers keep it on the stack and walk the row: for (v0 = 0; v0 < V; v0 += n) ...). */
enum { TD_EXP_ROW_BLOCK = 256 };
size_t td_exp_row_block(const float *x, double c, double *y, size_t left);

/* The index of x's first largest element, as the scan `best = 0; for v: if (x[v] > x[best])
 * best = v` gives it (a NaN in x[0]: 0; other NaNs never; ties: the first); 0 for n = 0.
 * AVX-512 where the CPU has it (src/numerics/argmax.c), the scan itself otherwise. */
size_t td_argmax_first(const float *x, size_t n);
size_t td_argmax_first_scalar(const float *x, size_t n);

/* The row forms of fp16 use the CPU's F16C conversions where it has them (bit-identical to
 * the scalar loops, NaN included: src/numerics/formats_f16c.c), FP8 decoding a 256-entry table.
 * Tests set td_formats_scalar_only to run the scalar loops, the reference for both. */
extern int td_formats_scalar_only;
int td_formats_have_vector_f16(void);   /* 1 when the fp16 rows take F16C on this CPU */

/* y[i] = decode(codes[i]) * scale for e4m3 or e5m2 codes: one rounding, the table's bits (F16C
 * where the CPU has it and td_formats_scalar_only is 0, else the table). */
void td_fp8_decode_scaled_row(td_format f, const uint8_t *codes, float scale, float *y, size_t n);

/* The 256 decoded values of every e4m3 or e5m2 code (NULL for other formats). */
const float *td_fp8_decode_table(td_format f);

/* ---- scalar round form: the one value form of td_round_row (SATFINITE), for kernels that
 * round inside their own loops (the recipe ops of the model). bf16 is inline here (the hot
 * case: bf16 recipes round every element several times); the others call the fast forms.
 * Same bits as td_round_row, NaN included (a NaN becomes the format's canonical NaN, decoded:
 * 0x7FFF0000 for bf16); tests/test_formats.c checks both against the reference forms. ---- */
static inline uint16_t td_bf16_bits_rne(uint32_t u)
{
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;        /* NaN -> canonical */
    u += 0x7FFFu + ((u >> 16) & 1u);                            /* round to nearest even */
    return (uint16_t)(u >> 16);                                  /* overflow carries to Inf */
}

float td_round_slow(td_format f, float x);   /* decode(encode(x, SATFINITE)), any format */

/* fp16 rounding on the fp32 pattern, without forming the code: normals (|x| >= 2^-14) keep
 * 10 fraction bits, nearest even (a carry may reach the exponent: 65520 and up become Inf);
 * below 2^-14 the fp32 sum |x| + 0.5 has ulp 2^-24, fp16's subnormal quantum, so the FPU rounds
 * to it (nearest even) and subtracting 0.5 back is exact. NaN -> 0x7FFFFFFF as decode gives. */
static inline float td_f16_round_value(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        a = 0x7FFFFFFFu;
        memcpy(&x, &a, 4);
        return x;
    }
    if (a >= 0x38800000u) {
        a = (a + 0xFFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
        if (a > 0x477FE000u) a = 0x7F800000u;   /* above 65504: Inf */
    } else {
        float m;                                 /* IEEE arithmetic: never built with fast-math */
        memcpy(&m, &a, 4);
        m = (m + 0.5f) - 0.5f;
        memcpy(&a, &m, 4);
    }
    a |= u & 0x80000000u;
    memcpy(&x, &a, 4);
    return x;
}

static inline float td_round(td_format f, float x)
{
    if (f == TD_F32) return x;
    if (f == TD_BF16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        u = (uint32_t)td_bf16_bits_rne(u) << 16;
        memcpy(&x, &u, 4);
        return x;
    }
    if (f == TD_F16) return td_f16_round_value(x);
    return td_round_slow(f, x);
}

TD_END_DECLS

#endif
