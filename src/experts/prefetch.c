/*
 * prefetch.c - the prefetch predictors' scoring and the per-layer gate (see
 * prefetch.h). Sets are byte maps over a layer's experts; everything is O(E)
 * per layer and step, next to the O(H x E) router product that produced them.
 */
#include "experts/prefetch.h"

#include "util/util.h"

#include <stdlib.h>
#include <string.h>

/* Weight of the newest step in a running recall: about the last ten steps count. */
#define PF_DECAY 0.1
/* A running read precision is a decayed count (one sample per uncached
 * prediction: each weighs MP_KEEP times the one after it, ~20 samples of
 * memory) over a prior of MP_PRIOR_USED used in MP_PRIOR_N: 0.33, below the
 * default threshold, so nothing is read until a bucket's shadow scoring has
 * shown it pays (2 of 2 used: 0.71); an optimistic start cost more
 * (docs/prefetch.md, "The gate"). */
#define MP_KEEP 0.95
#define MP_PRIOR_USED 0.5
#define MP_PRIOR_N 1.5

/* Read precision: of the predictions that were not cached when made (the only
 * ones a read-ahead can be spent on), the share the layer then used. It is far
 * below recall and depends on the prediction's rank in the router's top-k
 * (docs/prefetch.md, "The gate"), so it is kept per layer and per rank, plus
 * one bucket for the previous step's set, and scored for both predictors on
 * every step on which the router lookahead runs. */
typedef struct pf_layer {
    uint8_t *router;   /* [E] the router lookahead's set this step */
    uint8_t *rank;     /* [E] its best top-k rank in any row (valid where router[e]) */
    uint8_t *prev;     /* [E] the set the layer used in the previous step */
    uint8_t *issued;   /* [E] what was handed out to read this step */
    uint8_t *miss;     /* [E] 1 + bucket of an uncached prediction this step, 0: none */
    double *mused, *mn; /* [K + 1] decayed used / uncached predictions per rank; [K]: prev */
    bool have_router, have_prev, have_issued;
    df_pf_layer_stats st;
} pf_layer;

/* The time gate: PROBE_STEPS timed steps, prefetch on and off in the order
 * on off off on, on off off on, ... A trend in step time (a cache that is still
 * warming: the steps get faster by the token) then falls on both arms alike
 * (docs/prefetch.md, "The time gate"). A step's reads ahead are its own (the
 * store drops what is left of them at its end), so no step is left untimed. */
#define PROBE_STEPS 32
#define HOLD_STEPS 128
#define HOLD_MAX 4096
#define WIN 0.97 /* prefetch must make steps at least 3% faster */

enum { G_PROBE, G_HOLD_ON, G_HOLD_OFF };

struct df_prefetcher {
    int L, E, K, depth;
    df_pf_mode mode;
    double min_recall, min_precision;
    pf_layer *layers;
    /* time gate */
    int g_state;
    bool g_on;                          /* this step reads predictions */
    int g_left;                         /* steps left in the hold */
    int g_i;                            /* probe steps timed */
    double t[PROBE_STEPS];              /* their times, */
    int m[PROBE_STEPS];                 /* the cache misses they had, */
    bool on[PROBE_STEPS];               /* and whether they read ahead */
    int hold_off;                       /* the next losing hold, in steps */
    double speedup;
};

static const char *const mode_names[] = {"off", "on", "router", "prev"};

int df_pf_mode_from_name(const char *name) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, mode_names[i])) return i;
    return -1;
}

const char *df_pf_mode_name(df_pf_mode m) { return mode_names[m]; }

const char *df_pf_choice_name(df_pf_choice c) {
    return c == DF_PF_USE_ROUTER ? "router" : c == DF_PF_USE_PREV ? "prev" : "none";
}

static df_pf_choice initial_choice(df_pf_mode m) {
    /* Gated starts on the router: its recall is only known once it has run. */
    return m == DF_PF_PREV ? DF_PF_USE_PREV : m == DF_PF_OFF ? DF_PF_NONE : DF_PF_USE_ROUTER;
}

df_prefetcher *df_pf_new(int n_layers, int n_experts, int top_k, df_pf_mode mode, int depth,
                         double min_recall, double min_precision) {
    df_prefetcher *p = df_xcalloc(1, sizeof *p);
    p->L = n_layers;
    p->E = n_experts;
    p->K = top_k < 1 ? 1 : top_k > 254 ? 254 : top_k;
    p->mode = mode;
    p->depth = depth < 1 ? 1 : depth;
    p->min_recall = min_recall;
    p->min_precision = min_precision;
    p->layers = df_xcalloc((size_t)n_layers, sizeof(pf_layer));
    for (int l = 0; l < n_layers; l++) {
        pf_layer *y = &p->layers[l];
        y->router = df_xcalloc((size_t)n_experts, 1);
        y->rank = df_xcalloc((size_t)n_experts, 1);
        y->prev = df_xcalloc((size_t)n_experts, 1);
        y->issued = df_xcalloc((size_t)n_experts, 1);
        y->miss = df_xcalloc((size_t)n_experts, 1);
        y->mused = df_xcalloc((size_t)p->K + 1, sizeof(double));
        y->mn = df_xcalloc((size_t)p->K + 1, sizeof(double));
        for (int r = 0; r <= p->K; r++) {
            y->mused[r] = MP_PRIOR_USED;
            y->mn[r] = MP_PRIOR_N;
        }
        y->st.choice = initial_choice(mode);
        y->st.recall_router = 1.0;
        y->st.recall_prev = 0.0;
    }
    p->g_state = G_PROBE;
    p->g_on = true;
    p->hold_off = HOLD_STEPS;
    return p;
}

void df_pf_free(df_prefetcher *p) {
    if (!p) return;
    for (int l = 0; l < p->L; l++) {
        free(p->layers[l].router);
        free(p->layers[l].rank);
        free(p->layers[l].prev);
        free(p->layers[l].issued);
        free(p->layers[l].miss);
        free(p->layers[l].mused);
        free(p->layers[l].mn);
    }
    free(p->layers);
    free(p);
}

df_pf_mode df_pf_get_mode(const df_prefetcher *p) { return p->mode; }
int df_pf_depth(const df_prefetcher *p) { return p->depth; }

static double read_precision(const pf_layer *y, int bucket) { return y->mused[bucket] / y->mn[bucket]; }

static void score(pf_layer *y, int bucket, bool used) {
    y->mused[bucket] = MP_KEEP * y->mused[bucket] + (used ? 1.0 : 0.0);
    y->mn[bucket] = MP_KEEP * y->mn[bucket] + 1.0;
}

static int set_to_list(const uint8_t *set, int E, int *out) {
    int n = 0;
    for (int e = 0; e < E; e++)
        if (set[e]) out[n++] = e;
    return n;
}

int df_pf_predict(df_prefetcher *p, int layer, const int *sel, int n_sel, const uint8_t *cached,
                  int *out) {
    pf_layer *y = &p->layers[layer];
    int E = p->E, K = p->K;
    memset(y->router, 0, (size_t)E);
    for (int i = 0; i < n_sel; i++) {
        int e = sel[i];
        if (e < 0 || e >= E) continue;
        int r = i % K;
        if (!y->router[e] || r < y->rank[e]) y->rank[e] = (uint8_t)r;
        y->router[e] = 1;
    }
    y->have_router = true;
    /* Both predictors' uncached predictions are scored at observe time. */
    for (int e = 0; e < E; e++) {
        bool unc = !cached || !cached[e];
        y->miss[e] = 0;
        if (unc && y->router[e]) y->miss[e] = (uint8_t)(1 + y->rank[e]);
        else if (unc && y->have_prev && y->prev[e]) y->miss[e] = (uint8_t)(1 + K);
    }
    const uint8_t *use = NULL;
    bool by_rank = y->st.choice == DF_PF_USE_ROUTER;
    if (by_rank) use = y->router;
    else if (y->st.choice == DF_PF_USE_PREV && y->have_prev) use = y->prev;
    y->have_issued = use != NULL;
    if (!use) return 0;
    memcpy(y->issued, use, (size_t)E);
    if (p->mode != DF_PF_GATED) return set_to_list(use, E, out);
    /* Gated: only the uncached predictions whose bucket's reads have paid. */
    int n = 0;
    for (int e = 0; e < E; e++) {
        if (!use[e] || (cached && cached[e])) continue;
        if (read_precision(y, by_rank ? y->rank[e] : K) >= p->min_precision) out[n++] = e;
    }
    return n;
}

/* |set ∩ actual| / |actual| */
static double recall_of(const uint8_t *set, const uint8_t *actual, int E, int n_actual) {
    int hit = 0;
    for (int e = 0; e < E; e++) hit += set[e] && actual[e];
    return n_actual ? (double)hit / n_actual : 1.0;
}

static df_pf_choice gate(const df_prefetcher *p, const df_pf_layer_stats *st) {
    if (p->mode != DF_PF_GATED) return st->choice;
    bool router_ok = st->recall_router >= p->min_recall;
    bool prev_ok = st->recall_prev >= p->min_recall;
    if (router_ok && st->recall_router >= st->recall_prev) return DF_PF_USE_ROUTER;
    if (prev_ok) return DF_PF_USE_PREV;
    return router_ok ? DF_PF_USE_ROUTER : DF_PF_NONE;
}

void df_pf_observe(df_prefetcher *p, int layer, const int *experts, int n) {
    pf_layer *y = &p->layers[layer];
    int E = p->E;
    uint8_t actual[E];
    memset(actual, 0, sizeof actual);
    for (int i = 0; i < n; i++) actual[experts[i]] = 1;
    if (y->have_router) {
        double r = recall_of(y->router, actual, E, n);
        y->st.recall_router += PF_DECAY * (r - y->st.recall_router);
    }
    if (y->have_prev) {
        double r = recall_of(y->prev, actual, E, n);
        y->st.recall_prev += PF_DECAY * (r - y->st.recall_prev);
    }
    if (y->have_issued) {
        for (int e = 0; e < E; e++) {
            y->st.predicted += y->issued[e];
            y->st.correct += y->issued[e] && actual[e];
        }
        y->st.actual += (uint64_t)n;
    }
    /* A router prediction scores its rank's bucket; one that only the previous
     * step made scores the prev bucket (and a router one also counts for prev
     * when both made it, so prev's bucket sees all of its own predictions). */
    for (int e = 0; e < E; e++) {
        if (!y->miss[e]) continue;
        int b = y->miss[e] - 1;
        score(y, b, actual[e]);
        if (b < p->K && y->have_prev && y->prev[e]) score(y, p->K, actual[e]);
        y->miss[e] = 0;
    }
    y->st.steps++;
    y->st.choice = gate(p, &y->st);
    memcpy(y->prev, actual, (size_t)E);
    y->have_prev = true;
    y->have_router = y->have_issued = false;
}

void df_pf_layer(const df_prefetcher *p, int layer, df_pf_layer_stats *out) {
    const pf_layer *y = &p->layers[layer];
    *out = y->st;
    out->precision_first = read_precision(y, 0);
    out->precision_prev = read_precision(y, p->K);
    out->ranks_read = 0;
    for (int r = 0; r < p->K; r++) out->ranks_read += read_precision(y, r) >= p->min_precision;
}

/* ---- the time gate ------------------------------------------------------------------ */

/* A step's time is mostly its misses, which vary far more from step to step
 * than prefetch can change them (docs/prefetch.md, "The time gate"). So the
 * arms are compared at equal misses: the
 * mean time of each arm, adjusted by the within-arm slope of time on misses
 * to the misses of all probe steps (analysis of covariance). The policy sees
 * the same accesses with prefetch on or off, so a step's misses do not depend
 * on its arm. */
static void adjusted_means(const df_prefetcher *p, double *on, double *off) {
    double st[2] = {0}, sm[2] = {0}, n[2] = {0};
    for (int i = 0; i < PROBE_STEPS; i++) {
        st[p->on[i]] += p->t[i];
        sm[p->on[i]] += p->m[i];
        n[p->on[i]] += 1;
    }
    double mt[2], mm[2], mall = (sm[0] + sm[1]) / PROBE_STEPS, sxy = 0, sxx = 0;
    for (int a = 0; a < 2; a++) {
        mt[a] = n[a] ? st[a] / n[a] : 0;
        mm[a] = n[a] ? sm[a] / n[a] : 0;
    }
    for (int i = 0; i < PROBE_STEPS; i++) {
        double dx = p->m[i] - mm[p->on[i]];
        sxy += dx * (p->t[i] - mt[p->on[i]]);
        sxx += dx * dx;
    }
    double slope = sxx > 0 ? sxy / sxx : 0;
    *on = mt[1] - slope * (mm[1] - mall);
    *off = mt[0] - slope * (mm[0] - mall);
}

static void start_probe(df_prefetcher *p) {
    p->g_state = G_PROBE;
    p->g_on = true;
    p->g_i = 0;
}

void df_pf_step(df_prefetcher *p, double seconds, int rows, int misses) {
    if (p->mode != DF_PF_GATED || rows != 1) return;
    if (p->g_state != G_PROBE) {
        if (--p->g_left <= 0) start_probe(p);
        return;
    }
    p->t[p->g_i] = seconds;
    p->m[p->g_i] = misses;
    p->on[p->g_i] = p->g_on;
    if (++p->g_i < PROBE_STEPS) {
        p->g_on = (p->g_i + 1) / 2 % 2 == 0; /* on off off on on off off on ... */
        return;
    }
    double on, off;
    adjusted_means(p, &on, &off);
    p->speedup = on > 0 ? off / on : 0;
    if (on < off * WIN) {
        p->g_state = G_HOLD_ON;
        p->g_on = true;
        p->g_left = HOLD_STEPS;
        p->hold_off = HOLD_STEPS;
    } else {
        p->g_state = G_HOLD_OFF;
        p->g_on = false;
        p->g_left = p->hold_off;
        p->hold_off = p->hold_off * 2 > HOLD_MAX ? HOLD_MAX : p->hold_off * 2;
    }
}

bool df_pf_active(const df_prefetcher *p) { return p->mode != DF_PF_GATED || p->g_on; }

bool df_pf_wanted(const df_prefetcher *p) { return p->mode != DF_PF_GATED || p->g_state != G_HOLD_OFF; }

const char *df_pf_gate_state(const df_prefetcher *p) {
    if (p->mode != DF_PF_GATED) return "forced";
    return p->g_state == G_PROBE ? "probing" : p->g_state == G_HOLD_ON ? "on" : "off";
}

double df_pf_gate_speedup(const df_prefetcher *p) { return p->speedup; }
