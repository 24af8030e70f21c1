/* tidal — cudasim's CUDA-only math, bit and conversion intrinsics and vector types, against the
 * CUDA C++ Programming Guide: the documented results of the _rn / saturating conversions
 * (round half to even, saturation to INT_MAX / 0, NaN -> 0), __saturatef, the bit casts, and
 * the maximum-error table of the intrinsic functions (__expf: 2 + floor(|1.16 x|) ulp;
 * __logf and __sinf: 2^-21.41 absolute on their stated ranges), measured against glibc's double
 * functions. */
#include "cudasim.h"
#include "simtest.h"

#include <float.h>

static double ulp_of(float x) { return nextafterf(fabsf(x), INFINITY) - fabsf(x); }

static void test_bit_casts_and_saturate(void **state)
{
    assert_int_equal(__float_as_uint(1.0f), 0x3F800000u);
    assert_true(__uint_as_float(0x40490FDBu) == 3.14159274f);
    assert_int_equal(__float_as_int(-0.0f), INT_MIN);
    assert_true(__int_as_float(0x7F800000) == INFINITY);
    assert_true(__saturatef(-1.0f) == 0.0f && __saturatef(2.0f) == 1.0f && __saturatef(0.25f) == 0.25f);
    assert_true(__saturatef(NAN) == 0.0f);
    assert_int_equal(__popc(0xF0F0u), 8);
    assert_int_equal(__clz(1), 31);
    assert_int_equal(__clz(0), 32);
    assert_int_equal(__ffs(0), 0);
    assert_int_equal(__ffs(8), 4);
    assert_int_equal(__brev(1u), 0x80000000u);
}

static void test_conversions(void **state)
{
    assert_int_equal(__float2int_rn(2.5f), 2);    /* ties to even */
    assert_int_equal(__float2int_rn(3.5f), 4);
    assert_int_equal(__float2int_rn(-2.5f), -2);
    assert_int_equal(__float2int_rz(-2.7f), -2);
    assert_int_equal(__float2int_rd(-2.2f), -3);
    assert_int_equal(__float2int_ru(2.2f), 3);
    assert_int_equal(__float2int_rn(3e9f), INT_MAX);   /* saturates */
    assert_int_equal(__float2int_rn(-3e9f), INT_MIN);
    assert_int_equal(__float2int_rn(NAN), 0);
    assert_int_equal(__float2uint_rn(-1.0f), 0u);
    assert_int_equal(__float2uint_rn(5e9f), UINT_MAX);
}

static void test_rounded_ops_and_minmax(void **state)
{
    assert_true(rsqrtf(4.0f) == 0.5f);
    assert_true(__frcp_rn(4.0f) == 0.25f);
    assert_true(__fdividef(1.0f, 4.0f) == 0.25f);
    /* __fmaf_rn rounds once: (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly, the product alone rounds to 1 */
    const float a = 1.0f + FLT_EPSILON, b = 1.0f - FLT_EPSILON;
    assert_true(__fmaf_rn(a, b, -1.0f) == -ldexpf(1.0f, -46));
    assert_true(__fadd_rn(__fmul_rn(a, b), -1.0f) == 0.0f);
    assert_int_equal(max(-1, 2), 2);
    assert_int_equal(min(-1, 2), -1);
    assert_true(max(-1, 2u) == 4294967295u);          /* int, unsigned -> unsigned, as in C++ */
    assert_true(max(1.0f, NAN) == 1.0f);              /* fmaxf: NaN is ignored */
    assert_true(min(2.0, 3) == 2.0);
}

static void test_intrinsic_error_bounds(void **state)
{
    for (float x = -10.0f; x <= 10.0f; x += 0.0137f) {
        const double ref = exp((double)x);
        const double bound = (2 + floor(fabs(1.16 * x))) * ulp_of((float)ref);
        assert_true(fabs((double)__expf(x) - ref) <= bound);
    }
    for (float x = 0.5f; x <= 2.0f; x += 0.001f) assert_true(fabs((double)__logf(x) - log((double)x)) <= exp2(-21.41));
    for (float x = -3.14159f; x <= 3.14159f; x += 0.001f) {
        assert_true(fabs((double)__sinf(x) - sin((double)x)) <= exp2(-21.41));
        assert_true(fabs((double)__cosf(x) - cos((double)x)) <= exp2(-21.41));
    }
    float s, c;
    sincosf(0.5f, &s, &c);
    assert_true(s == sinf(0.5f) && c == cosf(0.5f));
}

static void test_vector_types(void **state)
{
    assert_int_equal(sizeof(float4), 16);
    assert_int_equal(alignof(float4), 16);
    assert_int_equal(alignof(float2), 8);
    assert_int_equal(alignof(uint4), 16);
    assert_int_equal(alignof(int2), 8);
    assert_true(make_float2(1.0f, 2.0f).y == 2.0f);
    assert_int_equal(make_uint4(1, 2, 3, 4).w, 4u);
    const dim3 d;
    assert_true(d.x == 1 && d.y == 1 && d.z == 1);
    const dim3 e(7);
    assert_true(e.x == 7 && e.y == 1 && e.z == 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_casts_and_saturate),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_rounded_ops_and_minmax),
        cmocka_unit_test(test_intrinsic_error_bounds),
        cmocka_unit_test(test_vector_types),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
