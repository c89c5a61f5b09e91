/*
 * store_simdisk.c - the simulated disk, for benchmarks (--sim-disk): reads are
 * handed over no earlier than a disk of sim_bps bytes/s would finish them.
 *
 * It serves reads one after another in submission order: a read of n bytes is
 * due at max(submitted, previous due) + n / sim_bps, and a completion the real
 * disk delivers earlier is held until it is due. The bytes still come from the
 * real disk, which must be faster than the simulated one; only when they are
 * handed over changes, so the output cannot. Why not the kernel's blkio
 * throttle: docs/expert-store.md, "The simulated disk".
 */
#include "experts/store_internal.h"

#include <stdlib.h>

void store_sim_open(df_store *s, double bps) {
    s->sim_bps = bps;
    s->held = df_xmalloc(sizeof(held_cqe) * (size_t)s->n_slots * MAX_OPS);
}

void store_sim_submitted(df_store *s, slot *x, int op, uint64_t n) {
    double now = df_now();
    s->sim_free = (s->sim_free > now ? s->sim_free : now) + (double)n / s->sim_bps;
    x->due[op] = s->sim_free;
}

void store_sim_hold(df_store *s, uint64_t data, int res) { s->held[s->n_held++] = (held_cqe){data, res}; }

static double due_of(const df_store *s, uint64_t d) { return s->slots[d / MAX_OPS].due[d % MAX_OPS]; }

int store_sim_take(df_store *s, uint64_t *d, int *res, double *wait) {
    int best = 0;
    for (int i = 1; i < s->n_held; i++)
        if (due_of(s, s->held[i].data) < due_of(s, s->held[best].data)) best = i;
    *wait = due_of(s, s->held[best].data) - df_now();
    if (*wait > 0) return 0;
    *d = s->held[best].data;
    *res = s->held[best].res;
    s->held[best] = s->held[--s->n_held];
    return 1;
}

void store_sim_drop_held(df_store *s) {
    for (int i = 0; i < s->n_held; i++) store_uncount(s, s->held[i].data);
    s->n_held = 0;
}
