/* tidal-cast — see a number in each format.
 *
 *   tidal-cast --format e4m3 --saturate 500      ->  0x7e 448
 *   printf '0.1\n0x1.8p-3\n' | tidal-cast --format bf16
 *   tidal-cast --format fp16 --decode 0x3c00     ->  0x3c00 1
 *
 * Each output line is the code in hex, then its decoded value (%.9g: enough digits to
 * reproduce the fp32 exactly). Numbers are parsed as fp32 by strtof (correctly rounded, any
 * strtod form: decimal, hex-float, inf, nan). With no number arguments, reads one number per
 * line from stdin; an unparseable line stops with its line number and exit status 1, after
 * every earlier line has been written.
 */
#include "tidal/formats.h"
#include "tidal/opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses a whole token as a float (trailing blanks allowed); 0 on success. */
static int parse_number(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s) return -1;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
    if (*end) return -1;
    *out = v;   /* ERANGE is fine: strtof already gives the correctly rounded Inf / 0 / subnormal */
    return 0;
}

static int parse_code(const char *s, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 0);
    if (end == s || errno) return -1;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
    if (*end || v > max) return -1;
    *out = (uint32_t)v;
    return 0;
}

typedef struct {
    td_format fmt;
    td_saturation sat;
    int decode;
    int hex_digits;
    uint32_t max_code;
} cast_opts;

/* Converts one token and prints its line; returns 0, or -1 if the token does not parse. */
static int cast_one(const cast_opts *o, const char *tok)
{
    uint32_t code;
    if (o->decode) {
        if (parse_code(tok, o->max_code, &code)) return -1;
    } else {
        float x;
        if (parse_number(tok, &x)) return -1;
        code = td_encode(o->fmt, x, o->sat);
    }
    printf("0x%0*x %.9g\n", o->hex_digits, code, (double)td_decode(o->fmt, code));
    return 0;
}

static int parse_format(void *dest, const char *v, char *why, size_t n)
{
    int f = td_format_from_name(v);
    if (f < 0 || f == TD_F32) return -1;
    *(td_format *)dest = (td_format)f;
    return 0;
}

int main(int argc, char **argv)
{
    cast_opts o = {.fmt = (td_format)-1, .sat = TD_SATFINITE};
    int sat = 1;
    td_opt opts[] = {
        TD_OPT_FUN("format", 'f', &o.fmt, "FMT", parse_format, "bf16, fp16, e4m3, e5m2 or e8m0", "bf16|fp16|e4m3|e5m2|e8m0"),
        TD_OPT_F("saturate", 0, &sat, 1, "FP8 overflow saturates to the largest finite value (default,\n"
                 "as the __nv_fp8_e4m3 constructor does)"),
        TD_OPT_F("no-saturate", 0, &sat, 0, "FP8 overflow gives NaN (e4m3) or Inf (e5m2)"),
        TD_OPT_F("decode", 0, &o.decode, 1, "read codes (hex or decimal) instead of numbers"),
        {0}};
    td_opt_get(opts, "format")->required = 1;
    td_cli cli = {"tidal-cast", "--format FMT [--saturate|--no-saturate] [--decode] [NUMBER...]",
                  "Prints the code (hex) and decoded value of each NUMBER in the format, as NVIDIA's conversions\n"
                  "compute them (round to nearest even). Without NUMBERs, reads one per line from stdin.\n"
                  "bf16 and fp16 have no saturating conversion: overflow is Inf. e8m0 rounds up (the MXFP8\n"
                  "convention). Negative numbers are operands: tidal-cast --format bf16 -1.5",
                  NULL, opts, 0, -1};
    const char **nums = td_xmalloc(((size_t)argc + 1) * sizeof *nums);
    int nargs, rc = td_cli_parse(&cli, argc, argv, nums, &nargs);
    if (rc >= 0) { free(nums); return rc; }
    o.sat = sat ? TD_SATFINITE : TD_NOSAT;
    const td_format_traits *t = td_format_info(o.fmt);
    o.hex_digits = t->storage_bits / 4;
    o.max_code = (uint32_t)((1ull << t->storage_bits) - 1);

    static char outbuf[1 << 20];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);

    if (nargs > 0) {
        for (int i = 0; i < nargs; i++)
            if (cast_one(&o, nums[i])) {
                fflush(stdout);
                fprintf(stderr, "tidal-cast: argument %d: cannot parse '%s' as a %s\n", i + 1, nums[i],
                        o.decode ? "code" : "number");
                free(nums);
                return 1;
            }
        free(nums);
        return fflush(stdout) ? 1 : 0;
    }
    free(nums);

    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned long lineno = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (cast_one(&o, line)) {
            fflush(stdout);
            if (len > 0 && line[len - 1] == '\n') line[len - 1] = 0;
            fprintf(stderr, "tidal-cast: stdin:%lu: cannot parse '%.80s' as a %s\n", lineno, line,
                    o.decode ? "code" : "number");
            free(line);
            return 1;
        }
    }
    free(line);
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "tidal-cast: error writing output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
