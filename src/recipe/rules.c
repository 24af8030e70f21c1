/* Rules that follow from a recipe's fields and that every backend applies the same way
 * (see recipe.h): whether a recipe is the plain fp32 reference, and the recipe of the lm_head. */
#include "tidal/recipe.h"

bool td_recipe_is_plain_fp32(const td_recipe *r)
{
    return !r || (r->weights == TD_F32 && r->activations == TD_F32 && r->gemm_inputs == TD_F32 &&
                  r->accumulate == TD_ACC_FP32 && r->split_k == 1 && r->attention == TD_ATTN_FULL &&
                  r->decode_splits == 1 && r->kv_cache == TD_F32 && !r->batch_invariant);
}

td_recipe td_recipe_for_head(const td_recipe *r)
{
    td_recipe h = *r;
    if (r->lm_head_fp32) {
        h.weights = h.activations = h.gemm_inputs = TD_F32;
    } else {
        if (h.weights == TD_E4M3 || h.weights == TD_E5M2) h.weights = h.activations;
        h.gemm_inputs = h.activations;
    }
    h.accumulate = TD_ACC_FP32;
    return h;
}
