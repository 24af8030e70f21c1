/* Figures: a series of zeros on a log axis is drawn on the "≤ 0" band, not dropped (issue 25:
 * grad_norm.png dropped a dead run's zeros, outcome.png the exact-match control's mismatch). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tidal/render.h"

static size_t count_colour(const td_canvas *c, uint8_t r, uint8_t g, uint8_t b)
{
    size_t n = 0;
    for (size_t i = 0; i < (size_t)c->w * c->h; i++)
        n += c->rgb[3 * i] == r && c->rgb[3 * i + 1] == g && c->rgb[3 * i + 2] == b;
    return n;
}

static void test_zeros_on_log_axis(void **state)
{
    (void)state;
    td_error err;
    td_font *font = td_font_open(NULL, &err);
    assert_non_null(font);
    double x[6] = {0, 1, 2, 3, 4, 5}, zero[6] = {0}, pos[6] = {1e-3, 2e-3, 1e-3, 5e-4, 4e-4, 1e-3};
    double mixed[6] = {1e-2, 1e-2, 0, 0, 1e-2, 1e-2};
    td_line lines[3] = {{"exact-match control", x, zero, 6, 0, 0, -1, 0}, {"bf16", x, pos, 6, 1, 0, -1, 0},
                        {"dead from step 2", x, mixed, 6, 2, 0, -1, 0}};
    td_lines_opts o = {"t", "s", "step", "mean |Δlogp|", 1};
    td_canvas *c = td_plot_lines(lines, 3, font, &o);
    /* tab10 blue (colour 0) and green (colour 2): far more pixels than a legend swatch (2 x 23) */
    size_t blue = count_colour(c, 31, 119, 180), green = count_colour(c, 44, 160, 44);
    print_message("zero series: %zu pixels; series dropping to zero: %zu pixels\n", blue, green);
    assert_true(blue > 400);
    assert_true(green > 400);
    td_canvas_free(c);
    /* no zero: no band, the same plot as before */
    td_line one = {"bf16", x, pos, 6, 0, 0, -1, 0};
    c = td_plot_lines(&one, 1, font, &o);
    size_t two = count_colour(c, 31, 119, 180);
    assert_true(two > 400);
    td_canvas_free(c);
    /* width: a 6-pixel line covers about three times the default's 2, a 1-pixel one about half;
     * an unlabelled line has no legend swatch */
    one.width = 6;
    c = td_plot_lines(&one, 1, font, &o);
    size_t six = count_colour(c, 31, 119, 180);
    td_canvas_free(c);
    one.width = 1;
    one.label = NULL;
    c = td_plot_lines(&one, 1, font, &o);
    size_t thin = count_colour(c, 31, 119, 180);
    td_canvas_free(c);
    print_message("line pixels: width 2 %zu, width 6 %zu, width 1 without a legend %zu\n", two, six, thin);
    assert_true(six > 2 * two && thin < two * 3 / 4);
    td_font_close(font);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_zeros_on_log_axis)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
