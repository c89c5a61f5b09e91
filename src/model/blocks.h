/*
 * blocks.h - the building blocks families' forward passes are made of: norms,
 * rotary embeddings, embedding lookup, linear layers, grouped-query attention
 * over the sequences' key/value caches, the SwiGLU feed-forward, the softmax
 * top-k router, and the MoE layer (router output -> the expert source ->
 * batched expert FFNs -> the per-row combine in top-k slot order).
 *
 * Exactness rules every block keeps, so that a row's results do not depend on
 * the batch, the thread count, the ISA path or where experts came from: every
 * reduction is a kernel from kernels.h (fixed order per output element) or a
 * plain sequential loop over one row; work is split over rows, heads or output
 * features, never over a reduction; expert outputs are combined per row in
 * top-k slot order, not in the order experts are computed.
 */
#ifndef DF_BLOCKS_H
#define DF_BLOCKS_H

#include "model/forward.h"

#include <math.h>

/* ---- row-local ------------------------------------------------------------------ */

/* Hugging Face's RMSNorm: (x * rsqrt(mean(x^2) + eps)) * w, in float. */
void df_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* Rows [0, T) of x (stride n) into out. */
void df_rmsnorm_rows(float *out, const float *x, const float *w, int T, int n, float eps);
static inline float df_silu(float x) { return x / (1.0f + expf(-x)); }
/* y[t][i] += bias[i] (NULL bias: nothing). */
void df_add_bias(float *y, int ld, const float *bias, int T, int n);
/* x[i] += y[i] over n elements. */
void df_add(float *x, const float *y, size_t n);

/* ---- embeddings and linear layers ------------------------------------------------ */

/* Row `tok` of the embedding table, widened to F32. */
void df_embed_rows(const df_weight *embed, const int32_t *tokens, int T, float *out);
/* y[T][w.rows] = x[T][w.cols] . w^T */
void df_linear(df_pool *p, float *y, const float *x, const df_weight *w, int T);
/* Several projections of the same input as one job over their stacked output
 * rows (one pool crossing instead of n); each output is still the same sum. */
void df_linear_multi(df_pool *p, int n, const df_weight *const *w, float *const *y, const float *x, int T);

/* ---- rotary position embedding ---------------------------------------------------- */

typedef struct df_rope {
    int dim;             /* rotated dimensions */
    float *inv_freq;     /* [dim/2], Hugging Face's float32 values */
    float attn_factor;   /* YaRN's cos/sin scale */
} df_rope;

/* Frequencies as Hugging Face initialises them for config c (default, linear,
 * yarn; dynamic is refused: its frequencies change with the sequence length). */
int df_rope_init(df_rope *r, const df_config *c, int dim, df_error *err);
void df_rope_free(df_rope *r);
/* cos/sin of position pos for each frequency ([dim/2] each). */
void df_rope_angles(const df_rope *r, int pos, float *cosv, float *sinv);
/* NeoX layout: the two halves of a head rotate together. */
void df_rope_neox(float *x, int dim, const float *cosv, const float *sinv);
/* Interleaved layout (DeepSeek, Kimi): frequency i rotates the pair
 * (x[2i], x[2i+1]). */
void df_rope_interleaved(float *x, int dim, const float *cosv, const float *sinv);

/* ---- grouped-query attention ------------------------------------------------------- */

/* Causal attention of every row of the batch over its own sequence's
 * key/value cache (layer li, positions 0..pos): q [T][nh*hd] in, out
 * [T][nh*hd]. The rows' keys and values are already appended. */
void df_gqa_attend(df_pool *p, const df_batch *b, int li, const float *q, float *out, int nh, int nkv,
                   int hd);

/* ---- multi-head latent attention (mla.c) ------------------------------------------- */

/* MLA's shape: nh heads whose queries are [nope | rope] values, keys and
 * values expanded from a kvl-wide latent by kv_b [nh*(nope+v)][kvl] (per
 * head: nope key rows, then v value rows), and one rope key shared by all
 * heads. The cache row of a position is [latent (kvl) | rotated rope key]. */
typedef struct df_mla {
    int nh, nope, rope, v, kvl;
    float scale;          /* softmax scale: 1/sqrt(nope + rope), times YaRN's mscale^2 */
} df_mla;

typedef struct df_mla_work {
    int rows, max_ctx;
    float *qcat;          /* [rows][nh][kvl + rope] absorbed queries */
    float *olat;          /* [rows][nh][kvl] attention-weighted latents */
    float *ml;            /* [rows][nh][2] the online softmax's running max and sum */
    float *wave;          /* [wave_cap] one wave of blocks' scores and partial sums */
    size_t wave_cap;
    int *len;             /* [rows][nh] positions each row-head sums over */
} df_mla_work;

/* Scratch for batches of up to `rows` rows; max_ctx only sizes it (a longer
 * context takes more passes over it, with the same result). */
df_mla_work *df_mla_work_new(const df_mla *a, int rows, int max_ctx);
void df_mla_work_free(df_mla_work *w);
uint64_t df_mla_work_bytes(const df_mla *a, int rows, int max_ctx);

/* Causal attention of every row of the batch over its sequence's latent cache
 * (layer li; the rows' cache rows already appended), in the absorbed form for
 * every row: q_lat = W_UK^T q_nope per head, score_j = [q_lat | q_pe] . cache_j,
 * softmax, o_lat = sum_j p_j latent_j, out = W_UV o_lat, the softmax online
 * over fixed blocks of positions (mla.c). q [T][nh][nope+rope] (rope part
 * rotated), out [T][nh*v]. One form for prefill and decode, so a row's result
 * is the same in a batch of any size. Rows of one sequence are consecutive. */
void df_mla_attend(df_pool *p, const df_batch *b, int li, const df_mla *a, const df_weight *kv_b,
                   const float *q, float *out, df_mla_work *w);

/* ---- Kimi Delta Attention (kda.c) ---------------------------------------------------- */

/* nh heads of dk key and dk value channels (C = nh * dk). Per row and head:
 * q, k, v through a causal depthwise convolution of `kernel` taps and SiLU;
 * q and k L2-normalised (x rsqrt(sum x^2 + 1e-6)), q times 1/sqrt(dk); a
 * log-decay g per key channel from graw + dt_bias: lower_bound *
 * sigmoid(a x), or -a softplus(x), with a = exp(A_log) per head or per key
 * channel (shared by the heads); beta = sigmoid(braw); then
 *   S = diag(exp(g)) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
 * and the head's output RMSNorm(o, o_norm, eps) * sigmoid(gate). */
typedef struct df_kda {
    int nh, dk, kernel;
    bool lower_bound_form;
    float lower_bound;
    bool a_per_channel;
    const float *a;         /* exp(A_log): [nh], or [dk] when a_per_channel */
    const float *dt_bias;   /* [C] */
    const float *conv[3];   /* q, k, v: [C][kernel] */
    const float *o_norm;    /* [dk] */
    float eps;
} df_kda;

/* Floats of one sequence's state for one layer (model/state.h df_rec_state). */
size_t df_kda_state_floats(const df_kda *k);
/* Every row of the batch through layer li's recurrence, in row order per
 * sequence (each row's sequence holds a df_rec_state at layer li). q, k, v,
 * graw, gate [T][C] (projections of the rows' inputs), braw [T][nh]; out
 * [T][C]. Snapshots the state after each row whose next position the
 * sequence keeps. */
void df_kda_rows(df_pool *p, const df_batch *b, int li, const df_kda *k, const float *q, const float *kk,
                 const float *v, const float *graw, const float *braw, const float *gate, float *out);

/* ---- feed-forward ------------------------------------------------------------------- */

/* A gated MLP's activation: silu(g) * u, or SiTU (Kimi K3):
 * (beta tanh(g/beta) sigmoid(g)) * (lbeta tanh(u/lbeta)), in float. */
typedef struct df_act {
    df_act_kind kind;
    float beta, lbeta;
} df_act;

static inline df_act df_act_of(const df_config *c) { return (df_act){c->act, c->act_beta, c->act_lbeta}; }
static inline float df_glu(const df_act *a, float g, float u) {
    if (a->kind == DF_ACT_SILU) return df_silu(g) * u;
    float sg = a->beta * tanhf(g / a->beta) * (1.0f / (1.0f + expf(-g)));
    return sg * (a->lbeta * tanhf(u / a->lbeta));
}

/* down(silu(gate x) * up x) over n rows: hg, hu [n][gate.rows] scratch. */
void df_swiglu(df_pool *p, const df_wview *gate, const df_wview *up, const df_wview *down, const float *x,
               float *y, float *hg, float *hu, int n);
/* The same with activation act. */
void df_gated_mlp(df_pool *p, const df_act *act, const df_wview *gate, const df_wview *up, const df_wview *down,
                  const float *x, float *y, float *hg, float *hu, int n);

/* ---- mixture of experts -------------------------------------------------------------- */

/* Softmax over E router logits (float), top-k by probability (ties: lower id),
 * optionally renormalised to sum to one (config.json norm_topk_prob).
 * forced (routing replay): these ids instead, each weighted by the router's
 * own probability for it, renormalised the same way. */
void df_route_softmax_topk(const float *logits, int E, int K, bool norm, int *sel, float *w,
                           const int *forced);

/* The scored router (router.c): softmax or sigmoid scores; top-k over the
 * scores (plus the correction bias for noaux_tc), within the topk_group best
 * of n_group groups for the group methods; weights are the chosen experts'
 * scores, renormalised to sum to one (norm, k > 1), times `scaling` unless
 * renormalised and !scale_normed. forced (routing replay): these ids. */
typedef struct df_router {
    df_score_fn scoring;
    df_topk_method method;
    int n_group, topk_group;
    bool norm, scale_normed;
    float scaling;
} df_router;

void df_route_scored(const df_router *r, const float *logits, const float *bias, int E, int K, int *sel,
                     float *w, const int *forced);
/* A MoE layer's scored router over T rows xb: logits = xb x gate, then
 * df_route_scored per row into sel/selw ([T][K]); when `replay` and f->route
 * is set, routing replay forces layer li's ids. */
void df_route_scored_rows(df_fwd *f, const df_router *r, const df_weight *gate, const float *bias, int li,
                          const float *xb, float *logits, int *sel, float *selw, int T, bool replay);

/* A MoE layer's buffers for up to `rows` rows of width H through E experts
 * (top-K) of inner width I; the family's router fills sel/selw. */
typedef struct df_moe_work {
    int rows, H, E, K, I;
    df_act act;          /* the experts' activation (silu unless set) */
    int *sel;            /* [rows][K] expert ids */
    int *lsel;           /* [rows][K] sel less the slots another process computes (-1) */
    float *selw;         /* [rows][K] routing weights */
    float *xg, *yg;      /* [rows][H] rows gathered for a job of experts, their outputs */
    int *grow;           /* [rows] (row * K + slot) of each gathered row */
    float *hg, *hu;      /* [rows][I] */
    float *yslot;        /* [rows][K][H] each row's expert outputs by top-k slot */
    /* a later layer's router run early (read-ahead) */
    float *pxb;          /* [rows][H] */
    float *prouter;      /* [rows][E] */
    int *psel;           /* [rows][K] */
    float *pselw;
} df_moe_work;

df_moe_work *df_moe_work_new(int rows, int H, int E, int K, int I);
void df_moe_work_free(df_moe_work *w);
uint64_t df_moe_work_bytes(int rows, int H, int E, int K, int I);

/* Router lookahead. A family's predict runs MoE layer target's norm and router
 * on the residual stream as it is now and hands the experts it picks to the
 * expert source to read ahead (target < 0: nothing); only reads depend on it,
 * the layer's own routing is computed afresh. */
typedef void (*df_predict_fn)(df_fwd *f, int target, int T);

/* The routed experts of MoE layer li for T rows of xin [T][H] whose top-k
 * (df_moe_sel/selw) are set: each needed expert is fetched once from the
 * expert source and computed for all rows routed to it (SwiGLU), and each
 * row's outputs are combined in slot order into out [T][H]
 * (out = sum_k w_k * expert_k(x)). Once the layer's reads are queued,
 * predict (may be NULL) is run for the MoE layer the source's lookahead depth
 * on, so that predicted reads go behind them; its time is charged to
 * DF_BLK_FFN (forward.h: it runs a router), the rest to DF_BLK_EXPERTS. */
int df_moe_experts(df_fwd *f, df_moe_work *w, int li, const float *xin, float *out, int T, int K,
                   df_predict_fn predict, df_error *err);

/* The experts' part of df_moe_experts, also run by a process that computes
 * experts for another (src/dist/): yslot of every (row, slot) of sel [T][K]
 * that names an expert (-1: skipped, left as it was), each expert fetched once
 * from src and computed for all its rows with mw->act. queued (may be NULL)
 * is called once the reads are requested. */
int df_moe_compute(df_pool *p, df_xsource *src, df_moe_work *mw, int li, const int *sel, const float *xin,
                   int T, void (*queued)(void *ctx), void *ctx, df_error *err);
/* The width routed experts compute at: the latent width where the family
 * has one (Kimi K3), else the hidden size. */
static inline int df_moe_width(const df_config *c) { return c->moe_latent_size ? c->moe_latent_size : c->hidden_size; }

/* The n-th MoE layer after model layer li (n >= 1), or -1. */
int df_moe_after(const df_config *c, int li, int n);

/* How many MoE layers ahead the expert source reads (0: it does not). */
int df_moe_lookahead_depth(df_fwd *f);

#endif
