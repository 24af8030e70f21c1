/* Fuzz target: one safetensors file (8-byte header length, JSON header, data area) opened as a
 * bare checkpoint file, then every tensor read as fp32 (which touches every byte the header
 * claims, so an offset or shape past the file shows up under ASan). */
#include "fuzz_util.h"
#include "tidal/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "model.safetensors", data, size);
    td_error err;
    td_checkpoint *ck = td_checkpoint_open(path, &err);
    if (!ck) return 0;
    size_t n = td_checkpoint_num_tensors(ck);
    for (size_t i = 0; i < n; i++) {
        const td_tensor *t = td_checkpoint_tensor(ck, i);
        /* the loader promised numel * size bytes inside the file, so this is bounded by it */
        float *dst = malloc((t->numel ? t->numel : 1) * sizeof(float));
        size_t bad = 0;
        td_tensor_to_f32(t, dst, &bad);
        free(dst);
        if (td_checkpoint_find(ck, t->name) != t) abort();
    }
    size_t nbad = 0;
    td_checkpoint_count_nonfinite(ck, &nbad);
    td_checkpoint_metadata(ck, "format");
    td_checkpoint_close(ck);
    return 0;
}
