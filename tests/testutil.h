/* testutil.h - shared bits for the cmocka test binaries. */
#ifndef DF_TESTUTIL_H
#define DF_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>

/* Root of the repository (tests run from it); overridable for out-of-tree runs. */
static inline const char *df_test_root(void) {
    const char *r = getenv("DF_ROOT");
    return r ? r : ".";
}
#endif
