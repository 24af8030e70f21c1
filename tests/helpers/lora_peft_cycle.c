/* lora_peft_cycle — a test driver of tidal's PEFT merge/unmerge arithmetic (td_lora_peft_delta,
 * td_lora_peft_merge, td_lora_peft_unmerge: the cycle tidal-rl --lora-sync merge-unmerge runs
 * before every rollout), not a user tool. tests/py/test_lora_peft.py runs PEFT's own
 * merge_adapter() / unmerge_adapter() on the same weights and compares the bits.
 *
 *   lora_peft_cycle --input FILE --output FILE --dtype bf16|fp16|fp32 --cycles K --scale S
 *                   [--unmerge rounded|fp32]
 *
 * FILE (safetensors): "weight" (out, in) in the base dtype (BF16, F16 or F32: the values W),
 * "lora_A" (r, in) and "lora_B" (K, out, r) in F32: cycle k merges and unmerges the adapter
 * (A, B[k]), as training changes the adapter between syncs. Output: "weight" after K cycles
 * and "merged" (the weights the last merge gave the engine), both F32 (exact for any dtype).
 * --unmerge rounded: peft >= 0.16 (W -= delta.to(W.dtype)); fp32: peft < 0.16 (W -= delta).
 * Exit 0, 1 on a failure (message on stderr), 2 on bad usage. */
#include "tidal/checkpoint.h"
#include "tidal/formats.h"
#include "tidal/lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *msg)
{
    fprintf(stderr, "lora_peft_cycle: %s\nusage: lora_peft_cycle --input FILE --output FILE --dtype "
            "bf16|fp16|fp32 --cycles K --scale S [--unmerge rounded|fp32]\n", msg);
    return 2;
}

static int fail(const td_error *err)
{
    fprintf(stderr, "lora_peft_cycle: %s\n", err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *outp = NULL, *dt = NULL, *um = "rounded";
    int cycles = -1;
    double scale = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--input")) in = argv[i + 1];
        else if (!strcmp(argv[i], "--output")) outp = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else if (!strcmp(argv[i], "--cycles")) cycles = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scale")) scale = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--unmerge")) um = argv[i + 1];
        else return usage(argv[i]);
    }
    int D = dt ? td_format_from_name(dt) : -1;
    if (!in || !outp || cycles < 0 || !(scale > 0) || (D != TD_F32 && D != TD_BF16 && D != TD_F16) ||
        (strcmp(um, "rounded") && strcmp(um, "fp32")))
        return usage("missing or bad option");
    td_error err;
    td_checkpoint *ck = td_checkpoint_open(in, &err);
    if (!ck) return fail(&err);
    const td_tensor *tw = td_checkpoint_find(ck, "weight"), *ta = td_checkpoint_find(ck, "lora_A"),
                    *tb = td_checkpoint_find(ck, "lora_B");
    if (!tw || !ta || !tb || tw->ndim != 2 || ta->ndim != 2 || tb->ndim != 3 || tb->shape[0] != cycles) {
        fprintf(stderr, "lora_peft_cycle: %s: expected weight (out, in), lora_A (r, in), lora_B (%d, out, r)\n", in, cycles);
        return 1;
    }
    int out = (int)tw->shape[0], inn = (int)tw->shape[1], r = (int)ta->shape[0];
    size_t n = (size_t)out * inn, bad = 0;
    float *w = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float)), *delta = malloc(n * sizeof(float));
    float *a = malloc((size_t)r * inn * sizeof(float)), *b = malloc((size_t)cycles * out * r * sizeof(float) + 1);
    int64_t sw[2] = {out, inn}, sa[2] = {r, inn}, sb[3] = {cycles, out, r};
    if (td_checkpoint_read_f32(ck, "weight", 2, sw, w, &bad, &err) || td_checkpoint_read_f32(ck, "lora_A", 2, sa, a, &bad, &err) ||
        td_checkpoint_read_f32(ck, "lora_B", 3, sb, b, &bad, &err))
        return fail(&err);
    td_checkpoint_close(ck);
    /* a one-pair adapter: the pair's matrices, rank and scale are all td_lora_peft_delta reads */
    td_lora_pair pair = {.a = a, .b = b, .out = out, .in = inn};
    td_lora lo = {.rank = r, .scale = (float)scale, .num_layers = 1, .pairs = &pair};
    memcpy(m, w, n * sizeof(float));
    for (int k = 0; k < cycles; k++) {
        pair.b = b + (size_t)k * out * r;
        td_lora_peft_delta(&lo, &pair, delta);
        memcpy(m, w, n * sizeof(float));
        td_lora_peft_merge((td_format)D, m, delta, n);
        memcpy(w, m, n * sizeof(float));
        td_lora_peft_unmerge((td_format)D, strcmp(um, "fp32") ? TD_PEFT_UNMERGE_ROUNDED : TD_PEFT_UNMERGE_FP32, w, delta, n);
    }
    td_st_writer *wr = td_st_writer_new(outp);
    int rc = td_st_writer_declare(wr, "weight", TD_DT_F32, 2, sw, &err) || td_st_writer_declare(wr, "merged", TD_DT_F32, 2, sw, &err) ||
             td_st_writer_begin(wr, &err) || td_st_writer_write_f32(wr, "weight", w, n, &err) ||
             td_st_writer_write_f32(wr, "merged", m, n, &err) || td_st_writer_finish(wr, &err);
    td_st_writer_free(wr);
    if (rc) return fail(&err);
    free(w); free(m); free(delta); free(a); free(b);
    return 0;
}
