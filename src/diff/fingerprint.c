/* The model's fingerprint (src/diff/job.h): FNV-1a 64 over config.json and the safetensors
 * headers' bytes (the first 64 KiB of each file) and the files' sizes. */
#include "job.h"

#include <stdio.h>
#include <sys/stat.h>

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001B3ull; }
    return h;
}

void model_fingerprint(const char *dir, char out[32])
{
    uint64_t h = 0xCBF29CE484222325ull;
    const char *files[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < 3; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);   /* the header and config: first 64 KiB */
        h = fnv1a(h, buf, n);
        struct stat st;
        if (stat(path, &st) == 0) h = fnv1a(h, &st.st_size, sizeof st.st_size);
        fclose(f);
    }
    snprintf(out, 32, "fnv1a64:%016llx", (unsigned long long)h);
}
