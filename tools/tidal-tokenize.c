/* tidal-tokenize: encode or decode text with a Hugging Face tokenizer.json, one line at a time.
 *
 *   tidal-tokenize --tokenizer DIR[/tokenizer.json] [--no-special] [--no-add-special] [--json] < text
 *       one line of space-separated ids per input line
 *   tidal-tokenize --tokenizer DIR[/tokenizer.json] --decode [--skip-special] [--json] < ids
 *       one line of text per input line of ids
 *   tidal-tokenize --tokenizer DIR[/tokenizer.json] --info
 *   tidal-tokenize --tokenizer DIR[/tokenizer.json] --bench < text
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
#include "tidal/opts.h"
#include "tidal/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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
    const char *path = NULL, *model_dir = NULL, *vocab_dir = NULL;
    int decode = 0, allow_special = 1, add_special = 1, skip_special = 0, json = 0, info = 0, do_bench = 0;
    td_opt opts[] = {
        TD_OPT_S("tokenizer", 0, &path, "PATH", "tokenizer.json, or the directory holding it (as vLLM's --tokenizer)"),
        TD_OPT_S("model", 0, &model_dir, "DIR", "the checkpoint directory: its tokenizer.json"),
        TD_OPT_F("decode", 0, &decode, 1, "read lines of ids, write text"),
        TD_OPT_F("no-special", 0, &allow_special, 0, "special tokens written in the text (\"<|endoftext|>\") are\nencoded as text"),
        TD_OPT_F("no-add-special", 0, &add_special, 0, "no BOS/EOS from the post-processor (HF add_special_tokens=False)"),
        TD_OPT_F("skip-special", 0, &skip_special, 1, "decode drops special tokens (HF's Python default; tidal keeps them)"),
        TD_OPT_F("json", 0, &json, 1, "each text line is a JSON string, so text may hold newlines"),
        TD_OPT_F("info", 0, &info, 1, "print vocab_size, bos_id, eos_id"),
        TD_OPT_F("bench", 0, &do_bench, 1, "encode stdin's lines, print \"bytes B tokens T seconds S MB/s R\""),
        TD_OPT_S("write-char-vocab", 0, &vocab_dir, "DIR", "write the default character vocabulary of tidal's task\n"
                 "models (tokenizer.json, tokenizer_config.json) into DIR"),
        {0}};
    td_cli cli = {"tidal-tokenize", "--tokenizer PATH|--model DIR [--decode] [--no-special] [--no-add-special] "
                  "[--skip-special] [--json] [--info] [--bench] < lines\n--write-char-vocab DIR",
                  "Encodes (one line of space-separated ids per input line) or decodes (one line of text per\n"
                  "line of ids) with a Hugging Face tokenizer.json.", NULL, opts, 0, 0};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc0 >= 0) return rc0;
    if (path && model_dir) return td_cli_bad(&cli, "--model", model_dir, "either --model or --tokenizer, not both");
    char tpath[4200];
    struct stat st;
    if (model_dir || (path && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
        snprintf(tpath, sizeof tpath, "%s/tokenizer.json", model_dir ? model_dir : path);
        path = tpath;
    }
    td_error err = {{0}};
    if (vocab_dir) {
        td_charvocab_spec spec = td_charvocab_default_spec();
        if (td_charvocab_write(vocab_dir, &spec, &err)) { fprintf(stderr, "tidal-tokenize: %s\n", err.msg); return 1; }
        return 0;
    }
    if (!path) return td_cli_bad(&cli, "--tokenizer", NULL, "required (PATH), or --model DIR");
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
