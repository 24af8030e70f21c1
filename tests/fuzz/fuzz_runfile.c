/* Fuzz target: tidal's own HDF5 run-file reader. The input is written as run.h5 and read the
 * way the tools read it: td_runfile_open (format and schema checks), the root attributes,
 * every known column's rows/width and a bounded read, td_diff_summarize (what tidal-diff
 * prints at the end), then the --resume path: open for writing, read /progress, cut every group
 * back. libhdf5 (1.10.8) is not hardened against hostile files: on mutated files it loops in
 * H5C_protect, reads out of bounds in H5O__msg_iterate_real (H5Aexists) and H5HG_read (vlen
 * string attributes) and asks for multi-GB allocations. Since issue 42 td_runfile_open checks
 * every file first (src/record/guard.c: the superblock in-process, then a child process that
 * reads what tidal reads under a CPU-time limit), so what this target reaches in-process is
 * what a file that passed the check can do; the child's own crashes are its verdict, printed
 * nowhere. TIDAL_RUNFILE_CHECK_SECONDS=0 turns the child off, to see what libhdf5 alone does.
 * LSan suppresses leaks inside libhdf5 (tests/fuzz/lsan.supp). */
#include "fuzz_util.h"
#include "tidal/diff.h"
#include "tidal/runfile.h"

static const char *const ATTRS[] = {"format", "tool", "command_line", "recipe_a", "recipe_b", "sampling",
                                    "shard", "batch", "prompts_file", "model_fingerprint"};
static const char *const COLS[] = {"/tokens/seq", "/tokens/pos", "/tokens/token", "/tokens/logp_a",
                                   "/tokens/dlogp", "/tokens/kl_ba", "/tokens/top1_a", "/tokens/is_prompt",
                                   "/seqs/prompt_index", "/seqs/token_offset", "/seqs/sum_dlogp",
                                   "/prompts/tokens", "/progress/batch", "/progress/seq_rows",
                                   "/progress/token_rows", "/progress/prompt_rows", "/layers/rel_err"};

static void read_all(td_runfile *rf)
{
    td_error err;
    for (size_t i = 0; i < sizeof ATTRS / sizeof ATTRS[0]; i++) free(td_runfile_get_str(rf, ATTRS[i], &err));
    int64_t v;
    td_runfile_get_i64(rf, "seed", &v, &err);
    double buf[256];
    for (size_t i = 0; i < sizeof COLS / sizeof COLS[0]; i++) {
        int64_t rows = td_runfile_rows(rf, COLS[i]);
        size_t w = td_runfile_width(rf, COLS[i]);
        if (rows < -1) abort();   /* -1: more rows claimed than stored (refused, never read) */
        if (rows <= 0 || w == 0 || w > 256) continue;
        int64_t n = (int64_t)(256 / w);
        if (n > rows) n = rows;
        td_runfile_read(rf, COLS[i], TD_COL_F64, 0, n, buf, &err);
        td_runfile_read(rf, COLS[i], TD_COL_I32, rows - n, n, buf, &err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "run.h5", data, size);
    td_error err;
    td_runfile *rf = td_runfile_open(path, 0, &err);
    if (!rf) return 0;
    read_all(rf);
    td_runfile_close(rf, &err);

    td_diff_summary sum;
    td_diff_summarize(path, &sum, &err);

    rf = td_runfile_open(path, 1, &err);   /* the --resume path: cut back to /progress */
    if (!rf) return 0;
    int64_t nb = td_runfile_rows(rf, "/progress/batch");
    int64_t p[3] = {0, 0, 0};
    if (nb > 0 && td_runfile_read(rf, "/progress/seq_rows", TD_COL_I64, nb - 1, 1, &p[0], &err) == 0 &&
        td_runfile_read(rf, "/progress/token_rows", TD_COL_I64, nb - 1, 1, &p[1], &err) == 0) {
        td_runfile_truncate_group(rf, "/seqs", p[0], &err);
        td_runfile_truncate_group(rf, "/tokens", p[1], &err);
    }
    td_runfile_close(rf, &err);
    return 0;
}
