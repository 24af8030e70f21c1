/* Aligned text / Markdown tables (table.h). */
#include "table.h"

#include <stdlib.h>
#include <string.h>


void t_row(table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 32;
        t->cells = td_xrealloc(t->cells, t->cap * sizeof *t->cells);
    }
    for (size_t c = 0; c < t->ncols; c++) {
        const char *s = cells[c] ? cells[c] : "";
        size_t n = strlen(s) + 1;
        t->cells[t->nrows][c] = td_xmalloc(n);
        memcpy(t->cells[t->nrows][c], s, n);
    }
    t->nrows++;
}

/* UTF-8 aware width: counts code points, not bytes (Δ, ‖ take one column). */
size_t u8width(const char *s)
{
    size_t w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

void t_print(FILE *f, table *t)
{
    size_t w[MAX_COLS] = {0};
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++)
            if (u8width(t->cells[r][c]) > w[c]) w[c] = u8width(t->cells[r][c]);
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r][c];
            size_t pad = w[c] - u8width(s);
            if (t->md) {  // a '|' inside a cell (|Δlogp|) would end it: escape it
                fputs("| ", f);
                for (const char *q = s; *q; q++) {
                    if (*q == '|') fputc('\\', f);
                    fputc(*q, f);
                }
                fprintf(f, "%*s ", (int)pad, "");
            }
            else if (c == 0) fprintf(f, "%s%*s", s, (int)pad, "");
            else fprintf(f, "  %*s%s", (int)pad, "", s);
        }
        fprintf(f, t->md ? "|\n" : "\n");
        if (r == 0) {
            if (t->md) {
                for (size_t c = 0; c < t->ncols; c++) fprintf(f, "|%s", c ? "---:" : "---");
                fprintf(f, "|\n");
            } else {
                size_t tot = 0;
                for (size_t c = 0; c < t->ncols; c++) tot += w[c] + (c ? 2 : 0);
                for (size_t i = 0; i < tot; i++) fputc('-', f);
                fputc('\n', f);
            }
        }
    }
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) free(t->cells[r][c]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

