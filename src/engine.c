/*
 * engine.c - the public API (deltafin.h) over the internal rooms: an engine owns
 * the model, tokenizer and thread pool; a session owns one KV-cache timeline and
 * its work buffers. Sessions feed the forward pass in chunks of rows, which does
 * not change any result (a row's logits do not depend on the batch it is in).
 * For benchmarks the engine can also replay a routing trace (one trace token per
 * evaluated row, through the forward pass's routing hook).
 */
#include "deltafin.h"

#include "experts/pack.h"
#include "experts/prefetch.h"
#include "experts/store.h"
#include "experts/trace.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DF_DEFAULT_CHUNK 512

/* The memory the budget counts, and --stats reports next to the peak RSS:
 * measured at open, and computed for what comes later. */
typedef struct df_mem_plan {
    uint64_t resident;  /* RSS with the weights kept in RAM and the tokenizer in */
    uint64_t load_peak; /* VmHWM then: loading may peak above what stays */
    uint64_t session;   /* one session: KV cache at `context`, work buffers */
    uint64_t slack;     /* what else comes (SLACK_*) */
    uint64_t reserve;   /* df_engine_opts.reserve_bytes (a draft model) */
    uint64_t available; /* the machine's available memory then */
    int context;
} df_mem_plan;

struct df_engine {
    df_model model;
    df_tokenizer *tok;
    df_pool *pool;
    df_store *store;      /* NULL: experts used in place from the mapping */
    uint64_t ram_budget;
    int budget_ctx;       /* context the budget reserved room for */
    df_mem_plan plan;     /* all zero when nothing was sized (experts resident, no budget) */
    const char *cache_sizing; /* df_stats.cache_sizing */
    df_model_info info;
    int32_t stop_ids[16];
    int n_stop;
    uint64_t tokens;
    double eval_s;
    int chunk;            /* rows per forward pass */
    /* routing replay (df_engine_opts.replay_routing) */
    df_trace *replay;
    char *replay_path;
    int *replay_layer;    /* [layers] MoE ordinal of each model layer, -1 dense */
    uint64_t replay_next; /* trace token the next evaluated row uses */
};

struct df_session {
    df_engine *eng;
    df_progress_fn progress;
    void *progress_user;
    df_kv kv;
    df_fwd_buf *buf;
    int pos;
    int max_ctx;
    uint64_t replay_base; /* trace token of row 0 of the pass in progress */
};

static void add_stop(df_engine *e, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < e->n_stop; i++)
        if (e->stop_ids[i] == id) return;
    if (e->n_stop < (int)(sizeof e->stop_ids / sizeof e->stop_ids[0])) e->stop_ids[e->n_stop++] = id;
}

/* ---- expert streaming set-up ---------------------------------------------------- */

static bool is_expert_tensor(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#define MADV_NOHUGEPAGE 15
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* The page-aligned range [*a, *a + *len) covering tensor t. */
static void tensor_pages(const df_tensor *t, long pg, uintptr_t *a, size_t *len) {
    *a = (uintptr_t)t->data & ~(uintptr_t)(pg - 1);
    *len = (size_t)((uintptr_t)t->data + t->nbytes - *a);
}

/* Maps the pages of the weights in now (page tables included), so that the
 * first forward pass does not pay a page fault per 4 KiB, and so that an RSS
 * measured next includes them. Routed experts are skipped when they stream,
 * and so are the tensors of files f with done[f] (already mapped in; done may
 * be NULL). */
static void prefault(const df_model *m, bool experts_too, const bool *done) {
    long pg = sysconf(_SC_PAGESIZE);
    /* Streaming: the expert bytes are read into the cache, never through this
     * mapping, but a 2 MiB folio of the page cache (a freshly written file is
     * held in those) that holds a small always-active tensor would be mapped
     * whole by one PMD when that tensor is touched, charging the experts'
     * bytes next to it to our RSS (test_budget.sh's 160 MiB arm was refused:
     * 170.7 MiB fixed). No huge mappings over expert tensors. */
    for (size_t i = 0; !experts_too && i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (!t->nbytes || !is_expert_tensor(t->name)) continue;
        uintptr_t a;
        size_t len;
        tensor_pages(t, pg, &a, &len);
        madvise((void *)a, len, MADV_NOHUGEPAGE);
    }
    for (size_t i = 0; i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (!t->nbytes || (!experts_too && is_expert_tensor(t->name)) || (done && done[t->file]) ||
            df_model_ram_copy(m, t))
            continue;
        uintptr_t a;
        size_t len;
        tensor_pages(t, pg, &a, &len);
        if (madvise((void *)a, len, MADV_POPULATE_READ) == 0) continue;
        volatile const char *p = t->data; /* older kernels: touch every page */
        char sink = 0;
        for (uint64_t o = 0; o < t->nbytes; o += (uint64_t)pg) sink ^= p[o];
        sink ^= p[t->nbytes - 1];
        (void)sink;
    }
}

/* ---- 2 MiB mappings for resident weights ---------------------------------------- */

/* Decode streams ~1.5 GB of weights per token, mostly in 3 MB expert matrices
 * at scattered places, so every 4 KiB page costs a TLB miss when the weights
 * are mapped with 4 KiB entries (and under a hypervisor each miss walks two
 * levels of page tables). Measured on this project's VM, one thread reading
 * random 3 MB chunks of a mapped checkpoint: 22-23 GB/s when the page cache
 * held it in small folios, 31-34 GB/s when its folios were 2 MiB and mapped by
 * PMDs (FilePmdMapped in /proc/self/smaps). Which folios the page cache holds
 * depends on how the file was last read (random pread()s, e.g. of the
 * page-cache expert streamer, leave small ones), not on the engine. So, for
 * weights that stay resident: ask for huge pages on the mappings, and where a
 * file is nonetheless mostly mapped by small pages, drop our mapping and the
 * file's page cache and read it back as 2 MiB folios: a one-off re-read from
 * storage (pages another process maps stay as they are).
 * A probe on one 2 MiB chunk first checks that this kernel and file system
 * can do it at all, so that a system without file THP never re-reads. */

typedef struct span { uintptr_t lo, hi; } span;

/* Page-aligned range covering the tensors of file f ({0, 0} if none). */
static span file_span(const df_model *m, int f) {
    long pg = sysconf(_SC_PAGESIZE);
    span r = {UINTPTR_MAX, 0};
    for (size_t i = 0; i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (t->file != f || !t->nbytes) continue;
        uintptr_t a = (uintptr_t)t->data, b = a + t->nbytes;
        if (a < r.lo) r.lo = a;
        if (b > r.hi) r.hi = b;
    }
    if (r.hi == 0) return (span){0, 0};
    r.lo &= ~(uintptr_t)(pg - 1);
    r.hi = (r.hi + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    return r;
}

/* What smaps says of the mapping that contains span s: Rss and FilePmdMapped
 * (bytes), and the file offset of s.lo. False when it cannot tell (no /proc,
 * or a kernel without FilePmdMapped). */
typedef struct pmd_info { uint64_t rss, pmd, off; } pmd_info;

static bool span_pmd(span s, pmd_info *o) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512], perms[8];
    bool in = false, seen = false;
    memset(o, 0, sizeof *o);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        unsigned long long kb;
        if (sscanf(line, "%lx-%lx %7s %lx", &lo, &hi, perms, &off) == 4) {
            in = lo <= s.lo && s.hi <= hi;
            if (in) o->off = s.lo - lo + off;
            continue;
        }
        if (!in) continue;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) o->rss = kb << 10;
        else if (sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1) o->pmd = kb << 10, seen = true;
    }
    fclose(f);
    return seen;
}

#define HUGE_SZ ((uintptr_t)2 << 20)

/* Drops our mapping of [lo, hi) and the file's page cache there (pages that
 * another process maps stay), so the next touch reads it back in. */
static void drop_range(const df_model *m, int f, span s, uint64_t off, uintptr_t lo, uintptr_t hi) {
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* our page tables only */
    posix_fadvise(df_st_file_fd(m->st, f), (off_t)(off + (lo - s.lo)), (off_t)(hi - lo),
                  POSIX_FADV_DONTNEED);
}

/* Maps span s in, its whole 2 MiB chunks [c, ce) first. From s.lo up, the
 * readahead around the span's first pages (whose chunk the header read left in
 * small folios) went on into the next chunk in small folios too; that chunk
 * then never mapped by a PMD, so on a file of a few chunks (models/demo-moe)
 * the check below failed at every start and the whole file was dropped and
 * read back from storage each time. */
static bool populate_span(span s, uintptr_t c, uintptr_t ce) {
    bool ok = madvise((void *)c, ce - c, MADV_POPULATE_READ) == 0;
    ok &= madvise((void *)s.lo, c - s.lo, MADV_POPULATE_READ) == 0;
    ok &= madvise((void *)ce, s.hi - ce, MADV_POPULATE_READ) == 0;
    return ok;
}

/* Sets done[f] for the files whose tensors it leaves mapped in: it has to
 * populate a file to see how the page cache maps it, and the prefault that
 * follows need not walk those pages again. It does not for a file too small
 * for a 2 MiB chunk, or one whose populate failed (an older kernel: the
 * prefault touches its pages, and no judging how it is mapped). A file is
 * "mostly" PMD-mapped when 90% of its whole chunks are: the partial ones at
 * either end never can be. */
static void huge_weights(const df_model *m, bool *done) {
    for (int f = 0; f < df_st_file_count(m->st); f++) {
        done[f] = false;
        span s = file_span(m, f);
        uintptr_t c = (s.lo + HUGE_SZ - 1) & ~(HUGE_SZ - 1); /* first whole 2 MiB chunk */
        uintptr_t ce = s.hi & ~(HUGE_SZ - 1);                /* end of the last one */
        if (s.hi <= s.lo || c + HUGE_SZ > s.hi) continue;
        madvise((void *)s.lo, s.hi - s.lo, MADV_HUGEPAGE);
        done[f] = populate_span(s, c, ce);
        pmd_info a, b;
        if (!done[f] || !span_pmd(s, &a) || a.pmd >= (ce - c) / 10 * 9) continue;
        /* Probe one chunk: re-read as a huge page, is it mapped by a PMD now?
         * (Not without file THP in this kernel and file system: then the file
         * is left as it is, at the price of one 2 MiB read.) */
        drop_range(m, f, s, a.off, c, c + HUGE_SZ);
        done[f] = done[f] && madvise((void *)c, HUGE_SZ, MADV_POPULATE_READ) == 0;
        if (!span_pmd(s, &b) || b.pmd < a.pmd + HUGE_SZ) continue;
        drop_range(m, f, s, a.off, s.lo, s.hi);
        done[f] = populate_span(s, c, ce); /* read back, as huge folios now */
    }
}

static uint64_t session_bytes(const df_model *m, int ctx, int chunk) {
    const df_config *c = &m->cfg;
    uint64_t kv = 2 * sizeof(float);
    kv = df_mul_sat(kv, (uint64_t)c->num_hidden_layers);
    kv = df_mul_sat(kv, (uint64_t)ctx);
    kv = df_mul_sat(kv, (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim);
    return df_add_sat(kv, df_fwd_buf_bytes(m, chunk, ctx));
}

/* What the memory estimate leaves room for beyond the weights, the tokenizer,
 * one session and the expert slots: allocator slack, thread stacks and code
 * paged in later (SLACK_FIXED), the caller's logits row, the sampler's
 * scratch and the server's token counts (per vocabulary entry: 4 + 48 + 4
 * bytes, sampler.c), its token copies (per position), and the pack's
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
    prefault(m, experts_resident, NULL);
    malloc_trim(0);
    df_mem_plan *p = &e->plan;
    rss_now(&p->resident, &p->load_peak);
    uint64_t n_experts = 0; /* streamed ones */
    if (!experts_resident)
        for (int li = 0; li < c->num_hidden_layers; li++)
            n_experts += c->layer_is_moe[li] ? (uint64_t)c->num_experts : 0;
    p->slack = df_add_sat(SLACK_FIXED, SLACK_PER_VOCAB * (uint64_t)c->vocab_size +
                                           SLACK_PER_POSITION * (uint64_t)ctx + SLACK_PER_EXPERT * n_experts);
    p->reserve = o->reserve_bytes;
    p->context = ctx;
    p->session = session_bytes(m, ctx, e->chunk);
    p->available = mem_available();
}

/* The estimate before the expert cache, with a session of `session` bytes. */
static uint64_t plan_total(const df_mem_plan *p, uint64_t session) {
    return df_add_sat(df_add_sat(p->resident, session), df_add_sat(p->slack, p->reserve));
}

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
    uint64_t fixed = plan_total(p, session_bytes(m, p->context, 0));
    if (!o->prefill_chunk && fixed < budget)
        while (e->chunk > 16 && df_fwd_buf_bytes(m, e->chunk, p->context) > (budget - fixed) / 4)
            e->chunk /= 2;
    p->session = session_bytes(m, p->context, e->chunk);
    uint64_t need = plan_total(p, p->session);
    if (need >= budget) {
        char what[800];
        if (o->reserve_bytes)
            snprintf(what, sizeof what, "the weights kept in RAM, the tokenizer, a %d-token context and %.1f MiB for %s",
                     p->context, (double)o->reserve_bytes / 1048576.0, o->reserve_for ? o->reserve_for : "other data");
        else
            snprintf(what, sizeof what, "the weights kept in RAM, the tokenizer and a %d-token context", p->context);
        return df_fail(err, DF_ERR_ARG, "--ram-budget %.1f MiB is too small: %s already need %.1f MiB",
                       (double)budget / 1048576.0, what, (double)need / 1048576.0);
    }
    if (p->load_peak >= budget)
        return df_fail(err, DF_ERR_ARG, "--ram-budget %.1f MiB is too small: loading the model, its "
                       "tokenizer%s already took %.1f MiB of RSS at the peak", (double)budget / 1048576.0,
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
        *cache = o->expert_cache;
        e->cache_sizing = "--expert-cache";
        snprintf(what, n, "--expert-cache sets");
        return DF_OK;
    }
    if (o->ram_budget) {
        int rc = budget_left(e, o, cache, err);
        if (rc) return rc;
        e->cache_sizing = "--ram-budget";
        snprintf(what, n, "--ram-budget %.1f MiB (%.1f MiB of it for the weights kept in RAM, the tokenizer "
                 "and a %d-token context) leaves", (double)o->ram_budget / 1048576.0,
                 (double)(o->ram_budget - *cache) / 1048576.0, p->context);
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
static int dense_budget(df_engine *e, const df_engine_opts *o, df_error *err) {
    uint64_t unused;
    plan_memory(e, o, true);
    return budget_left(e, o, &unused, err);
}

static int setup_streaming(df_engine *e, const df_engine_opts *o, df_error *err) {
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
    uint64_t cache;
    char what[300];
    int rc = df_model_dense_to_ram(&e->model, err);
    if (!rc) rc = size_cache(e, o, &cache, what, sizeof what, err);
    if (rc) {
        free(dirs_buf);
        return rc;
    }
    df_store_opts so = {.pack_dirs = n_dirs ? dirs : NULL, .n_pack_dirs = n_dirs, .cache_bytes = cache,
                        .cache_what = what, .policy = o->cache_policy, .pin_bytes = o->pin_bytes,
                        .prefetch = o->prefetch, .prefetch_depth = o->prefetch_depth,
                        .prefetch_min_recall = o->prefetch_min_recall > 0 ? o->prefetch_min_recall : -1,
                        .prefetch_min_precision =
                            o->prefetch_min_precision > 0 ? o->prefetch_min_precision : -1,
                        .sim_disk_bps = o->sim_disk_bps};
    rc = df_store_open(&e->store, m, &so, err);
    free(dirs_buf);
    if (rc) return rc;
    malloc_trim(0); /* the pack manifest's parse */
    if (df_store_holds_all(e->store)) e->cache_sizing = "all experts fit";
    return DF_OK;
}

/* ---- routing replay ------------------------------------------------------------ */

/* Loads the trace and checks it against the model's MoE layers, experts and top-k. */
static int setup_replay(df_engine *e, const char *path, df_error *err) {
    const df_config *c = &e->model.cfg;
    if (c->num_experts <= 0)
        return df_fail(err, DF_ERR_ARG, "--replay-routing %s: the model has no routed experts", path);
    df_trace *t = df_xcalloc(1, sizeof *t);
    int rc = df_trace_load(t, path, err);
    if (rc) {
        free(t);
        return rc;
    }
    int n_moe = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n_moe += c->layer_is_moe[i];
    const char *field = NULL;
    int have = 0, want = 0;
    if (t->n_layers != n_moe) field = "moe_layers", have = t->n_layers, want = n_moe;
    else if (t->n_experts != c->num_experts)
        field = "experts_per_layer", have = t->n_experts, want = c->num_experts;
    else if (t->top_k != c->num_experts_per_tok)
        field = "top_k", have = t->top_k, want = c->num_experts_per_tok;
    if (field || t->n_tokens == 0) {
        df_trace_free(t);
        free(t);
        if (!field) return df_fail(err, DF_ERR_ARG, "--replay-routing %s: the trace has no tokens", path);
        return df_fail(err, DF_ERR_ARG,
                       "--replay-routing %s: %s is %d but the model has %d (%d MoE layers, %d experts, "
                       "top-%d)", path, field, have, want, n_moe, c->num_experts, c->num_experts_per_tok);
    }
    e->replay = t;
    e->replay_path = df_xstrdup(path);
    e->replay_layer = df_xmalloc(sizeof(int) * (size_t)c->num_hidden_layers);
    for (int i = 0, k = 0; i < c->num_hidden_layers; i++) e->replay_layer[i] = c->layer_is_moe[i] ? k++ : -1;
    return DF_OK;
}

static void free_replay(df_engine *e) {
    if (e->replay) df_trace_free(e->replay);
    free(e->replay);
    free(e->replay_path);
    free(e->replay_layer);
    e->replay = NULL;
    e->replay_path = NULL;
    e->replay_layer = NULL;
}

/* The forward pass's hook: row `row` of the pass uses trace token replay_base + row
 * (wrapping around: a bench may decode more tokens than the trace holds). */
static void replay_route(void *user, int layer, int row, int *ids) {
    const df_session *s = user;
    const df_engine *e = s->eng;
    const df_trace *t = e->replay;
    int tok = (int)((s->replay_base + (uint64_t)row) % (uint64_t)t->n_tokens);
    const uint16_t *src = df_trace_at(t, tok, e->replay_layer[layer]);
    for (int k = 0; k < t->top_k; k++) ids[k] = src[k];
}

/* An --experts list names every directory: an empty one (or an empty list)
 * would otherwise be skipped, and a list with nothing in it run from the
 * safetensors without a word. */
static int check_experts(const char *list, df_error *err) {
    if (!list) return DF_OK;
    if (!list[strspn(list, ",")])
        return df_fail(err, DF_ERR_ARG,
                       "--experts '%s' names no directory: give the expert pack's directories, "
                       "comma-separated", list);
    const char *p = list;
    for (int i = 1;; i++) {
        size_t len = strcspn(p, ",");
        if (!len) return df_fail(err, DF_ERR_ARG, "--experts '%s': directory %d of the list is empty", list, i);
        if (!p[len]) return DF_OK;
        p += len + 1;
    }
}

int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err) {
    *out = NULL;
    if (!opts || !opts->model_dir) return df_fail(err, DF_ERR_ARG, "no model directory given");
    int rc = check_experts(opts->experts, err);
    if (rc) return rc;
    df_isa isa = df_isa_detect();
    if (opts->isa && *opts->isa) {
        int want = df_isa_from_name(opts->isa);
        if (want < 0)
            return df_fail(err, DF_ERR_ARG, "unknown kernel path '%s' (use auto, avx512, avx2 or c)",
                           opts->isa);
        if (df_isa_set((df_isa)want) != 0)
            return df_fail(err, DF_ERR_UNSUPPORTED, "this CPU cannot run the '%s' kernel path",
                           opts->isa);
        isa = (df_isa)want;
    } else {
        df_isa_set(isa);
    }
    int nt = opts->n_threads;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1) nt = 1;
    if (nt > 256) return df_fail(err, DF_ERR_ARG, "--threads %d is out of range (1..256)", nt);

    if (opts->prefill_chunk < 0 || opts->prefill_chunk > 65536)
        return df_fail(err, DF_ERR_ARG, "prefill chunk %d is out of range (1..65536)", opts->prefill_chunk);
    df_engine *e = df_xcalloc(1, sizeof *e);
    e->chunk = opts->prefill_chunk ? opts->prefill_chunk : DF_DEFAULT_CHUNK;
    rc = df_model_load(&e->model, opts->model_dir, err);
    if (rc) {
        free(e);
        return rc;
    }
    char *tp = df_path_join(opts->model_dir, "tokenizer.json");
    rc = df_tokenizer_load(&e->tok, tp, err);
    free(tp);
    /* Parsing a 151k-token tokenizer.json keeps 20 MiB and frees 75-90 MiB
     * of JSON nodes. Handed back to the kernel now, those pages do not sit
     * under the weights copied into RAM next, where they made the loading
     * peak (232 MiB instead of 173 on a 2-layer checkpoint with that vocabulary). */
    malloc_trim(0);
    if (rc) {
        df_model_free(&e->model);
        free(e);
        return rc;
    }
    const df_config *c = &e->model.cfg;
    /* before the budget is sized, so that the trace counts in what is resident */
    if (opts->replay_routing && (rc = setup_replay(e, opts->replay_routing, err))) {
        df_tokenizer_free(e->tok);
        df_model_free(&e->model);
        free(e);
        return rc;
    }
    bool have_pack = opts->experts && *opts->experts;
    if (have_pack || opts->ram_budget || opts->expert_cache || opts->sim_disk_bps > 0) {
        /* a dense model has nothing to stream: the budget must hold all of it.
         * A simulated disk paces pack reads only: streaming from the
         * safetensors, the page cache is the expert cache and most reads
         * never reach a disk. */
        if (opts->sim_disk_bps > 0 && (!have_pack || c->num_experts <= 0))
            rc = df_fail(err, DF_ERR_ARG, "a simulated disk needs a pack of the model's experts (--experts)");
        else
            rc = c->num_experts <= 0 && !opts->experts
                     ? (opts->ram_budget ? dense_budget(e, opts, err) : DF_OK)
                     : setup_streaming(e, opts, err);
        if (rc) {
            free_replay(e);
            df_tokenizer_free(e->tok);
            df_model_free(&e->model);
            free(e);
            return rc;
        }
    }
    if (!e->store) {
        bool *done = df_xcalloc((size_t)df_st_file_count(e->model.st) + 1, sizeof(bool));
        huge_weights(&e->model, done);
        prefault(&e->model, true, done);
        free(done);
    }
    for (int i = 0; i < c->n_eos_token_ids; i++) add_stop(e, c->eos_token_ids[i]);
    add_stop(e, df_tokenizer_find(e->tok, "<|im_end|>"));

    e->pool = df_pool_new(nt);
    df_model_info *in = &e->info;
    in->architecture = c->arch == DF_ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3";
    in->vocab_size = c->vocab_size;
    in->n_layers = c->num_hidden_layers;
    in->hidden_size = c->hidden_size;
    in->max_context = c->max_position_embeddings;
    in->n_experts = c->num_experts;
    in->n_experts_active = c->num_experts_per_tok;
    in->bytes_total = e->model.bytes_total;
    in->bytes_dense = e->model.bytes_dense;
    in->bytes_experts = e->model.bytes_experts;
    {
        const df_model *m = &e->model;
        uint64_t emb = m->embed.t->nbytes, act = m->bytes_dense - emb;
        if (m->lm_head.t == m->embed.t) act += emb; /* tied: the LM head reads it all */
        for (int li = 0; li < c->num_hidden_layers; li++) {
            const df_layer *L = &m->layers[li];
            if (!L->is_moe) continue;
            const df_expert *x = &L->experts[0];
            act += (uint64_t)c->num_experts_per_tok *
                   (x->gate.t->nbytes + x->up.t->nbytes + x->down.t->nbytes);
        }
        in->bytes_active_per_token = act;
    }
    in->isa = df_isa_name(isa);
    in->n_threads = nt;
    in->default_temperature = (float)c->gen_temperature;
    in->default_top_p = (float)c->gen_top_p;
    in->default_top_k = c->gen_top_k;
    *out = e;
    return DF_OK;
}

void df_engine_close(df_engine *e) {
    if (!e) return;
    df_store_close(e->store);
    free_replay(e);
    df_pool_free(e->pool);
    df_tokenizer_free(e->tok);
    df_model_free(&e->model);
    free(e);
}

uint64_t df_engine_session_bytes(const df_engine *e, int max_ctx) {
    const df_config *c = &e->model.cfg;
    if (max_ctx <= 0 || max_ctx > c->max_position_embeddings) max_ctx = c->max_position_embeddings;
    return session_bytes(&e->model, max_ctx, e->chunk);
}

const df_model_info *df_engine_info(const df_engine *e) { return &e->info; }

static void mem_stats(const df_engine *e, df_stats *o) {
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
    o->cache_sizing = e->cache_sizing;
    o->mem_available = p->available;
}

void df_engine_stats(const df_engine *e, df_stats *o) {
    memset(o, 0, sizeof *o);
    o->tokens = e->tokens;
    o->eval_s = e->eval_s;
    o->expert_source = "resident";
    o->replay_routing = e->replay_path;
    mem_stats(e, o);
    if (!e->store) return;
    df_store_stats s = df_store_get_stats(e->store);
    o->read_wait_s = s.wait_s;
    o->expert_requests = s.requests;
    o->expert_hits = s.hits;
    o->expert_misses = s.misses;
    o->expert_bytes_read = s.bytes_read;
    o->expert_rereads = s.rereads;
    o->cache_slots = df_store_slots(e->store);
    o->pinned_experts = df_store_pinned(e->store);
    o->cache_bytes = (uint64_t)df_store_slots(e->store) * df_store_slot_bytes(e->store);
    o->expert_source = df_store_source(e->store);
    o->direct_io = df_store_direct(e->store);
    o->sim_disk_bps = df_store_sim_disk(e->store);
    o->prefetch = df_store_prefetch_mode(e->store);
    o->prefetch_depth = df_store_prefetch_depth(e->store);
    o->prefetch_reads = s.prefetch_reads;
    o->prefetch_hits = s.prefetch_hits;
    o->prefetch_bytes_used = s.prefetch_bytes_used;
    o->prefetch_bytes_wasted = s.prefetch_bytes_wasted;
    o->prefetch_no_room = s.prefetch_no_room;
    o->prefetch_gate = df_store_prefetch_gate(e->store, &o->prefetch_speedup);
    int n_moe = df_store_moe_layers(e->store);
    for (int l = 0; l < n_moe; l++) {
        df_pf_layer_stats pl;
        df_store_prefetch_layer(e->store, l, &pl);
        o->prefetch_predicted += pl.predicted;
        o->prefetch_correct += pl.correct;
        o->prefetch_actual += pl.actual;
    }
}

int df_engine_prefetch_layers(const df_engine *e, df_prefetch_layer *out, int cap) {
    if (!e->store) return 0;
    int n = 0;
    for (int li = 0; li < e->model.cfg.num_hidden_layers; li++) {
        if (!e->model.layers[li].is_moe) continue;
        if (n < cap) {
            df_pf_layer_stats st;
            df_store_prefetch_layer(e->store, n, &st);
            out[n] = (df_prefetch_layer){.layer = li, .using = df_pf_choice_name(st.choice),
                                         .recall_router = st.recall_router, .recall_prev = st.recall_prev,
                                         .precision_first = st.precision_first,
                                         .precision_prev = st.precision_prev, .ranks_read = st.ranks_read,
                                         .predicted = st.predicted, .correct = st.correct,
                                         .actual = st.actual};
        }
        n++;
    }
    return n;
}

static const char *rope_name(df_rope_type t) {
    switch (t) {
    case DF_ROPE_LINEAR: return "linear";
    case DF_ROPE_DYNAMIC: return "dynamic";
    case DF_ROPE_YARN: return "yarn";
    default: return "default";
    }
}

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    snprintf(buf, n, "%.2f %s", v, u[i]);
}

void df_engine_inspect(const df_engine *e, FILE *f) {
    const df_config *c = &e->model.cfg;
    const df_model *m = &e->model;
    fprintf(f, "architecture          %s\n", e->info.architecture);
    fprintf(f, "vocab_size            %d\n", c->vocab_size);
    fprintf(f, "hidden_size           %d\n", c->hidden_size);
    fprintf(f, "layers                %d\n", c->num_hidden_layers);
    fprintf(f, "attention heads       %d (kv %d, head_dim %d)\n", c->num_attention_heads,
            c->num_key_value_heads, c->head_dim);
    fprintf(f, "intermediate_size     %d\n", c->intermediate_size);
    fprintf(f, "max_position          %d\n", c->max_position_embeddings);
    fprintf(f, "rope                  theta %g, scaling %s", c->rope_theta, rope_name(c->rope_type));
    if (c->rope_type != DF_ROPE_DEFAULT) fprintf(f, " (factor %g)", c->rope_factor);
    fprintf(f, "\nrms_norm_eps          %g\n", c->rms_norm_eps);
    fprintf(f, "tied embeddings       %s\n", c->tie_word_embeddings ? "yes" : "no");
    if (c->arch == DF_ARCH_QWEN3_MOE) {
        int nmoe = 0;
        for (int i = 0; i < c->num_hidden_layers; i++) nmoe += c->layer_is_moe[i];
        fprintf(f, "experts               %d, top-%d, moe_intermediate %d, norm_topk_prob %s\n",
                c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size,
                c->norm_topk_prob ? "yes" : "no");
        fprintf(f, "MoE layers            %d of %d (decoder_sparse_step %d)\n", nmoe,
                c->num_hidden_layers, c->decoder_sparse_step);
    }
    fprintf(f, "stop tokens          ");
    for (int i = 0; i < e->n_stop; i++) fprintf(f, " %d", e->stop_ids[i]);
    fprintf(f, "\nkernels               %s, %d threads\n", e->info.isa, e->info.n_threads);

    fprintf(f, "\ntensors (%zu in %d file%s):\n", df_st_count(m->st), df_st_file_count(m->st),
            df_st_file_count(m->st) == 1 ? "" : "s");
    /* Routed experts are summarised per layer: a 235B model has tens of
     * thousands of them. */
    uint64_t per_layer_bytes = 0;
    int per_layer_count = 0, cur_layer = -1;
    for (size_t i = 0; i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        int li, ex;
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.", &li, &ex) == 2) {
            if (li != cur_layer && per_layer_count) {
                char b[32];
                fmt_bytes(b, sizeof b, per_layer_bytes);
                fprintf(f, "  model.layers.%d.mlp.experts.*  %d tensors  %s\n", cur_layer,
                        per_layer_count, b);
                per_layer_bytes = 0;
                per_layer_count = 0;
            }
            cur_layer = li;
            per_layer_bytes += t->nbytes;
            per_layer_count++;
            continue;
        }
        char shp[96];
        size_t o = 0;
        for (int d = 0; d < t->ndim; d++)
            o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%lld", d ? "x" : "", (long long)t->shape[d]);
        if (!t->ndim) snprintf(shp, sizeof shp, "scalar");
        fprintf(f, "  %-56s %-5s %-14s %12llu\n", t->name, df_dtype_name(t->dtype), shp,
                (unsigned long long)t->nbytes);
    }
    if (per_layer_count) {
        char b[32];
        fmt_bytes(b, sizeof b, per_layer_bytes);
        fprintf(f, "  model.layers.%d.mlp.experts.*  %d tensors  %s\n", cur_layer, per_layer_count, b);
    }
    char a[32], d[32], x[32];
    fmt_bytes(a, sizeof a, m->bytes_total);
    fmt_bytes(d, sizeof d, m->bytes_dense);
    fmt_bytes(x, sizeof x, m->bytes_experts);
    fprintf(f, "\nbytes: total %s (%llu), always-active %s (%llu), routed experts %s (%llu)\n", a,
            (unsigned long long)m->bytes_total, d, (unsigned long long)m->bytes_dense, x,
            (unsigned long long)m->bytes_experts);
}

/* ---- tokenizer and chat ----------------------------------------------------------- */

int df_tokenize(const df_engine *e, const char *text, size_t len, int32_t **ids, size_t *n,
                df_error *err) {
    return df_tokenizer_encode(e->tok, text, len, ids, n, err);
}

int df_token_bytes(const df_engine *e, int32_t id, const char **bytes, size_t *len) {
    return df_tokenizer_token_bytes(e->tok, id, bytes, len);
}

int df_is_stop_token(const df_engine *e, int32_t id) {
    for (int i = 0; i < e->n_stop; i++)
        if (e->stop_ids[i] == id) return 1;
    return 0;
}

int df_chat_render(const df_engine *e, const df_chat_msg *msgs, int n, int add_gen,
                   int enable_thinking, char **out, df_error *err) {
    (void)e;
    return df_chat_render_qwen3(msgs, n, add_gen, enable_thinking, out, err);
}

int df_chat_tokenize(const df_engine *e, const df_chat_msg *msgs, int n, int add_gen,
                     int enable_thinking, int32_t **ids, size_t *n_ids, df_error *err) {
    if (!e) return df_fail(err, DF_ERR_ARG, "df_chat_tokenize: NULL engine");
    return df_chat_tokenize_qwen3(e->tok, msgs, n, add_gen, enable_thinking, ids, n_ids, err);
}

/* Length of the UTF-8 sequence a lead byte starts, 0 if it cannot start one. */
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

static size_t put(char *out, size_t cap, size_t o, const void *p, size_t n) {
    if (o + n <= cap) memcpy(out + o, p, n);
    return o + n;
}

/* Emits complete sequences from buf[0..n), keeps an incomplete tail. */
static size_t drain(df_text_stream *st, const unsigned char *buf, size_t n, char *out, size_t cap,
                    bool final) {
    static const char repl[] = "\xEF\xBF\xBD";
    size_t i = 0, o = 0;
    while (i < n) {
        int l = utf8_len(buf[i]);
        if (l == 0) {
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        if (i + (size_t)l > n) {
            /* incomplete: keep it if the bytes so far are valid continuations */
            bool ok = true;
            for (size_t j = i + 1; j < n; j++) ok &= (buf[j] & 0xC0) == 0x80;
            if (ok && !final) {
                st->n_pending = (int)(n - i);
                memcpy(st->pending, buf + i, n - i);
                return o;
            }
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        bool ok = true;
        for (int j = 1; j < l; j++) ok &= (buf[i + (size_t)j] & 0xC0) == 0x80;
        if (ok && l == 3 && buf[i] == 0xE0) ok = buf[i + 1] >= 0xA0;
        if (ok && l == 3 && buf[i] == 0xED) ok = buf[i + 1] < 0xA0;
        if (ok && l == 4 && buf[i] == 0xF0) ok = buf[i + 1] >= 0x90;
        if (ok && l == 4 && buf[i] == 0xF4) ok = buf[i + 1] < 0x90;
        if (!ok) {
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        o = put(out, cap, o, buf + i, (size_t)l);
        i += (size_t)l;
    }
    st->n_pending = 0;
    return o;
}

size_t df_text_stream_push(const df_engine *e, df_text_stream *st, int32_t id, char *out, size_t cap) {
    const char *b;
    size_t n;
    if (df_tokenizer_token_bytes(e->tok, id, &b, &n) != 0) return 0;
    unsigned char *tmp = df_xmalloc((size_t)st->n_pending + n);
    memcpy(tmp, st->pending, (size_t)st->n_pending);
    memcpy(tmp + st->n_pending, b, n);
    size_t r = drain(st, tmp, (size_t)st->n_pending + n, out, cap, false);
    free(tmp);
    return r > cap ? cap : r;
}

size_t df_text_stream_flush(df_text_stream *st, char *out, size_t cap) {
    unsigned char tmp[8];
    size_t n = (size_t)st->n_pending;
    memcpy(tmp, st->pending, n);
    size_t r = drain(st, tmp, n, out, cap, true);
    st->n_pending = 0;
    return r > cap ? cap : r;
}

/* ---- sessions ------------------------------------------------------------------ */

int df_session_new(df_session **out, df_engine *e, int max_ctx, df_error *err) {
    *out = NULL;
    const df_config *c = &e->model.cfg;
    if (max_ctx <= 0 || max_ctx > c->max_position_embeddings) max_ctx = c->max_position_embeddings;
    if (e->ram_budget && max_ctx > e->budget_ctx)
        return df_fail(err, DF_ERR_ARG,
                       "a %d-token session does not fit the RAM budget, which was sized for %d tokens "
                       "(set the engine's context)", max_ctx, e->budget_ctx);
    df_session *s = df_xcalloc(1, sizeof *s);
    s->eng = e;
    s->max_ctx = max_ctx;
    int rc = df_kv_init(&s->kv, &e->model, max_ctx, err);
    if (rc) {
        free(s);
        return rc;
    }
    /* no pass evaluates more rows than the context holds: a larger chunk's
     * buffers would never be used */
    s->buf = df_fwd_buf_new(&e->model, e->chunk < max_ctx ? e->chunk : max_ctx, max_ctx);
    if (e->replay) df_fwd_buf_set_route(s->buf, replay_route, s);
    *out = s;
    return DF_OK;
}

void df_session_free(df_session *s) {
    if (!s) return;
    df_kv_free(&s->kv);
    df_fwd_buf_free(s->buf);
    free(s);
}

int df_session_pos(const df_session *s) { return s->pos; }
int df_session_capacity(const df_session *s) { return s->max_ctx; }

void df_session_set_progress(df_session *s, df_progress_fn fn, void *user) {
    s->progress = fn;
    s->progress_user = user;
}

typedef struct {
    df_session *s;
    int done, total;
} progress_ctx;

static void on_layer(void *user, int layer, int n_layers, int rows) {
    progress_ctx *p = user;
    /* rows of this chunk count in proportion to the layers they have passed */
    p->s->progress(p->s->progress_user, layer, n_layers,
                   p->done + (int)((int64_t)rows * layer / n_layers), p->total);
}

int df_session_truncate(df_session *s, int pos, df_error *err) {
    if (pos < 0 || pos > s->pos)
        return df_fail(err, DF_ERR_ARG, "cannot truncate a session at %d to %d", s->pos, pos);
    s->pos = pos;
    return DF_OK;
}

int df_session_eval(df_session *s, const int32_t *tokens, int n, float *logits, int all_rows,
                    df_error *err) {
    const df_model *m = &s->eng->model;
    int V = m->cfg.vocab_size;
    if (n <= 0) return df_fail(err, DF_ERR_ARG, "nothing to evaluate");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return df_fail(err, DF_ERR_ARG, "token id %d at index %d is outside the vocabulary (0..%d)",
                           tokens[i], i, V - 1);
    if (s->pos + n > s->max_ctx)
        return df_fail(err, DF_ERR_CONTEXT, "context full: %d + %d tokens exceed the %d-token context",
                       s->pos, n, s->max_ctx);
    int R = df_fwd_buf_rows(s->buf);
    double t0 = df_now();
    for (int done = 0; done < n;) {
        int T = n - done < R ? n - done : R;
        bool last = done + T == n;
        float *lg = NULL;
        if (logits && all_rows) lg = logits + (size_t)done * V;
        else if (logits && last) lg = logits;
        progress_ctx pc = {s, done, n};
        s->replay_base = s->eng->replay_next;
        int rc = df_qwen3_forward(m, s->eng->store, s->eng->pool, &s->kv, s->buf, tokens + done, T,
                                  s->pos, lg, all_rows != 0, s->progress ? on_layer : NULL, &pc, err);
        if (rc) return rc; /* the position stays: the chunk can be evaluated again */
        s->pos += T;
        done += T;
        s->eng->replay_next += (uint64_t)T; /* only once the rows are in: a retry replays the same */
        s->eng->tokens += (uint64_t)T;
    }
    s->eng->eval_s += df_now() - t0;
    return DF_OK;
}
