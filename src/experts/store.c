/*
 * store.c - the expert store (see store.h): slots, reads through io_uring, the
 * per-layer request/hand-out protocol, and eviction.
 *
 * A slot holds one expert record: gate, up and down at fixed offsets. Reading a
 * record is a few operations in flight at once: one per stripe of a pack (each
 * at the same offset in its directory's experts.bin), or one per matrix when
 * streaming from safetensors. Short reads are continued and EINTR/EAGAIN
 * retried; a pack record whose checksum does not match is read once more, then
 * it is an error naming the expert.
 *
 * The policy (policy.h) owns n_cache slot numbers and decides on every miss
 * whether the expert is kept and what it displaces; cframe[] maps its slot
 * numbers to frames of memory. The other frames form the transient pool:
 * experts the policy chose not to keep are read there, used by the current
 * layer and forgotten, and predicted experts are read there ahead of need
 * (prefetch.h). When the policy admits an expert a prediction already brought
 * in (or is still bringing in), the frame changes hands instead of being
 * copied: the policy slot now maps to it and the victim's frame joins the
 * pool. A wrong prediction is dropped when its layer comes: a finished read
 * frees its frame at once, one still in flight is orphaned and frees it on
 * completion. The policy's heat histogram is loaded at open and saved at
 * close (next to the pack), and the hottest experts can be pinned and read in
 * at start-up.
 *
 * For benchmarks the store can stand in front of a simulated disk (sim_disk_bps):
 * completions are handed over no earlier than a disk of that bandwidth would
 * finish them (see "the simulated disk" below).
 */
#include "experts/store.h"

#include "experts/pack.h"
#include "experts/policy.h"
#include "experts/prefetch.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_OPS DF_PACK_MAX_STRIPES
#define RING_DEPTH 128
/* Prefetch reads go in pieces of this size, at most PF_INFLIGHT at a time, and
 * only while no demand read is in flight: a demand read that arrives then
 * waits behind at most PF_INFLIGHT pieces, not behind whole records. On a
 * simulated 0.6 GB/s disk (26 MoE layers, replayed routing, 10 % cache) 4 x 1
 * MiB left 17 MB/token of wrong predictions in flight when their layer came
 * ("prev": 0.76 of the I/O bound); 2 x 256 KiB, 5.4 MB (0.84; off: 0.84-0.88). */
#define PF_CHUNK ((uint64_t)1 << 18)
#define PF_INFLIGHT 2

/* A blocking wait for a read polls the completion queue this long before it
 * sleeps. On the development VM a thread asleep in the kernel took ~0.1-0.2 ms
 * to wake when its read landed, and a token waits 100+ times (26 MoE layers,
 * replayed routing, 10 % cache): polling took it from 0.85 to 0.89-0.90 of the
 * I/O bound on a simulated 0.6 GB/s disk, and the random-routing model from
 * 0.73 to 0.80; on the real disk it was neutral (52.5 vs 52.9 tok/s, medians
 * of 3). Cost: a core busy while a read is awaited, idle otherwise anyway. */
#define IO_SPIN_S 0.010

enum { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY };

/* A frame of memory for one expert record ("slot" for short). */
typedef struct slot {
    int key;            /* layer * E + expert, -1 when empty */
    int state;
    int pin;            /* in use by the current layer */
    int ops_left;       /* operations not finished (in flight or parked) */
    int n_inflight;     /* operations submitted and not completed */
    bool parked[MAX_OPS];   /* a prefetch operation waiting for an idle disk */
    bool op_demand[MAX_OPS];/* the class an in-flight operation was submitted as */
    int retried;
    bool cached;        /* mapped from a policy slot (else: transient pool) */
    bool orphan;        /* a dropped prediction whose read is still in flight */
    int pf_layer;       /* read on a prediction for this model layer, not yet
                           claimed; -1 otherwise */
    char *mem;
    uint64_t done[MAX_OPS]; /* bytes completed per operation */
    uint64_t len[MAX_OPS];  /* bytes each operation reads */
    double due[MAX_OPS];    /* simulated disk: when the operation in flight finishes */
} slot;

/* A completion taken off the ring before the simulated disk would deliver it. */
typedef struct held_cqe {
    uint64_t data;
    int res;
} held_cqe;

struct df_store {
    df_xsource base;    /* the model layer's view: an expert source */
    const df_model *m;
    df_pack *pack;
    int n_ops;          /* operations per record */
    struct io_uring ring;
    bool ring_ok;
    size_t slot_bytes;
    int n_slots;
    char *arena;
    size_t arena_bytes;
    slot *slots;
    int *key_slot;      /* [L * E] -> slot or -1 */
    int L, E;
    df_cache *cache;    /* the policy, over n_cache slot numbers */
    int n_cache;
    int *cframe;        /* [n_cache] policy slot -> frame */
    /* The transient pool: the frames no policy slot maps (cached false), in
     * ascending order. They are n_slots - n_cache of them, at most top-k,
     * and they hold every frame find_slot may hand out and every prediction
     * (pf_layer >= 0: read only into frames find_slot gave, and cached only
     * after claim_prefetched cleared it), so those scans look here instead of
     * at all n_slots frames, which for a 94-layer, 128-expert model with
     * thousands of slots and hundreds of misses a token were millions of
     * checks per token. Frame order keeps the choice of a scan of every frame. */
    int *pool;
    int n_pool;
    df_prefetcher *pf;  /* NULL: prefetch off */
    int *moe_index;     /* model layer -> MoE layer index, -1 for dense */
    int *moe_layer;     /* MoE layer index -> model layer */
    char *heat_path;    /* where the heat histogram persists, or NULL */
    int32_t *slotv;     /* per request: the policy's answer */
    int32_t *ids32;
    uint8_t *hitv;
    df_store_stats st;
    /* current layer */
    int layer;
    int *want;          /* experts asked for */
    bool *handed;       /* per want index */
    int n_want, n_handed;
    int *queue;         /* want indices without a slot yet */
    int n_queue;
    int *pred;          /* scratch: a layer's predicted experts */
    uint8_t *pred_cached; /* scratch: [E] which of a layer's experts need no read */
    double last_step_t; /* when the previous forward step ended (the time gate) */
    uint64_t last_step_misses; /* st.misses then */
    int *last;          /* slots handed out by the previous df_store_next */
    int n_last;
    int st_pinned;      /* experts read in at start-up (pinned tier) */
    /* Fault injection for tests (DF_TEST_IO_FAULTS=short,eintr): completions
     * are reported as short reads or EINTR, as a kernel may report them. */
    bool fault_short, fault_eintr;
    uint64_t n_completions;
    int demand_inflight, pf_inflight; /* operations in flight, per class */
    df_error fail;      /* sticky error from a completion */
    bool failed;
    double sim_bps;     /* simulated disk bandwidth, bytes/s; 0: the real one */
    double sim_free;    /* when the simulated disk has served what it was given */
    held_cqe *held;     /* completions not yet due, at most one per operation */
    int n_held;
};

/* ---- geometry -------------------------------------------------------------------- */

static size_t round4k(size_t n) { return (n + 4095) & ~(size_t)4095; }

static const df_expert_inventory *inv(const df_store *s) { return &s->m->experts; }

/* Offsets of an expert's parts inside a slot. */
static void part_offsets(const df_store *s, int layer, int e, size_t *off) {
    int np = inv(s)->layout->n_parts;
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        for (int i = 0; i < np; i++) off[i] = r->part[i].offset;
        return;
    }
    off[0] = 0;
    for (int i = 1; i < np; i++) off[i] = off[i - 1] + round4k(df_expert_part(inv(s), layer, e, i - 1)->nbytes);
}

/* File, offset and length of operation i of a record. */
static void op_geometry(const df_store *s, int layer, int e, int i, int *fd, uint64_t *foff,
                        uint64_t *len, size_t *moff) {
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        size_t sb = df_pack_stripe_bytes(r, s->n_ops);
        *fd = df_pack_fd(s->pack, i);
        *foff = r->offset;
        *len = sb;
        *moff = (size_t)i * sb;
        return;
    }
    const df_tensor *t = df_expert_part(inv(s), layer, e, i);
    size_t off[DF_EXPERT_MAX_PARTS];
    part_offsets(s, layer, e, off);
    *fd = df_st_file_fd(s->m->st, t->file);
    *foff = t->file_offset;
    *len = t->nbytes;
    *moff = off[i];
}

/* ---- the cache policy ---------------------------------------------------------------- */

static int complete(df_store *s, uint64_t d, int res);
static int next_cqe(df_store *s, bool block, uint64_t *d, int *res);
static void assign(df_store *s, int si, int key, int pf_layer);

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static void populate_arena(void *p, size_t n) {
    if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
    long pg = sysconf(_SC_PAGESIZE); /* older kernels: touch every page */
    for (size_t o = 0; o < n; o += (size_t)pg) ((volatile char *)p)[o] = 0;
}

/* A few transient slots let the policy turn one-off experts away. Predicted
 * experts are read into the ones the current layer leaves free: giving
 * prefetch slots of its own would shrink the cache, and measured on the
 * demo model that cost more (a lower hit rate) than prefetch saved. */
static int n_transient(const df_store *s) {
    int top_k = s->m->cfg.num_experts_per_tok;
    int t = s->n_slots / 8 < top_k ? s->n_slots / 8 : top_k;
    return t < 1 ? 1 : t;
}

static int wait_ready(df_store *s, int si, df_error *err) {
    io_uring_submit(&s->ring);
    while (s->slots[si].state != SLOT_READY) {
        if (s->failed) {
            *err = s->fail;
            return err->code;
        }
        uint64_t d;
        int res, r = next_cqe(s, true, &d, &res);
        if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_wait_cqe: %s", strerror(-r));
        complete(s, d, res);
    }
    return DF_OK;
}

/* Splits the slots between the policy and transient use, loads the persisted
 * heat, and reads in the pinned experts. */
static int setup_cache(df_store *s, const df_store_opts *o, int n_moe, df_cache_policy policy,
                       df_error *err) {
    int top_k = s->m->cfg.num_experts_per_tok;
    s->n_cache = s->n_slots - n_transient(s);
    if (s->n_cache < 1) s->n_cache = 0; /* a single slot: nothing is kept */
    s->n_pool = s->n_slots - s->n_cache;
    s->pool = df_xmalloc(sizeof(int) * (size_t)s->n_pool);
    for (int p = 0; p < s->n_pool; p++) s->pool[p] = s->n_cache + p;
    if (!s->n_cache) return DF_OK;
    s->cframe = df_xmalloc(sizeof(int) * (size_t)s->n_cache);
    for (int i = 0; i < s->n_cache; i++) {
        s->cframe[i] = i;
        s->slots[i].cached = true;
    }
    if (o->heat_path) s->heat_path = df_xstrdup(o->heat_path);
    else if (s->pack) s->heat_path = df_path_join(df_pack_dir(s->pack, 0), "experts.heat");
    df_heat heat;
    int rc = df_heat_init(&heat, n_moe, s->E, 0, err);
    if (rc) return rc;
    if (s->heat_path) {
        df_error why;
        df_heat_load_result lr = df_heat_load(&heat, s->heat_path, &why);
        if (lr == DF_HEAT_CORRUPT || lr == DF_HEAT_MISMATCH)
            fprintf(stderr, "deltafin: warning: %s\n", why.msg);
    }
    uint64_t pin_want = o->pin_bytes / s->slot_bytes; /* 64 bits: --pin 1T is not a negative count */
    int n_pin = pin_want < (uint64_t)s->n_cache ? (int)pin_want : s->n_cache;
    df_cache_opts co = {.n_layers = n_moe, .n_experts = s->E, .top_k = top_k,
                        .n_slots = s->n_cache, .policy = policy, .initial_heat = &heat,
                        .n_pinned = n_pin};
    rc = df_cache_new(&s->cache, &co, err);
    df_heat_free(&heat);
    if (rc) return rc;
    s->st_pinned = 0;
    /* The pinned tier is read in now, so it is warm from the first token. */
    for (int si = 0; si < s->n_cache; si++) {
        int32_t ck = df_cache_slot_key(s->cache, si);
        if (ck < 0) continue;
        int key = s->moe_layer[ck / s->E] * s->E + ck % s->E;
        assign(s, s->cframe[si], key, -1);
        if ((rc = wait_ready(s, s->cframe[si], err))) return rc;
        s->slots[s->cframe[si]].pin = 0;
        s->st_pinned++;
    }
    return DF_OK;
}

/* ---- the simulated disk (benchmarks) ------------------------------------------------
 *
 * "Fraction of the I/O bound" needs a disk whose bandwidth is known, and a
 * virtual disk's moves 1.0-2.8 GB/s between repetitions of the same read. The
 * kernel's blkio throttle makes the bandwidth constant but averages it over
 * 100 ms slices: time the disk sat idle while the engine computed is credited
 * to the next reads, so it hides exactly the stalls a benchmark of overlap
 * must see. The simulated disk has no such credit: it serves reads one after
 * another in submission order at sim_bps, a read of n bytes due at
 * max(submitted, previous due) + n / sim_bps, and a completion the real disk
 * delivers earlier is held until it is due. The bytes still come from the real
 * disk, which must be faster than the simulated one (the benchmarks check);
 * only when they are handed over changes, so the output cannot. */

/* The in-flight count of the operation a completion belongs to. */
static void uncount(df_store *s, uint64_t d) {
    if (s->slots[d / MAX_OPS].op_demand[d % MAX_OPS]) s->demand_inflight--;
    else s->pf_inflight--;
}

static double due_of(const df_store *s, uint64_t d) { return s->slots[d / MAX_OPS].due[d % MAX_OPS]; }

/* The next completion to hand over: 1 with *d and *res filled, 0 when none
 * is ready (block false), or a negative errno. With the simulated disk, the
 * earliest due of those held, once its time has come. */
static int next_cqe(df_store *s, bool block, uint64_t *d, int *res) {
    double spin_until = block ? df_now() + IO_SPIN_S : 0;
    for (;;) {
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            int r = cqe->res;
            io_uring_cqe_seen(&s->ring, cqe);
            if (s->sim_bps <= 0) {
                *d = data;
                *res = r;
                return 1;
            }
            s->held[s->n_held++] = (held_cqe){data, r};
        }
        int best = 0;
        double wait = 0;
        if (s->n_held) {
            for (int i = 1; i < s->n_held; i++)
                if (due_of(s, s->held[i].data) < due_of(s, s->held[best].data)) best = i;
            wait = due_of(s, s->held[best].data) - df_now();
            if (wait <= 0) {
                *d = s->held[best].data;
                *res = s->held[best].res;
                s->held[best] = s->held[--s->n_held];
                return 1;
            }
        }
        if (!block) return 0;
        if (df_now() < spin_until) continue; /* poll a while before sleeping */
        int r;
        if (s->n_held) { /* sleep until it is due, or until the real disk delivers another */
            struct __kernel_timespec ts = {.tv_sec = (long long)wait,
                                           .tv_nsec = (long long)((wait - (double)(long long)wait) * 1e9)};
            r = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
            if (r == -ETIME) continue;
        } else {
            r = io_uring_wait_cqe(&s->ring, &cqe);
        }
        if (r < 0 && r != -EINTR) return r;
    }
}

/* ---- the expert source interface (model/experts.h) ------------------------------- */

static int xs_begin(df_xsource *x, int layer, const int *experts, int n, df_error *err) {
    return df_store_begin_layer((df_store *)x, layer, experts, n, err);
}
static int xs_next(df_xsource *x, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err) {
    return df_store_next((df_store *)x, cap, ids, w, n_out, err);
}
static void xs_end_layer(df_xsource *x) { df_store_end_layer((df_store *)x); }
static void xs_end_step(df_xsource *x, int rows) { df_store_end_step((df_store *)x, rows); }
static int xs_depth(df_xsource *x) { return df_store_lookahead_depth((df_store *)x); }
static void xs_predict(df_xsource *x, int layer, const int *sel, int n) { df_store_predict((df_store *)x, layer, sel, n); }
static void xs_close(df_xsource *x) { df_store_close((df_store *)x); }

static const df_xsource_ops STORE_OPS = {xs_begin, xs_next, xs_end_layer, xs_end_step, xs_depth, xs_predict,
                                         xs_close};

df_xsource *df_store_xsource(df_store *s) { return &s->base; }

/* ---- open / close ------------------------------------------------------------------ */

/* n_slots and arena_bytes for cache_bytes of slots: never more than every
 * expert plus the transient slots. The count is taken in 64 bits and capped
 * before it becomes an int: a cache of "everything" (a budget of 400T) once
 * wrapped to a negative count and was refused as less than one expert. */
static int size_slots(df_store *s, uint64_t cache_bytes, int n_moe, const char *what, df_error *err) {
    uint64_t want = cache_bytes / s->slot_bytes;
    if (want < 1)
        return df_fail(err, DF_ERR_ARG, "%s %.1f MiB for the expert cache: less than one expert (%.1f MiB)",
                       what ? what : "the expert cache size leaves", (double)cache_bytes / 1048576.0,
                       (double)s->slot_bytes / 1048576.0);
    uint64_t top_k = (uint64_t)s->m->cfg.num_experts_per_tok;
    uint64_t trans = want / 8 < top_k ? want / 8 : top_k; /* n_transient() of want slots */
    uint64_t most = (uint64_t)n_moe * (uint64_t)s->E + (trans < 1 ? 1 : trans);
    s->n_slots = (int)(want < most ? want : most);
    if (__builtin_mul_overflow(s->slot_bytes, (size_t)s->n_slots, &s->arena_bytes))
        return df_fail(err, DF_ERR_NOMEM, "an expert cache of %d slots of %zu bytes is too large", s->n_slots,
                       s->slot_bytes);
    return DF_OK;
}

int df_store_open(df_store **out, const df_model *m, const df_store_opts *o, df_error *err) {
    *out = NULL;
    const df_config *c = &m->cfg;
    if (c->num_experts <= 0)
        return df_fail(err, DF_ERR_ARG, "the model has no routed experts to stream");
    int policy = df_cache_policy_from_name(o->policy ? o->policy : "deltafin");
    if (policy < 0 || policy == DF_POLICY_BELADY)
        return df_fail(err, DF_ERR_ARG, "unknown cache policy '%s' (use deltafin or lru)", o->policy);
    int pf_mode = df_pf_mode_from_name(o->prefetch ? o->prefetch : "off");
    if (pf_mode < 0)
        return df_fail(err, DF_ERR_ARG, "unknown prefetch mode '%s' (use on, off, router or prev)",
                       o->prefetch);
    if (o->prefetch_depth < 0 || o->prefetch_depth > 8)
        return df_fail(err, DF_ERR_ARG, "prefetch depth %d out of range 1..8", o->prefetch_depth);
    double min_recall = o->prefetch_min_recall < 0 ? 0.5 : o->prefetch_min_recall;
    if (min_recall > 1) return df_fail(err, DF_ERR_ARG, "prefetch minimum recall %g is above 1", min_recall);
    double min_precision = o->prefetch_min_precision < 0 ? 0.5 : o->prefetch_min_precision;
    if (min_precision > 1)
        return df_fail(err, DF_ERR_ARG, "prefetch minimum precision %g is above 1", min_precision);
    df_store *s = df_xcalloc(1, sizeof *s);
    s->m = m;
    s->L = c->num_hidden_layers;
    s->E = c->num_experts;
    s->base.ops = &STORE_OPS;
    int rc;
    if (o->n_pack_dirs > 0) {
        df_pack_ckpt ck = {NULL, &m->cfg, m->st, &m->experts};
        if ((rc = df_pack_open(&s->pack, o->pack_dirs, o->n_pack_dirs, &ck, err))) goto fail;
        s->n_ops = df_pack_stripes(s->pack);
        s->slot_bytes = df_pack_max_padded(s->pack);
    } else {
        int np = inv(s)->layout->n_parts;
        s->n_ops = np;
        for (int li = 0; li < s->L; li++) {
            if (!c->layer_is_moe[li]) continue;
            for (int e = 0; e < s->E; e++) {
                size_t off[DF_EXPERT_MAX_PARTS];
                part_offsets(s, li, e, off);
                size_t need = off[np - 1] + round4k(df_expert_part(inv(s), li, e, np - 1)->nbytes);
                if (need > s->slot_bytes) s->slot_bytes = need;
            }
        }
    }
    int n_moe = 0;
    for (int li = 0; li < s->L; li++) n_moe += c->layer_is_moe[li];
    if ((rc = size_slots(s, o->cache_bytes, n_moe, o->cache_what, err))) goto fail;
    if (pf_mode != DF_PF_OFF)
        s->pf = df_pf_new(n_moe, s->E, c->num_experts_per_tok, (df_pf_mode)pf_mode,
                          o->prefetch_depth ? o->prefetch_depth : 1, min_recall, min_precision);
    s->arena = mmap(NULL, s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->arena == MAP_FAILED) {
        s->arena = NULL;
        rc = df_fail(err, DF_ERR_NOMEM, "cannot reserve %.1f MiB for the expert cache",
                     (double)s->arena_bytes / 1048576.0);
        goto fail;
    }
    /* Huge pages: experts are streamed through at memory bandwidth, and 4 KiB
     * pages would cost a TLB miss every 4 KiB. The arena is faulted in now:
     * a huge page's first touch zeroes (and may compact) 2 MiB, which on the
     * development VM cost 0.3-2.5 s per GiB, paid otherwise by the first tokens
     * (a 512-token prompt's prefill once took 21 s instead of 5). */
    madvise(s->arena, s->arena_bytes, MADV_HUGEPAGE);
    populate_arena(s->arena, s->arena_bytes);
    s->slots = df_xcalloc((size_t)s->n_slots, sizeof(slot));
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].key = -1;
        s->slots[i].pf_layer = -1;
        s->slots[i].mem = s->arena + (size_t)i * s->slot_bytes;
    }
    s->key_slot = df_xmalloc(sizeof(int) * (size_t)s->L * (size_t)s->E);
    for (size_t i = 0; i < (size_t)s->L * (size_t)s->E; i++) s->key_slot[i] = -1;
    s->moe_index = df_xmalloc(sizeof(int) * (size_t)s->L);
    s->moe_layer = df_xmalloc(sizeof(int) * (size_t)s->L);
    for (int li = 0, k = 0; li < s->L; li++) {
        s->moe_index[li] = c->layer_is_moe[li] ? k : -1;
        if (c->layer_is_moe[li]) s->moe_layer[k++] = li;
    }
    s->slotv = df_xmalloc(sizeof(int32_t) * (size_t)s->E);
    s->ids32 = df_xmalloc(sizeof(int32_t) * (size_t)s->E);
    s->hitv = df_xmalloc((size_t)s->E);
    s->want = df_xmalloc(sizeof(int) * (size_t)s->E);
    s->handed = df_xcalloc((size_t)s->E, sizeof(bool));
    s->queue = df_xmalloc(sizeof(int) * (size_t)s->E);
    s->last = df_xmalloc(sizeof(int) * (size_t)s->E);
    s->pred = df_xmalloc(sizeof(int) * (size_t)s->E);
    s->pred_cached = df_xmalloc((size_t)s->E);
    if (o->sim_disk_bps > 0) {
        s->sim_bps = o->sim_disk_bps;
        s->held = df_xmalloc(sizeof(held_cqe) * (size_t)s->n_slots * MAX_OPS);
    }
    const char *faults = getenv("DF_TEST_IO_FAULTS");
    s->fault_short = faults && strstr(faults, "short");
    s->fault_eintr = faults && strstr(faults, "eintr");
    int r = io_uring_queue_init(RING_DEPTH, &s->ring, 0);
    if (r < 0) {
        rc = df_fail(err, DF_ERR_IO, "io_uring_queue_init: %s", strerror(-r));
        goto fail;
    }
    s->ring_ok = true;
    if ((rc = setup_cache(s, o, n_moe, (df_cache_policy)policy, err))) goto fail;
    *out = s;
    return DF_OK;
fail:
    df_store_close(s);
    return rc;
}

void df_store_close(df_store *s) {
    if (!s) return;
    if (s->ring_ok) {
        /* drain reads still in flight into memory we are about to unmap
         * (the simulated disk's held ones have landed already) */
        io_uring_submit(&s->ring);
        for (int i = 0; i < s->n_held; i++) uncount(s, s->held[i].data);
        s->n_held = 0;
        while (s->demand_inflight + s->pf_inflight > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&s->ring, &cqe) < 0) break;
            uncount(s, io_uring_cqe_get_data64(cqe));
            io_uring_cqe_seen(&s->ring, cqe);
        }
        io_uring_queue_exit(&s->ring);
    }
    if (s->cache && s->heat_path) {
        df_error e2;
        if (df_heat_save(df_cache_heat(s->cache), s->heat_path, &e2))
            fprintf(stderr, "deltafin: warning: %s\n", e2.msg); /* losing heat only slows warm-up */
    }
    df_cache_free(s->cache);
    df_pf_free(s->pf);
    free(s->cframe);
    free(s->pool);
    free(s->heat_path);
    free(s->moe_index);
    free(s->moe_layer);
    free(s->slotv);
    free(s->ids32);
    free(s->hitv);
    if (s->arena) munmap(s->arena, s->arena_bytes);
    if (s->pack) df_pack_close(s->pack);
    free(s->slots);
    free(s->key_slot);
    free(s->want);
    free(s->handed);
    free(s->queue);
    free(s->last);
    free(s->pred);
    free(s->pred_cached);
    free(s->held);
    free(s);
}

int df_store_slots(const df_store *s) { return s->n_slots; }
bool df_store_holds_all(const df_store *s) {
    int n_moe = 0;
    for (int li = 0; li < s->L; li++) n_moe += s->m->cfg.layer_is_moe[li];
    return (int64_t)s->n_cache >= (int64_t)n_moe * s->E;
}
size_t df_store_slot_bytes(const df_store *s) { return s->slot_bytes; }
bool df_store_direct(const df_store *s) { return s->pack && df_pack_is_direct(s->pack, 0); }
const char *df_store_source(const df_store *s) { return s->pack ? "pack" : "safetensors"; }
df_store_stats df_store_get_stats(const df_store *s) { return s->st; }

/* ---- reads ----------------------------------------------------------------------- */

/* Submits (the rest of) operation op of slot si; a prefetch only one piece. */
static void submit_op(df_store *s, int si, int op, bool demand) {
    slot *x = &s->slots[si];
    int layer = x->key / s->E, e = x->key % s->E;
    int fd;
    uint64_t foff, len;
    size_t moff;
    op_geometry(s, layer, e, op, &fd, &foff, &len, &moff);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) {
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
    }
    uint64_t d = x->done[op];
    x->len[op] = len;
    uint64_t n = len - d;
    if (!demand && n > PF_CHUNK) n = PF_CHUNK;
    io_uring_prep_read(sqe, fd, x->mem + moff + d, (unsigned)n, foff + d);
    io_uring_sqe_set_data64(sqe, (uint64_t)si * MAX_OPS + (uint64_t)op);
    if (s->sim_bps > 0) {
        double now = df_now();
        s->sim_free = (s->sim_free > now ? s->sim_free : now) + (double)n / s->sim_bps;
        x->due[op] = s->sim_free;
    }
    x->parked[op] = false;
    x->op_demand[op] = demand;
    x->n_inflight++;
    if (demand) s->demand_inflight++;
    else s->pf_inflight++;
}

/* A demand read is submitted now; a prefetch is parked until pump() finds the
 * disk free of demand reads. */
static void start_read(df_store *s, int si, bool demand) {
    slot *x = &s->slots[si];
    x->state = SLOT_LOADING;
    x->ops_left = s->n_ops;
    memset(x->done, 0, sizeof x->done);
    for (int op = 0; op < s->n_ops; op++) {
        if (demand) submit_op(s, si, op, true);
        else x->parked[op] = true;
    }
}

/* Low-priority reads: while no demand read is in flight, keep up to
 * PF_INFLIGHT prefetch pieces going, nearest layer first. */
static void pump(df_store *s) {
    bool any = false;
    while (s->demand_inflight == 0 && s->pf_inflight < PF_INFLIGHT) {
        int best = -1, best_op = -1;
        for (int p = 0; p < s->n_pool; p++) { /* predictions are in the pool */
            int i = s->pool[p];
            const slot *x = &s->slots[i];
            if (x->pf_layer < 0 || x->orphan || x->state != SLOT_LOADING) continue;
            if (best >= 0 && x->pf_layer >= s->slots[best].pf_layer) continue;
            for (int op = 0; op < s->n_ops; op++)
                if (x->parked[op]) {
                    best = i;
                    best_op = op;
                    break;
                }
        }
        if (best < 0) break;
        submit_op(s, best, best_op, false);
        any = true;
    }
    if (any) io_uring_submit(&s->ring);
}

static void fail_slot(df_store *s, int si, const char *what, int errnum) {
    slot *x = &s->slots[si];
    if (s->failed) return;
    s->failed = true;
    const char *src = s->pack ? df_pack_dir(s->pack, 0) : df_st_file_path(s->m->st, 0);
    df_fail(&s->fail, DF_ERR_IO, "%s %s: layer %d expert %d: %s%s%s", s->pack ? "pack" : "checkpoint",
            src, x->key / s->E, x->key % s->E, what, errnum ? ": " : "", errnum ? strerror(errnum) : "");
}

/* Handles one completion; returns the slot that became ready, or -1. */
static int complete(df_store *s, uint64_t d, int res) {
    int si = (int)(d / MAX_OPS), op = (int)(d % MAX_OPS);
    slot *x = &s->slots[si];
    s->n_completions++;
    x->n_inflight--;
    if (x->op_demand[op]) s->demand_inflight--;
    else s->pf_inflight--;
    if (x->orphan) { /* nobody wants this record any more: let the frame go */
        if (res > 0) {
            s->st.bytes_read += (uint64_t)res;
            s->st.prefetch_bytes_wasted += (uint64_t)res;
        }
        if (x->n_inflight == 0) {
            x->orphan = false;
            x->state = SLOT_EMPTY;
        }
        return -1;
    }
    bool demand = x->pf_layer < 0;
    int layer = x->key / s->E, e = x->key % s->E;
    if (s->fault_eintr && res > 0 && s->n_completions % 3 == 0) res = -EINTR;
    if (s->fault_short && res > 8192) {
        /* pretend only the first part arrived, and spoil the rest so that a
         * continuation that skipped it could not pass */
        int fd;
        uint64_t foff, len;
        size_t moff;
        op_geometry(s, layer, e, op, &fd, &foff, &len, &moff);
        int part = (res / 2) & ~4095; /* stays O_DIRECT-aligned */
        memset(x->mem + moff + x->done[op] + part, 0xA5, (size_t)(res - part));
        res = part;
    }
    if (res == -EINTR || res == -EAGAIN) {
        if (demand) submit_op(s, si, op, true);
        else x->parked[op] = true;
        return -1;
    }
    if (res < 0) {
        x->ops_left--;
        fail_slot(s, si, "read failed", -res);
        return -1;
    }
    if (res == 0) {
        x->ops_left--;
        fail_slot(s, si, "unexpected end of file (truncated?)", 0);
        return -1;
    }
    x->done[op] += (uint64_t)res;
    s->st.bytes_read += (uint64_t)res;
    if (!x->op_demand[op] && demand) s->st.prefetch_bytes_used += (uint64_t)res; /* claimed since */
    if (x->done[op] < x->len[op]) { /* short read or a prefetch piece: continue */
        if (demand) submit_op(s, si, op, true);
        else x->parked[op] = true;
        return -1;
    }
    if (--x->ops_left > 0) return -1;
    if (s->failed) return -1;
    s->st.records_read++;
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        if (XXH3_64bits(x->mem, r->length) != r->xxh3) {
            if (x->retried) {
                fail_slot(s, si, "checksum mismatch (after re-reading)", 0);
                return -1;
            }
            x->retried = 1;
            s->st.rereads++;
            start_read(s, si, demand);
            return -1;
        }
    }
    x->state = SLOT_READY;
    return si;
}

/* ---- slots and eviction ----------------------------------------------------------- */

static void drop_key(df_store *s, int si) {
    slot *x = &s->slots[si];
    if (x->key >= 0) s->key_slot[x->key] = -1;
    x->key = -1;
    x->pf_layer = -1;
    memset(x->parked, 0, sizeof x->parked);
    if (x->n_inflight > 0) x->orphan = true; /* the frame frees itself on completion */
    else x->state = SLOT_EMPTY;
}

static uint64_t bytes_done(const df_store *s, const slot *x) {
    uint64_t n = 0;
    for (int op = 0; op < s->n_ops; op++) n += x->done[op];
    return n;
}

/* A prediction that was read (or is being read) and not used: what arrived so
 * far is waste, and so is what its pieces still in flight bring. */
static void waste(df_store *s, int si) {
    s->st.prefetch_bytes_wasted += bytes_done(s, &s->slots[si]);
    drop_key(s, si);
}

/* A transient frame the current layer is not using, or -1: an empty one first;
 * for a demand read (steal), else a frame holding an unclaimed prediction. */
static int find_slot(df_store *s, bool steal) {
    int fallback = -1;
    for (int p = 0; p < s->n_pool; p++) {
        int i = s->pool[p];
        slot *x = &s->slots[i];
        if (x->pin || x->orphan) continue;
        if (x->state == SLOT_EMPTY) return i;
        /* a prediction whose pieces are all parked can be dropped at once */
        bool idle = x->state == SLOT_READY || (x->pf_layer >= 0 && x->n_inflight == 0);
        if (fallback < 0 && idle && (x->pf_layer < 0 || steal)) fallback = i;
    }
    if (fallback >= 0 && s->slots[fallback].pf_layer >= 0) waste(s, fallback);
    return fallback;
}

static void assign(df_store *s, int si, int key, int pf_layer) {
    drop_key(s, si);
    slot *x = &s->slots[si];
    x->key = key;
    x->pin = pf_layer < 0;
    x->pf_layer = pf_layer;
    x->retried = 0;
    s->key_slot[key] = si;
    start_read(s, si, pf_layer < 0);
}

/* Gives queued misses the slots that are free now, and submits their reads. */
static void fill_queue(df_store *s) {
    int kept = 0;
    bool any = false;
    for (int q = 0; q < s->n_queue; q++) {
        int wi = s->queue[q];
        int si = find_slot(s, true);
        if (si < 0) {
            s->queue[kept++] = wi;
            continue;
        }
        assign(s, si, s->layer * s->E + s->want[wi], -1);
        any = true;
    }
    s->n_queue = kept;
    if (any) io_uring_submit(&s->ring);
}

/* Frame `in` joins the pool in place of frame `out`, in frame order. */
static void pool_swap(df_store *s, int out, int in) {
    int p = 0;
    while (s->pool[p] != out) p++;
    for (; p + 1 < s->n_pool; p++) s->pool[p] = s->pool[p + 1];
    for (; p > 0 && s->pool[p - 1] > in; p--) s->pool[p] = s->pool[p - 1];
    s->pool[p] = in;
}

/* A miss that a prediction already brought in (or is bringing in) at frame fi.
 * When the policy keeps the expert in slot ps, the frame becomes that slot's
 * and the victim's frame joins the pool. */
static int claim_prefetched(df_store *s, int fi, int ps, df_error *err) {
    slot *x = &s->slots[fi];
    if (x->cached || x->pf_layer != s->layer) {
        s->failed = true;
        return df_fail(err, DF_ERR_IO, "expert store: prefetch bookkeeping lost layer %d expert %d",
                       s->layer, x->key % s->E);
    }
    x->pf_layer = -1;
    x->pin = 1;
    for (int op = 0; op < s->n_ops; op++) /* it is a demand read now */
        if (x->parked[op]) submit_op(s, fi, op, true);
    s->st.prefetch_hits++;
    s->st.prefetch_bytes_used += bytes_done(s, x);
    if (ps < 0) return DF_OK; /* bypassed: used from the pool, forgotten after the layer */
    int old = s->cframe[ps];
    slot *o = &s->slots[old];
    if (o->pin || o->state == SLOT_LOADING) {
        s->failed = true;
        return df_fail(err, DF_ERR_IO, "expert store: the policy evicted an expert in use (slot %d)", ps);
    }
    drop_key(s, old);
    o->cached = false;
    x->cached = true;
    s->cframe[ps] = fi;
    pool_swap(s, fi, old);
    return DF_OK;
}

int df_store_begin_layer(df_store *s, int layer, const int *experts, int n, df_error *err) {
    if (s->failed) {
        *err = s->fail;
        return err->code;
    }
    if (!s->m->cfg.layer_is_moe[layer] || n > s->E)
        return df_fail(err, DF_ERR_ARG, "expert store: bad request for layer %d", layer);
    s->layer = layer;
    s->n_want = n;
    s->n_handed = 0;
    s->n_queue = 0;
    s->n_last = 0;
    for (int i = 0; i < n; i++) {
        s->want[i] = experts[i];
        s->handed[i] = false;
        s->slotv[i] = -1;
        s->hitv[i] = 0;
    }
    if (s->pf) df_pf_observe(s->pf, s->moe_index[layer], experts, n);
    if (s->cache) {
        for (int i = 0; i < n; i++) s->ids32[i] = experts[i];
        df_cache_access_layer(s->cache, s->moe_index[layer], s->ids32, n, s->slotv, s->hitv);
    }
    for (int i = 0; i < n; i++) {
        int key = layer * s->E + experts[i];
        int fi = s->key_slot[key];
        s->st.requests++;
        if (s->hitv[i]) {
            if (fi < 0 || fi != s->cframe[s->slotv[i]]) {
                s->failed = true;
                return df_fail(err, DF_ERR_IO, "expert store: cache bookkeeping lost layer %d expert %d",
                               layer, experts[i]);
            }
            s->st.hits++;
            s->slots[fi].pin = 1;
            continue;
        }
        s->st.misses++;
        if (fi >= 0) { /* predicted: read ahead already */
            int rc = claim_prefetched(s, fi, s->slotv[i], err);
            if (rc) return rc;
        } else if (s->slotv[i] >= 0) { /* admitted: read into the slot the policy freed */
            assign(s, s->cframe[s->slotv[i]], key, -1);
        } else {
            s->queue[s->n_queue++] = i; /* bypassed: a transient slot when one is free */
        }
    }
    /* Predictions for this layer that it did not ask for were wrong. */
    if (s->pf)
        for (int p = 0; p < s->n_pool; p++)
            if (s->slots[s->pool[p]].pf_layer == layer) waste(s, s->pool[p]);
    io_uring_submit(&s->ring);
    fill_queue(s);
    pump(s);
    return DF_OK;
}

static void fill_weights(const df_store *s, int layer, int e, const slot *x, df_expert_w *w) {
    size_t off[DF_EXPERT_MAX_PARTS];
    const void *parts[DF_EXPERT_MAX_PARTS];
    part_offsets(s, layer, e, off);
    for (int p = 0; p < inv(s)->layout->n_parts; p++) parts[p] = x->mem + off[p];
    df_expert_bind(inv(s), layer, e, parts, w);
}

/* Hands out the ready experts not handed out yet, up to cap; 0 when none is. */
static int hand_out(df_store *s, int cap, int *ids, df_expert_w *w) {
    int n = 0;
    for (int i = 0; i < s->n_want && n < cap; i++) {
        if (s->handed[i]) continue;
        int si = s->key_slot[s->layer * s->E + s->want[i]];
        if (si < 0 || s->slots[si].state != SLOT_READY) continue;
        s->handed[i] = true;
        s->n_handed++;
        s->last[s->n_last++] = si;
        ids[n] = s->want[i];
        fill_weights(s, s->layer, s->want[i], &s->slots[si], &w[n]);
        n++;
    }
    return n;
}

int df_store_next(df_store *s, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err) {
    *n_out = 0;
    for (int i = 0; i < s->n_last; i++) /* the caller is done with the previous ones */
        s->slots[s->last[i]].pin = 0;
    s->n_last = 0;
    while (s->n_handed < s->n_want) {
        if (s->failed) {
            *err = s->fail;
            return err->code;
        }
        /* reap whatever has finished without blocking */
        uint64_t d;
        int res;
        while (next_cqe(s, false, &d, &res) > 0) complete(s, d, res);
        if (s->n_queue) fill_queue(s);
        pump(s);
        /* While misses wait for a transient slot, one expert at a time: each
         * one used frees its slot for the next read. */
        if ((*n_out = hand_out(s, s->n_queue ? 1 : cap, ids, w)) > 0) return DF_OK;
        if (s->failed) continue;
        /* nothing ready: block on the disk */
        io_uring_submit(&s->ring);
        if (s->demand_inflight + s->pf_inflight == 0) {
            s->failed = true;
            return df_fail(err, DF_ERR_IO, "expert store: layer %d waits for a read never issued",
                           s->layer);
        }
        double t0 = df_now();
        int r = next_cqe(s, true, &d, &res);
        s->st.wait_s += df_now() - t0;
        if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_wait_cqe: %s", strerror(-r));
        complete(s, d, res);
    }
    return DF_OK;
}

void df_store_end_layer(df_store *s) {
    for (int i = 0; i < s->n_want; i++) {
        int si = s->key_slot[s->layer * s->E + s->want[i]];
        if (si < 0) continue;
        s->slots[si].pin = 0;
        if (!s->slots[si].cached && s->slots[si].state == SLOT_READY) drop_key(s, si); /* transient */
    }
    s->n_last = 0;
    s->n_want = s->n_handed = s->n_queue = 0;
    pump(s);
}

void df_store_end_step(df_store *s, int rows) {
    if (s->cache) df_cache_token_end(s->cache);
    double now = df_now();
    if (s->pf && s->last_step_t > 0)
        df_pf_step(s->pf, now - s->last_step_t, rows, (int)(s->st.misses - s->last_step_misses));
    s->last_step_t = now;
    s->last_step_misses = s->st.misses;
    /* predictions for layers the step never reached (an error stopped it) */
    if (s->pf)
        for (int p = 0; p < s->n_pool; p++)
            if (s->slots[s->pool[p]].pf_layer >= 0) waste(s, s->pool[p]);
}

int df_store_pinned(const df_store *s) { return s->st_pinned; }

/* ---- read-ahead ---------------------------------------------------------------------- */

double df_store_sim_disk(const df_store *s) { return s->sim_bps; }
int df_store_prefetch_depth(const df_store *s) { return s->pf ? df_pf_depth(s->pf) : 0; }
int df_store_lookahead_depth(const df_store *s) { return s->pf && df_pf_wanted(s->pf) ? df_pf_depth(s->pf) : 0; }

const char *df_store_prefetch_mode(const df_store *s) {
    return s->pf ? df_pf_mode_name(df_pf_get_mode(s->pf)) : "off";
}

const char *df_store_prefetch_gate(const df_store *s, double *speedup) {
    *speedup = s->pf ? df_pf_gate_speedup(s->pf) : 0;
    return s->pf ? df_pf_gate_state(s->pf) : "off";
}

int df_store_moe_layers(const df_store *s) {
    int n = 0;
    for (int li = 0; li < s->L; li++) n += s->moe_index[li] >= 0;
    return n;
}

void df_store_prefetch_layer(const df_store *s, int moe_layer, struct df_pf_layer_stats *out) {
    memset(out, 0, sizeof *out);
    if (s->pf) df_pf_layer(s->pf, moe_layer, out);
}

void df_store_predict(df_store *s, int layer, const int *sel, int n_sel) {
    if (!s->pf || s->failed || s->moe_index[layer] < 0) return;
    for (int e = 0; e < s->E; e++) s->pred_cached[e] = s->key_slot[layer * s->E + e] >= 0;
    int n = df_pf_predict(s->pf, s->moe_index[layer], sel, n_sel, s->pred_cached, s->pred);
    if (!df_pf_active(s->pf)) return; /* scored, not read: the time gate says it does not pay */
    if (s->n_queue) { /* the current layer still waits for slots: it comes first */
        s->st.prefetch_no_room += (uint64_t)n;
        return;
    }
    const int *pred = s->pred;
    for (int i = 0; i < n; i++) {
        int key = layer * s->E + pred[i];
        if (s->key_slot[key] >= 0) continue; /* cached, or already on its way */
        int si = find_slot(s, false);
        if (si < 0) {
            s->st.prefetch_no_room += (uint64_t)(n - i);
            break;
        }
        assign(s, si, key, layer);
        s->st.prefetch_reads++;
    }
    pump(s);
}
