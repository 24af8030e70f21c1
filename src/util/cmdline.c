/* The command line as one shell-quoted string: every output file records it. */
#include "tidal/common.h"

#include <stdio.h>
#include <string.h>

char *td_command_line(int argc, char **argv)
{
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += 4 * strlen(argv[i]) + 3;
    char *s = td_xmalloc(n), *p = s;
    for (int i = 0; i < argc; i++) {
        if (i) *p++ = ' ';
        int plain = argv[i][0] != 0;
        for (const char *c = argv[i]; *c; c++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%", *c)) plain = 0;
        if (plain) { p += sprintf(p, "%s", argv[i]); continue; }
        *p++ = '\'';
        for (const char *c = argv[i]; *c; c++) {
            if (*c == '\'') { memcpy(p, "'\\''", 4); p += 4; }
            else *p++ = *c;
        }
        *p++ = '\'';
    }
    *p = 0;
    return s;
}
