/* Stopping a long run on SIGINT / SIGTERM the one way every tool does it (include/tidal/opts.h):
 * the first signal sets a flag the tool reads between units of work and says so on stderr; the
 * handler resets itself (SA_RESETHAND), so a second Ctrl-C stops the process at once. What a tool
 * keeps on disk is written at the unit boundaries, so an immediate stop loses only the unit in
 * flight. */
#include "tidal/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;
static char stop_msg[256];
static size_t stop_msg_len;

/* async-signal-safe: a flag and one write(2) of a message prepared beforehand */
static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
    if (write(2, stop_msg, stop_msg_len) < 0) { /* nothing to do */ }
}

volatile sig_atomic_t *td_stop_on_signals(const char *prog, const char *unit)
{
    snprintf(stop_msg, sizeof stop_msg, "\n%s: stopping after the %s in flight (Ctrl-C again to stop now)\n", prog, unit);
    stop_msg_len = strlen(stop_msg);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;   /* the work in flight goes on: reads and writes are not cut */
    sigemptyset(&sa.sa_mask);
    /* a SIGINT ignored by whoever started us stays ignored (a script's background job: the
     * terminal's Ctrl-C is not meant for it), as the shell convention goes */
    struct sigaction old;
    if (sigaction(SIGINT, NULL, &old) != 0 || old.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return &stop_requested;
}

void td_stop_print_command(const char *prog, const char *what, int argc, char **argv, const char *const *drop,
                           const char *add)
{
    char *cmd = td_command_line_edit(argc, argv, drop, add);
    fprintf(stderr, "%s: to %s, run:\n  %s\n", prog, what, cmd);
    free(cmd);
}
