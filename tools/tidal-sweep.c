/* tidal-sweep — a grid of tidal-rl runs (recipes x corrections x seeds x flags) from a small JSON
 * file, N parallel workers, finished runs skipped and unfinished ones resumed, and a comparison
 * report (PNG line plots, a Markdown table); or the grid as a Slurm / HTCondor job array.
 *
 *   tidal-sweep CONFIG.json --workers 2          run (or continue) the grid, then the report
 *   tidal-sweep CONFIG.json --report-only        the report from what is on disk
 *   tidal-sweep CONFIG.json --emit slurm         write the job array instead of running
 */
#include "tidal/opts.h"
#include "tidal/sweep.h"
#include "tidal/tfevents.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int workers = 1, report_only = 0, no_report = 0, dry = 0, list = 0, emit = -1, gave_report_to = 0;
    unsigned report_to = 0;
    td_opt opts[] = {
        TD_OPT_I("workers", 'j', &workers, "N", 1, 256, "runs at once (default 1; each run is --n-jobs threads)"),
        TD_OPT_F("report-only", 0, &report_only, 1, "only write the report from the runs on disk"),
        TD_OPT_F("no-report", 0, &no_report, 1, "run the grid, skip the report"),
        TD_OPT_F("dry-run", 'n', &dry, 1, "print the commands of the runs still to do"),
        TD_OPT_F("list", 0, &list, 1, "list the runs and their state"),
        TD_OPT_FUN("report-to", 0, &report_to, "LIST", td_report_to_parse, TD_REPORT_TO_EXPECT,
                   "given to every run, replacing the config's report-to:\ntensorboard (tensorboard --logdir OUTPUT_DIR "
                   "then shows\nthe runs side by side), jsonl, all or none"),
        TD_OPT_C("emit", 0, &emit, "slurm|condor", "write a cluster job array (a task per run and a report\n"
                 "step after them) instead of running"),
        {0}};
    td_cli cli = {"tidal-sweep", "CONFIG.json [--workers N] [--report-only | --emit slurm|condor]",
                  "Runs a grid of tidal-rl runs from a small JSON file (include/tidal/sweep.h has the format),\n"
                  "skipping finished runs and resuming unfinished ones, then writes a comparison report.",
                  "Ctrl-C (SIGINT, SIGTERM): the running runs finish their step and save a checkpoint, no new run\n"
                  "starts, and the command that continues the sweep is printed (exit 130).\n"
                  "Exit status: 0 done, 1 a run failed (its OUTPUT/RUN/log.txt says why), 2 usage error, 130\n"
                  "stopped by a signal.",
                  opts, 1, 1};
    const char *cfg_path = NULL;
    td_opt_get(opts, "report-to")->given = &gave_report_to;
    int nargs, rc = td_cli_parse(&cli, argc, argv, &cfg_path, &nargs);
    if (rc >= 0) return rc;
    if (report_only && (no_report || emit >= 0 || dry))
        return td_cli_bad(&cli, "--report-only", NULL, "contradicts --no-report, --emit and --dry-run");
    td_error err;
    td_sweep s;
    if (td_sweep_load(cfg_path, argv[0], &s, &err)) { fprintf(stderr, "tidal-sweep: %s\n", err.msg); return 1; }
    if (gave_report_to) td_sweep_set_arg(&s, "report-to", td_report_to_name(report_to));
    int status = 0;
    if (list) {
        static const char *st[] = {"new", "unfinished", "finished"};
        for (size_t i = 0; i < s.n; i++) printf("%-40s %-10s %s\n", s.runs[i].name, st[td_sweep_state(&s.runs[i])], s.runs[i].dir);
    } else if (emit >= 0) {
        char report[8400];
        snprintf(report, sizeof report, "%s %s --report-only", argv[0], cfg_path);
        if (td_sweep_emit(&s, emit ? "condor" : "slurm", report, &err)) { fprintf(stderr, "tidal-sweep: %s\n", err.msg); status = 1; }
    } else {
        if (!report_only) {
            volatile sig_atomic_t *stop = dry ? NULL : td_stop_on_signals("tidal-sweep", "running runs' steps");
            int n_stopped = 0, failed = td_sweep_execute(&s, workers, dry, stop, &n_stopped, &err);
            if (failed < 0) { fprintf(stderr, "tidal-sweep: %s\n", err.msg); status = 1; }
            else if (failed > 0) { fprintf(stderr, "tidal-sweep: %d runs failed\n", failed); status = 1; }
            if (stop && *stop) {   /* the same command skips the finished runs and resumes the rest */
                fprintf(stderr, "tidal-sweep: stopped; %d runs saved a checkpoint\n", n_stopped);
                td_stop_print_command("tidal-sweep", "continue the sweep", argc, argv, NULL, NULL);
                td_sweep_free(&s);
                return TD_EXIT_STOPPED;
            }
        }
        if (!dry && !no_report && status == 0) {
            if (td_sweep_report(&s, stdout, &err)) { fprintf(stderr, "tidal-sweep: %s\n", err.msg); status = 1; }
            else fprintf(stderr, "tidal-sweep: report in %s\n", s.report_dir);
        }
    }
    td_sweep_free(&s);
    return status;
}
