/*
 * engine/dev.h - benchmark and test controls of the engine: not the product
 * API (include/deltafin.h is). Routing replay, a simulated disk, prefetch
 * tuning, a fixed speculative depth and the full statistics record, for
 * `deltafin bench`, bench/ and tests/. The server never uses them.
 */
#ifndef DF_ENGINE_DEV_H
#define DF_ENGINE_DEV_H

#include "deltafin.h"

typedef struct df_engine_dev {
    /* A routing trace (# moe-routing-trace v1) whose tokens, in file order,
     * choose the experts of the rows evaluated, one trace token per row,
     * wrapping around at the end. The router still runs and the weights are
     * its scores of the replayed ids as the family weights its own choice
     * (Qwen3: softmax probabilities; the DeepSeek-V3 family: softmax or
     * sigmoid scores, times routed_scaling_factor), renormalised when the
     * model renormalises its top-k, so compute and bytes are those of a model
     * that routed this way; the output is not the model's own. The trace's MoE
     * layer count, experts per layer and top-k must match the model. NULL: the
     * model's own routing. */
    const char *replay_routing;
    /* Expert reads from the pack are handed over no earlier than a disk of
     * this many bytes/s would finish them, serving them in submission order
     * with no credit for time it sat idle (a bandwidth that is known and
     * constant, on a machine whose disk is faster and varies). Needs a pack;
     * 0: off. */
    double sim_disk_bps;
    /* Prefetch tuning (df_engine_opts.prefetch): MoE layers ahead the router
     * lookahead runs (1..8, 0 = 1); "on" mode's running recall a predictor
     * needs (0 = 0.5), and the read precision a rank of predictions needs
     * before it is read (0 = 0.5). */
    int prefetch_depth;
    double prefetch_min_recall;
    double prefetch_min_precision;
} df_engine_dev;

/* Routing replay per sequence: the session's rows replay the trace from
 * token `token` on, one trace token per row, whatever other sessions
 * evaluate (without it every row, of any session, takes the engine's next
 * trace token). Several sequences decoded together then each follow their
 * own stretch of the trace, as unrelated requests would, rather than
 * interleaving neighbouring tokens. */
void df_session_replay_from(df_session *s, uint64_t token);

/* df_engine_open with these controls (dev NULL: none, as df_engine_open). */
int df_engine_open_dev(df_engine **out, const df_engine_opts *opts, const df_engine_dev *dev, df_error *err);

/* What df_stats leaves out: prediction quality and the prefetch time gate,
 * and the controls in use. */
typedef struct df_dev_stats {
    int prefetch_depth;
    /* over all MoE layers and the steps where a prediction was issued: experts
     * predicted, of those used, and used (recall = correct / actual) */
    uint64_t prefetch_predicted, prefetch_correct, prefetch_actual;
    /* "on" mode's time gate: "probing", "on", "off" ("forced" in router/prev
     * mode), and its last probe's speed-up (step time without / with) */
    const char *prefetch_gate;
    double prefetch_speedup;
    const char *replay_routing; /* trace the routing is replayed from, NULL: the model's own */
    double sim_disk_bps;        /* 0: none */
} df_dev_stats;
void df_engine_dev_stats(const df_engine *eng, df_dev_stats *out);

/* Per MoE layer prediction quality. predicted/correct/actual count experts over
 * the steps where a prediction was issued: recall = correct/actual, precision =
 * correct/predicted. recall_router/recall_prev are the running recalls the gate
 * compares; `using` is what the layer uses now ("router", "prev", "none"). */
typedef struct df_prefetch_layer {
    int layer;            /* model layer */
    const char *using;
    double recall_router, recall_prev;
    /* Running read precision (the share of uncached predictions that the layer
     * used) of the router's first choice and of the previous step's set; how
     * many of the router's ranks "on" reads now. */
    double precision_first, precision_prev;
    int ranks_read;
    uint64_t predicted, correct, actual;
} df_prefetch_layer;
/* Fills up to cap entries; returns the number of MoE layers (0: not streaming). */
int df_engine_prefetch_layers(const df_engine *eng, df_prefetch_layer *out, int cap);

/* Speculative decoding at a fixed depth (> 0: always draft this many, no
 * gate; for measurement), set before the first step. */
void df_spec_set_fixed_depth(df_spec *sp, int depth);

#endif
