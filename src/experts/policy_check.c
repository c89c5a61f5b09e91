/*
 * policy_check.c - the expert cache's self-check (df_cache_check, for tests):
 * every slot, list, heap and tournament-tree invariant of policy.c recomputed
 * from scratch, the first broken one named in the error.
 */
#include "experts/policy_internal.h"

/* Slots and keys map each other, and every slot is used or free. */
static int check_slots(const df_cache *c, int *cached, df_error *err) {
    *cached = 0;
    for (int s = 0; s < c->n_slots; s++) {
        int32_t k = c->key[s];
        if (k < 0) continue;
        (*cached)++;
        if (k >= c->nk || c->slot_of[k] != s)
            return df_fail(err, DF_ERR_FORMAT, "slot %d holds key %d but slot_of says %d", s,
                           (int)k, k < c->nk ? (int)c->slot_of[k] : -2);
    }
    int mapped = 0;
    for (int k = 0; k < c->nk; k++)
        if (c->slot_of[k] >= 0) mapped++;
    if (mapped != *cached)
        return df_fail(err, DF_ERR_FORMAT, "%d keys mapped, %d slots used", mapped, *cached);
    if (*cached + c->n_free != c->n_slots)
        return df_fail(err, DF_ERR_FORMAT, "%d used + %d free != %d slots", *cached, c->n_free,
                       c->n_slots);
    return DF_OK;
}

static int check_lru(const df_cache *c, int *in_lists, df_error *err) {
    for (int32_t s = c->head, p = -1; s >= 0; p = s, s = c->next[s]) {
        if (c->prev[s] != p) return df_fail(err, DF_ERR_FORMAT, "lru: broken link at %d", s);
        if (++*in_lists > c->n_slots) return df_fail(err, DF_ERR_FORMAT, "lru: cycle");
    }
    return DF_OK;
}

static int check_belady(const df_cache *c, int *in_lists, df_error *err) {
    *in_lists = c->heap_n;
    for (int i = 1; i < c->heap_n; i++)
        if (c->nu[c->heap[(i - 1) / 2]] < c->nu[c->heap[i]])
            return df_fail(err, DF_ERR_FORMAT, "belady: heap order broken at %d", i);
    for (int i = 0; i < c->heap_n; i++)
        if (c->hpos[c->heap[i]] != i)
            return df_fail(err, DF_ERR_FORMAT, "belady: heap position of %d", i);
    return DF_OK;
}

/* deltafin's lists: linked, each in its (layer, bucket), in recency order, leaves fresh. */
static int check_deltafin_lists(const df_cache *c, int *in_lists, df_error *err) {
    for (int list = 0; list < c->n_lists; list++) {
        int64_t newer = INT64_MAX;
        for (int32_t s = c->lhead[list], p = -1; s >= 0; p = s, s = c->next[s]) {
            int32_t k = c->key[s];
            if (c->prev[s] != p || c->list_of[s] != list)
                return df_fail(err, DF_ERR_FORMAT, "deltafin: list %d broken at %d", list, s);
            if (k / c->E != list / c->NB || c->bucket[k] != list % c->NB)
                return df_fail(err, DF_ERR_FORMAT, "deltafin: key %d in wrong list %d",
                               (int)k, list);
            if (c->last_tok[k] > newer)
                return df_fail(err, DF_ERR_FORMAT, "deltafin: list %d not in recency order",
                               list);
            newer = c->last_tok[k];
            if (++*in_lists > c->n_slots)
                return df_fail(err, DF_ERR_FORMAT, "deltafin: cycle");
        }
        if (c->leafv[list] != df_cache_leaf_value(c, list))
            return df_fail(err, DF_ERR_FORMAT, "deltafin: stale leaf %d", list);
    }
    return DF_OK;
}

/* The tree's answer against a scan of every cached, unprotected entry. */
static int check_deltafin_victim(const df_cache *c, df_error *err) {
    int got = df_cache_victim_list(c);
    double best = INF_H;
    int best_dist = -1;
    int l = c->cur_l < 0 ? 0 : c->cur_l;
    for (int s = 0; s < c->n_slots; s++) {
        int32_t k = c->key[s];
        if (k < 0 || c->pinned[s] || protected_key(c, k)) continue;
        int kl = k / c->E;
        int64_t m = c->tok - c->last_tok[k] - (kl > c->cur_l ? 1 : 0);
        if (m < 0) m = 0;
        if (m > c->M) m = c->M;
        double h = c->H[m * c->NB + c->bucket[k]];
        int dist = kl > l ? kl - l : c->L - l + kl;
        if (h < best || (h == best && dist > best_dist)) {
            best = h;
            best_dist = dist;
        }
    }
    if ((got < 0) != (best >= INF_H))
        return df_fail(err, DF_ERR_FORMAT, "deltafin: victim %d, scan best %g", got, best);
    if (got >= 0) {
        int gl = got / c->NB;
        int gd = gl > l ? gl - l : c->L - l + gl;
        if (c->leafv[got] != best || gd != best_dist)
            return df_fail(err, DF_ERR_FORMAT,
                           "deltafin: tree picks H=%g dist=%d, scan H=%g dist=%d",
                           c->leafv[got], gd, best, best_dist);
    }
    return DF_OK;
}

int df_cache_check(const df_cache *c, df_error *err) {
    int cached, in_lists = 0;
    int rc = check_slots(c, &cached, err);
    if (rc) return rc;
    if (c->policy == DF_POLICY_LRU) rc = check_lru(c, &in_lists, err);
    else if (c->policy == DF_POLICY_BELADY) rc = check_belady(c, &in_lists, err);
    else if (!(rc = check_deltafin_lists(c, &in_lists, err))) rc = check_deltafin_victim(c, err);
    if (rc) return rc;
    if (in_lists + c->n_pinned != cached)
        return df_fail(err, DF_ERR_FORMAT, "%d in policy structures + %d pinned != %d cached",
                       in_lists, c->n_pinned, cached);
    return DF_OK;
}
