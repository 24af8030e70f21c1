/* td_rollout_generate on the CUDA backend (src/paths/rollout.c, decode_on_device: the decode
 * rows stay on the device and sample_cuda draws the tokens) against the CPU backend, on
 * datasets/models/add (V 100), 6 sequences of random prompts (lengths 3..9), 12 new tokens,
 * one batch, several samplings (greedy; T 1; T 0.7 + top-p 0.9; T 1.3 + top-k 5 + min-p 0.05 +
 * repetition penalty 1.2), EOS stopping on when greedy (the sampled runs go to full length):
 *   - tokens, lengths and finish reasons identical to the CPU's
 *   - the processed log-probs (b->logp_proc) within 1e-4 of the CPU's (the fp32 forward differs
 *     by the GEMMs' summation order, tests/cudasim/test_forward_sim: 3.8e-6)
 *   - on the GPU, the run without a row callback (only tokens and processed log-probs come down)
 *     and the run with one (full rows downloaded for the callback, raw log-probs b->logp too)
 *     give the same tokens and bit-identical processed log-probs; the callback sees every
 *     response position once, with the processed log-prob that was stored */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <cmath>
#include <vector>

extern "C" {
#include "tidal/memplan.h"
#include "tidal/model.h"
#include "tidal/rollout.h"
#include "tidal/sampling.h"
}

#define MODEL "datasets/models/add"
enum { NSEQ = 6, MAXLEN = 24, NEW = 12 };

typedef struct {
    std::vector<std::vector<int>> tok;
    std::vector<std::vector<float>> lp, lpraw;
    std::vector<int> len, finish;
    int calls;
    int mismatched;   /* callback's logp_proc != stored one */
} result;

static void on_row(void *user, int seq, int pos, const float *logp, float logp_proc)
{
    result *r = (result *)user;
    (void)logp;
    r->calls++;
    r->lp[seq][pos] = logp_proc;   /* compared with the stored b->logp_proc after the run */
}

static result run(td_model *m, const td_sampling &smp_opts, int with_rows)
{
    td_error err;
    int V = m->cfg.vocab_size;
    td_session *s = td_session_create(m, NSEQ, MAXLEN, 4, &err);
    if (!s) fail_msg("%s", err.msg);
    td_sampler *smp = td_sampler_create(V);
    result r;
    r.tok.assign(NSEQ, std::vector<int>(MAXLEN, 0));
    r.lp.assign(NSEQ, std::vector<float>(MAXLEN, 0));
    r.lpraw.assign(NSEQ, std::vector<float>(MAXLEN, 0));
    std::vector<std::vector<float>> lpstore(NSEQ, std::vector<float>(MAXLEN, 0));
    r.len.assign(NSEQ, 0);
    r.finish.assign(NSEQ, 0);
    r.calls = 0;
    r.mismatched = 0;
    td_rng g;
    td_rng_seed(&g, 3);
    std::vector<int *> tp(NSEQ);
    std::vector<float *> lpp(NSEQ), lrp(NSEQ);
    std::vector<int> plen(NSEQ);
    std::vector<uint64_t> stream(NSEQ);
    for (int q = 0; q < NSEQ; q++) {
        plen[q] = 3 + q;
        for (int t = 0; t < plen[q]; t++) r.tok[q][t] = 3 + (int)td_rng_below(&g, 90);
        tp[q] = r.tok[q].data();
        lpp[q] = lpstore[q].data();
        lrp[q] = r.lpraw[q].data();
        stream[q] = (uint64_t)q;
    }
    int eos[1] = {2};
    td_rollout_opts o = {};
    o.sampling = smp_opts;
    o.max_new_tokens = NEW;
    o.max_len = MAXLEN;
    o.eos = eos;
    o.n_eos = 1;
    o.stop_at_eos = smp_opts.temperature == 0;   /* EOS stopping in the greedy case, full length else */
    o.seed = 77;
    td_rollout_batch b = {};
    b.n = NSEQ;
    b.tokens = tp.data();
    b.prompt_len = plen.data();
    b.stream = stream.data();
    b.len = r.len.data();
    b.finish = r.finish.data();
    b.logp_proc = lpp.data();
    if (with_rows) b.logp = lrp.data();
    if (td_rollout_generate(s, smp, &o, &b, with_rows ? on_row : NULL, &r, &err)) fail_msg("%s", err.msg);
    int resp = 0;
    for (int q = 0; q < NSEQ; q++)
        for (int t = plen[q]; t < r.len[q]; t++) {
            resp++;
            if (with_rows && memcmp(&r.lp[q][t], &lpstore[q][t], sizeof(float))) r.mismatched++;
        }
    if (with_rows) assert_int_equal(r.calls, resp);
    r.lp = lpstore;
    td_sampler_free(smp);
    td_session_free(s);
    return r;
}

static void test_rollout(void **state)
{
    (void)state;
    td_error err;
    td_model *cpu = td_model_load(MODEL, &err);
    td_model *gpu = td_model_load(MODEL, &err);
    if (!cpu || !gpu) fail_msg("%s", err.msg);
    gpu->backend = td_cuda_backend_open(0, NULL, 0, &err);
    if (!gpu->backend) fail_msg("%s", err.msg);
    struct { const char *name; double T, top_p; int top_k; double min_p, rep; } cs[] = {
        {"greedy", 0, 1, 0, 0, 1},
        {"T1", 1, 1, 0, 0, 1},
        {"T0.7 top-p0.9", 0.7, 0.9, 0, 0, 1},
        {"T1.3 k5 min-p0.05 rep1.2", 1.3, 1, 5, 0.05, 1.2},
    };
    for (auto &c : cs) {
        td_sampling sm = td_sampling_default();
        sm.temperature = c.T; sm.top_p = c.top_p; sm.top_k = c.top_k; sm.min_p = c.min_p; sm.repetition_penalty = c.rep;
        result rc = run(cpu, sm, 0), rg = run(gpu, sm, 0), rr = run(gpu, sm, 1);
        int ntok = 0, diff = 0;
        double worst = 0;
        for (int q = 0; q < NSEQ; q++) {
            assert_int_equal(rc.len[q], rg.len[q]);
            assert_int_equal(rc.finish[q], rg.finish[q]);
            assert_int_equal(rg.len[q], rr.len[q]);
            for (int t = 0; t < rc.len[q]; t++) {
                assert_int_equal(rc.tok[q][t], rg.tok[q][t]);
                assert_int_equal(rg.tok[q][t], rr.tok[q][t]);
            }
            for (int t = 3 + q; t < rc.len[q]; t++) {
                ntok++;
                double d = fabs((double)rc.lp[q][t] - rg.lp[q][t]);
                worst = d > worst ? d : worst;
                if (memcmp(&rg.lp[q][t], &rr.lp[q][t], sizeof(float))) diff++;
            }
        }
        printf("%-26s %d response tokens: same tokens as the CPU, max |dlogp_proc| %.2g; "
               "rows-downloaded run: %d logp_proc differ, %d callback mismatches\n",
               c.name, ntok, worst, diff, rr.mismatched);
        assert_true(ntok > NSEQ);
        assert_true(worst <= 1e-4);
        assert_int_equal(diff, 0);
        assert_int_equal(rr.mismatched, 0);
    }
    td_model_free(cpu);
    td_model_free(gpu);
}

/* Prompt rows kept on the device (td_rollout_batch.keep with prompt_rows, as tidal-diff
 * --score-prompt --device cuda runs it): prefill's rows go from the logits buffer to the kept
 * rows (row_logsoftmax) and its last rows to the first draw without reaching the host. Three
 * runs of the same batch (T 1 sampling, rows at T 0.7) on the GPU: every sequence's prompt rows
 * on the device; even sequences asking for raw log-probs (b->logp: their prompt rows come to the
 * host and are uploaded into the kept rows, their last rows sampled from the host copy), odd ones
 * not; and the CPU (its rows on the host, no kept rows). Checks: the same tokens in all three;
 * the kept rows, scored by one GPU training path (td_forward_metrics), give bit-identical
 * td_token_metrics in both GPU runs at every prompt and response position (the device's
 * log-softmax is td_log_softmax's floats); the prompt positions' log-probs (logp_b of the kept
 * row, and b->logp_proc where the host path wrote it) within 1e-4 of the CPU rollout's
 * logp_proc there (the fp32 forward's summation order, 3.8e-6 in test_forward_sim); the all-
 * device run copies at most 64 bytes per sequence per sampled token to the host (prefill's rows
 * stay; the counter td_device_d2h_bytes). */
static void test_prompt_rows_kept(void **state)
{
    (void)state;
    td_error err;
    td_model *cpu = td_model_load(MODEL, &err);
    td_model *gpu = td_model_load(MODEL, &err);
    if (!cpu || !gpu) fail_msg("%s", err.msg);
    gpu->backend = td_cuda_backend_open(0, NULL, 0, &err);
    if (!gpu->backend) fail_msg("%s", err.msg);
    const int V = gpu->cfg.vocab_size;
    td_rows_dev *kept[2] = {td_rows_dev_create(gpu, (size_t)NSEQ * MAXLEN), td_rows_dev_create(gpu, (size_t)NSEQ * MAXLEN)};
    assert_non_null(kept[0]);
    assert_non_null(kept[1]);
    std::vector<int> from(NSEQ, 1);
    std::vector<size_t> base(NSEQ);
    for (int q = 0; q < NSEQ; q++) base[q] = (size_t)q * MAXLEN;
    std::vector<int> plen(NSEQ);
    std::vector<uint64_t> stream(NSEQ);
    std::vector<std::vector<int>> prompt(NSEQ);
    td_rng g;
    td_rng_seed(&g, 9);
    for (int q = 0; q < NSEQ; q++) {
        plen[q] = 3 + 2 * q;   /* up to 13: prefill chunks of 4 (the session's), several logits chunks */
        for (int t = 0; t < plen[q]; t++) prompt[q].push_back(3 + (int)td_rng_below(&g, 90));
        stream[q] = (uint64_t)q;
    }
    td_rollout_opts o = {};
    o.sampling = td_sampling_default();
    o.sampling.temperature = 1;
    o.max_new_tokens = 6;
    o.max_len = MAXLEN;
    o.seed = 5;
    o.prompt_rows = 1;
    o.row_temperature = 0.7f;
    /* run 0: GPU, all on the device; run 1: GPU, even sequences read raw log-probs; run 2: CPU */
    std::vector<std::vector<int>> tok[3];
    std::vector<std::vector<float>> lproc[3], lraw[3];
    std::vector<int> len[3], finish[3];
    size_t d2h = 0;
    for (int k = 0; k < 3; k++) {
        td_model *m = k < 2 ? gpu : cpu;
        td_session *s = td_session_create(m, NSEQ, MAXLEN, 4, &err);
        if (!s) fail_msg("%s", err.msg);
        td_sampler *smp = td_sampler_create(V);
        tok[k].assign(NSEQ, std::vector<int>(MAXLEN, 0));
        lproc[k].assign(NSEQ, std::vector<float>(MAXLEN, NAN));
        lraw[k].assign(NSEQ, std::vector<float>(MAXLEN, NAN));
        len[k].assign(NSEQ, 0);
        finish[k].assign(NSEQ, 0);
        std::vector<int *> tp(NSEQ);
        std::vector<float *> lpp(NSEQ), lrp(NSEQ, nullptr);
        for (int q = 0; q < NSEQ; q++) {
            std::copy(prompt[q].begin(), prompt[q].end(), tok[k][q].begin());
            tp[q] = tok[k][q].data();
            lpp[q] = lproc[k][q].data();
            if (k == 1 && q % 2 == 0) lrp[q] = lraw[k][q].data();
        }
        td_rollout_batch b = {};
        b.n = NSEQ;
        b.tokens = tp.data();
        b.prompt_len = plen.data();
        b.stream = stream.data();
        b.len = len[k].data();
        b.finish = finish[k].data();
        b.logp_proc = lpp.data();
        if (k == 1) b.logp = lrp.data();
        if (k < 2) b.keep = td_rows_dev_map{kept[k], from.data(), base.data()};
        size_t d0 = td_device_d2h_bytes();
        if (td_rollout_generate(s, smp, &o, &b, NULL, NULL, &err)) fail_msg("%s", err.msg);
        if (k == 0) d2h = td_device_d2h_bytes() - d0;
        td_sampler_free(smp);
        td_session_free(s);
    }
    int sampled = 0;
    for (int q = 0; q < NSEQ; q++) {
        assert_int_equal(len[0][q], len[2][q]);
        assert_int_equal(len[1][q], len[2][q]);
        sampled += len[0][q] - plen[q];
        for (int t = 0; t < len[0][q]; t++) {
            assert_int_equal(tok[0][q][t], tok[2][q][t]);
            assert_int_equal(tok[1][q][t], tok[2][q][t]);
        }
    }
    /* the kept rows of both GPU runs, scored against one training path's rows */
    td_forward *fa = td_forward_create(gpu, NSEQ * MAXLEN, MAXLEN, 0, &err);
    if (!fa) fail_msg("%s", err.msg);
    /* calloc: nvcc's front end fails on a std::vector of an anonymous struct (GPU build) */
    td_token_metrics *met[2][NSEQ];
    std::vector<const int *> tk(NSEQ);
    for (int q = 0; q < NSEQ; q++) tk[q] = tok[0][q].data();
    for (int k = 0; k < 2; k++) {
        for (int q = 0; q < NSEQ; q++) met[k][q] = (td_token_metrics *)calloc(MAXLEN, sizeof(td_token_metrics));
        td_rows_dev_map map = {kept[k], from.data(), base.data()};
        if (td_forward_metrics(fa, NSEQ, tk.data(), len[0].data(), &map, met[k], &err)) fail_msg("%s", err.msg);
    }
    int npos = 0, ndiff = 0, nproc = 0;
    double worst = 0;
    for (int q = 0; q < NSEQ; q++)
        for (int pos = 1; pos < len[0][q]; pos++) {
            npos++;
            if (memcmp(&met[0][q][pos], &met[1][q][pos], sizeof(td_token_metrics))) ndiff++;
            if (pos >= plen[q]) continue;
            double d = fabs(met[0][q][pos].logp_b - lproc[2][q][pos]);
            worst = d > worst ? d : worst;
            if (!std::isnan(lproc[1][q][pos])) {   /* written by the host path (even sequences) */
                nproc++;
                assert_true(lproc[1][q][pos] == (float)met[1][q][pos].logp_b);
                assert_true(lraw[1][q][pos] == lproc[1][q][pos]);
            }
        }
    printf("prompt rows kept on the device: %d positions scored, %d metrics differ between the all-device run and "
           "the mixed one; prompt log-probs vs the CPU rollout: max |d| %.2g; %d host-path prompt log-probs equal "
           "the kept rows'; device to host %zu bytes for %d sampled tokens of %d sequences\n",
           npos, ndiff, worst, nproc, d2h, sampled, NSEQ);
    assert_int_equal(ndiff, 0);
    assert_true(worst <= 1e-4);
    assert_true(nproc > 0);
    assert_true(d2h > 0 && d2h <= (size_t)64 * sampled);
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < NSEQ; q++) free(met[k][q]);
    td_forward_free(fa);
    td_rows_dev_free(kept[0]);
    td_rows_dev_free(kept[1]);
    td_model_free(cpu);
    td_model_free(gpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rollout),
        cmocka_unit_test(test_prompt_rows_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
