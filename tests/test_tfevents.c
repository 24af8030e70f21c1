/* --report-to's writers (src/record/tfevents.c, steplog.c; include/tidal/tfevents.h):
 * CRC-32C on the published check vectors (the "123456789" check value of the CRC catalogue and
 * RFC 3720 appendix B.4's iSCSI vectors) and TFRecord's mask (values from TensorBoard's own
 * masked_crc32c); an events file read back frame by frame (lengths, both CRCs, the file_version
 * record first, one Event per step with its tags and float32 values); the --resume cut-back
 * (records past the boundary and a torn tail removed, a file left with no step deleted, the
 * JSON-lines file cut at the same step); --report-to's parser and HF's tag rule. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <cmocka.h>

#include "tidal/tfevents.h"
#include "testutil.h"

static void test_crc32c_vectors(void **state)
{
    (void)state;
    unsigned char b[32];
    assert_int_equal(td_crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(td_crc32c("", 0), 0x00000000u);
    memset(b, 0, 32);
    assert_int_equal(td_crc32c(b, 32), 0x8A9136AAu);   /* RFC 3720 B.4: 32 bytes of zeros */
    memset(b, 0xFF, 32);
    assert_int_equal(td_crc32c(b, 32), 0x62A8AB43u);   /* 32 bytes of ones */
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    assert_int_equal(td_crc32c(b, 32), 0x46DD794Eu);   /* incrementing 00..1f */
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    assert_int_equal(td_crc32c(b, 32), 0x113FDB5Cu);   /* decrementing 1f..00 */
    /* tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c */
    assert_int_equal(td_crc32c_mask(td_crc32c("123456789", 9)), 0xC78AB0E5u);
    assert_int_equal(td_crc32c_mask(td_crc32c("", 0)), 0xA282EAD8u);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    assert_int_equal(td_crc32c_mask(td_crc32c(b, 32)), 0x951F7892u);
}

/* ---- an independent reader of the frames and the Event fields the writer uses ---- */
typedef struct {
    int version;            /* the file_version record ("brain.Event:2") */
    long long step;
    double wall_time;
    int n;                  /* Summary values */
    char tag[8][64];
    float value[8];
} event_t;

static uint64_t varint(const unsigned char **p)
{
    uint64_t v = 0;
    for (int s = 0;; s += 7) {
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7F) << s;
        if (!(c & 0x80)) return v;
    }
}

static uint32_t rd32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void parse_value(const unsigned char *p, const unsigned char *end, event_t *e)
{
    while (p < end) {
        uint64_t key = varint(&p);
        if (key == (1 << 3 | 2)) {
            uint64_t n = varint(&p);
            assert_true(n < 64);
            memcpy(e->tag[e->n], p, n);
            e->tag[e->n][n] = 0;
            p += n;
        } else {
            assert_int_equal(key, 2 << 3 | 5);   /* simple_value, fixed32 */
            uint32_t u = rd32(p);
            memcpy(&e->value[e->n], &u, 4);
            p += 4;
        }
    }
    e->n++;
}

static void parse_event(const unsigned char *p, size_t n, event_t *e)
{
    const unsigned char *end = p + n;
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = varint(&p), len, u = 0;
        switch (key) {
        case 1 << 3 | 1:
            for (int i = 0; i < 8; i++) u |= (uint64_t)p[i] << (8 * i);
            memcpy(&e->wall_time, &u, 8);
            p += 8;
            break;
        case 2 << 3 | 0: e->step = (long long)varint(&p); break;
        case 3 << 3 | 2:
            len = varint(&p);
            assert_int_equal(len, 13);
            assert_memory_equal(p, "brain.Event:2", 13);
            e->version = 1;
            p += len;
            break;
        case 5 << 3 | 2: {
            len = varint(&p);
            const unsigned char *s = p, *se = p + len;
            while (s < se) {
                assert_int_equal(varint(&s), 1 << 3 | 2);   /* Summary.value */
                uint64_t vl = varint(&s);
                assert_true(e->n < 8);
                parse_value(s, s + vl, e);
                s += vl;
            }
            p += len;
            break;
        }
        default: fail_msg("unexpected Event key %llu", (unsigned long long)key);
        }
    }
}

/* Reads every record of a file (asserting both CRCs); returns the count. */
static int read_events(const char *path, event_t *ev, int cap)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char head[12], data[4096];
    int n = 0;
    while (fread(head, 1, 12, f) == 12) {
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
        assert_int_equal(td_crc32c_mask(td_crc32c(head, 8)), rd32(head + 8));
        assert_true(len + 4 <= sizeof data);
        assert_int_equal(fread(data, 1, len + 4, f), len + 4);
        assert_int_equal(td_crc32c_mask(td_crc32c(data, len)), rd32(data + len));
        assert_true(n < cap);
        parse_event(data, len, &ev[n++]);
    }
    assert_true(feof(f));
    fclose(f);
    return n;
}

/* the events files of dir; returns how many, the first's path in path */
static int list_events(const char *dir, char *path, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20) && n++ == 0) snprintf(path, cap, "%s/%s", dir, e->d_name);
    closedir(d);
    return n;
}

static void test_events_file(void **state)
{
    (void)state;
    char dir[128], path[4400];
    test_path(dir, sizeof dir, "ev/runs");
    td_error err;
    td_tfevents *w = td_tfevents_create(dir, &err);
    assert_non_null(w);
    assert_non_null(strstr(td_tfevents_path(w), "/events.out.tfevents."));
    const char *tags[2] = {"train/reward", "eval/accuracy"};
    for (int k = 0; k < 10; k++) {
        float v[2] = {0.25f * (float)k, -1e30f * (float)k};
        assert_int_equal(td_tfevents_scalars(w, k, 1.7e9 + k, tags, v, 2, &err), 0);
    }
    float big = INFINITY;
    assert_int_equal(td_tfevents_scalars(w, 1LL << 40, 1.7e9, tags, &big, 1, &err), 0);   /* a multi-byte varint */
    assert_int_equal(td_tfevents_close(w, &err), 0);
    assert_int_equal(list_events(dir, path, sizeof path), 1);
    event_t ev[16];
    int n = read_events(path, ev, 16);
    assert_int_equal(n, 12);
    assert_true(ev[0].version && ev[0].n == 0 && ev[0].wall_time > 1e9);
    for (int k = 0; k < 10; k++) {
        event_t *e = &ev[k + 1];
        assert_false(e->version);
        assert_int_equal(e->step, k);
        assert_true(e->wall_time == 1.7e9 + k);
        assert_int_equal(e->n, 2);
        assert_string_equal(e->tag[0], "train/reward");
        assert_string_equal(e->tag[1], "eval/accuracy");
        assert_true(e->value[0] == 0.25f * (float)k && e->value[1] == -1e30f * (float)k);
    }
    assert_true(ev[11].step == 1LL << 40 && isinf(ev[11].value[0]));

    /* --resume at 6: steps 0..5 stay; then a torn record appended is cut too */
    assert_int_equal(td_tfevents_trim(dir, 6, &err), 0);
    assert_int_equal(read_events(path, ev, 16), 7);
    assert_int_equal(ev[6].step, 5);
    FILE *f = fopen(path, "ab");
    fwrite("\x20\0\0\0\0\0\0\0garbage", 1, 15, f);
    fclose(f);
    assert_int_equal(td_tfevents_trim(dir, 100, &err), 0);
    assert_int_equal(read_events(path, ev, 16), 7);
    /* a fresh run: no step left, the file goes */
    assert_int_equal(td_tfevents_trim(dir, 0, &err), 0);
    assert_int_equal(list_events(dir, path, sizeof path), 0);
    char missing[128];
    test_path(missing, sizeof missing, "no/such/dir");
    assert_int_equal(td_tfevents_trim(missing, 0, &err), 0);
}

typedef struct { int n; int64_t step[32]; char tag[32][32]; double v[32]; } scalars_t;

static int collect(void *ctx, int64_t step, const char *tag, double v)
{
    scalars_t *s = ctx;
    if (s->n < 32) {
        s->step[s->n] = step;
        snprintf(s->tag[s->n], sizeof s->tag[s->n], "%s", tag);
        s->v[s->n] = v;
    }
    s->n++;
    return 0;
}

/* td_tfevents_read (tidal-postmortem's reader) gives back what the writer wrote; a torn last
 * record ends the read quietly; a damaged record before it is an error naming the file */
static void test_events_read(void **state)
{
    (void)state;
    char dir[128], path[4400];
    test_path(dir, sizeof dir, "rd/runs");
    td_error err;
    td_tfevents *w = td_tfevents_create(dir, &err);
    assert_non_null(w);
    const char *tags[2] = {"train/reward", "train/entropy"};
    for (int k = 1; k <= 5; k++) {
        float v[2] = {0.125f * (float)k, 3.0f - (float)k};
        assert_int_equal(td_tfevents_scalars(w, k, 1.7e9 + k, tags, v, 2, &err), 0);
    }
    assert_int_equal(td_tfevents_close(w, &err), 0);
    assert_int_equal(list_events(dir, path, sizeof path), 1);
    scalars_t s = {0};
    assert_int_equal(td_tfevents_read(path, collect, &s, &err), 0);
    assert_int_equal(s.n, 10);
    for (int k = 0; k < 5; k++) {
        assert_int_equal(s.step[2 * k], k + 1);
        assert_string_equal(s.tag[2 * k], "train/reward");
        assert_true(s.v[2 * k] == 0.125 * (k + 1) && s.v[2 * k + 1] == 3.0 - (k + 1));
    }
    FILE *f = fopen(path, "ab");   /* torn: a writer stopped mid-record */
    fwrite("\x20\0\0\0\0\0\0\0gar", 1, 11, f);
    fclose(f);
    memset(&s, 0, sizeof s);
    assert_int_equal(td_tfevents_read(path, collect, &s, &err), 0);
    assert_int_equal(s.n, 10);
    f = fopen(path, "r+b");   /* a flipped byte inside the second record's data */
    fseek(f, 60, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 60, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_equal(td_tfevents_read(path, collect, &s, &err), -1);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "CRC"));
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void test_steplog_resume(void **state)
{
    (void)state;
    char out[128], runs[160], jl[160], path[4400];
    test_path(out, sizeof out, "log");
    snprintf(runs, sizeof runs, "%s/runs", out);
    snprintf(jl, sizeof jl, "%s/metrics.jsonl", out);
    td_error err;
    td_steplog *L = td_steplog_open(out, TD_REPORT_TENSORBOARD | TD_REPORT_JSONL, 0, &err);
    assert_non_null(L);
    for (int k = 0; k < 8; k++) {
        td_step_value v[4] = {{"reward", 0.5 * k, 0}, {"kl", NAN, 0}, {"eval_accuracy", k % 2 ? NAN : 1.0, 0},
                              {"collapse_fired", k == 3 ? 4 : 0, 1}};
        assert_int_equal(td_steplog_write(L, k, v, 4, &err), 0);
    }
    assert_int_equal(td_steplog_close(L, &err), 0);
    assert_int_equal(count_lines(jl), 8);
    FILE *f = fopen(jl, "r");
    char line[512];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "{\"step\": 0, \"reward\": 0.0, \"kl\": null, \"eval_accuracy\": 1.0, \"collapse_fired\": 0}\n");
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "{\"step\": 1, \"reward\": 0.5, \"kl\": null, \"eval_accuracy\": null, \"collapse_fired\": 0}\n");
    fclose(f);
    assert_int_equal(list_events(runs, path, sizeof path), 1);
    event_t ev[16];
    assert_int_equal(read_events(path, ev, 16), 9);
    /* NaN left out: step 0 has reward, eval/accuracy, collapse_fired; step 1 no eval */
    assert_int_equal(ev[1].n, 3);
    assert_string_equal(ev[1].tag[1], "eval/accuracy");
    assert_string_equal(ev[1].tag[2], "train/collapse_fired");
    assert_int_equal(ev[2].n, 2);

    /* resumed at 5: a new events file; the old one and the JSON lines keep steps 0..4 */
    L = td_steplog_open(out, TD_REPORT_TENSORBOARD | TD_REPORT_JSONL, 5, &err);
    assert_non_null(L);
    assert_int_equal(count_lines(jl), 5);
    assert_int_equal(read_events(path, ev, 16), 6);
    td_step_value v = {"reward", 9.0, 0};
    assert_int_equal(td_steplog_write(L, 5, &v, 1, &err), 0);
    assert_int_equal(td_steplog_close(L, &err), 0);
    assert_int_equal(count_lines(jl), 6);
    assert_int_equal(list_events(runs, path, sizeof path), 2);

    /* a torn JSON line is cut; --report-to none still cuts (the logs never disagree with the
     * run file) and creates nothing */
    f = fopen(jl, "a");
    fputs("{\"step\": 6, \"rew", f);
    fclose(f);
    L = td_steplog_open(out, 0, 6, &err);
    assert_non_null(L);
    assert_int_equal(td_steplog_write(L, 6, &v, 1, &err), 0);
    assert_int_equal(td_steplog_close(L, &err), 0);
    assert_int_equal(count_lines(jl), 6);
    struct stat st;
    assert_int_equal(stat(jl, &st), 0);
    assert_int_equal(list_events(runs, path, sizeof path), 2);
    /* a fresh run removes them all */
    L = td_steplog_open(out, 0, 0, &err);
    assert_non_null(L);
    td_steplog_close(L, NULL);
    assert_int_equal(count_lines(jl), -1);
    assert_int_equal(list_events(runs, path, sizeof path), 0);
}

static void test_report_to_parse(void **state)
{
    (void)state;
    unsigned m = 99;
    char why[256] = "";
    assert_int_equal(td_report_to_parse(&m, "none", why, sizeof why), 0);
    assert_int_equal(m, 0);
    assert_int_equal(td_report_to_parse(&m, "tensorboard", why, sizeof why), 0);
    assert_int_equal(m, TD_REPORT_TENSORBOARD);
    assert_int_equal(td_report_to_parse(&m, "jsonl,tensorboard", why, sizeof why), 0);
    assert_int_equal(m, TD_REPORT_TENSORBOARD | TD_REPORT_JSONL);
    assert_int_equal(td_report_to_parse(&m, "all", why, sizeof why), 0);
    assert_string_equal(td_report_to_name(m), "tensorboard,jsonl");
    assert_int_equal(td_report_to_parse(&m, "wandb", why, sizeof why), -1);
    assert_int_equal(td_report_to_parse(&m, "tensorboard,", why, sizeof why), -1);
    assert_int_equal(td_report_to_parse(&m, "", why, sizeof why), -1);
    assert_int_equal(td_report_to_parse(&m, "none,jsonl", why, sizeof why), -1);
    assert_msg_has(why, "contradiction");
    char tag[64];
    td_report_tag("reward", tag, sizeof tag);
    assert_string_equal(tag, "train/reward");
    td_report_tag("eval_accuracy", tag, sizeof tag);
    assert_string_equal(tag, "eval/accuracy");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_events_file),
        cmocka_unit_test(test_events_read),
        cmocka_unit_test(test_steplog_resume),
        cmocka_unit_test(test_report_to_parse),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
