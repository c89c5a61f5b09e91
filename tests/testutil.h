/* testutil.h - shared bits for the cmocka test binaries. */
#ifndef DF_TESTUTIL_H
#define DF_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/util.h"

/* Root of the repository (tests run from it); overridable for out-of-tree runs. */
static inline const char *df_test_root(void) {
    const char *r = getenv("DF_ROOT");
    return r ? r : ".";
}

/* Copies file `from` to `to` (test fixtures), failing the test on any error. */
static inline void df_test_copy_file(const char *from, const char *to) {
    size_t n;
    char *d;
    df_error e;
    assert_int_equal(df_read_file(from, &d, &n, &e), 0);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(d);
}
#endif
