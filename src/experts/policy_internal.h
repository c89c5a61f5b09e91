/*
 * policy_internal.h - internal to the experts room: the expert cache's fields
 * (struct df_cache), shared by the policies (policy.c) and their self-check
 * (policy_check.c), and the two policy internals that the check recomputes.
 */
#ifndef DF_EXPERTS_POLICY_INTERNAL_H
#define DF_EXPERTS_POLICY_INTERNAL_H

#include "experts/policy.h"

#define NB_MAX 8
#define INF_H 1e300
/* heat-rate bucket edges, in units of the uniform rate top_k / n_experts */
static const double BUCKET_EDGES[NB_MAX - 1] = {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

struct df_cache {
    df_cache_policy policy;
    int L, E, K, nk;
    int n_slots, n_pinned;
    df_heat heat; /* what gets persisted: every use, full weight */
    df_heat rank; /* deltafin's view: the persisted part weighed down as a prior */
    df_cache_stats st;

    /* clock: token counter, layer of the current layer step (-1: none yet in
     * this token), and a stamp that changes at every layer step */
    int64_t tok;
    int cur_l;
    uint64_t stamp;

    /* per key */
    int32_t *slot_of;
    int64_t *last_tok;
    uint64_t *use_stamp;
    uint8_t *bucket;
    uint64_t *key_next; /* belady: next use of the upcoming lookup */

    /* per slot */
    int32_t *key;
    int32_t *prev, *next;
    int32_t *list_of;
    uint8_t *pinned;
    int32_t *free_stack;
    int n_free;

    /* lru */
    int32_t head, tail;

    /* deltafin */
    int NB, M, relearn, tokens_since_relearn;
    double learn_decay, admit_factor, p0;
    int n_lists;
    int32_t *lhead, *ltail;
    double *num, *den, *H; /* (M + 1) * NB */
    double *leafv;         /* n_lists */
    int P;                 /* tree leaves (power of two) */
    int32_t *tree;         /* 2P: best list index of the subtree, -1 none */

    /* belady: max-heap of slots by next use */
    uint64_t *nu;
    int32_t *heap, *hpos;
    int heap_n;
    int32_t *stash;
    int32_t *order; /* n_experts: admission order within a step */
};

static inline int protected_key(const df_cache *c, int32_t key) {
    return c->use_stamp[key] == c->stamp;
}

/* deltafin: the hazard of a list's tail (the tournament tree's leaf value), and the
 * list whose tail is the victim now. */
double df_cache_leaf_value(const df_cache *c, int list);
int df_cache_victim_list(const df_cache *c);

#endif
