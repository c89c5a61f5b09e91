/*
 * engine/ranks.c - experts by rank (df_engine_opts.experts_by_rank) as the
 * engine sees it: MPI started before the model opens (a worker rank then
 * keeps no always-active weight in RAM), "{rank}" in the expert pack paths,
 * what this rank brings to the plan (fingerprint, expert cache, bandwidth),
 * the worker's loop, statistics and the end. The run itself is src/dist/'s.
 */
#include "engine/internal.h"

#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>

/* s with every "{rank}" replaced by the rank's number (malloc'ed). */
static char *subst_rank(const char *s, int rank) {
    char num[16];
    snprintf(num, sizeof num, "%d", rank);
    size_t cap = strlen(s) + 1, n = 0;
    for (const char *p = s; (p = strstr(p, "{rank}")); p += 6) cap += strlen(num);
    char *out = df_xmalloc(cap);
    for (const char *p = s; *p;) {
        if (!strncmp(p, "{rank}", 6)) {
            memcpy(out + n, num, strlen(num));
            n += strlen(num), p += 6;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

int df_engine_ranks_init(df_engine *e, const df_engine_opts *o, char **experts, df_error *err) {
    *experts = NULL;
    if (o->rank_timeout_s < 0)
        return df_fail(err, DF_ERR_ARG, "--rank-timeout %g is negative", o->rank_timeout_s);
    if (o->rank_bandwidth_gbs < 0)
        return df_fail(err, DF_ERR_ARG, "--rank-bandwidth %g is negative", o->rank_bandwidth_gbs);
    int rc = df_dist_init(&e->dist, err);
    if (rc) return rc;
    e->worker = df_dist_rank(e->dist) != 0;
    if (o->experts) *experts = subst_rank(o->experts, df_dist_rank(e->dist));
    return DF_OK;
}

/* The bandwidth this rank's misses read at, for the plan (bytes/s). */
static double rank_bandwidth(const df_engine *e, const df_engine_opts *o, const char *experts) {
    if (o->rank_bandwidth_gbs > 0) return o->rank_bandwidth_gbs * 1e9;
    if (!e->store) return 10e9; /* resident: RAM (the plan gives such a rank its share by bytes) */
    if (df_store_sim_disk(e->store) > 0) return df_store_sim_disk(e->store); /* bench --sim-disk */
    char first[4096];
    snprintf(first, sizeof first, "%s", experts && *experts ? experts : o->model_dir);
    first[strcspn(first, ",")] = 0;
    double bw = df_dist_measure_bandwidth(first);
    return bw > 0 ? bw : 1e9;
}

/* This rank's expert storage counters (a worker sends them with its answers). */
static void storage_of(void *ctx, df_dist_storage *o) {
    df_store_stats s = df_store_get_stats((const df_store *)ctx);
    o->bytes_read = s.bytes_read, o->hits = s.hits, o->misses = s.misses;
}

int df_engine_ranks_start(df_engine *e, const df_engine_opts *o, const char *experts, df_error *err) {
    const df_model *m = &e->model;
    if (m->cfg.num_experts <= 0 || !e->experts)
        return df_fail(err, DF_ERR_UNSUPPORTED, "--experts-by-rank: %s has no routed experts to spread over ranks",
                       o->model_dir);
    df_dist_local me = {0};
    int rc = df_model_fingerprint(m, o->model_dir, me.fingerprint, err);
    if (rc) return rc;
    me.cache_bytes = e->store ? df_mul_sat((uint64_t)df_store_slots(e->store), df_store_slot_bytes(e->store))
                              : m->experts.bytes;
    me.bandwidth = rank_bandwidth(e, o, experts);
    me.can_predict = e->store && e->experts->ops->predict && o->prefetch && strcmp(o->prefetch, "off");
    me.no_experts = !e->worker && o->rank0_no_experts;
    if (e->store) df_dist_set_storage(e->dist, storage_of, e->store);
    if (me.no_experts) me.cache_bytes = 0, me.can_predict = false; /* it opened no store */
    return df_dist_start(e->dist, m, &me, e->experts, e->pool, o->rank_timeout_s, &e->experts, err);
}

int df_engine_is_worker(const df_engine *e) { return e && e->worker; }
const char *df_engine_ranks_failed(const df_engine *e) { return e ? df_dist_failed(e->dist) : NULL; }

int df_engine_work(df_engine *e, df_error *err) {
    if (!e->worker) return df_fail(err, DF_ERR_ARG, "df_engine_work: this process is not a worker rank");
    return df_dist_work(e->dist, err);
}

void df_engine_close_ranks(df_engine *e) {
    df_dist_close(e->dist);
    e->dist = NULL;
}

int df_engine_ranks_blame(const df_engine *e, int rc, df_error *err) {
    if (!rc || !e->dist || df_dist_size(e->dist) < 2) return rc;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    snprintf(err->msg, sizeof err->msg, "rank %d on %s: %.960s", df_dist_rank(e->dist), df_dist_host(e->dist), msg);
    return rc;
}

void df_engine_ranks_stats(const df_engine *e, df_stats *o) {
    if (!e->dist) return;
    df_dist_stats s;
    df_dist_get_stats(e->dist, &s);
    o->ranks = s.ranks;
    o->rank_bytes_sent = s.bytes_sent;
    o->rank_bytes_received = s.bytes_received;
    o->rank_messages = s.messages;
    o->rank_wait_s = s.wait_s;
    o->rank_storage_bytes_read = s.workers.bytes_read;
    o->rank_storage_hits = s.workers.hits;
    o->rank_storage_misses = s.workers.misses;
}
