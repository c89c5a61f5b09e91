/*
 * store.c - the expert store (see store.h): its slots, the per-layer
 * request/hand-out protocol, the glue to the cache policy and the prefetcher,
 * the expert source the model layer sees, and open/close. How a record is read
 * is store_io.c's; the simulated disk is store_simdisk.c's; the test build's
 * fault injection is store_faults.c's. Read docs/expert-store.md first.
 *
 * A slot holds one expert record. The policy (policy.h) owns n_cache slot
 * numbers and decides on every miss whether the expert is kept and what it
 * displaces; cframe[] maps its slot numbers to frames of memory. The other
 * frames form the transient pool: experts the policy chose not to keep are
 * read there, used by the current layer and forgotten, and predicted experts
 * are read there ahead of need (prefetch.h). When the policy admits an expert
 * a prediction already brought in (or is still bringing in), the frame changes
 * hands instead of being copied: the policy slot now maps to it and the
 * victim's frame joins the pool. A wrong prediction is dropped when its layer
 * comes: a finished read frees its frame at once, one still in flight is
 * orphaned and frees it on completion. The policy's heat histogram is loaded
 * at open and saved at close (next to the pack), and the hottest experts can
 * be pinned and read in at start-up.
 */
#include "experts/store_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

static void assign(df_store *s, int si, int key, int pf_layer);

/* ---- the cache policy ---------------------------------------------------------------- */

/* A few transient slots let the policy turn one-off experts away; predictions
 * share them rather than shrink the cache (docs/expert-store.md, "Slots"). */
static int n_transient(const df_store *s) {
    int top_k = s->m->cfg.num_experts_per_tok;
    int t = s->n_slots / 8 < top_k ? s->n_slots / 8 : top_k;
    return t < 1 ? 1 : t;
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
        if ((rc = store_wait_ready(s, s->cframe[si], err))) return rc;
        s->slots[s->cframe[si]].pin = 0;
        s->st_pinned++;
    }
    return DF_OK;
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
    store_start_read(s, si, pf_layer < 0);
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
    if (any) store_io_submit(s);
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
        if (x->parked[op]) store_submit_op(s, fi, op, true);
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
    store_io_submit(s);
    fill_queue(s);
    store_pump(s);
    return DF_OK;
}

static void fill_weights(const df_store *s, int layer, int e, const slot *x, df_expert_w *w) {
    size_t off[DF_EXPERT_MAX_PARTS];
    const void *parts[DF_EXPERT_MAX_PARTS];
    store_part_offsets(s, layer, e, off);
    for (int p = 0; p < store_inv(s)->layout->n_parts; p++) parts[p] = x->mem + off[p];
    df_expert_bind(store_inv(s), layer, e, parts, w);
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
        while (store_next_cqe(s, false, &d, &res) > 0) store_complete(s, d, res);
        if (s->n_queue) fill_queue(s);
        store_pump(s);
        /* While misses wait for a transient slot, one expert at a time: each
         * one used frees its slot for the next read. */
        if ((*n_out = hand_out(s, s->n_queue ? 1 : cap, ids, w)) > 0) return DF_OK;
        if (s->failed) continue;
        /* nothing ready: block on the disk */
        store_io_submit(s);
        if (s->demand_inflight + s->pf_inflight == 0) {
            s->failed = true;
            return df_fail(err, DF_ERR_IO, "expert store: layer %d waits for a read never issued",
                           s->layer);
        }
        double t0 = df_now();
        int r = store_next_cqe(s, true, &d, &res);
        s->st.wait_s += df_now() - t0;
        if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_wait_cqe: %s", strerror(-r));
        store_complete(s, d, res);
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
    store_pump(s);
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
    store_pump(s);
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
                                         xs_close, NULL, NULL};

df_xsource *df_store_xsource(df_store *s) { return &s->base; }

/* ---- open / close ------------------------------------------------------------------ */

/* n_slots and arena_bytes for cache_bytes of slots: never more than every
 * expert plus the transient slots. The count is taken in 64 bits and capped
 * before it becomes an int (a cache of "everything", a budget of 400T, must
 * not wrap to a negative count). */
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

/* The options that need no model: the policy, the prefetch mode and its thresholds. */
typedef struct store_choice {
    int policy, pf_mode;
    double min_recall, min_precision;
} store_choice;

static int check_opts(const df_store_opts *o, store_choice *ch, df_error *err) {
    ch->policy = df_cache_policy_from_name(o->policy ? o->policy : "deltafin");
    if (ch->policy < 0 || ch->policy == DF_POLICY_BELADY)
        return df_fail(err, DF_ERR_ARG, "unknown cache policy '%s' (use deltafin or lru)", o->policy);
    ch->pf_mode = df_pf_mode_from_name(o->prefetch ? o->prefetch : "off");
    if (ch->pf_mode < 0)
        return df_fail(err, DF_ERR_ARG, "unknown prefetch mode '%s' (use on, off, router or prev)",
                       o->prefetch);
    if (o->prefetch_depth < 0 || o->prefetch_depth > 8)
        return df_fail(err, DF_ERR_ARG, "prefetch depth %d out of range 1..8", o->prefetch_depth);
    /* 0.5 defaults: docs/prefetch.md, "The gate" */
    ch->min_recall = o->prefetch_min_recall < 0 ? 0.5 : o->prefetch_min_recall;
    if (ch->min_recall > 1)
        return df_fail(err, DF_ERR_ARG, "prefetch minimum recall %g is above 1", ch->min_recall);
    ch->min_precision = o->prefetch_min_precision < 0 ? 0.5 : o->prefetch_min_precision;
    if (ch->min_precision > 1)
        return df_fail(err, DF_ERR_ARG, "prefetch minimum precision %g is above 1", ch->min_precision);
    return DF_OK;
}

/* The frames, on huge pages and faulted in now: the first tokens would pay
 * for it otherwise (docs/expert-store.md, "Slots"). */
static int alloc_arena(df_store *s, df_error *err) {
    s->arena = mmap(NULL, s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->arena == MAP_FAILED) {
        s->arena = NULL;
        return df_fail(err, DF_ERR_NOMEM, "cannot reserve %.1f MiB for the expert cache",
                       (double)s->arena_bytes / 1048576.0);
    }
    df_advise_huge(s->arena, s->arena_bytes);
    df_prefault_write(s->arena, s->arena_bytes);
    s->slots = df_xcalloc((size_t)s->n_slots, sizeof(slot));
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].key = -1;
        s->slots[i].pf_layer = -1;
        s->slots[i].mem = s->arena + (size_t)i * s->slot_bytes;
    }
    return DF_OK;
}

/* The lookup tables and the per-layer scratch. */
static void alloc_tables(df_store *s) {
    const df_config *c = &s->m->cfg;
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
}

int df_store_open(df_store **out, const df_model *m, const df_store_opts *o, df_error *err) {
    *out = NULL;
    const df_config *c = &m->cfg;
    if (c->num_experts <= 0)
        return df_fail(err, DF_ERR_ARG, "the model has no routed experts to stream");
    store_choice ch = {0};
    int rc = check_opts(o, &ch, err);
    if (rc) return rc;
    df_store *s = df_xcalloc(1, sizeof *s);
    s->m = m;
    s->L = c->num_hidden_layers;
    s->E = c->num_experts;
    s->base.ops = &STORE_OPS;
    if ((rc = store_source_open(s, o, err))) goto fail;
    int n_moe = 0;
    for (int li = 0; li < s->L; li++) n_moe += c->layer_is_moe[li];
    if ((rc = size_slots(s, o->cache_bytes, n_moe, o->cache_what, err))) goto fail;
    if (ch.pf_mode != DF_PF_OFF)
        s->pf = df_pf_new(n_moe, s->E, c->num_experts_per_tok, (df_pf_mode)ch.pf_mode,
                          o->prefetch_depth ? o->prefetch_depth : 1, ch.min_recall, ch.min_precision);
    if ((rc = alloc_arena(s, err))) goto fail;
    alloc_tables(s);
    if (o->sim_disk_bps > 0) store_sim_open(s, o->sim_disk_bps);
#ifdef DF_TEST_HOOKS
    store_faults_init(s);
#endif
    if ((rc = store_io_open(s, err))) goto fail;
    if ((rc = setup_cache(s, o, n_moe, (df_cache_policy)ch.policy, err))) goto fail;
    *out = s;
    return DF_OK;
fail:
    df_store_close(s);
    return rc;
}

void df_store_close(df_store *s) {
    if (!s) return;
    store_io_close(s);
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
