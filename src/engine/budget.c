/*
 * engine/budget.c - the RAM budget: the memory plan measured at open (what is
 * resident, the sessions, slack, a reserve), the forward chunk under a tight
 * budget, the expert cache's size and what set it, and opening the expert
 * store with it. docs/budget.md has the counts and their measurements.
 */
#include "engine/internal.h"

#include "experts/pack.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static uint64_t work_bytes(const df_model *m, int chunk, int ctx) {
    return m->cfg.arch->work_bytes(m, chunk, ctx);
}

uint64_t df_engine_session_bytes_at(const df_model *m, int ctx, int chunk) {
    return df_add_sat(m->cfg.arch->seq_bytes(m, ctx), chunk > 0 ? work_bytes(m, chunk, ctx) : 0);
}

/* n sessions that run at once: each one's state, and one set of work
 * buffers (a lone session's own, or the batcher's that evaluates them all). */
static uint64_t sessions_bytes(const df_model *m, int ctx, int chunk, int n) {
    return df_add_sat(df_mul_sat(m->cfg.arch->seq_bytes(m, ctx), (uint64_t)n),
                      chunk > 0 ? work_bytes(m, chunk, ctx) : 0);
}

/* The sessions' bytes this process holds: none on a worker rank of experts
 * by rank (it computes experts for rank 0, whose sessions they are). */
static uint64_t sessions_here(const df_engine *e, int ctx, int chunk, int n) {
    return e->worker ? 0 : sessions_bytes(&e->model, ctx, chunk, n);
}

/* What the memory estimate leaves room for beyond the weights, the tokenizer,
 * one session and the expert slots: allocator slack, thread stacks and code
 * paged in later (SLACK_FIXED), the caller's logits row, the sampler's
 * scratch and the server's token counts (per vocabulary entry: 4 + 48 + 4
 * bytes, sampler.c), its token copies (per position), all once per session
 * that runs at once (df_engine_opts.sessions), the kernels' scratch for
 * products over many tokens (DF_STAGE_BYTES per thread), and the pack's
 * records, the store's and the policy's tables (per routed expert of the
 * model; the store never has more slots than experts plus top-k). Measured:
 * docs/budget.md. */
#define SLACK_FIXED ((uint64_t)8 << 20)
#define SLACK_PER_VOCAB 64
#define SLACK_PER_POSITION 16
#define SLACK_PER_EXPERT 1024

/* Resident bytes of this process and its high-water mark so far (VmRSS and
 * VmHWM of /proc/self/status), 0 where unknown. */
static void rss_now(uint64_t *rss, uint64_t *peak) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb;
    *rss = *peak = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) *rss = (uint64_t)kb << 10;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) *peak = (uint64_t)kb << 10;
    }
    if (f) fclose(f);
}

/* Bytes of memory the machine has available (MemAvailable; for tests,
 * DF_TEST_MEM_AVAILABLE, a size such as 512M), 0 if it cannot tell (then
 * nothing is capped by it). */
static uint64_t mem_available(void) {
    const char *fake = getenv("DF_TEST_MEM_AVAILABLE");
    uint64_t b = 0;
    df_error ignored;
    if (fake && df_parse_size(fake, "DF_TEST_MEM_AVAILABLE", &b, &ignored) == DF_OK) return b;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) b = (uint64_t)kb << 10;
    if (f) fclose(f);
    if (!b) b = df_mul_sat((uint64_t)sysconf(_SC_AVPHYS_PAGES), (uint64_t)sysconf(_SC_PAGESIZE));
    return b;
}

/* Counts what the process holds before the expert cache (df_mem_plan): the
 * context the budget is for, the always-active weights mapped in, and the
 * RSS measured then. Freed heap is handed back to the kernel first (the
 * tokenizer's parse, a draft engine opened and closed to size it): left in
 * the RSS, it was counted once as resident and again as the session that
 * would reuse it. */
static void plan_memory(df_engine *e, const df_engine_opts *o, bool experts_resident) {
    const df_model *m = &e->model;
    const df_config *c = &m->cfg;
    int ctx = o->context > 0 ? o->context : (c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096);
    if (ctx > c->max_position_embeddings) ctx = c->max_position_embeddings;
    e->budget_ctx = ctx;
    if (!e->worker) df_engine_prefault(m, experts_resident, NULL); /* a worker reads experts only */
    if (!e->worker) df_model_fp8_maps(&e->model, e->pool);          /* counted in the RSS below */
    malloc_trim(0);
    df_mem_plan *p = &e->plan;
    rss_now(&p->resident, &p->load_peak);
    uint64_t n_experts = 0; /* streamed ones */
    if (!experts_resident)
        for (int li = 0; li < c->num_hidden_layers; li++)
            n_experts += c->layer_is_moe[li] ? (uint64_t)c->num_experts : 0;
    int n = o->sessions > 1 ? o->sessions : 1;
    uint64_t per_session = SLACK_PER_VOCAB * (uint64_t)c->vocab_size + SLACK_PER_POSITION * (uint64_t)ctx;
    uint64_t stage = df_mul_sat(DF_STAGE_BYTES, (uint64_t)df_pool_size(e->pool)); /* kernels.h */
    p->slack = df_add_sat(df_add_sat(SLACK_FIXED, stage),
                          df_add_sat(df_mul_sat(per_session, (uint64_t)n), SLACK_PER_EXPERT * n_experts));
    p->reserve = o->reserve_bytes;
    p->context = ctx;
    p->sessions = n;
    p->session = sessions_here(e, ctx, e->chunk, n);
    p->available = mem_available();
}

/* The estimate before the expert cache, with a session of `session` bytes. */
static uint64_t plan_total(const df_mem_plan *p, uint64_t session) {
    return df_add_sat(df_add_sat(p->resident, session), df_add_sat(p->slack, p->reserve));
}

/* A size the user gave, for "%.*f MiB": one decimal, or four below 0.1 MiB
 * (a 1 KiB budget is 0.0010 MiB, not 0.0) */
#define MIB_ARG(b) ((b) < 104858 ? 4 : 1), ((double)(b) / 1048576.0)

/* Sizes the budget on the plan: the forward chunk, and what is left for the
 * expert cache. Fails when that is nothing, or when loading already went past
 * the budget (the peak RSS counts it). */
static int budget_left(df_engine *e, const df_engine_opts *o, uint64_t *left, df_error *err) {
    const df_model *m = &e->model;
    df_mem_plan *p = &e->plan;
    uint64_t budget = o->ram_budget;
    e->ram_budget = budget;
    /* A chunk longer than the context is never filled. The default chunk is a
     * speed choice, not a promise: under a tight budget it shrinks so that its
     * buffers take at most a quarter of what the weights and the KV cache
     * leave, the rest going to expert slots. */
    if (e->chunk > p->context) e->chunk = p->context;
    uint64_t fixed = plan_total(p, sessions_here(e, p->context, 0, p->sessions));
    if (!o->prefill_chunk && fixed < budget)
        while (e->chunk > 16 && work_bytes(m, e->chunk, p->context) > (budget - fixed) / 4)
            e->chunk /= 2;
    p->session = sessions_here(e, p->context, e->chunk, p->sessions);
    uint64_t need = plan_total(p, p->session);
    if (need >= budget) {
        /* what the refusal names: the least any budget would need, the chunk
         * at the smallest the loop above makes it */
        int least = e->chunk;
        while (!o->prefill_chunk && least > 16) least /= 2;
        need = plan_total(p, sessions_here(e, p->context, least, p->sessions));
        char what[800], ctx[80];
        if (p->sessions > 1) snprintf(ctx, sizeof ctx, "%d sessions of a %d-token context", p->sessions, p->context);
        else snprintf(ctx, sizeof ctx, "a %d-token context", p->context);
        if (o->reserve_bytes)
            snprintf(what, sizeof what, "the weights kept in RAM, the tokenizer, %s and %.1f MiB for %s", ctx,
                     (double)o->reserve_bytes / 1048576.0, o->reserve_for ? o->reserve_for : "other data");
        else
            snprintf(what, sizeof what, "the weights kept in RAM, the tokenizer and %s", ctx);
        return df_fail(err, DF_ERR_ARG, "--ram-budget %.*f MiB is too small: %s already need %.1f MiB",
                       MIB_ARG(budget), what, (double)need / 1048576.0);
    }
    if (p->load_peak >= budget)
        return df_fail(err, DF_ERR_ARG, "--ram-budget %.*f MiB is too small: loading the model, its "
                       "tokenizer%s already took %.1f MiB of RSS at the peak", MIB_ARG(budget),
                       o->reserve_bytes ? " and sizing the draft" : "", (double)p->load_peak / 1048576.0);
    *left = budget - need;
    return DF_OK;
}

/* Without a budget the cache takes what the machine has: its available
 * memory less the session, slack and reserve still to come, and, for the
 * rest of the system, an eighth of it (at least AVAIL_KEEP_MIN). A budget is
 * capped at the available memory with nothing kept: the user chose it (the
 * benchmarks shrink the machine to the budget plus a little). */
#define AVAIL_KEEP_MIN ((uint64_t)128 << 20)

static uint64_t avail_keep(uint64_t available) {
    return available / 8 > AVAIL_KEEP_MIN ? available / 8 : AVAIL_KEEP_MIN;
}

static uint64_t avail_cap(const df_engine *e, bool keep) {
    const df_mem_plan *p = &e->plan;
    uint64_t cap = df_sub_floor(p->available, df_sub_floor(plan_total(p, p->session), p->resident));
    return keep ? df_sub_floor(cap, avail_keep(p->available)) : cap;
}

/* The expert cache's size, and what set it (df_stats.cache_sizing; `what`
 * words it for the store's "less than one expert" error). */
static int size_cache(df_engine *e, const df_engine_opts *o, uint64_t *cache, char *what, size_t n,
                      df_error *err) {
    df_mem_plan *p = &e->plan;
    plan_memory(e, o, false);
    if (o->expert_cache) {
        /* with a budget too, the cache must fit in what the budget leaves */
        uint64_t left = 0;
        int rc = o->ram_budget ? budget_left(e, o, &left, err) : DF_OK;
        if (rc) return rc;
        if (o->ram_budget && o->expert_cache > left)
            return df_fail(err, DF_ERR_ARG, "--expert-cache %.*f MiB does not fit in --ram-budget %.*f MiB: "
                           "the weights kept in RAM, the tokenizer and the context leave %.1f MiB for it",
                           MIB_ARG(o->expert_cache), MIB_ARG(o->ram_budget), (double)left / 1048576.0);
        *cache = o->expert_cache;
        e->cache_sizing = "--expert-cache";
        snprintf(what, n, "--expert-cache sets");
        return DF_OK;
    }
    if (o->ram_budget) {
        int rc = budget_left(e, o, cache, err);
        if (rc) return rc;
        e->cache_sizing = "--ram-budget";
        char ctx[80] = "a";
        if (p->sessions > 1) snprintf(ctx, sizeof ctx, "%d sessions of a", p->sessions);
        snprintf(what, n, "--ram-budget %.1f MiB (%.1f MiB of it for the weights kept in RAM, the tokenizer "
                 "and %s %d-token context) leaves", (double)o->ram_budget / 1048576.0,
                 (double)(o->ram_budget - *cache) / 1048576.0, ctx, p->context);
    } else {
        *cache = UINT64_MAX;
    }
    uint64_t cap = avail_cap(e, !o->ram_budget);
    if (p->available && cap < *cache) {
        *cache = cap;
        e->cache_sizing = "available memory";
        if (o->ram_budget)
            snprintf(what, n, "--ram-budget is more than the memory available (%.1f MiB), which leaves",
                     (double)p->available / 1048576.0);
        else
            snprintf(what, n, "no --ram-budget or --expert-cache given, and the memory available (%.1f MiB, "
                     "less %.1f MiB kept for the system) leaves", (double)p->available / 1048576.0,
                     (double)avail_keep(p->available) / 1048576.0);
    }
    return DF_OK;
}

/* A model with nothing to stream: the budget must hold all of it. */
int df_engine_dense_budget(df_engine *e, const df_engine_opts *o, df_error *err) {
    uint64_t unused;
    plan_memory(e, o, true);
    return budget_left(e, o, &unused, err);
}

int df_engine_setup_streaming(df_engine *e, const df_engine_opts *o, const df_engine_dev *dev, df_error *err) {
    const df_model *m = &e->model;
    char *dirs_buf = NULL;
    const char *dirs[DF_PACK_MAX_STRIPES];
    int n_dirs = 0;
    if (o->experts && *o->experts) {
        dirs_buf = df_xstrdup(o->experts);
        for (char *tok = strtok(dirs_buf, ","); tok; tok = strtok(NULL, ",")) {
            if (n_dirs == DF_PACK_MAX_STRIPES) {
                free(dirs_buf);
                return df_fail(err, DF_ERR_ARG, "--experts: at most %d directories", DF_PACK_MAX_STRIPES);
            }
            dirs[n_dirs++] = tok;
        }
    }
    uint64_t cache = 0;
    char what[300];
    int rc = e->worker ? DF_OK : df_model_dense_to_ram(&e->model, err);
    if (!rc) rc = size_cache(e, o, &cache, what, sizeof what, err);
    if (rc) {
        free(dirs_buf);
        return rc;
    }
    df_store_opts so = {.pack_dirs = n_dirs ? dirs : NULL, .n_pack_dirs = n_dirs, .cache_bytes = cache,
                        .cache_what = what, .policy = o->cache_policy, .pin_bytes = o->pin_bytes,
                        .prefetch = o->prefetch, .prefetch_depth = dev ? dev->prefetch_depth : 0,
                        .prefetch_min_recall = dev && dev->prefetch_min_recall > 0 ? dev->prefetch_min_recall : -1,
                        .prefetch_min_precision =
                            dev && dev->prefetch_min_precision > 0 ? dev->prefetch_min_precision : -1,
                        .sim_disk_bps = dev ? dev->sim_disk_bps : 0};
    rc = df_store_open(&e->store, m, &so, err);
    free(dirs_buf);
    if (rc) return rc;
    e->experts = df_store_xsource(e->store);
    malloc_trim(0); /* the pack manifest's parse */
    if (df_store_holds_all(e->store)) e->cache_sizing = "all experts fit";
    return DF_OK;
}


int df_engine_no_experts_budget(df_engine *e, const df_engine_opts *o, df_error *err) {
    int rc = o->ram_budget ? df_model_dense_to_ram(&e->model, err) : DF_OK;
    if (rc) return rc;
    plan_memory(e, o, false); /* prefaults the always-active weights only */
    uint64_t unused;
    e->cache_sizing = "--rank0-experts no (none)";
    return o->ram_budget ? budget_left(e, o, &unused, err) : DF_OK;
}

void df_engine_mem_stats(const df_engine *e, df_stats *o) {
    const df_mem_plan *p = &e->plan;
    if (!p->context) return;
    uint64_t cache = e->store ? df_mul_sat(df_store_slots(e->store), df_store_slot_bytes(e->store)) : 0;
    uint64_t sum = df_add_sat(plan_total(p, p->session), cache);
    o->ram_budget = e->ram_budget;
    o->mem_estimate = sum > p->load_peak ? sum : p->load_peak;
    o->mem_resident = p->resident;
    o->mem_load_peak = p->load_peak;
    o->mem_session = p->session;
    o->mem_slack = p->slack;
    o->mem_reserve = p->reserve;
    o->mem_context = p->context;
    o->mem_sessions = p->sessions;
    o->cache_sizing = e->cache_sizing;
    o->mem_available = p->available;
}

