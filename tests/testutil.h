/* Helpers shared by the cmocka tests (header-only; include after <cmocka.h>):
 * a per-test-program temporary directory, temp files with given text, and a message check. */
#ifndef TIDAL_TESTUTIL_H
#define TIDAL_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char test_dir[64];

/* Where the tests' temporary files go: $TMPDIR (tests/run.sh gives each test program a fresh one
 * and removes it afterwards, so nothing a test leaves behind accumulates) when it is short enough
 * for the 64-byte paths below, else /tmp. */
static inline const char *test_tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] && strlen(t) <= 32 ? t : "/tmp";
}

/* cmocka group setup / teardown: a fresh temporary directory for the group's files, removed after. */
static inline int test_dir_setup(void **state)
{
    (void)state;
    snprintf(test_dir, sizeof test_dir, "%s/tidal_test_XXXXXX", test_tmp_base());
    return mkdtemp(test_dir) ? 0 : -1;
}

static inline int test_dir_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* out = test_dir/name */
static inline void test_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", test_dir, name); }

/* Writes text to a fresh temporary file whose name ends in suffix ("" or e.g. ".json"); its path goes
 * to path (64 bytes). */
static inline void test_write_temp(char *path, const char *text, const char *suffix)
{
    snprintf(path, 64, "%s/tidal_test_XXXXXX%s", test_tmp_base(), suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_true(write(fd, text, n) == (ssize_t)n);
    close(fd);
}

/* Asserts that msg contains needle (prints msg on failure). */
static inline void assert_msg_has(const char *msg, const char *needle)
{
    if (!strstr(msg, needle)) {
        print_error("message \"%s\" does not contain \"%s\"\n", msg, needle);
        fail();
    }
}

#endif
