/*
 * store_faults.c - injected I/O faults for the tests, compiled only into the
 * test build (-DDF_TEST_HOOKS, the sanitizer build): the release library has
 * neither these hooks nor their callers.
 *
 * DF_TEST_IO_FAULTS=short,eintr makes completions arrive as a kernel may
 * report them: "short" delivers only the first part of a read (and spoils the
 * rest of its buffer, so a continuation that skipped it could not pass the
 * checksum), "eintr" turns every third completion into EINTR. The store must
 * continue and retry them and still hand out exact weights
 * (tests/test_stream.c).
 */
#ifdef DF_TEST_HOOKS

#include "experts/store_internal.h"

#include <errno.h>
#include <stdlib.h>

void store_faults_init(df_store *s) {
    const char *faults = getenv("DF_TEST_IO_FAULTS");
    s->fault_short = faults && strstr(faults, "short");
    s->fault_eintr = faults && strstr(faults, "eintr");
}

int store_fault(df_store *s, int si, int op, int res) {
    slot *x = &s->slots[si];
    s->n_completions++;
    if (x->orphan) return res; /* nobody reads it: nothing to test */
    if (s->fault_eintr && res > 0 && s->n_completions % 3 == 0) return -EINTR;
    if (s->fault_short && res > 8192) {
        /* pretend only the first part arrived, and spoil the rest */
        int fd;
        uint64_t foff, len;
        size_t moff;
        store_op_geometry(s, x->key / s->E, x->key % s->E, op, &fd, &foff, &len, &moff);
        int part = (res / 2) & ~4095; /* stays O_DIRECT-aligned */
        memset(x->mem + moff + x->done[op] + part, 0xA5, (size_t)(res - part));
        res = part;
    }
    return res;
}

#else
typedef int store_faults_unused; /* ISO C: a translation unit is not empty */
#endif
