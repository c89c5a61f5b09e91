/*
 * forward.h - what one forward pass is given: a batch of rows, each a token
 * at a position of some sequence, and the context it runs in (thread pool,
 * expert source, work buffers, hooks). The architecture's forward function
 * (arch.h) runs it; df_forward checks the batch and dispatches.
 *
 * Rows of one sequence must be consecutive positions starting at the
 * sequence's current position, in order; rows of several sequences may be
 * mixed. A row's logits do not depend on the other rows in the batch, the
 * thread count, the ISA path or where the experts came from.
 */
#ifndef DF_FORWARD_H
#define DF_FORWARD_H

#include "model/model.h"
#include "model/state.h"
#include "util/util.h"

typedef struct df_batch {
    int n;                   /* rows */
    const int32_t *tokens;   /* [n] */
    const int *pos;          /* [n] position of each row in its sequence */
    df_seq *const *seq;      /* [n] the sequence each row belongs to */
} df_batch;

/* Routing replay (benchmarks and tests only): called for every row of every MoE
 * layer after the router ran; writes the top_k expert ids (distinct, in
 * [0, num_experts)) that row uses instead of the router's top-k. `layer` is the
 * model layer index, `row` the row within the pass. */
typedef void (*df_route_fn)(void *user, int layer, int row, int *ids);
/* Called after each layer (progress displays). */
typedef void (*df_layer_cb)(void *user, int layers_done, int n_layers, int rows);

/* Where a pass's wall time goes (df_stats: the per-token split). The pass is
 * always in one block; entering another charges the time since the last
 * switch to the one it leaves: one clock read per switch, a few per layer. */
typedef enum df_blk {
    DF_BLK_OTHER,   /* embedding, residual adds and AttnRes mixing, final norm, LM head */
    DF_BLK_KDA,     /* Kimi Delta Attention layers: norm, projections, convolutions, recurrence */
    DF_BLK_ATTN,    /* softmax attention (GQA, MLA): norm, projections, attention over the cache */
    DF_BLK_FFN,     /* the MoE spine and dense FFN: norm, routers (predictions too), shared
                       experts, latent projections and norm */
    DF_BLK_EXPERTS, /* df_moe_experts: routed experts' compute, and waits on their reads */
    DF_BLK_N
} df_blk;

typedef struct df_fwd {
    const df_model *m;
    df_pool *pool;
    df_xsource *experts;     /* where routed experts come from */
    void *work;              /* the family's buffers for max_rows rows (arch->work_new) */
    int max_rows, max_ctx;
    df_route_fn route;       /* NULL: the router's choice */
    void *route_user;
    df_layer_cb on_layer;    /* may be NULL */
    void *layer_user;
    /* seconds charged to each block, summed over passes (the engine takes
     * them after each one); the block the pass is in and since when */
    double block_s[DF_BLK_N];
    df_blk blk;
    double blk_t;
    /* A multi-sequence pass wants the logits of chosen rows: when n_out > 0,
     * logits gets one [vocab] row per out_rows[i] (batch rows, ascending), in
     * place of all_rows / the last row. */
    const int *out_rows;
    int n_out;
} df_fwd;

/* Enters block b; returns the block left (to go back to after a nested one). */
static inline df_blk df_blk_enter(df_fwd *f, df_blk b) {
    double now = df_now();
    df_blk prev = f->blk;
    f->block_s[prev] += now - f->blk_t;
    f->blk = b, f->blk_t = now;
    return prev;
}

/* Runs the batch (b->n <= f->max_rows): appends every row to its sequence's
 * state and advances the sequences. logits: NULL, or [n][vocab] when
 * all_rows, else [vocab] for the last row. Fails only on expert read errors
 * (and on a malformed batch, a programming error reported as DF_ERR_ARG). */
int df_forward(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err);

/* The end of every family's pass: the final norm and the LM head on the rows
 * the logits are asked for (the last, all, or f->out_rows) of the final
 * hidden rows x [T][hidden]; xb is scratch for T rows. A row's logits are
 * those of its own row alone, whichever rows go with it. */
void df_forward_logits(df_fwd *f, const float *x, float *xb, int T, float *logits, bool all_rows);

#endif
