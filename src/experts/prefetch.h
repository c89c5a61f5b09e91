/*
 * prefetch.h - which experts to read ahead of need, and whether to read any.
 *
 * Two predictors are scored on every MoE layer of every step, whichever one is
 * in use (shadow evaluation, so a layer that was switched off can come back;
 * the router only while the time gate below does not hold prefetch off):
 *   router  layer L's post-attention norm and router applied to the residual
 *           stream as it stands `depth` MoE layers earlier (the forward pass
 *           computes it and hands in the top-k of each row);
 *   prev    the experts layer L chose in the previous step.
 * Each layer keeps a running (exponentially decayed) recall per predictor. In
 * gated mode a layer uses the better predictor when its recall reaches the
 * minimum, and no prefetch otherwise; the other modes force one choice.
 *
 * Recall says a prediction is right, not that reading it early pays: when the
 * disk is already busy, right guesses hide nothing and wrong ones cost reads.
 * So gated mode also measures time: on single-row steps it alternates
 * prefetch on and off step by step, compares the step times at equal cache
 * misses, and holds the winner for a while before probing again (longer after
 * each loss). The object owns only this bookkeeping: the store (store.h) owns
 * slots and I/O.
 */
#ifndef DF_EXPERTS_PREFETCH_H
#define DF_EXPERTS_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

typedef enum df_pf_mode {
    DF_PF_OFF = 0,  /* never prefetch */
    DF_PF_GATED,    /* per layer: the better predictor if it pays, else nothing */
    DF_PF_ROUTER,   /* always the router lookahead */
    DF_PF_PREV,     /* always the previous step's experts */
} df_pf_mode;

/* What a layer uses now (in gated mode it changes as recall moves). */
typedef enum df_pf_choice { DF_PF_NONE = 0, DF_PF_USE_ROUTER, DF_PF_USE_PREV } df_pf_choice;

typedef struct df_pf_layer_stats {
    df_pf_choice choice;
    double recall_router, recall_prev; /* running, decayed */
    /* Running read precision (uncached predictions the layer used): the router's
     * first choice, the previous step's set; and how many of the router's top-k
     * ranks the gate reads now. */
    double precision_first, precision_prev;
    int ranks_read;
    uint64_t steps;                    /* steps this layer was observed */
    /* Totals over the steps where a prediction was issued: experts predicted,
     * how many of them the layer then used, and how many it used in all. */
    uint64_t predicted, correct, actual;
} df_pf_layer_stats;

typedef struct df_prefetcher df_prefetcher;

/* Parses "off", "on" (gated), "router" or "prev"; -1 if unknown. */
int df_pf_mode_from_name(const char *name);
const char *df_pf_mode_name(df_pf_mode m);
const char *df_pf_choice_name(df_pf_choice c);

/* n_layers: MoE layers; top_k: experts per row; depth: how many MoE layers
 * ahead the router lookahead runs (>= 1); min_recall: the gate's recall
 * threshold in [0, 1]; min_precision: the read precision a rank needs. */
df_prefetcher *df_pf_new(int n_layers, int n_experts, int top_k, df_pf_mode mode, int depth,
                         double min_recall, double min_precision);
void df_pf_free(df_prefetcher *p);
df_pf_mode df_pf_get_mode(const df_prefetcher *p);
int df_pf_depth(const df_prefetcher *p);

/* The router lookahead's experts for MoE layer `layer` in the current step (the
 * rows' top-k in rank order, flattened, duplicates allowed); cached[e] != 0
 * where expert e is already in memory or on its way (NULL: none is). Returns
 * how many experts to read ahead, written to out[] (distinct, ascending): the
 * router's set, the previous step's set, or none, as the layer's choice says;
 * in gated mode only its uncached members whose rank (or the prev bucket) has
 * a running read precision of at least min_precision. */
int df_pf_predict(df_prefetcher *p, int layer, const int *sel, int n_sel, const uint8_t *cached,
                  int *out);

/* The experts MoE layer `layer` actually uses in the current step (distinct).
 * Scores both predictors, updates the layer's choice and remembers the set as
 * the next step's "previous" prediction. */
void df_pf_observe(df_prefetcher *p, int layer, const int *experts, int n);

void df_pf_layer(const df_prefetcher *p, int layer, df_pf_layer_stats *out);

/* A forward step of `rows` rows took `seconds` (from the end of the previous
 * one) and missed the cache `misses` times. Only single-row steps are timed. */
void df_pf_step(df_prefetcher *p, double seconds, int rows, int misses);
/* Whether this step reads predictions (the time gate; forced modes: always). */
bool df_pf_active(const df_prefetcher *p);
/* Whether this step needs the router lookahead at all: not while the time gate
 * holds prefetch off (its cost, one small product and a pool dispatch per MoE
 * layer, was 2-3 % of a demo-model step); the previous step's set is scored
 * all the same. */
bool df_pf_wanted(const df_prefetcher *p);
/* "probing", "on", "off", or "forced"; and the last probe's measured speed-up
 * (median step time without / with prefetch; 0 before the first probe). */
const char *df_pf_gate_state(const df_prefetcher *p);
double df_pf_gate_speedup(const df_prefetcher *p);

#endif
