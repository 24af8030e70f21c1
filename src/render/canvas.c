/* RGB canvas, PNG output through libpng, and the viridis-like colour map. */
#include "tidal/render.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

td_canvas *td_canvas_new(int w, int h, td_rgb bg)
{
    td_canvas *c = td_xmalloc(sizeof *c);
    c->w = w;
    c->h = h;
    c->rgb = td_xmalloc((size_t)w * (size_t)h * 3);
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++) {
        c->rgb[3 * i] = bg.r;
        c->rgb[3 * i + 1] = bg.g;
        c->rgb[3 * i + 2] = bg.b;
    }
    return c;
}

void td_canvas_free(td_canvas *c)
{
    if (!c) return;
    free(c->rgb);
    free(c);
}

void td_canvas_rect(td_canvas *c, int x, int y, int w, int h, td_rgb col)
{
    int x0 = x < 0 ? 0 : x, y0 = y < 0 ? 0 : y;
    int x1 = x + w > c->w ? c->w : x + w, y1 = y + h > c->h ? c->h : y + h;
    for (int yy = y0; yy < y1; yy++)
        for (int xx = x0; xx < x1; xx++) {
            uint8_t *p = c->rgb + 3 * ((size_t)yy * (size_t)c->w + (size_t)xx);
            p[0] = col.r; p[1] = col.g; p[2] = col.b;
        }
}

/* Bresenham; dash > 0 draws dash pixels on, dash pixels off. */
void td_canvas_line(td_canvas *c, int x0, int y0, int x1, int y1, td_rgb col, int dash)
{
    int dx = abs(x1 - x0), sx = x0 < x1 ? 1 : -1, dy = -abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int e = dx + dy;
    for (int k = 0;; k++) {
        if ((!dash || (k / dash) % 2 == 0) && x0 >= 0 && y0 >= 0 && x0 < c->w && y0 < c->h) {
            uint8_t *p = c->rgb + 3 * ((size_t)y0 * (size_t)c->w + (size_t)x0);
            p[0] = col.r; p[1] = col.g; p[2] = col.b;
        }
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * e;
        if (e2 >= dy) { e += dy; x0 += sx; }
        if (e2 <= dx) { e += dx; y0 += sy; }
    }
}

int td_canvas_write_png(const td_canvas *c, const char *path, const char *const *kv, size_t n_kv, td_error *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return td_fail(err, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return td_fail(err, "%s: cannot create (%s)", tmp, strerror(errno));
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_text *text = td_xcalloc(n_kv ? n_kv : 1, sizeof *text);
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(text);
        fclose(f);
        remove(tmp);
        return td_fail(err, "%s: libpng could not write the picture (disk full?)", path);
    }
    png_init_io(png, f);
    png_set_compression_level(png, 9);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    /* iTXt: UTF-8 text, since command lines may hold non-Latin-1 paths */
    for (size_t i = 0; i < n_kv; i++) {
        text[i].compression = PNG_ITXT_COMPRESSION_NONE;
        text[i].key = (char *)kv[2 * i];
        text[i].text = (char *)kv[2 * i + 1];
        text[i].lang = (char *)"";
        text[i].lang_key = (char *)"";
    }
    if (n_kv) png_set_text(png, info, text, (int)n_kv);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->rgb + (size_t)y * (size_t)c->w * 3);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(text);
    if (fclose(f) != 0) { remove(tmp); return td_fail(err, "%s: write failed (disk full?)", path); }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return td_fail(err, "%s: cannot rename %s into place (%s)", path, tmp, strerror(errno));
    }
    return 0;
}

/* matplotlib viridis sampled at t = 0, 1/8, ..., 1 */
static const uint8_t VIRIDIS[9][3] = {
    {0x44, 0x01, 0x54}, {0x47, 0x2d, 0x7b}, {0x3b, 0x52, 0x8b}, {0x2c, 0x72, 0x8e}, {0x21, 0x91, 0x8c},
    {0x28, 0xae, 0x80}, {0x5e, 0xc9, 0x62}, {0xad, 0xdc, 0x30}, {0xfd, 0xe7, 0x25}};

td_rgb td_viridis(double t)
{
    if (isnan(t)) return (td_rgb){214, 214, 214};
    if (t < 0) t = 0;
    if (t > 1) t = 1;
    double x = t * 8;
    int i = (int)x;
    if (i > 7) i = 7;
    double f = x - i;
    td_rgb c;
    c.r = (uint8_t)lround(VIRIDIS[i][0] + f * (VIRIDIS[i + 1][0] - VIRIDIS[i][0]));
    c.g = (uint8_t)lround(VIRIDIS[i][1] + f * (VIRIDIS[i + 1][1] - VIRIDIS[i][1]));
    c.b = (uint8_t)lround(VIRIDIS[i][2] + f * (VIRIDIS[i + 1][2] - VIRIDIS[i][2]));
    return c;
}
