/* tidal — per-step metrics for the tools people watch runs with (--report-to), written by tidal
 * itself: TensorBoard event files and a JSON-lines file, besides the run file (reports/SCHEMA.md).
 *
 * TensorBoard event file (what tf.summary / torch SummaryWriter write): a sequence of TFRecords
 *     uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
 * (little-endian; masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, c the CRC-32C,
 * Castagnoli), each record an `Event` protobuf (tensorflow/core/util/event.proto):
 *     double wall_time = 1;  int64 step = 2;  string file_version = 3;  Summary summary = 5;
 *     Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 * The first record is {wall_time, file_version: "brain.Event:2"}; then one Event per step with
 * all of the step's scalars as Values. The few protobuf fields are encoded by hand (varint keys,
 * fixed64 / fixed32 / length-delimited values): no protobuf library.
 *
 * Where and under which names (--report-to tensorboard, jsonl, or both):
 *   OUTPUT_DIR/runs/events.out.tfevents.<unix time>.<hostname>.<pid>  one per invocation (a
 *       --resume adds one; TensorBoard reads every events file of a folder as one run, in name
 *       order = time order). runs/ is HF's logging_dir parent (output_dir/runs/<date_host>),
 *       without the per-invocation folder so that a resumed run stays one curve:
 *       `tensorboard --logdir OUTPUT_DIR` (or a sweep's output_dir: one run per sub-folder).
 *       Tags: every /steps column by HF's rewrite_logs rule, "eval_X" -> "eval/X", any other
 *       name -> "train/NAME" (so TRL's train/reward, train/kl, train/entropy, train/grad_norm,
 *       train/loss where tidal has them); the step is the row's /steps/step value. NaN values
 *       (tidal's "not measured at this step": eval between evaluations, kl without --beta) are
 *       left out; +-inf are kept. Values are float32 (simple_value).
 *   OUTPUT_DIR/metrics.jsonl  one JSON object per step, flushed per line: "step" first, then
 *       every /steps column under its own name (HF's log_history keys), integers for integer
 *       columns, null for a NaN or infinite value (strict JSON; the run file has which).
 * --resume: the logs are first cut back to the steps the run file keeps (records of steps past
 * the checkpoint, and a torn last record, are removed; a file left with none is deleted), so no
 * step is logged twice; a fresh run (or --overwrite-output-dir) removes the old logs. This is
 * done whatever --report-to says, so that logs on disk never disagree with the run file. */
#ifndef TIDAL_TFEVENTS_H
#define TIDAL_TFEVENTS_H

#include "tidal/common.h"

TD_BEGIN_DECLS

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF):
 * "123456789" -> 0xE3069283. */
uint32_t td_crc32c(const void *data, size_t n);
/* TFRecord's masked form of a CRC. */
uint32_t td_crc32c_mask(uint32_t crc);

/* ---- the TensorBoard events file ---- */
typedef struct td_tfevents td_tfevents;
/* A new events file in dir (created with its parents), the file_version record written. */
td_tfevents *td_tfevents_create(const char *dir, td_error *err);
/* One Event at `step` holding n scalars (tags[i], values[i]); flushed. */
int td_tfevents_scalars(td_tfevents *w, int64_t step, double wall_time, const char *const *tags, const float *values,
                        int n, td_error *err);
const char *td_tfevents_path(const td_tfevents *w);
int td_tfevents_close(td_tfevents *w, td_error *err);
/* Every events.out.tfevents.* file in dir cut back to its records with step < keep_below (the
 * file_version record kept; from the first record at or past it, or the first torn or corrupt
 * one, on: removed); a file left without a step record is deleted. A missing dir is fine. */
int td_tfevents_trim(const char *dir, int64_t keep_below, td_error *err);

/* ---- reading: the scalars of an events file (tidal-postmortem) ----
 * Calls fn(ctx, step, tag, value) for every scalar Value of every Event: simple_value (what
 * tf.summary.scalar in TF1, torch's SummaryWriter and tidal write) and a scalar tensor (TF2's
 * tf.summary.scalar: TensorProto float_val / double_val / 4- or 8-byte tensor_content of dtype
 * DT_FLOAT or DT_DOUBLE). Other values (images, histograms, text) are skipped. A torn last record
 * (a writer still running, or killed) ends the read quietly; a CRC mismatch before it is an error
 * naming the file and the byte offset. fn returning non-zero stops the read (its value returned). */
typedef int (*td_tfevents_scalar_fn)(void *ctx, int64_t step, const char *tag, double value);
int td_tfevents_read(const char *path, td_tfevents_scalar_fn fn, void *ctx, td_error *err);

/* ---- --report-to ---- */
enum { TD_REPORT_TENSORBOARD = 1u, TD_REPORT_JSONL = 2u };
#define TD_REPORT_TO_EXPECT "none, tensorboard, jsonl, or a comma-separated list of them (all = both)"
/* "none" | "tensorboard" | "jsonl" | "tensorboard,jsonl" | "all" -> a TD_REPORT_* mask in
 * *(unsigned *)dest; td_opt's TD_OPT_FN signature. */
int td_report_to_parse(void *dest, const char *value, char *why, size_t whylen);
/* "none", "tensorboard", "jsonl" or "tensorboard,jsonl" (static). */
const char *td_report_to_name(unsigned mask);

/* One /steps value of a step: its column name, the value, whether the column is an integer. */
typedef struct {
    const char *name;
    double value;
    int integer;
} td_step_value;

/* The TensorBoard tag of a /steps column (HF's rewrite_logs: eval_X -> eval/X, else train/X). */
void td_report_tag(const char *name, char *buf, size_t n);

typedef struct td_steplog td_steplog;
/* The sinks of `mask` under output_dir, after cutting the existing logs back to the steps
 * < keep_below (0: a fresh run, every old log removed). */
td_steplog *td_steplog_open(const char *output_dir, unsigned mask, int64_t keep_below, td_error *err);
/* One step's values to every sink (nothing when the mask is 0). */
int td_steplog_write(td_steplog *L, int64_t step, const td_step_value *v, int n, td_error *err);
/* Closes (NULL is fine); 0 or -1 + err. */
int td_steplog_close(td_steplog *L, td_error *err);

TD_END_DECLS

#endif
