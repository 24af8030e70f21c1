/* tidal-sweep's grid (include/tidal/sweep.h): the config file expanded into runs, their state
 * on disk, a pool of worker processes, and job arrays for Slurm and HTCondor. */
#include "tidal/rl.h"
#include "tidal/runfile.h"
#include "tidal/sweep.h"
#include "tidal/opts.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = td_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

static char *xprintf(const char *a, const char *sep, const char *b)
{
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *p = td_xmalloc(n);
    snprintf(p, n, "%s%s%s", a, *a ? sep : "", b);
    return p;
}

/* argv from a merged argument object */
static int args_to_argv(const td_sweep *s, json_t *args, const char *dir, td_sweep_run *r, td_error *err)
{
    size_t cap = 2 * json_object_size(args) + 5;
    r->argv = td_xcalloc(cap, sizeof(char *));
    r->argv[r->argc++] = xstrdup(s->tool);
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        char flag[256], val[64];
        snprintf(flag, sizeof flag, "--%s", key);
        if (json_is_false(v) || json_is_null(v)) continue;
        r->argv[r->argc++] = xstrdup(flag);
        if (json_is_true(v)) continue;
        if (json_is_string(v)) r->argv[r->argc++] = xstrdup(json_string_value(v));
        else if (json_is_integer(v)) { snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v)); r->argv[r->argc++] = xstrdup(val); }
        else if (json_is_real(v)) {   /* the shortest form that reads back as the same double */
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(val, sizeof val, "%.*g", prec, json_real_value(v));
                if (strtod(val, NULL) == json_real_value(v)) break;
            }
            r->argv[r->argc++] = xstrdup(val);
        }
        else return td_fail(err, "%s: run %s: argument \"%s\" must be a string, number or boolean", s->path, r->name, key);
    }
    r->argv[r->argc++] = xstrdup("--output-dir");
    r->argv[r->argc++] = xstrdup(dir);
    return 0;
}

static int add_run(td_sweep *s, const char *name, const char *config, json_t *args, size_t *cap, td_error *err)
{
    if (s->n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        s->runs = td_xrealloc(s->runs, *cap * sizeof *s->runs);
    }
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->runs[i].name, name)) return td_fail(err, "%s: two runs named %s", s->path, name);
    td_sweep_run *r = &s->runs[s->n++];
    memset(r, 0, sizeof *r);
    r->name = xstrdup(name);
    r->config = xstrdup(config);
    r->dir = xprintf(s->output_dir, "/", name);
    return args_to_argv(s, args, r->dir, r, err);
}

typedef struct { const char *axis; json_t *values; int seed; } axis_t;

/* crosses axes[a..] onto (name, config, args) */
static int expand(td_sweep *s, axis_t *ax, int na, int a, const char *name, const char *config,
                  json_t *args, int seeds_only, size_t *cap, td_error *err)
{
    while (a < na && seeds_only && !ax[a].seed) a++;
    if (a == na) return add_run(s, name, config, args, cap, err);
    const char *label;
    json_t *val;
    json_object_foreach(ax[a].values, label, val) {
        if (!json_is_object(val))
            return td_fail(err, "%s: axis %s, value %s: expected an object of arguments", s->path, ax[a].axis, label);
        json_t *merged = json_deep_copy(args);
        json_object_update(merged, val);
        char *n2 = xprintf(name, "-", label), *c2 = ax[a].seed ? xstrdup(config) : xprintf(config, "-", label);
        int rc = expand(s, ax, na, a + 1, n2, c2, merged, seeds_only, cap, err);
        free(n2); free(c2);
        json_decref(merged);
        if (rc) return -1;
    }
    return 0;
}

int td_sweep_load(const char *path, const char *self, td_sweep *s, td_error *err)
{
    memset(s, 0, sizeof *s);
    s->path = xstrdup(path);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return td_fail(err, "%s:%d: %s", path, je.line, je.text);
    int rc = -1;
    axis_t *ax = NULL;
    if (!json_is_object(root)) { td_fail(err, "%s: expected a JSON object", path); goto done; }
    const char *known[] = {"tool", "output_dir", "report_dir", "args", "grid", "runs", "comment"};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
        if (!ok) { td_fail(err, "%s: unknown key \"%s\" (expected tool, output_dir, report_dir, args, grid, runs)", path, key); goto done; }
    }
    json_t *jo = json_object_get(root, "output_dir"), *jt = json_object_get(root, "tool");
    json_t *jr = json_object_get(root, "report_dir"), *args = json_object_get(root, "args");
    json_t *grid = json_object_get(root, "grid"), *runs = json_object_get(root, "runs");
    if (!json_is_string(jo)) { td_fail(err, "%s: \"output_dir\" (a string) is required", path); goto done; }
    s->output_dir = xstrdup(json_string_value(jo));
    s->report_dir = jr && json_is_string(jr) ? xstrdup(json_string_value(jr)) : xprintf(s->output_dir, "/", "report");
    if (jt && json_is_string(jt)) s->tool = xstrdup(json_string_value(jt));
    else {
        const char *slash = strrchr(self, '/');
        char buf[4200];
        snprintf(buf, sizeof buf, "%.*stidal-rl", slash ? (int)(slash - self + 1) : 0, self);
        s->tool = xstrdup(buf);
    }
    if (args && !json_is_object(args)) { td_fail(err, "%s: \"args\" must be an object", path); goto done; }
    json_t *base = args ? json_deep_copy(args) : json_object();
    int na = grid ? (int)json_array_size(grid) : 0;
    if (grid && !json_is_array(grid)) { json_decref(base); td_fail(err, "%s: \"grid\" must be an array of axes", path); goto done; }
    ax = td_xcalloc((size_t)(na ? na : 1), sizeof *ax);
    for (int i = 0; i < na; i++) {
        json_t *a = json_array_get(grid, (size_t)i);
        json_t *name = json_object_get(a, "axis"), *vals = json_object_get(a, "values");
        if (!json_is_string(name) || !json_is_object(vals) || !json_object_size(vals)) {
            json_decref(base);
            td_fail(err, "%s: grid[%d]: expected {\"axis\": NAME, \"values\": {LABEL: {args}, ...}}", path, i);
            goto done;
        }
        ax[i] = (axis_t){json_string_value(name), vals, json_is_true(json_object_get(a, "seed"))};
    }
    size_t cap = 0;
    if (na && expand(s, ax, na, 0, "", "", base, 0, &cap, err)) { json_decref(base); goto done; }
    for (size_t i = 0; runs && i < json_array_size(runs); i++) {
        json_t *r = json_array_get(runs, i), *rn = json_object_get(r, "name"), *ra = json_object_get(r, "args");
        if (!json_is_string(rn) || (ra && !json_is_object(ra))) {
            json_decref(base);
            td_fail(err, "%s: runs[%zu]: expected {\"name\": NAME, \"args\": {...}}", path, i);
            goto done;
        }
        json_t *merged = json_deep_copy(base);
        if (ra) json_object_update(merged, ra);
        int e = expand(s, ax, na, 0, json_string_value(rn), json_string_value(rn), merged, 1, &cap, err);
        json_decref(merged);
        if (e) { json_decref(base); goto done; }
    }
    json_decref(base);
    if (!s->n) { td_fail(err, "%s: no runs (give \"grid\" or \"runs\")", path); goto done; }
    rc = 0;
done:
    free(ax);
    json_decref(root);
    return rc;
}

/* "--report_to" and "--report-to" are one option to the tools' parser */
static int same_flag(const char *arg, const char *name)
{
    if (strncmp(arg, "--", 2)) return 0;
    for (arg += 2; *arg && *name; arg++, name++)
        if (*arg != *name && !((*arg == '_' || *arg == '-') && (*name == '_' || *name == '-'))) return 0;
    return !*arg && !*name;
}

void td_sweep_set_arg(td_sweep *s, const char *name, const char *value)
{
    for (size_t i = 0; i < s->n; i++) {
        td_sweep_run *r = &s->runs[i];
        int a = 1;
        while (a + 1 < r->argc && !same_flag(r->argv[a], name)) a++;
        if (a + 1 < r->argc && strncmp(r->argv[a + 1], "--", 2)) {   /* the config's own value: replaced */
            free(r->argv[a + 1]);
            r->argv[a + 1] = xstrdup(value);
            continue;
        }
        r->argv = td_xrealloc(r->argv, ((size_t)r->argc + 3) * sizeof(char *));
        r->argv[r->argc++] = xprintf("--", "", name);
        r->argv[r->argc++] = xstrdup(value);
        r->argv[r->argc] = NULL;
    }
}

void td_sweep_free(td_sweep *s)
{
    for (size_t i = 0; i < s->n; i++) {
        td_sweep_run *r = &s->runs[i];
        for (int a = 0; a < r->argc; a++) free(r->argv[a]);
        free(r->argv); free(r->name); free(r->config); free(r->dir);
    }
    free(s->runs); free(s->path); free(s->tool); free(s->output_dir); free(s->report_dir);
    memset(s, 0, sizeof *s);
}

td_run_state td_sweep_state(const td_sweep_run *r)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", r->dir, TD_RL_RUNFILE);
    struct stat st;
    if (stat(p, &st)) return TD_RUN_NEW;
    td_runfile *rf = td_runfile_open(p, 0, NULL);
    if (!rf) return TD_RUN_UNFINISHED;
    int64_t fin = 0, total = 0, stopped = 0;
    td_runfile_get_i64(rf, "finished", &fin, NULL);
    td_runfile_get_i64(rf, "max_steps", &total, NULL);
    td_runfile_get_i64(rf, "stopped_on_collapse", &stopped, NULL);
    td_runfile_close(rf, NULL);
    /* a finished run whose --max-steps has grown since is continued to the new total (--resume
     * extends it, as HF's Trainer does) */
    for (int a = 1; fin == 1 && !stopped && a + 1 < r->argc; a++)
        if ((!strcmp(r->argv[a], "--max-steps") || !strcmp(r->argv[a], "--max_steps")) && atoll(r->argv[a + 1]) > total)
            fin = 0;
    return fin == 1 ? TD_RUN_FINISHED : TD_RUN_UNFINISHED;
}

static pid_t launch(const td_sweep_run *r, int resume)
{
    mkdir(r->dir, 0755);
    pid_t pid = fork();
    if (pid != 0) return pid;
    char log[4200];
    snprintf(log, sizeof log, "%s/log.txt", r->dir);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
    char **argv = td_xcalloc((size_t)r->argc + 2, sizeof(char *));
    for (int a = 0; a < r->argc; a++) argv[a] = r->argv[a];
    if (resume) argv[r->argc] = "--resume";
    execv(argv[0], argv);
    fprintf(stderr, "tidal-sweep: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* the output directory and its parents (build/rl/lora/grid on a fresh clone) */
static int make_output_dir(const td_sweep *s, td_error *err)
{
    if (td_make_parent_dirs(s->output_dir, err)) return -1;
    if (mkdir(s->output_dir, 0755) && errno != EEXIST)
        return td_fail(err, "%s: cannot create the output directory: %s", s->output_dir, strerror(errno));
    return 0;
}

int td_sweep_execute(const td_sweep *s, int workers, int dry_run, volatile sig_atomic_t *stop, int *n_stopped,
                     td_error *err)
{
    if (n_stopped) *n_stopped = 0;
    if (make_output_dir(s, err)) return -1;
    size_t *todo = td_xmalloc((s->n ? s->n : 1) * sizeof *todo), ntodo = 0, skipped = 0;
    int *resume = td_xcalloc(s->n ? s->n : 1, sizeof(int));
    for (size_t i = 0; i < s->n; i++) {
        td_run_state st = td_sweep_state(&s->runs[i]);
        if (st == TD_RUN_FINISHED) {
            /* killed while it compacted its finished rl.h5: finish that (the rename removes the
             * temporary); the file is whole either way */
            char p[4200], tmp[4300];
            snprintf(p, sizeof p, "%s/%s", s->runs[i].dir, TD_RL_RUNFILE);
            snprintf(tmp, sizeof tmp, "%s.compact.tmp", p);
            td_error e2;
            if (!dry_run && access(tmp, F_OK) == 0 && td_runfile_compact(p, &e2))
                fprintf(stderr, "tidal-sweep: warning: %s\n", e2.msg);
            skipped++;
            continue;
        }
        resume[ntodo] = st == TD_RUN_UNFINISHED;
        todo[ntodo++] = i;
    }
    fprintf(stderr, "tidal-sweep: %zu runs: %zu finished (skipped), %zu to run with %d workers\n", s->n, skipped,
            ntodo, workers);
    if (dry_run) {
        for (size_t k = 0; k < ntodo; k++) {
            char *cmd = td_command_line(s->runs[todo[k]].argc, s->runs[todo[k]].argv);
            printf("%s%s\n", cmd, resume[k] ? " --resume" : "");
            free(cmd);
        }
        free(todo); free(resume);
        return 0;
    }
    pid_t *pids = td_xcalloc((size_t)workers, sizeof(pid_t));
    size_t *slot_run = td_xcalloc((size_t)workers, sizeof(size_t));
    size_t next = 0, done = 0;
    int failed = 0, running = 0, forwarded = 0, halted = 0;
    double t0 = omp_get_wtime();
    while (done < ntodo) {
        int stopping = stop && *stop;
        while (!stopping && running < workers && next < ntodo) {
            int w = 0;
            while (pids[w]) w++;
            pids[w] = launch(&s->runs[todo[next]], resume[next]);
            slot_run[w] = todo[next];
            fprintf(stderr, "tidal-sweep: start %s%s\n", s->runs[todo[next]].name, resume[next] ? " (resume)" : "");
            next++;
            running++;
        }
        /* a stop: the running runs get it too (SIGTERM: each finishes its step, checkpoints and
         * exits 130; a Ctrl-C at the terminal also reached them as SIGINT, which their handler
         * counts as the same first stop), no new run starts, and we wait for them to save */
        if (stopping && !forwarded) {
            forwarded = 1;
            fprintf(stderr, "tidal-sweep: stopping: %d running runs finish their step and save a checkpoint; %zu not "
                    "started\n", running, ntodo - next);
            for (int w = 0; w < workers; w++) if (pids[w] > 0) kill(pids[w], SIGTERM);
        }
        if (running == 0) break;
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == 0) {   /* polled, so a stop is forwarded at once */
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int w = 0; w < workers; w++)
            if (pids[w] == pid) {
                int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                done++;
                running--;
                pids[w] = 0;
                int ok = rc == 0 || rc == 3, was_stopped = forwarded && rc == TD_EXIT_STOPPED;
                failed += !ok && !was_stopped;
                halted += was_stopped;
                double el = omp_get_wtime() - t0, eta = el / done * (ntodo - done);   /* wall per finished run */
                if (was_stopped)
                    fprintf(stderr, "tidal-sweep: [%zu/%zu] %s stopped, its checkpoint saved (%s/log.txt)\n", done,
                            ntodo, s->runs[slot_run[w]].name, s->runs[slot_run[w]].dir);
                else
                    fprintf(stderr, "tidal-sweep: [%zu/%zu] %s %s%s (%.0f s elapsed, ETA %.0f min)\n", done, ntodo,
                            s->runs[slot_run[w]].name, ok ? "done" : "FAILED, see ",
                            ok ? (rc == 3 ? " (stopped on collapse)" : "") : s->runs[slot_run[w]].dir, el, eta / 60);
            }
    }
    if (n_stopped) *n_stopped = halted;
    free(pids); free(slot_run); free(todo); free(resume);
    return failed;
}

/* ---------------------------------------------------------------- job arrays */

static FILE *open_out(const td_sweep *s, const char *name, char *path, size_t n, td_error *err)
{
    snprintf(path, n, "%s/%s", s->output_dir, name);
    FILE *f = fopen(path, "w");
    if (!f) td_fail(err, "%s: cannot write", path);
    return f;
}

/* Writes out and closes f; a failed write (a full disk) is an error naming the file. */
static int close_out(FILE *f, const char *path, td_error *err)
{
    int bad = ferror(f);
    if (fclose(f) || bad) return td_fail(err, "%s: write failed (disk full?)", path);
    return 0;
}

/* What one task asks the scheduler for: the largest --n-jobs of the runs (cpus) and a GPU when
 * a run has --device cuda or cuda:N. */
static void task_resources(const td_sweep *s, int *cpus, int *gpu)
{
    *cpus = 1;
    *gpu = 0;
    for (size_t i = 0; i < s->n; i++)
        for (int a = 1; a + 1 < s->runs[i].argc; a++) {
            const char *k = s->runs[i].argv[a], *v = s->runs[i].argv[a + 1];
            if (!strcmp(k, "--n-jobs") && atoi(v) > *cpus) *cpus = atoi(v);
            if (!strcmp(k, "--device") && !strncmp(v, "cuda", 4)) *gpu = 1;
        }
}

int td_sweep_emit(const td_sweep *s, const char *kind, const char *report_cmd, td_error *err)
{
    if (make_output_dir(s, err)) return -1;
    int cpus, gpu;
    task_resources(s, &cpus, &gpu);
    char path[4300], cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return td_fail(err, "cannot read the working directory");
    FILE *f = open_out(s, "jobs.txt", path, sizeof path, err);
    if (!f) return -1;
    for (size_t i = 0; i < s->n; i++) {   /* --resume on a run that does not exist yet starts it */
        char *cmd = td_command_line(s->runs[i].argc, s->runs[i].argv);
        fprintf(f, "mkdir -p %s && %s --resume > %s/log.txt 2>&1\n", s->runs[i].dir, cmd, s->runs[i].dir);
        free(cmd);
    }
    if (close_out(f, path, err)) return -1;
    if (!strcmp(kind, "slurm")) {
        if (!(f = open_out(s, "sweep.sbatch", path, sizeof path, err))) return -1;
        fprintf(f, "#!/bin/bash\n#SBATCH --job-name=tidal-sweep\n#SBATCH --array=0-%zu\n#SBATCH --cpus-per-task=%d\n%s"
                "#SBATCH --output=%s/slurm-%%A_%%a.out\n# one run of %s per array task (line TASK+1 of jobs.txt)\n"
                "cd %s\neval \"$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" %s/jobs.txt)\"\n",
                s->n - 1, cpus, gpu ? "#SBATCH --gres=gpu:1\n" : "", s->output_dir, s->path, cwd, s->output_dir);
        if (close_out(f, path, err)) return -1;
        if (!(f = open_out(s, "report.sbatch", path, sizeof path, err))) return -1;
        fprintf(f, "#!/bin/bash\n#SBATCH --job-name=tidal-sweep-report\n#SBATCH --output=%s/slurm-report.out\ncd %s\n%s\n",
                s->output_dir, cwd, report_cmd);
        if (close_out(f, path, err)) return -1;
        if (!(f = open_out(s, "submit.sh", path, sizeof path, err))) return -1;
        fprintf(f, "#!/bin/bash\n# the grid as a job array, then the report once every task has ended\nset -e\n"
                "jid=$(sbatch --parsable %s/sweep.sbatch)\nsbatch --dependency=afterany:$jid %s/report.sbatch\n",
                s->output_dir, s->output_dir);
        if (close_out(f, path, err)) return -1;
        chmod(path, 0755);
        fprintf(stderr, "tidal-sweep: %zu tasks: submit with  bash %s/submit.sh\n", s->n, s->output_dir);
        return 0;
    }
    if (!strcmp(kind, "condor")) {
        if (!(f = open_out(s, "task.sh", path, sizeof path, err))) return -1;
        fprintf(f, "#!/bin/bash\n# HTCondor task $1: line $1+1 of jobs.txt\ncd %s\neval \"$(sed -n \"$(($1 + 1))p\" %s/jobs.txt)\"\n",
                cwd, s->output_dir);
        if (close_out(f, path, err)) return -1;
        chmod(path, 0755);
        if (!(f = open_out(s, "sweep.sub", path, sizeof path, err))) return -1;
        fprintf(f, "# %s: one task per run\nexecutable = %s%s%s/task.sh\narguments = $(Process)\nrequest_cpus = %d\n%s"
                "output = %s/condor-$(Process).out\nerror = %s/condor-$(Process).err\nlog = %s/condor.log\nqueue %zu\n",
                s->path, s->output_dir[0] == '/' ? "" : cwd, s->output_dir[0] == '/' ? "" : "/", s->output_dir,
                cpus, gpu ? "request_gpus = 1\n" : "", s->output_dir, s->output_dir,
                s->output_dir, s->n);
        if (close_out(f, path, err)) return -1;
        if (!(f = open_out(s, "report.sub", path, sizeof path, err))) return -1;
        fprintf(f, "executable = /bin/bash\narguments = \"-c 'cd %s && %s'\"\noutput = %s/condor-report.out\n"
                "error = %s/condor-report.err\nlog = %s/condor.log\nqueue\n", cwd, report_cmd, s->output_dir,
                s->output_dir, s->output_dir);
        if (close_out(f, path, err)) return -1;
        if (!(f = open_out(s, "sweep.dag", path, sizeof path, err))) return -1;
        fprintf(f, "JOB grid %s/sweep.sub\nJOB report %s/report.sub\nPARENT grid CHILD report\n", s->output_dir, s->output_dir);
        if (close_out(f, path, err)) return -1;
        fprintf(stderr, "tidal-sweep: %zu tasks: condor_submit %s/sweep.sub (the grid), or condor_submit_dag "
                "%s/sweep.dag (the grid, then the report)\n", s->n, s->output_dir, s->output_dir);
        return 0;
    }
    return td_fail(err, "--emit %s: expected slurm or condor", kind);
}
