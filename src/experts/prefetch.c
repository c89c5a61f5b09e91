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

typedef struct pf_layer {
    uint8_t *router;   /* [E] the router lookahead's set this step */
    uint8_t *prev;     /* [E] the set the layer used in the previous step */
    uint8_t *issued;   /* [E] what was handed out to read this step */
    bool have_router, have_prev, have_issued;
    df_pf_layer_stats st;
} pf_layer;

/* The time gate: PROBE_ROUNDS rounds of PHASE timed steps on, then off. */
#define PHASE 8
#define PROBE_ROUNDS 2
#define HOLD_STEPS 128
#define HOLD_MAX 4096
#define WIN 0.97 /* prefetch must make steps at least 3% faster */

enum { G_PROBE, G_HOLD_ON, G_HOLD_OFF };

struct df_prefetcher {
    int L, E, depth;
    df_pf_mode mode;
    double min_recall;
    pf_layer *layers;
    /* time gate */
    int g_state;
    bool g_on;                          /* this step reads predictions */
    int g_left;                         /* steps left in the phase or hold */
    int g_phase;                        /* probe phases done */
    bool g_skip;                        /* the first step of a phase is not timed */
    double on_t[PHASE * PROBE_ROUNDS], off_t[PHASE * PROBE_ROUNDS];
    int n_on, n_off;
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

df_prefetcher *df_pf_new(int n_layers, int n_experts, df_pf_mode mode, int depth, double min_recall) {
    df_prefetcher *p = df_xcalloc(1, sizeof *p);
    p->L = n_layers;
    p->E = n_experts;
    p->mode = mode;
    p->depth = depth < 1 ? 1 : depth;
    p->min_recall = min_recall;
    p->layers = df_xcalloc((size_t)n_layers, sizeof(pf_layer));
    for (int l = 0; l < n_layers; l++) {
        pf_layer *y = &p->layers[l];
        y->router = df_xcalloc((size_t)n_experts, 1);
        y->prev = df_xcalloc((size_t)n_experts, 1);
        y->issued = df_xcalloc((size_t)n_experts, 1);
        y->st.choice = initial_choice(mode);
        y->st.recall_router = 1.0;
        y->st.recall_prev = 0.0;
    }
    p->g_state = G_PROBE;
    p->g_on = true;
    p->g_left = PHASE;
    p->g_skip = true;
    p->hold_off = HOLD_STEPS;
    return p;
}

void df_pf_free(df_prefetcher *p) {
    if (!p) return;
    for (int l = 0; l < p->L; l++) {
        free(p->layers[l].router);
        free(p->layers[l].prev);
        free(p->layers[l].issued);
    }
    free(p->layers);
    free(p);
}

df_pf_mode df_pf_get_mode(const df_prefetcher *p) { return p->mode; }
int df_pf_depth(const df_prefetcher *p) { return p->depth; }

static int set_to_list(const uint8_t *set, int E, int *out) {
    int n = 0;
    for (int e = 0; e < E; e++)
        if (set[e]) out[n++] = e;
    return n;
}

int df_pf_predict(df_prefetcher *p, int layer, const int *sel, int n_sel, int *out) {
    pf_layer *y = &p->layers[layer];
    memset(y->router, 0, (size_t)p->E);
    for (int i = 0; i < n_sel; i++)
        if (sel[i] >= 0 && sel[i] < p->E) y->router[sel[i]] = 1;
    y->have_router = true;
    const uint8_t *use = NULL;
    if (y->st.choice == DF_PF_USE_ROUTER) use = y->router;
    else if (y->st.choice == DF_PF_USE_PREV && y->have_prev) use = y->prev;
    y->have_issued = use != NULL;
    if (!use) return 0;
    memcpy(y->issued, use, (size_t)p->E);
    return set_to_list(use, p->E, out);
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
    y->st.steps++;
    y->st.choice = gate(p, &y->st);
    memcpy(y->prev, actual, (size_t)E);
    y->have_prev = true;
    y->have_router = y->have_issued = false;
}

void df_pf_layer(const df_prefetcher *p, int layer, df_pf_layer_stats *out) { *out = p->layers[layer].st; }

/* ---- the time gate ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void start_probe(df_prefetcher *p) {
    p->g_state = G_PROBE;
    p->g_on = true;
    p->g_left = PHASE;
    p->g_phase = 0;
    p->g_skip = true;
    p->n_on = p->n_off = 0;
}

void df_pf_step(df_prefetcher *p, double seconds, int rows) {
    if (p->mode != DF_PF_GATED || rows != 1) return;
    if (p->g_state != G_PROBE) {
        if (--p->g_left <= 0) start_probe(p);
        return;
    }
    if (p->g_skip) { /* its reads were started under the previous phase */
        p->g_skip = false;
        return;
    }
    if (p->g_on) p->on_t[p->n_on++] = seconds;
    else p->off_t[p->n_off++] = seconds;
    if (--p->g_left > 0) return;
    if (++p->g_phase < 2 * PROBE_ROUNDS) { /* next phase: the other arm */
        p->g_on = !p->g_on;
        p->g_left = PHASE;
        p->g_skip = true;
        return;
    }
    double on = median(p->on_t, p->n_on), off = median(p->off_t, p->n_off);
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

const char *df_pf_gate_state(const df_prefetcher *p) {
    if (p->mode != DF_PF_GATED) return "forced";
    return p->g_state == G_PROBE ? "probing" : p->g_state == G_HOLD_ON ? "on" : "off";
}

double df_pf_gate_speedup(const df_prefetcher *p) { return p->speedup; }
