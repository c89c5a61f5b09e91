/* testutil.h - shared bits for the cmocka test binaries. */
#ifndef DF_TESTUTIL_H
#define DF_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/kernels.h"
#include "util/util.h"

/* Root of the repository (tests run from it); overridable for out-of-tree runs. */
static inline const char *df_test_root(void) {
    const char *r = getenv("DF_ROOT");
    return r ? r : ".";
}

/* Writes n bytes to path (test fixtures), failing the test on any error. */
static inline void df_test_write_path(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The same for file `name` in directory `dir`, and for a NUL-terminated text. */
static inline void df_test_write_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    df_test_write_path(p, data, n);
}
static inline void df_test_write_text(const char *dir, const char *name, const char *text) {
    df_test_write_file(dir, name, text, strlen(text));
}

/* Copies file `from` to `to` (test fixtures), failing the test on any error. */
static inline void df_test_copy_file(const char *from, const char *to) {
    size_t n;
    char *d;
    df_error e;
    assert_int_equal(df_read_file(from, &d, &n, &e), 0);
    df_test_write_path(to, d, n);
    free(d);
}
static inline int df_test_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Removes a test's scratch directory and everything in it. */
static inline void df_test_rm_tree(const char *dir) { nftw(dir, df_test_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* The real-routing excerpt in tests/data/traces (see the README there). */
static inline const char *df_test_trace_excerpt(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s/tests/data/traces/intent-excerpt.trace", df_test_root());
    return p;
}

/* A tiny deterministic generator (xorshift), the same sequence in every test
 * binary: uniform in [0, n). */
static inline uint32_t df_test_rnd(uint32_t n) {
    static uint64_t s = 88172645463325252ull;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t)(s % n);
}
/* Whether this CPU runs kernel path isa ("c" always; "auto" the detected one). */
static inline bool df_test_isa_available(const char *isa) {
    int want = df_isa_from_name(isa);
    return want >= 0 && (int)df_isa_detect() >= want;
}

#endif
