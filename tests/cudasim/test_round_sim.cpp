/* The device roundings (src/backend/cuda/round.cuh) against the CPU's (formats.h td_encode /
 * td_round, themselves checked bit for bit against NVIDIA's host conversions by tests/nv), run
 * in a kernel: under the simulator here, on the GPU in tests/gpu/run.sh (the same source). For
 * each format (bf16, fp16, e4m3, e5m2; SATFINITE, what the kernels use) the encoded code and the
 * rounded value of every input must be identical, NaN payloads included. Inputs: every fp32
 * pattern whose top 20 bits are a multiple of 3 and whose low 12 bits are one of a few values
 * (every sign and exponent, the rounding boundaries of all four formats) plus 2^16 random patterns; TD_ROUND_ALL=1 takes all
 * 2^32 patterns (for a GPU: seconds there, long under the simulator). */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "tidal/formats.h"
}

__global__ void round_kernel(const uint32_t *in, uint32_t *code, uint32_t *val, size_t n, int f)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = tdc_float(in[i]);
    uint32_t c;
    switch (f) {
    case TD_BF16: c = tdc_bf16_enc(x); break;
    case TD_F16: c = tdc_f16_enc(x); break;
    case TD_E4M3: c = tdc_e4m3_enc(x); break;
    default: c = tdc_e5m2_enc(x); break;
    }
    code[i] = c;
    val[i] = tdc_bits(tdc_round(f, x));
}

static uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

static size_t inputs(uint32_t **out, size_t chunk0, size_t chunk)
{
    uint32_t *in = (uint32_t *)malloc(chunk * sizeof *in);
    for (size_t i = 0; i < chunk; i++) in[i] = (uint32_t)(chunk0 + i);
    *out = in;
    return chunk;
}

static size_t sampled(uint32_t **out)
{
    static const uint32_t low[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};
    size_t n = ((size_t)1 << 20) / 3 * 6 + 6 + 65536, k = 0;
    uint32_t *in = (uint32_t *)malloc(n * sizeof *in);
    for (uint32_t hi = 0; hi < (1u << 20); hi += 3)   /* every exponent, a third of the mantissas */
        for (int j = 0; j < 6; j++) in[k++] = (hi << 12) | low[j];
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 65536; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        in[k++] = (uint32_t)s;
    }
    *out = in;
    return k;
}

static long check(const uint32_t *in, size_t n, int f)
{
    uint32_t *d_in, *d_code, *d_val;
    CUDA_CHECK(cudaMalloc((void **)&d_in, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&d_code, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&d_val, n * 4));
    CUDA_CHECK(cudaMemcpy(d_in, in, n * 4, cudaMemcpyHostToDevice));
    TD_LAUNCH(round_kernel, (unsigned)((n + 255) / 256), 256, 0, 0, d_in, d_code, d_val, n, f);
    CUDA_CHECK_LAUNCH();
    uint32_t *code = (uint32_t *)malloc(n * 4), *val = (uint32_t *)malloc(n * 4);
    CUDA_CHECK(cudaMemcpy(code, d_code, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(val, d_val, n * 4, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, &in[i], 4);
        uint32_t c = td_encode((td_format)f, x, TD_SATFINITE), v = bits(td_round_slow((td_format)f, x));
        if (code[i] != c || val[i] != v) {
            if (bad < 5)
                fprintf(stderr, "format %s input 0x%08x: device code 0x%x value 0x%08x, CPU 0x%x 0x%08x\n",
                        td_format_info((td_format)f)->name, in[i], code[i], val[i], c, v);
            bad++;
        }
    }
    cudaFree(d_in); cudaFree(d_code); cudaFree(d_val);
    free(code); free(val);
    return bad;
}

static void formats(void **state)
{
    (void)state;
    static const int F[] = {TD_BF16, TD_F16, TD_E4M3, TD_E5M2};
    if (getenv("TD_ROUND_ALL")) {
        const size_t chunk = (size_t)1 << 26;
        for (size_t c0 = 0; c0 < ((size_t)1 << 32); c0 += chunk) {
            uint32_t *in;
            size_t n = inputs(&in, c0, chunk);
            for (int f = 0; f < 4; f++) assert_int_equal(check(in, n, F[f]), 0);
            free(in);
        }
        printf("all 2^32 fp32 patterns: device roundings identical to the CPU's in 4 formats\n");
        return;
    }
    uint32_t *in;
    size_t n = sampled(&in);
    for (int f = 0; f < 4; f++) {
        long bad = check(in, n, F[f]);
        printf("%s: %zu inputs, %ld differ\n", td_format_info((td_format)F[f])->name, n, bad);
        assert_int_equal(bad, 0);
    }
    free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(formats)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
