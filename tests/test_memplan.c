/* The trainers' memory plan (td_memplan_train_*, src/backend/memplan.c): its arithmetic on the
 * Qwen2.5-0.5B preset's shape (C 896, L 24, NH 14, NKV 2, HD 64, F 4864, V 151936, tied, q/k/v
 * biases), by hand:
 *  - optimizer state = 16 bytes x trained parameters: every tensor of the parameter table (the
 *    tied embedding once), or the LoRA adapter's A and B only;
 *  - gradient checkpointing keeps one slice of the per-layer buffers instead of L: the saved
 *    activations shrink by exactly (L - 1) x N x (2 QD + 2 KVD + 3 F + 3 C + 2 + NH) x 4 bytes;
 *  - the rollout KV cache is L x slots x positions x td_memplan_kv_bytes;
 *  - a plan that does not fit is refused with the numbers and the flags that help.
 * And on the Qwen3-30B-A3B preset's (C 2048, L 48, NH 32, NKV 4, HD 128, F 6144, V 151936, E 128,
 * K 8, FE 768, every layer sparse), a mixture of experts' buffers as acts_alloc, moe.c and
 * grad_acts_alloc make them on a device, by hand:
 *  - a forward path's activations: per row the dense set (x, xn, proj, q, att, k, v, gate, up) and
 *    one MoE layer's moe_logits (E), moe_rows_b and moe_weights_b (K each), moe_in and moe_y (C
 *    each), moe_gate and moe_up (FE each); a fused recipe (vllm-bf16) adds moe_v, K x C per row;
 *  - gradient checkpointing saves the same (L - 1) slices as for a dense model: the MoE's device
 *    buffers are one layer's either way (the routing kept per layer is host memory);
 *  - the activation gradients: the dense set and moe_act, moe_dact, moe_dgate, moe_dup (FE each),
 *    moe_dy, moe_dx (C each), moe_dlogits (E), moe_dw (K).
 * The plan against measured peaks: tests/py/test_memplan_train.py, test_memplan_moe.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tidal/checkpoint.h"
#include "tidal/memplan.h"
#include "tidal/recipe.h"

static td_config cfg;

static td_memplan_train_in base_in(const td_recipe *train, const td_recipe *roll)
{
    return (td_memplan_train_in){.cfg = &cfg, .train = train, .infer = roll, .max_tokens = 4096, .max_seq_len = 1024,
                                 .scoring_forwards = 1, .slots = 16, .max_len = 1024, .sampler = 1, .nthreads = 4};
}

static void test_state(void **state)
{
    (void)state;
    const td_recipe *r = td_recipe_find_preset("bf16-train"), *b = td_recipe_find_preset("bf16-infer");
    size_t C = 896, L = 24, QD = 14 * 64, KVD = 2 * 64, F = 4864, V = 151936;
    size_t per_layer = C * QD + 2 * C * KVD + QD * C + 3 * C * F + 2 * C + QD + 2 * KVD;
    size_t n = V * C + L * per_layer + C;   /* tied: the lm_head is the embedding */
    td_memplan_train_in in = base_in(r, b);
    td_memplan_train p = {0};
    td_memplan_train_compute(&in, &p);
    assert_int_equal(p.nparams, n);
    assert_int_equal(p.state, 16 * n);
    in.lora_rank = 16;   /* default modules: q_proj, v_proj */
    td_memplan_train_compute(&in, &p);
    assert_int_equal(p.nparams, L * 16 * ((C + QD) + (C + KVD)));
    assert_int_equal(p.state, 16 * p.nparams);
}

static void test_checkpointing(void **state)
{
    (void)state;
    const td_recipe *r = td_recipe_find_preset("fp32");
    td_memplan_train_in in = base_in(r, r);
    td_memplan_train full = {0}, gc = {0};
    td_memplan_train_compute(&in, &full);
    in.gradient_checkpointing = 1;
    td_memplan_train_compute(&in, &gc);
    size_t C = 896, L = 24, NH = 14, QD = NH * 64, KVD = 2 * 64, F = 4864, N = 4096;
    assert_int_equal(full.acts - gc.acts, (L - 1) * N * (2 * QD + 2 * KVD + 3 * F + 3 * C + 2 + NH) * 4);
    assert_int_equal(full.total - gc.total, full.acts - gc.acts);   /* nothing else moves */
    assert_int_equal(full.grad_acts, gc.grad_acts);
}

static void test_kv_and_fit(void **state)
{
    (void)state;
    const td_recipe *r = td_recipe_find_preset("bf16-train"), *b = td_recipe_find_preset("bf16-infer");
    td_memplan_train_in in = base_in(r, b);
    td_memplan_train p = {0};
    td_memplan_train_compute(&in, &p);
    assert_int_equal(p.rollout_kv, 24 * 16 * 1024 * td_memplan_kv_bytes(&cfg, b, 1));
    size_t total = p.total;
    in.max_tokens = 8192;   /* more tokens per micro-batch: more of everything that scales with it */
    td_memplan_train_compute(&in, &p);
    assert_true(p.total > total);
    p.free = p.device_total = (size_t)1 << 30;   /* 1 GiB: the 0.5B plan does not fit */
    assert_false(td_memplan_train_fits(&p));
    td_error err;
    assert_int_equal(td_memplan_train_refuse("tidal-rl", "cuda", &p, &in, &err), -1);
    assert_non_null(strstr(err.msg, "does not fit the GPU"));
    assert_non_null(strstr(err.msg, "short by"));
    assert_non_null(strstr(err.msg, "--gradient-checkpointing"));
    assert_non_null(strstr(err.msg, "--max-completion-length"));
    p.free = (size_t)80 << 30;
    assert_true(td_memplan_train_fits(&p));
    char *j = td_memplan_train_json(&p, &in);
    assert_non_null(strstr(j, "\"optimizer_state\": "));
    free(j);
}

static void test_moe(void **state)
{
    (void)state;
    td_config moe;
    assert_int_equal(td_config_preset("qwen3-30b-a3b", &moe), 0);
    /* every layer is MoE: intermediate_size (6144) sizes no buffer, the dense MLP's are 0 wide */
    size_t C = 2048, L = 48, NH = 32, NKV = 4, QD = NH * 128, KVD = NKV * 128, F = 0, V = 151936;
    size_t E = 128, K = 8, FE = 768;
    assert_int_equal(moe.num_experts, E);
    assert_int_equal(moe.moe_intermediate_size, FE);
    assert_int_equal(moe.intermediate_size, 6144);
    assert_int_equal(td_config_num_moe_layers(&moe), L);
    assert_int_equal(td_config_dense_mlp_width(&moe), 0);
    moe.mlp_only_layers[moe.n_mlp_only++] = 3;   /* one dense layer: the buffers are back */
    assert_int_equal(td_config_dense_mlp_width(&moe), 6144);
    moe.n_mlp_only = 0;
    size_t T = 4096, N = 4 * T, nt = 4;
    size_t dense_row = 3 * C + 2 * QD + 2 * KVD + 2 * F, moe_row = E + 2 * K + 2 * C + 2 * FE;
    td_memplan_in in = {.cfg = &moe, .storage = TD_BF16, .a = td_recipe_find_preset("bf16-train"),
                        .fwd_tokens = (int)N, .fwd_seq_len = (int)T, .nthreads = (int)nt};
    td_memplan p = {0};
    td_memplan_compute(&in, &p);
    assert_int_equal(p.acts_a, (N * (dense_row + moe_row) + nt * 64 * T + 256 * V) * 4);
    size_t unfused = p.acts_a;
    in.a = td_recipe_find_preset("vllm-bf16");   /* vLLM's fused_moe: the weighted rows of every (row, slot) */
    td_memplan_compute(&in, &p);
    assert_int_equal(p.acts_a - unfused, N * K * C * 4);

    td_memplan_train_in ti = {.cfg = &moe, .train = td_recipe_find_preset("fp32"), .max_tokens = (int)N,
                              .max_seq_len = (int)T, .nthreads = (int)nt};
    td_memplan_train full = {0}, gc = {0};
    td_memplan_train_compute(&ti, &full);
    ti.gradient_checkpointing = 1;
    td_memplan_train_compute(&ti, &gc);
    /* the dense model's saved slices, Qwen3's q_raw, k_raw and their rstd among them */
    assert_int_equal(full.acts - gc.acts,
                     (L - 1) * N * (2 * QD + 2 * KVD + 3 * F + 3 * C + 2 + NH + QD + KVD + NH + NKV) * 4);
    size_t grads = N * (2 * C + 3 * QD + 3 * KVD + 3 * F) + nt * 2 * 64 * T + N * (4 * FE + 2 * C + E + K);
    assert_int_equal(full.grad_acts, grads * 4);
    assert_int_equal(gc.grad_acts, grads * 4);
}

int main(void)
{
    if (td_config_preset("qwen2.5-0.5b", &cfg) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state),
        cmocka_unit_test(test_checkpointing),
        cmocka_unit_test(test_kv_and_fit),
        cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests_name("memplan", tests, NULL, NULL);
}
