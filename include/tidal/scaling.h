/* tidal — FP8 scaling recipes: how a tensor is divided into blocks, how each block's scale is
 * computed from its absolute maximum, and how values are quantised with it.
 *
 * A tensor is row-major (rows, cols): activations are (tokens, features), GEMM weights are HF's
 * (out_features, in_features), so "row" scaling is per-token for activations and per-channel
 * for weights. Blocks:
 *   TD_SCALE_TENSOR   one block                          (per-tensor current scaling)
 *   TD_SCALE_ROW      1 x cols                           (per-token / per-channel)
 *   TD_SCALE_GROUP    1 x G, G = 128 by default          (DeepSeek-V3 activations)
 *   TD_SCALE_BLOCK    G x G, G = 128 by default          (DeepSeek-V3 weights)
 *   TD_SCALE_MX       1 x 32 with an E8M0 scale          (MXFP8)
 * Edge blocks are partial.
 *
 * Scale arithmetic: x ≈ decode(code) * s, with s the block's dequantisation scale.
 *   TD_ARITH_DIV (vLLM):   s = max(amax, 1e-10) / fmax;   code = enc(x / s)
 *                          with pow2: s = 2^ceil(log2 s) (UE8M0 scales)
 *   TD_ARITH_MUL (Transformer Engine): k = fmax / amax (k = 1 if amax is 0 or Inf, FLT_MAX if
 *                          the division overflows); with pow2: k rounded down to 2^floor(log2 k);
 *                          code = enc(x * k), s = 1 / k (TE's scale_inv)
 *   TD_SCALE_MX:           s = 2^ceil(log2(amax * (1/fmax))) as an E8M0 byte (rounded up,
 *                          clipped at 2^-127; fp32 reciprocal as TE's MXFP8 cast computes
 *                          it); code = enc(x / s), an exact division
 * All arithmetic is fp32 with round-to-nearest, as on the GPU. DIV and MUL differ in the last
 * bit of some codes: both are needed to model vLLM rollouts and TE training.
 */
#ifndef TIDAL_SCALING_H
#define TIDAL_SCALING_H

#include "tidal/formats.h"

TD_BEGIN_DECLS

typedef enum {
    TD_SCALE_TENSOR = 0,
    TD_SCALE_ROW,
    TD_SCALE_GROUP,
    TD_SCALE_BLOCK,
    TD_SCALE_MX,
    TD_SCALE_COUNT
} td_scale_granularity;

typedef enum { TD_ARITH_DIV = 0, TD_ARITH_MUL = 1 } td_scale_arith;

typedef struct {
    td_format fmt;              /* TD_E4M3 or TD_E5M2                                   */
    td_scale_granularity gran;
    td_scale_arith arith;       /* ignored by TD_SCALE_MX (its division is exact)         */
    bool pow2;                  /* power-of-two scales (always true for MX)               */
    td_saturation sat;          /* TD_SATFINITE: what the GPU kernels do                  */
    int group;                  /* G for GROUP / BLOCK (0 = 128); MX block (0 = 32)       */
} td_fp8_scheme;

/* The block shape of a scheme on a (rows, cols) tensor, and the number of blocks. */
void   td_fp8_block_shape(const td_fp8_scheme *s, size_t rows, size_t cols,
                          size_t *block_rows, size_t *block_cols);
size_t td_fp8_num_scales(const td_fp8_scheme *s, size_t rows, size_t cols);

/* The dequantisation scale of one block from its amax, and the quantisation multiplier or
 * divisor it implies (see above). Exposed for tests and for recipes that keep an amax history. */
float  td_fp8_scale_from_amax(const td_fp8_scheme *s, float amax);

/* codes: rows*cols bytes; scales: td_fp8_num_scales() dequantisation scales, blocks in
 * row-major order. */
void td_fp8_quantize(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols,
                     uint8_t *codes, float *scales);
void td_fp8_dequantize(const td_fp8_scheme *s, const uint8_t *codes, const float *scales,
                       size_t rows, size_t cols, float *y);
/* Quantise then dequantise (y may equal x): the values an FP8 GEMM multiplies. */
void td_fp8_fake_quant(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols, float *y);
/* y (rows, cols) = td_fp8_fake_quant of x^T (cols, rows), transposed back, without transposing: x
 * quantised down its columns, where the scheme's blocks are single rows of x^T (groups, MX, per
 * row) and the CPU has the vector rounding (AVX2 and F16C): 1; else 0 and nothing written. y may
 * be x. */
int td_fp8_fake_quant_cols(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols, float *y);

/* "tensor", "row"/"token"/"channel", "group"/"1x128", "block"/"128x128", "mx"/"mxfp8"; -1 if unknown. */
int td_scale_granularity_from_name(const char *name);
const char *td_scale_granularity_name(td_scale_granularity g);

TD_END_DECLS

#endif
