/* tidal-tokenize: encode or decode text with a Hugging Face tokenizer.json, one line at a time.
 *
 *   tidal-tokenize --tokenizer DIR/tokenizer.json [--no-special] [--no-add-special] [--json] < text
 *       one line of space-separated ids per input line
 *   tidal-tokenize --tokenizer DIR/tokenizer.json --decode [--skip-special] [--json] < ids
 *       one line of text per input line of ids
 *   tidal-tokenize --tokenizer DIR/tokenizer.json --info
 *   tidal-tokenize --tokenizer DIR/tokenizer.json --bench < text
 *       encodes every line, prints "bytes B tokens T seconds S MB/s R" (encode time only)
 *   tidal-tokenize --write-char-vocab DIR
 *       writes the default character vocabulary of tidal's task models (tokenizer.json and
 *       tokenizer_config.json) into DIR
 *
 *   --no-special      special tokens written in the text ("<|endoftext|>") are encoded as text
 *   --no-add-special  no BOS/EOS from the post-processor (HF add_special_tokens=False)
 *   --skip-special    decode drops special tokens (HF's Python default; tidal keeps them)
 *   --json            each text line is a JSON string, so text may hold newlines: input lines
 *                     when encoding, output lines when decoding
 */
#include "tidal/io.h"
#include "tidal/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(void)
{
    fprintf(stderr, "usage: tidal-tokenize --tokenizer PATH/tokenizer.json [--decode] [--no-special] "
                    "[--no-add-special] [--skip-special] [--json] [--info] [--bench]\n"
                    "       tidal-tokenize --write-char-vocab DIR\n");
    exit(2);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads all of stdin, then times the encoding of its lines (loading and I/O excluded). */
static int bench(const td_tokenizer *tok)
{
    char *all = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 65536 > cap) {
            cap = 2 * cap + 65536;
            all = realloc(all, cap);
            if (!all) { fprintf(stderr, "tidal-tokenize: out of memory\n"); return 1; }
        }
        got = fread(all + n, 1, 65536, stdin);
        n += got;
    } while (got);
    size_t tokens = 0;
    td_error err;
    double t0 = now();
    for (size_t a = 0; a < n;) {
        const char *nl = memchr(all + a, '\n', n - a);
        size_t b = nl ? (size_t)(nl - all) : n;
        int32_t *ids;
        size_t k;
        if (td_tokenizer_encode(tok, all + a, b - a, true, true, &ids, &k, &err)) {
            fprintf(stderr, "tidal-tokenize: %s\n", err.msg);
            free(all);
            return 1;
        }
        tokens += k;
        free(ids);
        a = b + 1;
    }
    double dt = now() - t0;
    printf("bytes %zu tokens %zu seconds %.3f MB/s %.2f\n", n, tokens, dt, (double)n / 1e6 / dt);
    free(all);
    return 0;
}

static int parse_ids(const char *line, int32_t **ids, size_t *n, size_t *cap)
{
    *n = 0;
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) return 0;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < -2147483648L || v > 2147483647L) return -1;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            *ids = realloc(*ids, *cap * sizeof **ids);
            if (!*ids) { fprintf(stderr, "tidal-tokenize: out of memory\n"); exit(1); }
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
}

int main(int argc, char **argv)
{
    const char *path = NULL, *vocab_dir = NULL;
    bool decode = false, allow_special = true, add_special = true, skip_special = false, json = false, info = false;
    bool do_bench = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--write-char-vocab") && i + 1 < argc) vocab_dir = argv[++i];
        else if (!strcmp(argv[i], "--decode")) decode = true;
        else if (!strcmp(argv[i], "--no-special")) allow_special = false;
        else if (!strcmp(argv[i], "--no-add-special")) add_special = false;
        else if (!strcmp(argv[i], "--skip-special")) skip_special = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--info")) info = true;
        else if (!strcmp(argv[i], "--bench")) do_bench = true;
        else usage();
    }
    td_error err = {{0}};
    if (vocab_dir) {
        td_charvocab_spec spec = td_charvocab_default_spec();
        if (td_charvocab_write(vocab_dir, &spec, &err)) { fprintf(stderr, "tidal-tokenize: %s\n", err.msg); return 1; }
        return 0;
    }
    if (!path) usage();
    td_tokenizer *tok = td_tokenizer_load(path, &err);
    if (!tok) { fprintf(stderr, "tidal-tokenize: %s\n", err.msg); return 1; }
    if (info) {
        printf("vocab_size %zu\nbos_id %d\neos_id %d\n", td_tokenizer_vocab_size(tok), td_tokenizer_bos_id(tok),
               td_tokenizer_eos_id(tok));
        td_tokenizer_free(tok);
        return 0;
    }
    if (do_bench) {
        int rc = bench(tok);
        td_tokenizer_free(tok);
        return rc;
    }
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    char *line = NULL;
    size_t lcap = 0, lineno = 0;
    ssize_t got;
    int32_t *ids = NULL;
    size_t nids = 0, idcap = 0;
    int status = 0;
    while ((got = getline(&line, &lcap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (!decode) {
            const char *text = line;
            size_t tlen = len;
            json_t *js = NULL;
            if (json) {
                json_error_t je;
                js = td_json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                if (!json_is_string(js)) {
                    fprintf(stderr, "tidal-tokenize: stdin line %zu: expected a JSON string (%s)\n", lineno, js ? "not a string" : je.text);
                    status = 1;
                    json_decref(js);
                    break;
                }
                text = json_string_value(js);
                tlen = json_string_length(js);
            }
            int32_t *out;
            size_t n;
            if (td_tokenizer_encode(tok, text, tlen, allow_special, add_special, &out, &n, &err)) {
                fprintf(stderr, "tidal-tokenize: stdin line %zu: %s\n", lineno, err.msg);
                status = 1;
                json_decref(js);
                break;
            }
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", out[i]);
            putchar('\n');
            free(out);
            json_decref(js);
        } else {
            if (parse_ids(line, &ids, &nids, &idcap)) {
                fprintf(stderr, "tidal-tokenize: stdin line %zu: expected integer ids separated by spaces\n", lineno);
                status = 1;
                break;
            }
            size_t tlen;
            char *text = td_tokenizer_decode(tok, ids, nids, skip_special, &tlen);
            if (json) {
                json_t *js = json_stringn(text, tlen);
                char *s = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
                printf("%s\n", s ? s : "null");
                free(s);
                json_decref(js);
            } else {
                fwrite(text, 1, tlen, stdout);
                putchar('\n');
            }
            free(text);
        }
    }
    free(line);
    free(ids);
    td_tokenizer_free(tok);
    if (fflush(stdout) != 0) { fprintf(stderr, "tidal-tokenize: write to stdout failed\n"); return 1; }
    return status;
}
