/* tidal — what matmul.cu and fp8_quant.cu offer besides matmul_forward_cuda (internal header). */
#ifndef TIDAL_CUDA_MATMUL_CUH
#define TIDAL_CUDA_MATMUL_CUH

#include "cuda_internal.cuh"

extern "C" {
/* td_fp8_quantize on the GPU, bit for bit: x (rows, cols) fp32 in device memory -> codes (rows *
 * cols bytes) and td_fp8_num_scales(s, rows, cols) dequantisation scales, blocks in row-major
 * order, both device memory. Every granularity and scale arithmetic of scaling.h. */
void fp8_quantize_cuda(const td_fp8_scheme *s, const float *x, int rows, int cols, uint8_t *codes,
                       float *scales);

/* Drops the fp32 copies matmul.cu widens non-fp32 weights into (keyed by host address, as
 * tdc_const's cache is) and its cuBLASLt plans: be->forget calls it with tdc_const's cache. */
void matmul_forget_cuda(void);
}

#endif
