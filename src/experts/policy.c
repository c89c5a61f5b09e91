/*
 * policy.c - the expert cache and its policies (lru, belady, deltafin); see
 * policy.h for the contract and docs/cache-policy.md for why deltafin ranks
 * entries the way it does.
 *
 * Data layout: per key (layer * n_experts + expert) the slot, the token and the
 * layer-step stamp of its last use and its heat bucket; per slot the key and
 * doubly-linked list links. All arrays are allocated once in df_cache_new.
 *
 * deltafin keeps one recency list per (layer, heat bucket). Inside a list every
 * entry shares the bucket and the layer, hence the distance to its next routing
 * opportunity, so its oldest entry (the tail) has the most missed opportunities
 * and the lowest hazard: the tail is the list's only eviction candidate. A
 * tournament tree over the lists' tails (leaf = list, value = the tail's hazard)
 * finds the victim in O(log lists); ties go to the list whose layer comes up last,
 * which the tree answers with two range queries around the current layer.
 * The cache's fields are in policy_internal.h, its self-check in policy_check.c.
 */
#include "experts/policy_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *df_cache_policy_name(df_cache_policy p) {
    switch (p) {
    case DF_POLICY_LRU: return "lru";
    case DF_POLICY_BELADY: return "belady";
    case DF_POLICY_DELTAFIN: return "deltafin";
    default: return "?";
    }
}

int df_cache_policy_from_name(const char *name) {
    for (int p = 0; p < DF_POLICY_COUNT; p++)
        if (name && strcmp(name, df_cache_policy_name((df_cache_policy)p)) == 0) return p;
    return -1;
}


/* ---- slot lists (lru: one list; deltafin: one per (layer, bucket)) ------- */

static void list_unlink(df_cache *c, int32_t *head, int32_t *tail, int32_t s) {
    if (c->prev[s] >= 0) c->next[c->prev[s]] = c->next[s];
    else *head = c->next[s];
    if (c->next[s] >= 0) c->prev[c->next[s]] = c->prev[s];
    else *tail = c->prev[s];
    c->prev[s] = c->next[s] = -1;
}

static void list_push_head(df_cache *c, int32_t *head, int32_t *tail, int32_t s) {
    c->prev[s] = -1;
    c->next[s] = *head;
    if (*head >= 0) c->prev[*head] = s;
    else *tail = s;
    *head = s;
}

/* ---- deltafin: hazard table and tournament tree -------------------------- */

static int heat_bucket(const df_cache *c, int32_t key) {
    double r = df_heat_rate(&c->rank, key) / c->p0;
    int b = 0;
    while (b < c->NB - 1 && r >= BUCKET_EDGES[b]) b++;
    return b;
}

static void relearn(df_cache *c) {
    for (int b = 0; b < c->NB; b++) {
        double prev = INF_H;
        for (int m = 0; m <= c->M; m++) {
            int i = m * c->NB + b;
            /* one pseudo-observation at the uniform rate keeps empty cells sane */
            double h = (c->num[i] + c->p0) / (c->den[i] + 1.0);
            /* more missed opportunities never make an expert likelier: enforcing
             * this keeps the tail of each list its best candidate */
            if (h > prev) h = prev;
            c->H[i] = prev = h;
        }
    }
}

double df_cache_leaf_value(const df_cache *c, int list) {
    int32_t s = c->ltail[list];
    if (s < 0) return INF_H;
    int32_t key = c->key[s];
    if (protected_key(c, key)) return INF_H;
    int l = list / c->NB, b = list % c->NB;
    int64_t m = c->tok - c->last_tok[key] - (l > c->cur_l ? 1 : 0);
    if (m < 0) m = 0;
    if (m > c->M) m = c->M;
    return c->H[m * c->NB + b];
}

static inline int32_t better(const df_cache *c, int32_t a, int32_t b) {
    if (a < 0) return b;
    if (b < 0) return a;
    double va = c->leafv[a], vb = c->leafv[b];
    if (va != vb) return va < vb ? a : b;
    return a > b ? a : b; /* later layer in the range: its next opportunity is later */
}

static void tree_update(df_cache *c, int list) {
    c->leafv[list] = df_cache_leaf_value(c, list);
    for (int n = (c->P + list) >> 1; n >= 1; n >>= 1)
        c->tree[n] = better(c, c->tree[2 * n], c->tree[2 * n + 1]);
}

static void tree_rebuild(df_cache *c) {
    for (int i = 0; i < c->P; i++) {
        if (i < c->n_lists) c->leafv[i] = df_cache_leaf_value(c, i);
        c->tree[c->P + i] = i < c->n_lists ? i : -1;
    }
    for (int n = c->P - 1; n >= 1; n--) c->tree[n] = better(c, c->tree[2 * n], c->tree[2 * n + 1]);
}

static int32_t tree_query(const df_cache *c, int lo, int hi) { /* inclusive */
    int32_t res = -1;
    for (int a = lo + c->P, b = hi + c->P + 1; a < b; a >>= 1, b >>= 1) {
        if (a & 1) res = better(c, res, c->tree[a++]);
        if (b & 1) res = better(c, res, c->tree[--b]);
    }
    return res;
}

static void refresh_layer(df_cache *c, int l) {
    for (int b = 0; b < c->NB; b++) tree_update(c, l * c->NB + b);
}

/* The list whose tail should go, or -1 when every entry is protected. */
int df_cache_victim_list(const df_cache *c) {
    int l = c->cur_l < 0 ? 0 : c->cur_l;
    int NB = c->NB;
    /* layers after the current one come up in this token, those up to and
     * including it only in the next: on equal hazard the latter go first */
    int32_t soon = l + 1 < c->L ? tree_query(c, (l + 1) * NB, c->L * NB - 1) : -1;
    int32_t late = tree_query(c, 0, (l + 1) * NB - 1);
    if (soon >= 0 && c->leafv[soon] >= INF_H) soon = -1;
    if (late >= 0 && c->leafv[late] >= INF_H) late = -1;
    if (soon < 0) return late;
    if (late < 0) return soon;
    return c->leafv[late] <= c->leafv[soon] ? late : soon;
}

static void learn_use(df_cache *c, int32_t key) {
    int64_t last = c->last_tok[key];
    if (last < 0) return;
    int64_t missed = c->tok - last - 1; /* opportunities passed without this key */
    if (missed < 0) return;             /* second lookup in the same token */
    int b = c->bucket[key], M = c->M, NB = c->NB;
    int64_t upto = missed < M ? missed : M;
    for (int64_t m = 0; m < upto; m++) c->den[m * NB + b] += 1.0;
    /* the capped state was visited (missed - M) times without use, then used */
    c->den[upto * NB + b] += (double)(missed - upto) + 1.0;
    c->num[upto * NB + b] += 1.0;
}

/* ---- belady: max-heap over slots by next use ------------------------------ */

static void heap_swap(df_cache *c, int i, int j) {
    int32_t a = c->heap[i], b = c->heap[j];
    c->heap[i] = b;
    c->heap[j] = a;
    c->hpos[b] = i;
    c->hpos[a] = j;
}
static void heap_up(df_cache *c, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (c->nu[c->heap[p]] >= c->nu[c->heap[i]]) break;
        heap_swap(c, i, p);
        i = p;
    }
}
static void heap_down(df_cache *c, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < c->heap_n && c->nu[c->heap[l]] > c->nu[c->heap[m]]) m = l;
        if (r < c->heap_n && c->nu[c->heap[r]] > c->nu[c->heap[m]]) m = r;
        if (m == i) return;
        heap_swap(c, i, m);
        i = m;
    }
}
static void heap_push(df_cache *c, int32_t s) {
    c->heap[c->heap_n] = s;
    c->hpos[s] = c->heap_n++;
    heap_up(c, c->heap_n - 1);
}
static void heap_remove(df_cache *c, int32_t s) {
    int i = c->hpos[s];
    c->heap_n--;
    if (i != c->heap_n) {
        heap_swap(c, i, c->heap_n);
        int32_t moved = c->heap[i];
        heap_up(c, i);
        heap_down(c, c->hpos[moved]);
    }
    c->hpos[s] = -1;
}
static void heap_fix(df_cache *c, int32_t s) {
    heap_up(c, c->hpos[s]);
    heap_down(c, c->hpos[s]);
}
/* Unprotected slot with the farthest next use, -1 if none. */
static int32_t belady_victim(df_cache *c) {
    int ns = 0;
    int32_t v = -1;
    while (c->heap_n > 0) {
        int32_t top = c->heap[0];
        if (!protected_key(c, c->key[top])) {
            v = top;
            break;
        }
        heap_remove(c, top);
        c->stash[ns++] = top;
    }
    while (ns > 0) heap_push(c, c->stash[--ns]);
    return v;
}

/* ---- construction ---------------------------------------------------------- */

void df_cache_free(df_cache *c) {
    if (!c) return;
    df_heat_free(&c->heat);
    df_heat_free(&c->rank);
    free(c->slot_of);
    free(c->last_tok);
    free(c->use_stamp);
    free(c->bucket);
    free(c->key_next);
    free(c->key);
    free(c->prev);
    free(c->next);
    free(c->list_of);
    free(c->pinned);
    free(c->free_stack);
    free(c->lhead);
    free(c->ltail);
    free(c->num);
    free(c->den);
    free(c->H);
    free(c->leafv);
    free(c->tree);
    free(c->nu);
    free(c->heap);
    free(c->hpos);
    free(c->stash);
    free(c->order);
    free(c);
}

static int check_opts(const df_cache_opts *o, df_error *err) {
    if (!o) return df_fail(err, DF_ERR_ARG, "cache: no options");
    if (o->n_layers < 1 || o->n_experts < 1 || o->n_layers > 65536 || o->n_experts > 65536 ||
        (int64_t)o->n_layers * o->n_experts > (1 << 26))
        return df_fail(err, DF_ERR_ARG, "cache: bad shape %d layers x %d experts",
                       o->n_layers, o->n_experts);
    if (o->top_k < 1 || o->top_k > o->n_experts)
        return df_fail(err, DF_ERR_ARG, "cache: top_k %d not in [1, %d]", o->top_k,
                       o->n_experts);
    if (o->n_slots < 1)
        return df_fail(err, DF_ERR_ARG, "cache: needs at least one slot, got %d", o->n_slots);
    if ((int)o->policy < 0 || o->policy >= DF_POLICY_COUNT)
        return df_fail(err, DF_ERR_ARG, "cache: unknown policy %d", (int)o->policy);
    if (o->n_pinned < 0 || o->n_pinned > o->n_slots)
        return df_fail(err, DF_ERR_ARG, "cache: %d pinned entries for %d slots", o->n_pinned,
                       o->n_slots);
    if (o->n_pinned > 0 && !o->initial_heat)
        return df_fail(err, DF_ERR_ARG, "cache: pinning needs an initial heat histogram");
    if (o->initial_heat && (o->initial_heat->n_layers != o->n_layers ||
                            o->initial_heat->n_experts != o->n_experts))
        return df_fail(err, DF_ERR_ARG,
                       "cache: initial heat is %d x %d, the cache is %d layers x %d experts",
                       o->initial_heat->n_layers, o->initial_heat->n_experts, o->n_layers,
                       o->n_experts);
    const df_cache_tuning *tu = &o->tuning;
    if (tu->n_buckets < 0 || tu->n_buckets > NB_MAX)
        return df_fail(err, DF_ERR_ARG, "cache: tuning buckets=%d is outside 0..%d (0: the default)", tu->n_buckets,
                       NB_MAX);
    if (tu->max_missed < 0 || tu->max_missed > 4096)
        return df_fail(err, DF_ERR_ARG, "cache: tuning max_missed=%d is outside 0..4096 (0: the default)",
                       tu->max_missed);
    if (tu->relearn_tokens < 0)
        return df_fail(err, DF_ERR_ARG, "cache: tuning relearn=%d is negative", tu->relearn_tokens);
    /* written so that NaN fails */
    if (!(tu->admit_factor >= 0) || !(tu->learn_half_life >= 0) || !(tu->prior_tokens >= 0))
        return df_fail(err, DF_ERR_ARG, "cache: tunings admit, learn_half_life and prior_tokens must be numbers >= 0 "
                       "(got %g, %g, %g)", tu->admit_factor, tu->learn_half_life, tu->prior_tokens);
    return DF_OK;
}

/* The per-key and per-slot arrays every policy uses, all empty. */
static void alloc_common(df_cache *c) {
    size_t nk = (size_t)c->nk, ns = (size_t)c->n_slots;
    c->slot_of = df_xmalloc(nk * sizeof *c->slot_of);
    c->last_tok = df_xmalloc(nk * sizeof *c->last_tok);
    c->use_stamp = df_xcalloc(nk, sizeof *c->use_stamp);
    c->bucket = df_xcalloc(nk, sizeof *c->bucket);
    c->key = df_xmalloc(ns * sizeof *c->key);
    c->prev = df_xmalloc(ns * sizeof *c->prev);
    c->next = df_xmalloc(ns * sizeof *c->next);
    c->list_of = df_xmalloc(ns * sizeof *c->list_of);
    c->pinned = df_xcalloc(ns, 1);
    c->free_stack = df_xmalloc(ns * sizeof *c->free_stack);
    for (size_t i = 0; i < nk; i++) {
        c->slot_of[i] = -1;
        c->last_tok[i] = -1;
    }
    for (size_t i = 0; i < ns; i++) {
        c->key[i] = -1;
        c->prev[i] = c->next[i] = c->list_of[i] = -1;
    }
    c->head = c->tail = -1;
    c->cur_l = -1;
    c->stamp = 1;
}

/* The tuning (kept for every policy), and deltafin's lists, hazard table and
 * tree, and its view of the heat. */
static int init_deltafin(df_cache *c, const df_cache_opts *o, df_error *err) {
    const df_cache_tuning *tu = &o->tuning;
    c->NB = tu->n_buckets ? tu->n_buckets : NB_MAX;
    c->M = tu->max_missed ? tu->max_missed : 16;
    c->relearn = tu->relearn_tokens ? tu->relearn_tokens : 8;
    c->admit_factor = tu->admit_factor > 0 ? tu->admit_factor : 0.85;
    c->learn_decay = tu->learn_half_life > 0 ? exp2(-(double)c->relearn / tu->learn_half_life)
                                             : 1.0;
    c->p0 = (double)c->K / (double)c->E;
    if (c->policy != DF_POLICY_DELTAFIN) return DF_OK;
    c->n_lists = c->L * c->NB;
    c->lhead = df_xmalloc((size_t)c->n_lists * sizeof *c->lhead);
    c->ltail = df_xmalloc((size_t)c->n_lists * sizeof *c->ltail);
    for (int i = 0; i < c->n_lists; i++) c->lhead[i] = c->ltail[i] = -1;
    size_t nh = (size_t)(c->M + 1) * (size_t)c->NB;
    c->num = df_xcalloc(nh, sizeof *c->num);
    c->den = df_xcalloc(nh, sizeof *c->den);
    c->H = df_xcalloc(nh, sizeof *c->H);
    int rc = o->initial_heat ? df_heat_copy(&c->rank, o->initial_heat, err)
                             : df_heat_init(&c->rank, c->L, c->E, o->heat_half_life, err);
    if (rc) return rc;
    /* a histogram from another workload must not outvote this run for long */
    double prior = tu->prior_tokens > 0 ? tu->prior_tokens : 128.0;
    if (c->rank.norm > prior) df_heat_scale(&c->rank, prior / c->rank.norm);
    c->P = 1;
    while (c->P < c->n_lists) c->P *= 2;
    c->leafv = df_xcalloc((size_t)c->P, sizeof *c->leafv);
    c->tree = df_xmalloc(2 * (size_t)c->P * sizeof *c->tree);
    relearn(c);
    tree_rebuild(c);
    /* a persisted histogram gives the buckets meaning from the first token */
    for (int i = 0; i < c->nk; i++) c->bucket[i] = (uint8_t)heat_bucket(c, i);
    return DF_OK;
}

static void init_belady(df_cache *c) {
    if (c->policy != DF_POLICY_BELADY) return;
    size_t nk = (size_t)c->nk, ns = (size_t)c->n_slots;
    c->key_next = df_xmalloc(nk * sizeof *c->key_next);
    for (size_t i = 0; i < nk; i++) c->key_next[i] = UINT64_MAX;
    c->nu = df_xmalloc(ns * sizeof *c->nu);
    c->heap = df_xmalloc(ns * sizeof *c->heap);
    c->hpos = df_xmalloc(ns * sizeof *c->hpos);
    c->stash = df_xmalloc(ns * sizeof *c->stash);
    c->order = df_xmalloc((size_t)c->E * sizeof *c->order);
    for (size_t i = 0; i < ns; i++) c->hpos[i] = -1;
}

/* The pinned tier: the hottest persisted entries, resident for good; the
 * other slots are free. */
static void pin_hottest(df_cache *c, const df_cache_opts *o) {
    int np = 0;
    if (o->n_pinned > 0) {
        int32_t *top = df_xmalloc((size_t)o->n_pinned * sizeof *top);
        int hot = df_heat_top(&c->heat, o->n_pinned, top);
        for (; np < hot; np++) {
            c->key[np] = top[np];
            c->slot_of[top[np]] = np;
            c->pinned[np] = 1;
        }
        free(top);
    }
    c->n_pinned = np;
    for (int s = c->n_slots - 1; s >= np; s--) c->free_stack[c->n_free++] = s;
}

int df_cache_new(df_cache **out, const df_cache_opts *o, df_error *err) {
    *out = NULL;
    int rc = check_opts(o, err);
    if (rc) return rc;
    df_cache *c = df_xcalloc(1, sizeof *c);
    c->policy = o->policy;
    c->L = o->n_layers;
    c->E = o->n_experts;
    c->K = o->top_k;
    c->nk = c->L * c->E;
    c->n_slots = o->n_slots > c->nk ? c->nk : o->n_slots;
    rc = o->initial_heat ? df_heat_copy(&c->heat, o->initial_heat, err)
                         : df_heat_init(&c->heat, c->L, c->E, o->heat_half_life, err);
    if (rc) {
        free(c);
        return rc;
    }
    alloc_common(c);
    if ((rc = init_deltafin(c, o, err))) {
        df_cache_free(c);
        return rc;
    }
    init_belady(c);
    pin_hottest(c, o);
    *out = c;
    return DF_OK;
}

/* ---- operations ------------------------------------------------------------ */

static void enter_layer(df_cache *c, int l) {
    if (l == c->cur_l) return;
    int old = c->cur_l;
    c->cur_l = l;
    c->stamp++;
    if (c->policy != DF_POLICY_DELTAFIN) return;
    if (l > old) {
        /* layers passed since old had an opportunity: their m grew by one; old's
         * own entries lose their protection */
        for (int x = old < 0 ? 0 : old; x <= l; x++) refresh_layer(c, x);
    } else {
        tree_rebuild(c); /* out-of-order layers: correct, just slower */
    }
}

int df_cache_lookup(df_cache *c, int layer, int expert) {
    if (layer < 0 || layer >= c->L || expert < 0 || expert >= c->E) return -1;
    enter_layer(c, layer);
    int32_t key = layer * c->E + expert;
    c->st.accesses++;
    if (c->policy == DF_POLICY_DELTAFIN) learn_use(c, key);
    df_heat_add(&c->heat, key);
    c->last_tok[key] = c->tok;
    c->use_stamp[key] = c->stamp;
    if (c->policy == DF_POLICY_DELTAFIN) {
        df_heat_add(&c->rank, key);
        c->bucket[key] = (uint8_t)heat_bucket(c, key);
    }
    int32_t s = c->slot_of[key];
    if (s < 0) {
        c->st.misses++;
        return -1;
    }
    c->st.hits++;
    if (c->pinned[s]) return s;
    switch (c->policy) {
    case DF_POLICY_LRU:
        list_unlink(c, &c->head, &c->tail, s);
        list_push_head(c, &c->head, &c->tail, s);
        break;
    case DF_POLICY_BELADY:
        c->nu[s] = c->key_next[key];
        heap_fix(c, s);
        break;
    case DF_POLICY_DELTAFIN: {
        int from = c->list_of[s], to = layer * c->NB + c->bucket[key];
        list_unlink(c, &c->lhead[from], &c->ltail[from], s);
        list_push_head(c, &c->lhead[to], &c->ltail[to], s);
        c->list_of[s] = to;
        tree_update(c, from);
        if (to != from) tree_update(c, to);
        break;
    }
    default: break;
    }
    return s;
}

static void place(df_cache *c, int32_t s, int32_t key) {
    c->key[s] = key;
    c->slot_of[key] = s;
    switch (c->policy) {
    case DF_POLICY_LRU: list_push_head(c, &c->head, &c->tail, s); break;
    case DF_POLICY_BELADY:
        c->nu[s] = c->key_next[key];
        heap_push(c, s);
        break;
    case DF_POLICY_DELTAFIN: {
        int list = (key / c->E) * c->NB + c->bucket[key];
        list_push_head(c, &c->lhead[list], &c->ltail[list], s);
        c->list_of[s] = list;
        tree_update(c, list);
        break;
    }
    default: break;
    }
}

static void unplace(df_cache *c, int32_t s) {
    int32_t key = c->key[s];
    switch (c->policy) {
    case DF_POLICY_LRU: list_unlink(c, &c->head, &c->tail, s); break;
    case DF_POLICY_BELADY: heap_remove(c, s); break;
    case DF_POLICY_DELTAFIN: {
        int list = c->list_of[s];
        list_unlink(c, &c->lhead[list], &c->ltail[list], s);
        c->list_of[s] = -1;
        tree_update(c, list);
        break;
    }
    default: break;
    }
    c->slot_of[key] = -1;
    c->key[s] = -1;
}

int df_cache_admit(df_cache *c, int layer, int expert, int32_t *evicted) {
    if (evicted) *evicted = -1;
    if (layer < 0 || layer >= c->L || expert < 0 || expert >= c->E) return -1;
    int32_t key = layer * c->E + expert;
    if (c->slot_of[key] >= 0) return c->slot_of[key];
    /* only a miss of the current layer step can be admitted: anything else
     * would enter the recency order out of turn */
    if (layer != c->cur_l || !protected_key(c, key)) return -1;
    if (c->n_free > 0) {
        int32_t s = c->free_stack[--c->n_free];
        place(c, s, key);
        c->st.admitted++;
        return s;
    }
    int32_t v = -1;
    switch (c->policy) {
    case DF_POLICY_LRU:
        /* entries of this layer step sit at the head: a protected tail means
         * everything is protected */
        if (c->tail >= 0 && !protected_key(c, c->key[c->tail])) v = c->tail;
        break;
    case DF_POLICY_BELADY:
        v = belady_victim(c);
        /* never needed again before the victim is: do not cache it */
        if (v >= 0 && c->key_next[key] >= c->nu[v]) v = -1;
        break;
    case DF_POLICY_DELTAFIN: {
        int list = df_cache_victim_list(c);
        if (list >= 0) {
            double hv = c->leafv[list];
            double hn = c->H[c->bucket[key]]; /* m = 0 just after this use */
            if (hn * c->admit_factor >= hv) v = c->ltail[list];
        }
        break;
    }
    default: break;
    }
    if (v < 0) {
        c->st.bypassed++;
        return -1;
    }
    if (evicted) *evicted = c->key[v];
    unplace(c, v);
    place(c, v, key);
    c->st.admitted++;
    c->st.evictions++;
    return v;
}

int df_cache_access_layer(df_cache *c, int layer, const int32_t *experts, int n,
                          int32_t *slots, uint8_t *hit) {
    int hits = 0;
    for (int i = 0; i < n; i++) {
        int s = df_cache_lookup(c, layer, experts[i]);
        slots[i] = s;
        if (hit) hit[i] = s >= 0;
        hits += s >= 0;
    }
    if (c->policy == DF_POLICY_BELADY && n <= c->E && layer >= 0 && layer < c->L) {
        /* admitted misses are protected for the rest of the step, so the one
         * needed soonest must claim the farthest victim first */
        int nm = 0;
        for (int i = 0; i < n; i++) {
            if (slots[i] >= 0 || experts[i] < 0 || experts[i] >= c->E) continue;
            uint64_t ki = c->key_next[layer * c->E + experts[i]];
            int j = nm++;
            while (j > 0 && c->key_next[layer * c->E + experts[c->order[j - 1]]] > ki) {
                c->order[j] = c->order[j - 1];
                j--;
            }
            c->order[j] = i;
        }
        for (int j = 0; j < nm; j++)
            slots[c->order[j]] = df_cache_admit(c, layer, experts[c->order[j]], NULL);
        return hits;
    }
    for (int i = 0; i < n; i++)
        if (slots[i] < 0) slots[i] = df_cache_admit(c, layer, experts[i], NULL);
    return hits;
}

void df_cache_token_end(df_cache *c) {
    int old = c->cur_l;
    c->tok++;
    c->cur_l = -1;
    c->stamp++;
    c->st.tokens++;
    df_heat_token_end(&c->heat);
    if (c->policy != DF_POLICY_DELTAFIN) return;
    df_heat_token_end(&c->rank);
    if (++c->tokens_since_relearn >= c->relearn) {
        c->tokens_since_relearn = 0;
        if (c->learn_decay < 1.0) {
            size_t nh = (size_t)(c->M + 1) * (size_t)c->NB;
            for (size_t i = 0; i < nh; i++) {
                c->num[i] *= c->learn_decay;
                c->den[i] *= c->learn_decay;
            }
        }
        relearn(c);
        tree_rebuild(c);
        return;
    }
    /* layers the token did not reach passed an opportunity; old's protection ends */
    for (int x = old < 0 ? 0 : old; x < c->L; x++) refresh_layer(c, x);
}

void df_cache_set_next_use(df_cache *c, int layer, int expert, uint64_t next_step) {
    if (c->policy != DF_POLICY_BELADY) return;
    if (layer < 0 || layer >= c->L || expert < 0 || expert >= c->E) return;
    c->key_next[layer * c->E + expert] = next_step;
}

int32_t df_cache_slot_key(const df_cache *c, int slot) {
    return slot >= 0 && slot < c->n_slots ? c->key[slot] : -1;
}

int df_cache_find(const df_cache *c, int layer, int expert) {
    if (layer < 0 || layer >= c->L || expert < 0 || expert >= c->E) return -1;
    return c->slot_of[layer * c->E + expert];
}

int df_cache_is_pinned(const df_cache *c, int slot) {
    return slot >= 0 && slot < c->n_slots && c->pinned[slot];
}

const df_cache_stats *df_cache_get_stats(const df_cache *c) { return &c->st; }
const df_heat *df_cache_heat(const df_cache *c) { return &c->heat; }
int df_cache_n_slots(const df_cache *c) { return c->n_slots; }

int df_cache_hazard(const df_cache *c, double *out, int cap, int *n_missed, int *n_buckets) {
    if (c->policy != DF_POLICY_DELTAFIN) return 0;
    int n = (c->M + 1) * c->NB;
    if (n_missed) *n_missed = c->M + 1;
    if (n_buckets) *n_buckets = c->NB;
    for (int i = 0; i < n && i < cap; i++) out[i] = c->H[i];
    return n;
}
