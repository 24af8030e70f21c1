/* Helpers shared by the checkpoint tests: temporary directories and hand-built files.
 * Bad files are built here, byte by byte, rather than committed as binaries. */
#ifndef TIDAL_CKPT_TESTUTIL_H
#define TIDAL_CKPT_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

/* A fresh directory under $TMPDIR or /tmp; removed (with its files) by rm_tree. */
static inline char *make_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    char *d = malloc(4096);
    assert_non_null(d);
    snprintf(d, 4096, "%s/tidal-ckpt-test-XXXXXX", t && t[0] ? t : "/tmp");
    assert_non_null(mkdtemp(d));
    return d;
}

static inline void rm_tree(char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static inline void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static inline void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static inline void path_join(char *out, size_t n, const char *dir, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* A safetensors file from a header string and a data area: u64 LE length | header | data. */
static inline void write_safetensors(const char *path, const char *header, const void *data, size_t ndata)
{
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + ndata + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (ndata) memcpy(buf + 8 + hl, data, ndata);
    write_bytes(path, buf, 8 + hl + ndata);
    free(buf);
}

/* True if haystack contains every one of the NULL-terminated needles. */
static inline int contains_all(const char *hay, ...)
{
    va_list ap;
    va_start(ap, hay);
    const char *s;
    int ok = 1;
    while ((s = va_arg(ap, const char *)))
        if (!strstr(hay, s)) {
            fprintf(stderr, "message \"%s\" lacks \"%s\"\n", hay, s);
            ok = 0;
        }
    va_end(ap);
    return ok;
}

/* A minimal config.json of a tiny Llama: V=16 C=8 F=12 L=1 NH=2 NKV=1 HD=4, untied. */
__attribute__((unused)) static const char *tiny_llama_config =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 16, \"hidden_size\": 8,"
    " \"intermediate_size\": 12, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-5, \"torch_dtype\": \"float32\"}";

#endif
