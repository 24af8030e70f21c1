/* Text through FreeType: glyphs rendered anti-aliased (8-bit coverage) and blended onto the
 * canvas. A string is first laid out into a coverage buffer, so it can be anchored by its
 * measured size and rotated for y-axis labels. */
#include "tidal/render.h"

#include <ft2build.h>
#include FT_FREETYPE_H
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TD_DEFAULT_FONT "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

struct td_font {
    FT_Library lib;
    FT_Face face;
    int px;  // pixel size currently set
};

td_font *td_font_open(const char *path, td_error *err)
{
    if (!path) path = getenv("TIDAL_FONT");
    if (!path || !*path) path = TD_DEFAULT_FONT;
    if (access(path, R_OK) != 0) {
        td_fail(err, "%s: font not found (install the Debian package fonts-dejavu-core, or set TIDAL_FONT "
                     "to a .ttf file)", path);
        return NULL;
    }
    td_font *f = td_xcalloc(1, sizeof *f);
    if (FT_Init_FreeType(&f->lib)) { free(f); td_fail(err, "FreeType failed to initialise"); return NULL; }
    if (FT_New_Face(f->lib, path, 0, &f->face)) {
        FT_Done_FreeType(f->lib);
        free(f);
        td_fail(err, "%s: FreeType cannot read this font file", path);
        return NULL;
    }
    return f;
}

void td_font_close(td_font *f)
{
    if (!f) return;
    FT_Done_Face(f->face);
    FT_Done_FreeType(f->lib);
    free(f);
}

static void set_px(td_font *f, int px)
{
    if (f->px != px) { FT_Set_Pixel_Sizes(f->face, 0, (FT_UInt)px); f->px = px; }
}

/* Next code point of UTF-8 text; invalid bytes come out as U+FFFD one byte at a time. */
static uint32_t next_cp(const char **s)
{
    const unsigned char *p = (const unsigned char *)*s;
    uint32_t c = p[0];
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0) { (*s)++; return 0xFFFD; }
    c &= n == 0 ? 0x7F : (0x3F >> n);
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) { (*s)++; return 0xFFFD; }
        c = (c << 6) | (p[i] & 0x3F);
    }
    *s += n + 1;
    return c;
}

int td_font_width(td_font *f, int px, const char *text)
{
    set_px(f, px);
    long w = 0;
    for (const char *s = text; *s;) {
        uint32_t cp = next_cp(&s);
        if (!FT_Load_Char(f->face, cp, FT_LOAD_DEFAULT)) w += f->face->glyph->advance.x >> 6;
    }
    return (int)w;
}

void td_font_draw(td_font *f, td_canvas *c, int x, int y, int px, int ha, int va, int rot90, td_rgb col,
                  const char *text)
{
    set_px(f, px);
    int asc = (int)(f->face->size->metrics.ascender >> 6), desc = (int)(-f->face->size->metrics.descender >> 6);
    int tw = td_font_width(f, px, text), th = asc + desc;
    if (tw <= 0 || th <= 0) return;
    uint8_t *cov = td_xcalloc((size_t)tw * (size_t)th, 1);  // (th, tw) coverage
    int pen = 0;
    for (const char *s = text; *s;) {
        uint32_t cp = next_cp(&s);
        if (FT_Load_Char(f->face, cp, FT_LOAD_RENDER)) continue;
        FT_GlyphSlot g = f->face->glyph;
        for (unsigned r = 0; r < g->bitmap.rows; r++)
            for (unsigned q = 0; q < g->bitmap.width; q++) {
                int xx = pen + g->bitmap_left + (int)q, yy = asc - g->bitmap_top + (int)r;
                if (xx < 0 || yy < 0 || xx >= tw || yy >= th) continue;
                uint8_t v = g->bitmap.buffer[r * (unsigned)g->bitmap.pitch + q];
                if (v > cov[(size_t)yy * tw + xx]) cov[(size_t)yy * tw + xx] = v;
            }
        pen += (int)(g->advance.x >> 6);
    }
    int bw = rot90 ? th : tw, bh = rot90 ? tw : th;  // box on the canvas
    int x0 = x - (ha == 1 ? bw / 2 : ha == 2 ? bw : 0), y0 = y - (va == 1 ? bh / 2 : va == 2 ? bh : 0);
    for (int by = 0; by < bh; by++)
        for (int bx = 0; bx < bw; bx++) {
            /* rotated 90° counter-clockwise: box (bx, by) shows text (tw-1-by, bx) */
            int tx = rot90 ? tw - 1 - by : bx, ty = rot90 ? bx : by;
            unsigned a = cov[(size_t)ty * tw + tx];
            int cx = x0 + bx, cy = y0 + by;
            if (!a || cx < 0 || cy < 0 || cx >= c->w || cy >= c->h) continue;
            uint8_t *p = c->rgb + 3 * ((size_t)cy * (size_t)c->w + (size_t)cx);
            p[0] = (uint8_t)((p[0] * (255 - a) + col.r * a) / 255);
            p[1] = (uint8_t)((p[1] * (255 - a) + col.g * a) / 255);
            p[2] = (uint8_t)((p[2] * (255 - a) + col.b * a) / 255);
        }
    free(cov);
}
