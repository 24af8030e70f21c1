/* tidal — the user's reward: --reward-command CMD (include/tidal/rl.h, "Rewards").
 *
 * CMD runs once per run under /bin/sh -c, in a process group of its own (a timeout kills it and
 * whatever it started). Every step, tidal writes one JSON object per completion on its stdin,
 * all of them at once (a script may score them in parallel), and reads one line per completion
 * from its stdout, in the same order: a number, or a JSON object of named components combined
 * with --reward-weights. poll() interleaves the two, so neither pipe's buffer can deadlock them.
 * stderr is the user's terminal. PYTHONUNBUFFERED=1 is set for it: a Python script's print()
 * reaches tidal at once instead of sitting in a block buffer until the timeout. */
#include "rl_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct rl_reward {
    pid_t pid;
    int in, out;             /* our ends: its stdin (we write), its stdout (we read)        */
    double timeout;          /* seconds without a reward line before it is stopped          */
    const char *cmd;
    int n_names;             /* --reward-weights                                            */
    char **names;
    double *weights;
    char *buf;               /* bytes read and not yet consumed                             */
    size_t len, cap;
    long lines;              /* reward lines read so far (the line number in its output)   */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int td_rl_reward_weights_parse(const char *spec, int *n, char ***names, double **w, td_error *err)
{
    *n = 0;
    *names = NULL;
    *w = NULL;
    if (!spec || !*spec) return 0;
    char *copy = strdup(spec);
    int rc = 0;
    for (char *save, *kv = strtok_r(copy, ",", &save); kv && !rc; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '='), *end;
        double x = eq ? strtod(eq + 1, &end) : NAN;
        if (!eq || eq == kv || !eq[1] || *end || !isfinite(x)) {
            rc = td_fail(err, "--reward-weights: '%s' is not NAME=WEIGHT (e.g. correct=1.0,format=0.2)", kv);
            break;
        }
        *eq = 0;
        for (int i = 0; i < *n; i++)
            if (!strcmp((*names)[i], kv)) rc = td_fail(err, "--reward-weights: '%s' is given twice", kv);
        *names = td_xrealloc(*names, (size_t)(*n + 1) * sizeof **names);
        *w = td_xrealloc(*w, (size_t)(*n + 1) * sizeof **w);
        (*names)[*n] = strdup(kv);
        (*w)[(*n)++] = x;
    }
    free(copy);
    if (rc) {
        for (int i = 0; i < *n; i++) free((*names)[i]);
        free(*names); free(*w);
        *n = 0; *names = NULL; *w = NULL;
    }
    return rc;
}

rl_reward *rl_reward_start(const td_rl_opts *o, td_error *err)
{
    rl_reward *p = td_xcalloc(1, sizeof *p);
    p->pid = -1;
    p->in = p->out = -1;
    p->cmd = o->reward_command;
    p->timeout = o->reward_timeout;
    if (td_rl_reward_weights_parse(o->reward_weights, &p->n_names, &p->names, &p->weights, err)) { free(p); return NULL; }
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) || pipe2(from_child, O_CLOEXEC)) {
        td_fail(err, "--reward-command: cannot create pipes: %s", strerror(errno));
        rl_reward_stop(p);
        return NULL;
    }
    /* its environment: ours, with PYTHONUNBUFFERED=1 unless set */
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = td_xmalloc((ne + 2) * sizeof *env);
    int have = 0;
    for (size_t i = 0; i < ne; i++) {
        env[i] = environ[i];
        have |= !strncmp(environ[i], "PYTHONUNBUFFERED=", 17);
    }
    env[ne] = have ? NULL : "PYTHONUNBUFFERED=1";
    env[ne + 1] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    posix_spawnattr_init(&at);
    posix_spawnattr_setpgroup(&at, 0);
    sigset_t dflt;
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGPIPE);
    posix_spawnattr_setsigdefault(&at, &dflt);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {"sh", "-c", (char *)o->reward_command, NULL};
    int rc = posix_spawn(&p->pid, "/bin/sh", &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    close(to_child[0]);
    close(from_child[1]);
    p->in = to_child[1];
    p->out = from_child[0];
    if (rc) {
        p->pid = -1;
        td_fail(err, "--reward-command: cannot start /bin/sh: %s", strerror(rc));
        rl_reward_stop(p);
        return NULL;
    }
    fcntl(p->in, F_SETFL, fcntl(p->in, F_GETFL) | O_NONBLOCK);
    /* a reward process that exits makes our writes fail with EPIPE (reported), not kill us */
    signal(SIGPIPE, SIG_IGN);
    return p;
}

/* How the process ended, for messages ("exited with status 1", "was killed by signal 9"). */
static void reap(rl_reward *p, char *buf, size_t n, int wait_s)
{
    int st = 0;
    pid_t r = 0;
    for (int i = 0; i < wait_s * 20 && (r = waitpid(p->pid, &st, WNOHANG)) == 0; i++) usleep(50000);
    if (r == 0) {
        kill(-p->pid, SIGKILL);
        r = waitpid(p->pid, &st, 0);
    }
    if (r == p->pid && WIFEXITED(st))
        snprintf(buf, n, "exited with status %d%s", WEXITSTATUS(st),
                 WEXITSTATUS(st) == 127 ? " (the shell could not find the command)" :
                 WEXITSTATUS(st) == 126 ? " (the command is not executable)" : "");
    else if (r == p->pid && WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "ended");
    p->pid = -1;
}

void rl_reward_stop(rl_reward *p)
{
    if (!p) return;
    if (p->in >= 0) close(p->in);
    if (p->pid > 0) {
        char how[128];
        reap(p, how, sizeof how, 5);   /* it sees EOF on its input and should exit */
    }
    if (p->out >= 0) close(p->out);
    for (int i = 0; i < p->n_names; i++) free(p->names[i]);
    free(p->names);
    free(p->weights);
    free(p->buf);
    free(p);
}

int rl_reward_names(const rl_reward *p, const char *const **names)
{
    *names = (const char *const *)p->names;
    return p->n_names;
}

/* One reply line into *reward and comp[0 .. n_names). 0 or -1 + why. */
static int parse_reply(const rl_reward *p, const char *line, size_t len, double *reward, double *comp, char *why,
                       size_t wn)
{
    json_error_t je;
    json_t *v = json_loadb(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!v) {
        /* Python's print(float("nan")) and json.dumps(nan) are not JSON */
        int nonfinite = (len >= 3 && (!strncasecmp(line, "nan", 3) || !strncasecmp(line, "inf", 3))) ||
                        (len >= 4 && !strncasecmp(line, "-inf", 4)) || memmem(line, len, "NaN", 3) ||
                        memmem(line, len, "Infinity", 8);
        if (nonfinite)
            snprintf(why, wn, "a finite number (nan and inf are not rewards)");
        else
            snprintf(why, wn, "a number or a JSON object of named rewards ({\"correct\": 1.0, \"format\": 0.5}); "
                     "print diagnostics on stderr, not stdout");
        return -1;
    }
    if (json_is_number(v)) {
        if (p->n_names) snprintf(why, wn, "a JSON object with the components of --reward-weights, not a number");
        else if (!isfinite(json_number_value(v))) snprintf(why, wn, "a finite number");
        else { *reward = json_number_value(v); rc = 0; }
    } else if (json_is_object(v)) {
        double sum = 0;
        int any = 0;
        const char *k;
        json_t *x;
        rc = 0;
        json_object_foreach(v, k, x) {
            int at = -1;
            for (int i = 0; i < p->n_names; i++) if (!strcmp(p->names[i], k)) at = i;
            if (p->n_names && at < 0) {
                char list[400] = "";
                for (int i = 0; i < p->n_names; i++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", p->names[i]);
                snprintf(why, wn, "components among --reward-weights' names (%s), got \"%s\"", list, k);
                rc = -1;
                break;
            }
            if (json_is_null(x)) { if (at >= 0 && comp) comp[at] = NAN; continue; }   /* TRL: None = does not apply */
            if (!json_is_number(x) || !isfinite(json_number_value(x))) {
                snprintf(why, wn, "component \"%s\" to be a finite number or null", k);
                rc = -1;
                break;
            }
            double w = at >= 0 ? p->weights[at] : 1.0;
            if (at >= 0 && comp) comp[at] = json_number_value(x);
            sum += w * json_number_value(x);
            any = 1;
        }
        for (int i = 0; rc == 0 && i < p->n_names; i++)
            if (!json_object_get(v, p->names[i])) {
                snprintf(why, wn, "a value (or null) for every --reward-weights component: \"%s\" is missing", p->names[i]);
                rc = -1;
            }
        if (rc == 0 && !any) { snprintf(why, wn, "at least one component that is not null"); rc = -1; }
        if (rc == 0) *reward = sum;
    } else {
        snprintf(why, wn, "a number or a JSON object of named rewards%s", json_is_null(v) ? " (null applies to a "
                 "component, not to the whole reward)" : "");
    }
    json_decref(v);
    return rc;
}

/* Shows a bad line in messages: at most 80 bytes, control characters escaped. */
static void quote(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < 80 && k + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 32) k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
        else out[k++] = (char)c;
    }
    if (n > 80 && k + 4 < cap) { memcpy(out + k, "...", 3); k += 3; }
    out[k] = 0;
}

int rl_reward_score(rl_reward *p, int n, char *const *req, double *reward, double *comp,
                    const char *const *where, td_error *err)
{
    if (p->pid < 0) return td_fail(err, "--reward-command '%s' is no longer running", p->cmd);
    /* what to write: the n request lines */
    size_t total = 0;
    for (int i = 0; i < n; i++) total += strlen(req[i]) + 1;
    char *out = td_xmalloc(total ? total : 1);
    size_t at = 0, sent = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(req[i]);
        memcpy(out + at, req[i], l);
        out[at + l] = '\n';
        at += l + 1;
    }
    int got = 0, rc = 0;
    double deadline = now_s() + p->timeout;
    char how[160];
    while (got < n && rc == 0) {
        /* whole lines already read */
        char *nl;
        while (got < n && p->len && (nl = memchr(p->buf, '\n', p->len))) {
            size_t l = (size_t)(nl - p->buf), b = 0;
            p->lines++;
            while (l && (p->buf[l - 1] == '\r' || p->buf[l - 1] == ' ' || p->buf[l - 1] == '\t')) l--;
            while (b < l && (p->buf[b] == ' ' || p->buf[b] == '\t')) b++;
            char why[600];
            if (parse_reply(p, p->buf + b, l - b, &reward[got], comp ? comp + (size_t)got * p->n_names : NULL, why,
                            sizeof why)) {
                char q[400];
                quote(p->buf + b, l - b, q, sizeof q);
                rc = td_fail(err, "--reward-command: line %ld of its output, the reward of %s: expected %s; got '%s'",
                             p->lines, where[got], why, q);
                break;
            }
            size_t used = (size_t)(nl - p->buf) + 1;
            memmove(p->buf, p->buf + used, p->len - used);
            p->len -= used;
            got++;
            deadline = now_s() + p->timeout;
        }
        if (rc || got == n) break;
        struct pollfd fds[2] = {{p->out, POLLIN, 0}, {p->in, POLLOUT, 0}};
        int nf = sent < total ? 2 : 1;
        double left = deadline - now_s();
        int r = left > 0 ? poll(fds, (nfds_t)nf, (int)fmin(left * 1000 + 1, 1e9)) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = td_fail(err, "--reward-command: poll: %s", strerror(errno)); break; }
        if (r == 0) {
            kill(-p->pid, SIGKILL);
            reap(p, how, sizeof how, 0);
            rc = td_fail(err, "--reward-command: no reward line for %g s (--reward-timeout) for %s, the completion "
                         "after line %ld of its output: stopped it (a script must flush each line: Python's "
                         "print(..., flush=True))", p->timeout, where[got], p->lines);
            break;
        }
        if (nf == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = write(p->in, out + sent, total - sent);
            if (w > 0) sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                /* it closed its input: it exited or is exiting; its exit status says more */
                sent = total;
                if (!(fds[0].revents & POLLIN)) {
                    reap(p, how, sizeof how, 2);
                    rc = td_fail(err, "--reward-command '%s' %s before the reward of %s (line %ld of its output; "
                                 "its stderr above says why)", p->cmd, how, where[got], p->lines + 1);
                    break;
                }
            }
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (p->cap - p->len < 4096) { p->cap = 2 * p->cap + 65536; p->buf = td_xrealloc(p->buf, p->cap); }
            ssize_t k = read(p->out, p->buf + p->len, p->cap - p->len - 1);
            if (k > 0) { p->len += (size_t)k; continue; }
            if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            reap(p, how, sizeof how, 2);
            rc = td_fail(err, "--reward-command '%s' %s before the reward of %s (line %ld of its output; its stderr "
                         "above says why)", p->cmd, how, where[got], p->lines + 1);
        }
    }
    free(out);
    if (rc == 0 && p->len > 0) {
        char q[400];
        quote(p->buf, p->len, q, sizeof q);
        rc = td_fail(err, "--reward-command: more output than completions after line %ld ('%s'): one line per "
                     "completion on stdout, diagnostics on stderr", p->lines, q);
    }
    return rc;
}
