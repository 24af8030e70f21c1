/* tidal — a recipe's weights prepared on the device from a trainer's device masters
 * (td_backend_cuda's prepare entry, src/model/ops.h; the host form is weights_recipe.c's
 * td_gemm_prepare_weight / td_round_row / td_encode_row and lora_run.c's vLLM B):
 *   prepare_cuda   dst[i] = R(src[i]), then R(dst[i] * scale) when scale != 1, R = round.cuh's
 *                  tdc_round of fmt (the CPU's bit arithmetic, SATFINITE); stored as fp32 or as
 *                  bf16 / fp16 codes (tdc_bf16_enc / tdc_f16_enc: td_encode_row's codes). Bit for
 *                  bit the host preparation (tests/cudasim/test_prepare_sim.cpp).
 * dst is the device copy the ops look up for the host key (tdc_const_slot, backend.cu): the host
 * buffer is never written. fp8 weight formats are not prepared here (their block scales are a
 * reduction per block): weights_recipe.c prepares them on the host. */
#include "kern.cuh"

#define PREP_THREADS 256

__global__ static void prepare_elems(void *dst, int storage, const float *src, size_t n, int fmt, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = tdc_round(fmt, src[i]);
        if (scale != 1.0f) v = tdc_round(fmt, tdc_mul(v, scale));
        if (storage == TD_BF16) ((uint16_t *)dst)[i] = tdc_bf16_enc(v);
        else if (storage == TD_F16) ((uint16_t *)dst)[i] = tdc_f16_enc(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" void prepare_cuda(const void *key, int storage, const float *src, size_t n, int fmt, float scale)
{
    if (!n) return;
    if ((storage != TD_F32 && storage != fmt) || (storage != TD_F32 && storage != TD_BF16 && storage != TD_F16) ||
        fmt == TD_E4M3 || fmt == TD_E5M2) {
        fprintf(stderr, "tidal: prepare_cuda: storage %d from format %d is not prepared on the device (a tidal bug)\n",
                storage, fmt);
        abort();
    }
    void *dst = tdc_const_slot(key, n * (storage == TD_F32 ? 4 : 2));
    size_t b = (n + PREP_THREADS - 1) / PREP_THREADS;
    TD_LAUNCH(prepare_elems, (unsigned)(b > 4096 ? 4096 : b), PREP_THREADS, 0, tdc_stream(), dst, storage,
              (const float *)tdc_in(src, n * sizeof(float)), n, fmt, scale);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
