/* tidal — sweeps of tidal-rl runs (tidal-sweep, over src/rl/sweep*.c).
 *
 * A sweep is a small JSON file:
 *   {
 *     "tool": "build/bin/tidal-rl",          the program each run executes (default this one)
 *     "output_dir": "build/rl/grid",          one sub-directory per run (its --output-dir)
 *     "report_dir": "reports/rl/grid",        the comparison report (default output_dir/report)
 *     "args": {"model-path": "...", "num-generations": 8, "exact-match": true, ...},
 *     "grid": [                               crossed, in this order; names joined by '-'
 *       {"axis": "recipe", "values": {"bf16": {"dtype": "bf16"}, "fp16": {"dtype": "fp16"}}},
 *       {"axis": "is", "values": {"none": {}, "tis": {"is-correction": "token-tis"}}},
 *       {"axis": "seed", "seed": true, "values": {"s1": {"seed": 1}, "s2": {"seed": 2}}}
 *     ],
 *     "runs": [ {"name": "em", "args": {"exact-match": true}} ]   extra runs (controls), each
 *                                             crossed with the seed axes only
 *   }
 * A run's arguments are "args", then each chosen value's object (a later key replaces an
 * earlier one); a key k with a string or number value becomes --k VALUE, true becomes --k,
 * false leaves it out. Runs that differ only in their seed-axis values form one configuration
 * (the report averages over them).
 *
 * Running: N workers fork/exec the tool, one run each (stdout and stderr to RUN/log.txt). A
 * run whose rl.h5 says finished is skipped (unless "max-steps" has grown past the run's total:
 * --resume extends it); one with an unfinished rl.h5 is continued with --resume; others start.
 * SIGINT / SIGTERM stop the sweep: the running runs are told to stop (they checkpoint their last
 * step) and waited for, and the same command continues. tidal-sweep --report-to LIST gives every
 * run --report-to LIST (a finished run is not run again, so it gets no logs it did not have).
 * --emit slurm|condor writes the grid as a cluster job array instead (a task per run + a report
 * step that runs when they are done), and runs nothing. */
#ifndef TIDAL_SWEEP_H
#define TIDAL_SWEEP_H

#include "tidal/common.h"

#include <signal.h>
#include <stdio.h>

TD_BEGIN_DECLS

typedef struct {
    char *name;           /* "bf16-tis-s1" */
    char *config;         /* the name without seed-axis labels: "bf16-tis" */
    char *dir;            /* output_dir/name */
    char **argv;          /* tool, its arguments, --output-dir dir (NULL-terminated) */
    int argc;
} td_sweep_run;

typedef struct {
    char *path;           /* the config file */
    char *tool, *output_dir, *report_dir;
    td_sweep_run *runs;
    size_t n;
} td_sweep;

/* Reads and expands a sweep file; errors name the file and the key. self: argv[0] of
 * tidal-sweep (the default tool is tidal-rl beside it). */
int td_sweep_load(const char *path, const char *self, td_sweep *s, td_error *err);
void td_sweep_free(td_sweep *s);
/* Gives every run --NAME VALUE (tidal-sweep's --report-to): the value of a run's own --NAME
 * (from the config's arguments) is replaced, else the pair is appended. NAME takes a value. */
void td_sweep_set_arg(td_sweep *s, const char *name, const char *value);

typedef enum { TD_RUN_NEW = 0, TD_RUN_UNFINISHED, TD_RUN_FINISHED } td_run_state;
td_run_state td_sweep_state(const td_sweep_run *r);

/* Runs every unfinished run with `workers` parallel processes; progress with an ETA on stderr.
 * stop (may be NULL; td_stop_on_signals): once set, no run starts, the running ones get SIGTERM
 * (each finishes its step, saves a checkpoint and exits 130) and are waited for; *n_stopped (may
 * be NULL) = how many stopped so. The same sweep command run again continues every one of them.
 * Returns the number of runs that failed (their logs say why), or -1 + err. */
int td_sweep_execute(const td_sweep *s, int workers, int dry_run, volatile sig_atomic_t *stop, int *n_stopped,
                     td_error *err);

/* Writes OUTPUT_DIR/jobs.txt (one command per run) and the job-array files: slurm
 * (sweep.sbatch with #SBATCH --array, report.sbatch, submit.sh chaining them with
 * --dependency=afterany) or condor (task.sh, sweep.sub with queue N, report.sub, sweep.dag:
 * the grid then the report under DAGMan). report_cmd: the command that writes the report. */
int td_sweep_emit(const td_sweep *s, const char *kind, const char *report_cmd, td_error *err);

/* The comparison report of every run that has an rl.h5: REPORT_DIR/{reward,accuracy,mismatch,
 * grad_norm,entropy,is_ess}.png (mean over seeds per configuration; a ring where a seed's
 * collapse was marked), eval_accuracy.png (runs with --eval-steps: the evaluated steps joined)
 * base_drift.png (LoRA runs) and routing_flips.png (MoE runs: routing_flip_rate), and REPORT_DIR/table.md (steps-to-collapse per seed, the first
 * precursor, final and best accuracy, mismatch at step 0 and at the last step; with
 * --eval-steps the final clean accuracy as mean ± sd over seeds and per seed; for LoRA the base
 * drift at the end), also printed on out. */
int td_sweep_report(const td_sweep *s, FILE *out, td_error *err);

TD_END_DECLS

#endif
