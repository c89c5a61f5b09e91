/*
 * router.c - the scored top-k router of the DeepSeek-V3 family (and Kimi K3):
 * softmax or sigmoid scores, optional expert groups (group-limited greedy,
 * noaux_tc with its correction bias), routing weights from the scores alone,
 * renormalised and scaled. Everything in float, one row at a time, in a fixed
 * order, so a row's choice never depends on the batch.
 */
#include "model/blocks.h"

/* Index of the largest v[i] over i < n with !taken[i] (ties: lower index),
 * or -1. */
static int argmax_free(const float *v, const bool *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

static void scores(const df_router *r, const float *logits, int E, float *s) {
    if (r->scoring == DF_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-logits[e]));
        return;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
        if (logits[e] > mx) mx = logits[e];
    for (int e = 0; e < E; e++) sum += s[e] = expf(logits[e] - mx);
    for (int e = 0; e < E; e++) s[e] /= sum;
}

/* Drops (to -inf) the experts outside the topk_group best groups; a group's
 * score is its best value (group-limited greedy) or the sum of its two best
 * (noaux_tc). Ties between groups: the lower group. */
static void limit_groups(const df_router *r, float *v, int E) {
    int G = r->n_group, per = E / G;
    float gs[G];
    bool taken[G];
    for (int g = 0; g < G; g++) {
        const float *x = v + (size_t)g * per;
        float a = -INFINITY, b = -INFINITY; /* best, second best */
        for (int i = 0; i < per; i++) {
            if (x[i] > a) b = a, a = x[i];
            else if (x[i] > b) b = x[i];
        }
        gs[g] = r->method == DF_TOPK_NOAUX_TC ? a + b : a;
        taken[g] = false;
    }
    for (int k = 0; k < r->topk_group; k++) taken[argmax_free(gs, taken, G)] = true;
    for (int g = 0; g < G; g++)
        if (!taken[g])
            for (int i = 0; i < per; i++) v[(size_t)g * per + i] = -INFINITY;
}

void df_route_scored(const df_router *r, const float *logits, const float *bias, int E, int K, int *sel,
                     float *w, const int *forced) {
    float s[E], v[E];
    scores(r, logits, E, s);
    if (forced) {
        for (int k = 0; k < K; k++) sel[k] = forced[k];
    } else {
        for (int e = 0; e < E; e++) v[e] = r->method == DF_TOPK_NOAUX_TC && bias ? s[e] + bias[e] : s[e];
        if (r->method != DF_TOPK_GREEDY && r->n_group > 1) limit_groups(r, v, E);
        bool taken[E];
        memset(taken, 0, sizeof taken);
        for (int k = 0; k < K; k++) taken[sel[k] = argmax_free(v, taken, E)] = true;
    }
    for (int k = 0; k < K; k++) w[k] = s[sel[k]];
    bool normed = K > 1 && r->norm;
    if (normed) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) sum += w[k];
        sum += 1e-20f;
        for (int k = 0; k < K; k++) w[k] /= sum;
    }
    if (!normed || r->scale_normed)
        for (int k = 0; k < K; k++) w[k] *= r->scaling;
}

void df_route_scored_rows(df_fwd *f, const df_router *r, const df_weight *gate, const float *bias, int li,
                          const float *xb, float *logits, int *sel, float *selw, int T, bool replay) {
    const df_config *c = &f->m->cfg;
    int E = c->num_experts, K = c->num_experts_per_tok;
    df_linear(f->pool, logits, xb, gate, T);
    for (int t = 0; t < T; t++) {
        int forced[K];
        bool force = replay && f->route;
        if (force) f->route(f->route_user, li, t, forced);
        df_route_scored(r, logits + (size_t)t * E, bias, E, K, sel + (size_t)t * K, selw + (size_t)t * K,
                        force ? forced : NULL);
    }
}
