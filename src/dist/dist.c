/*
 * dist/dist.c - an MPI run's life: MPI_Init_thread, the start-up exchange
 * (every rank's host, model fingerprint, expert cache and bandwidth), the
 * fingerprint check, the ownership plan rank 0 makes and broadcasts (and
 * prints), small messages kept until sent, statistics, and the end (rank 0
 * says quit; every rank finalizes). Rank 0's source is xsource.c's, a
 * worker's loop worker.c's.
 */
#include "dist/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define DF_DEFAULT_TIMEOUT 60.0

int df_dist_init(df_dist **out, df_error *err) {
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return df_fail(err, DF_ERR_UNSUPPORTED, "--experts-by-rank: MPI was already finalized in this process "
                       "(one engine with experts by rank per process)");
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return df_fail(err, DF_ERR_UNSUPPORTED, "--experts-by-rank: MPI_Init_thread failed");
    }
    /* naps between polls of a few tens of microseconds, not the default 50 us
     * of timer slack on top */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    /* a broken connection is an error code the caller reports, not an abort */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    df_dist *d = df_xcalloc(1, sizeof *d);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    d->ranks = df_xcalloc((size_t)d->size, sizeof *d->ranks);
    d->peer_storage = df_xcalloc((size_t)d->size, sizeof *d->peer_storage);
    char host[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(host, &len);
    snprintf(d->host, sizeof d->host, "%s", host);
    d->st.ranks = d->size;
    *out = d;
    return DF_OK;
}

int df_dist_rank(const df_dist *d) { return d->rank; }
int df_dist_size(const df_dist *d) { return d->size; }
const char *df_dist_host(const df_dist *d) { return d->host; }

void df_dist_nap(int us) {
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
}

/* Completes req, polling, within timeout_s; 0 when done. */
static int wait_polling(MPI_Request *req, double timeout_s) {
    double end = df_now() + timeout_s;
    for (int flag = 0;;) {
        MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag) return 0;
        if (df_now() > end) return -1;
        df_dist_nap(200);
    }
}

static void hex16(const uint8_t *b, char *out) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Every rank's df_dist_rank; the fingerprint check (every rank fails alike). */
static int exchange(df_dist *d, const df_dist_local *me, df_error *err) {
    df_dist_peer mine;
    memset(&mine, 0, sizeof mine);
    mine.l = *me;
    snprintf(mine.host, sizeof mine.host, "%s", d->host);
    MPI_Request req;
    MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, d->ranks, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD, &req);
    if (wait_polling(&req, d->timeout_s))
        return df_fail(err, DF_ERR_IO, "--experts-by-rank: not every one of the %d ranks started within %.0f s",
                       d->size, d->timeout_s);
    d->agreed = true;
    for (int r = 1; r < d->size; r++) {
        if (!memcmp(d->ranks[r].l.fingerprint, d->ranks[0].l.fingerprint, 16)) continue;
        char a[33], b[33];
        hex16(d->ranks[r].l.fingerprint, a);
        hex16(d->ranks[0].l.fingerprint, b);
        return df_fail(err, DF_ERR_ARG,
                       "--experts-by-rank: rank %d on host %s opened another model than rank 0 on %s "
                       "(model fingerprint %s, rank 0's %s): every rank must open the same checkpoint",
                       r, d->ranks[r].host, d->ranks[0].host, a, b);
    }
    if (d->ranks[0].l.no_experts && d->size < 2)
        return df_fail(err, DF_ERR_ARG, "--rank0-experts no needs other ranks to own the experts "
                       "(this run has 1 rank: start it with mpirun -n 2 or more)");
    return DF_OK;
}

/* Rank 0's plan on stderr: per rank its host, experts owned, bytes, weight. */
static void print_plan(const df_dist *d, const double *w) {
    const df_config *c = &d->m->cfg;
    fprintf(stderr, "deltafin: experts by rank: %d rank%s\n", d->size, d->size > 1 ? "s" : "");
    for (int r = 0; r < d->size; r++) {
        uint64_t n = 0, bytes = 0;
        for (int l = 0; l < c->num_hidden_layers; l++)
            for (int e = 0; c->layer_is_moe[l] && e < c->num_experts; e++)
                if (d->owner[(size_t)l * (size_t)c->num_experts + (size_t)e] == r)
                    n++, bytes += df_expert_bytes(&d->m->experts, l, e);
        char b[32], cb[32];
        df_fmt_bytes(b, sizeof b, bytes);
        df_fmt_bytes(cb, sizeof cb, d->ranks[r].l.cache_bytes);
        fprintf(stderr, "deltafin:   rank %d on %s: %llu experts, %s (cache %s, %.2f GB/s, weight %.4g)\n", r,
                d->ranks[r].host, (unsigned long long)n, b, cb, d->ranks[r].l.bandwidth / 1e9, w[r]);
    }
}

/* Rank 0 plans the owners; every rank receives them. */
static int plan(df_dist *d, df_error *err) {
    const df_config *c = &d->m->cfg;
    size_t n = (size_t)c->num_hidden_layers * (size_t)(c->num_experts > 0 ? c->num_experts : 1);
    d->owner = df_xcalloc(n, sizeof(int));
    double w[d->size];
    if (d->rank == 0) {
        uint64_t cache[d->size];
        double bw[d->size];
        bool excl[d->size];
        for (int r = 0; r < d->size; r++)
            cache[r] = d->ranks[r].l.cache_bytes, bw[r] = d->ranks[r].l.bandwidth, excl[r] = d->ranks[r].l.no_experts;
        df_dist_plan_weights(cache, bw, excl, d->size, d->m->experts.bytes, w);
        df_dist_plan_owners(c, w, d->size, d->owner);
    }
    MPI_Request req;
    MPI_Ibcast(d->owner, (int)n, MPI_INT, 0, MPI_COMM_WORLD, &req);
    if (wait_polling(&req, d->timeout_s))
        return df_fail(err, DF_ERR_IO, "--experts-by-rank: the plan did not reach every rank within %.0f s",
                       d->timeout_s);
    if (d->rank == 0) print_plan(d, w);
    return DF_OK;
}

int df_dist_start(df_dist *d, const df_model *m, const df_dist_local *me, df_xsource *local, df_pool *pool,
                  double timeout_s, df_xsource **src, df_error *err) {
    d->m = m;
    d->local = local;
    d->pool = pool;
    d->timeout_s = timeout_s > 0 ? timeout_s : DF_DEFAULT_TIMEOUT;
    int rc = exchange(d, me, err);
    if (!rc) rc = plan(d, err);
    if (rc) return rc;
    d->started = true;
    if (d->rank == 0) *src = df_dist_xsource(d);
    return DF_OK;
}

/* ---- small messages ---------------------------------------------------------------- */

static void reap_small(df_dist *d) {
    int k = 0;
    for (int i = 0; i < d->n_out; i++) {
        int flag = 0;
        MPI_Test(&d->out[i].req, &flag, MPI_STATUS_IGNORE);
        if (flag) free(d->out[i].buf);
        else d->out[k++] = d->out[i];
    }
    d->n_out = k;
}

void df_dist_send_small(df_dist *d, int to, int tag, const int32_t *v, int n) {
    if (d->failed) return;
    reap_small(d);
    if (d->n_out == d->cap_out) {
        d->cap_out = d->cap_out ? 2 * d->cap_out : 16;
        d->out = df_xrealloc(d->out, sizeof *d->out * (size_t)d->cap_out);
    }
    struct df_dist_out *o = &d->out[d->n_out++];
    o->buf = df_xmalloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    memcpy(o->buf, v, sizeof(int32_t) * (size_t)n);
    MPI_Isend(o->buf, (int)(sizeof(int32_t) * (size_t)n), MPI_BYTE, to, tag, MPI_COMM_WORLD, &o->req);
    d->st.bytes_sent += sizeof(int32_t) * (uint64_t)n;
    d->st.messages++;
}

void df_dist_flush_small(df_dist *d) {
    double end = df_now() + d->timeout_s;
    while (d->n_out && df_now() < end) {
        reap_small(d);
        if (d->n_out) df_dist_nap(100);
    }
}

/* ---- statistics, the end ------------------------------------------------------------- */

void df_dist_get_stats(const df_dist *d, df_dist_stats *o) {
    *o = d->st;
    memset(&o->workers, 0, sizeof o->workers);
    for (int r = 1; r < d->size; r++) {
        o->workers.bytes_read += d->peer_storage[r].bytes_read;
        o->workers.hits += d->peer_storage[r].hits;
        o->workers.misses += d->peer_storage[r].misses;
    }
}
void df_dist_set_storage(df_dist *d, df_dist_storage_fn fn, void *ctx) {
    d->storage = fn;
    d->storage_ctx = ctx;
}

const char *df_dist_failed(const df_dist *d) { return d && d->failed ? d->why : NULL; }

void df_dist_close(df_dist *d) {
    if (!d) return;
    if (d->rank == 0 && d->started && !d->failed) {
        int32_t q = 0;
        for (int r = 1; r < d->size; r++) df_dist_send_small(d, r, DF_TAG_QUIT, &q, 1);
        df_dist_flush_small(d);
    }
    /* A rank that failed to answer may never finalize: then this process
     * leaves without it, and mpirun ends the rest. */
    if (d->agreed && !d->failed && !d->n_out) MPI_Finalize();
    for (int i = 0; i < d->n_out; i++) free(d->out[i].buf);
    free(d->out);
    free(d->owner);
    free(d->ranks);
    free(d->peer_storage);
    free(d);
}
