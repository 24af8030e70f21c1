/* tidal — FP8 quantisation on the GPU: fp8_quantize_cuda, td_fp8_quantize (scaling.c) bit for
 * bit, for the activation operand of FP8 GEMMs (matmul.cu). Every granularity of scaling.h:
 * per-tensor amax over the whole batch, per row, 1 x G groups, G x G blocks, MX; DIV and MUL
 * arithmetic, power-of-two scales, saturation or not.
 *
 * Three kernels: (1) the maximum |x| of each chunk of a row (a chunk never straddles two column
 * blocks); (2) per scale block, the maximum of its chunks' maxima (a CUDA block reduces it, or one
 * thread when there are at most 64: 1 x 128 groups, MX; fmaxf ignores NaN as the CPU's loop does,
 * and a maximum is exact in any order), then the scale and the quantisation step with scaling.c's
 * fp32 arithmetic (IEEE division: nvcc's default -prec-div=true); (3) every element encoded as
 * enc(x * mul) or enc(x / div), saturating as the scheme says. Scratch slot MISC holds the chunk
 * maxima and the steps. */
#include "matmul.cuh"

#include <float.h>

#define TPB 256
#define GTID ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

static unsigned nblk(size_t n) { return (unsigned)((n + TPB - 1) / TPB); }

typedef struct { int fmt, gran, arith, pow2, sat; } qscheme;

/* td_f32_to_e8m0(x, TD_SATFINITE, TD_ROUND_UP) and td_e8m0_to_f32 */
__device__ static inline uint8_t e8m0_up(float x)
{
    uint32_t a = tdc_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFF;
    if (a == 0x7F800000u) return 0xFE;
    int e = (int)(a >> 23);
    uint32_t mant = a & 0x7FFFFFu;
    if (e == 0) return mant == 0 ? 0 : (mant > 0x400000u ? 1 : 0);
    int p = e + (mant != 0);
    return (uint8_t)(p > 254 ? 0xFE : p);
}
__device__ static inline float e8m0_dec(uint8_t c)
{
    return c == 0xFF ? tdc_float(0x7FFF0000u) : c == 0 ? tdc_float(0x00400000u) : tdc_float((uint32_t)c << 23);
}

/* block_scale_from_amax of scaling.c: the block's dequantisation scale, and x * mul (mul != 0)
 * or x / div as the quantisation step */
__device__ static void block_factors(qscheme s, float amax, float *scale, float *mul, float *div)
{
    const float fmax = s.fmt == TD_E4M3 ? 448.0f : 57344.0f;
    *mul = 0.0f;
    *div = 1.0f;
    if (s.gran == TD_SCALE_MX) {
        *scale = *div = e8m0_dec(e8m0_up(amax * (1.0f / fmax)));
        return;
    }
    if (s.arith == TD_ARITH_DIV) {
        float a = amax > 1e-10f ? amax : 1e-10f;
        float sc = a / fmax;
        if (s.pow2) sc = e8m0_dec(e8m0_up(sc));
        *scale = *div = sc;
        return;
    }
    uint32_t ab = tdc_bits(amax) & 0x7FFFFFFFu;
    float k = 1.0f;
    if (!(ab >= 0x7F800000u || amax == 0.0f)) {     /* not Inf, NaN or zero */
        k = fmax / amax;
        if ((tdc_bits(k) & 0x7FFFFFFFu) == 0x7F800000u) k = FLT_MAX;
    }
    if (s.pow2) k = tdc_float(tdc_bits(k) & 0xFF800000u);
    *mul = k;
    *scale = 1.0f / k;
}

/* cam[r * nch + cc] = max |x| over row r, columns [cc * ch, cc * ch + ch) */
__global__ void chunk_amax_kernel(const float *x, int rows, int cols, int ch, int nch, float *cam)
{
    size_t i = GTID;
    if (i >= (size_t)rows * nch) return;
    size_t r = i / nch;
    int c0 = (int)(i % nch) * ch, c1 = c0 + ch < cols ? c0 + ch : cols;
    float m = 0.0f;
    for (int c = c0; c < c1; c++) m = fmaxf(m, fabsf(x[r * cols + c]));
    cam[i] = m;
}

/* one CUDA block per scale block: amax over its chunk maxima, then its scale and step */
__global__ void block_scale_kernel(const float *cam, int rows, int cols, int ch, int nch, int br,
                                   int bc, int nbc, qscheme s, float *scales, float *qmul,
                                   float *qdiv)
{
    TD_DYN_SMEM(float, red);
    int bi = blockIdx.x, t = threadIdx.x;
    int r0 = bi / nbc * br, r1 = r0 + br < rows ? r0 + br : rows;
    int c0 = bi % nbc * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
    int cc0 = c0 / ch, ncc = (c1 + ch - 1) / ch - cc0;
    long count = (long)(r1 - r0) * ncc;
    float m = 0.0f;
    for (long e = t; e < count; e += blockDim.x) m = fmaxf(m, cam[(size_t)(r0 + e / ncc) * nch + cc0 + e % ncc]);
    red[t] = m;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h) red[t] = fmaxf(red[t], red[t + h]);
        __syncthreads();
    }
    if (t == 0) block_factors(s, red[0], &scales[bi], &qmul[bi], &qdiv[bi]);
}

/* the same for small blocks (a few chunks each: 1 x 128 groups, MX): one thread per scale block */
__global__ void block_scale_serial_kernel(const float *cam, int rows, int cols, int ch, int nch, int br,
                                          int bc, int nbc, int nb, qscheme s, float *scales,
                                          float *qmul, float *qdiv)
{
    size_t bi = GTID;
    if (bi >= (size_t)nb) return;
    int r0 = (int)(bi / nbc) * br, r1 = r0 + br < rows ? r0 + br : rows;
    int c0 = (int)(bi % nbc) * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
    int cc0 = c0 / ch, cc1 = (c1 + ch - 1) / ch;
    float m = 0.0f;
    for (int r = r0; r < r1; r++)
        for (int cc = cc0; cc < cc1; cc++) m = fmaxf(m, cam[(size_t)r * nch + cc]);
    block_factors(s, m, &scales[bi], &qmul[bi], &qdiv[bi]);
}

__global__ void fp8_encode_kernel(const float *x, int rows, int cols, int br, int bc, int nbc,
                                  qscheme s, const float *qmul, const float *qdiv, uint8_t *codes)
{
    size_t i = GTID;
    if (i >= (size_t)rows * cols) return;
    size_t b = (i / cols) / br * nbc + (i % cols) / bc;
    float v = qmul[b] != 0.0f ? x[i] * qmul[b] : x[i] / qdiv[b];
    codes[i] = (uint8_t)(s.fmt == TD_E4M3 ? tdc_narrow_enc(v, 3, 7, 0x80u, 0x7Eu, 0x7Fu, 0x7Fu, s.sat == TD_SATFINITE)
                                          : tdc_narrow_enc(v, 2, 15, 0x80u, 0x7Bu, 0x7Fu, 0x7Cu, s.sat == TD_SATFINITE));
}

extern "C" void fp8_quantize_cuda(const td_fp8_scheme *s, const float *x, int rows, int cols,
                                  uint8_t *codes, float *scales)
{
    if (rows <= 0 || cols <= 0) return;
    size_t br, bc;
    td_fp8_block_shape(s, (size_t)rows, (size_t)cols, &br, &bc);
    int nbr = (int)((rows + br - 1) / br), nbc = (int)((cols + bc - 1) / bc);
    /* chunks of a row never straddle two column blocks: a block's own width, or 128 columns when
     * a row is one block */
    int ch = bc < (size_t)cols ? (int)bc : cols > 128 ? 128 : cols;
    int nch = (cols + ch - 1) / ch;
    size_t nb = (size_t)nbr * nbc;
    float *cam = (float *)tdc_scratch(TDC_SLOT_MISC, ((size_t)rows * nch + 2 * nb) * sizeof(float));
    float *qmul = cam + (size_t)rows * nch, *qdiv = qmul + nb;
    qscheme q = {s->fmt, s->gran, s->arith, s->pow2, s->sat};
    cudaStream_t st = tdc_stream();
    TD_LAUNCH(chunk_amax_kernel, nblk((size_t)rows * nch), TPB, 0, st, x, rows, cols, ch, nch, cam);
    CUDA_CHECK_LAUNCH();
    size_t per_block = (br < (size_t)rows ? br : (size_t)rows) * (((bc < (size_t)cols ? bc : (size_t)cols) + ch - 1) / ch);
    if (per_block <= 64)   /* few chunk maxima per scale block: a thread each */
        TD_LAUNCH(block_scale_serial_kernel, nblk(nb), TPB, 0, st, cam, rows, cols, ch, nch, (int)br, (int)bc,
                  nbc, (int)nb, q, scales, qmul, qdiv);
    else                   /* many (per-tensor, per-row, 128 x 128): a CUDA block each */
        TD_LAUNCH(block_scale_kernel, (unsigned)nb, TPB, TPB * sizeof(float), st, cam, rows, cols, ch,
                  nch, (int)br, (int)bc, nbc, q, scales, qmul, qdiv);
    CUDA_CHECK_LAUNCH();
    TD_LAUNCH(fp8_encode_kernel, nblk((size_t)rows * cols), TPB, 0, st, x, rows, cols, (int)br,
              (int)bc, nbc, q, qmul, qdiv, codes);
    CUDA_CHECK_LAUNCH();
}

