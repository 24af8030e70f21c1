/* tidal — aligned terminal / Markdown tables for the analysis tools (internal header): rows of
 * cells, the first row the header; t_print prints and empties the table. */
#ifndef TIDAL_ANALYSIS_TABLE_H
#define TIDAL_ANALYSIS_TABLE_H

#include "tidal/common.h"

#include <stdio.h>

#define MAX_COLS 16

typedef struct {
    int md;               // Markdown pipes instead of aligned columns
    size_t ncols;         // label column + one per run (or per field)
    size_t nrows, cap;
    char *(*cells)[MAX_COLS];
} table;

/* Appends a row of t->ncols cells (copied; NULL = empty). */
void t_row(table *t, const char *const *cells);
/* Display width of UTF-8 text: code points, not bytes. */
size_t u8width(const char *s);
/* Prints the table (a rule under the header row) and frees its rows. */
void t_print(FILE *f, table *t);

#endif
