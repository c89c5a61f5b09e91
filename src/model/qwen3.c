/*
 * qwen3.c - the forward pass of Qwen3 (dense) and Qwen3-MoE, read top to bottom:
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) -> q, k, v projections -> per-head q/k rmsnorm -> rotary
 *       x += o_proj(causal grouped-query attention over the KV cache)
 *       h = rmsnorm(x)
 *       x += dense SiLU-gated MLP(h)        or, on MoE layers,
 *       x += sum_k w_k * expert_k(h)        softmax router over all experts, top-k
 *   logits = lm_head(rmsnorm(x))
 *
 * The pass takes T consecutive positions of one sequence at once. Exactness
 * rules that make a row's logits independent of T and of the thread count:
 * every reduction is either a kernel from kernels.h (fixed order per output
 * element) or a plain sequential loop over one row; work is split over rows,
 * heads or output features, never over a reduction; MoE outputs are combined
 * per row in top-k slot order, not in the order experts happen to be computed.
 */
#include "model/model.h"

#include "experts/store.h"

#include <math.h>
#include <stdlib.h>

struct df_fwd_buf {
    int rows, max_ctx;
    float *x, *xb, *q, *k, *v, *att, *hg, *hu;
    float *router;      /* [R][E] */
    int *sel;           /* [R][topk] expert ids */
    float *selw;        /* [R][topk] routing weights */
    float *xg, *yg;     /* [R][H] rows gathered for one expert, its output */
    int *grow;          /* [R] (row*topk + slot) of each gathered row */
    float *yslot;       /* [R][topk][H] */
    float *pxb, *prouter; /* [R][H], [R][E]: a later layer's router, run early */
    int *psel;            /* [R][topk] */
    float *pselw;
    df_route_fn route_fn; /* routing replay (benchmarks): replaces the top-k ids */
    void *route_user;
};

/* The sizes the work buffers are made of. */
typedef struct dims { size_t R, H, qd, kvd, I, E, K, HG; } dims;

static dims buf_dims(const df_model *m, int rows) {
    const df_config *c = &m->cfg;
    dims d;
    d.R = (size_t)rows;
    d.H = (size_t)c->hidden_size;
    d.qd = (size_t)c->num_attention_heads * (size_t)c->head_dim;
    d.kvd = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    d.I = (size_t)(c->intermediate_size > c->moe_intermediate_size ? c->intermediate_size
                                                                   : c->moe_intermediate_size);
    d.E = (size_t)(c->num_experts > 0 ? c->num_experts : 1);
    d.K = (size_t)(c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
    /* hg/hu: R rows of the widest MLP, or one row's K experts side by side
     * (moe_one_row) */
    size_t one_row = c->num_experts > 0 ? d.K * (size_t)c->moe_intermediate_size : 0;
    d.HG = d.R * d.I > one_row ? d.R * d.I : one_row;
    return d;
}

df_fwd_buf *df_fwd_buf_new(const df_model *m, int rows, int max_ctx) {
    dims d = buf_dims(m, rows);
    size_t R = d.R, H = d.H, qd = d.qd, kvd = d.kvd, E = d.E, K = d.K, HG = d.HG;
    df_fwd_buf *b = df_xcalloc(1, sizeof *b);
    b->rows = rows;
    b->max_ctx = max_ctx;
    b->x = df_aligned_alloc(sizeof(float) * R * H);
    b->xb = df_aligned_alloc(sizeof(float) * R * H);
    b->q = df_aligned_alloc(sizeof(float) * R * qd);
    b->k = df_aligned_alloc(sizeof(float) * R * kvd);
    b->v = df_aligned_alloc(sizeof(float) * R * kvd);
    b->att = df_aligned_alloc(sizeof(float) * R * qd);
    b->hg = df_aligned_alloc(sizeof(float) * HG);
    b->hu = df_aligned_alloc(sizeof(float) * HG);
    b->router = df_aligned_alloc(sizeof(float) * R * E);
    b->sel = df_xcalloc(R * K, sizeof(int));
    b->selw = df_aligned_alloc(sizeof(float) * R * K);
    b->xg = df_aligned_alloc(sizeof(float) * R * H);
    b->yg = df_aligned_alloc(sizeof(float) * R * H);
    b->grow = df_xcalloc(R, sizeof(int));
    b->yslot = df_aligned_alloc(sizeof(float) * R * K * H);
    b->pxb = df_aligned_alloc(sizeof(float) * R * H);
    b->prouter = df_aligned_alloc(sizeof(float) * R * E);
    b->psel = df_xcalloc(R * K, sizeof(int));
    b->pselw = df_aligned_alloc(sizeof(float) * R * K);
    return b;
}

void df_fwd_buf_free(df_fwd_buf *b) {
    if (!b) return;
    free(b->x); free(b->xb); free(b->q); free(b->k); free(b->v); free(b->att);
    free(b->hg); free(b->hu); free(b->router); free(b->sel); free(b->selw);
    free(b->xg); free(b->yg); free(b->grow); free(b->yslot);
    free(b->pxb); free(b->prouter); free(b->psel); free(b->pselw);
    free(b);
}

int df_fwd_buf_rows(const df_fwd_buf *b) { return b->rows; }

void df_fwd_buf_set_route(df_fwd_buf *b, df_route_fn fn, void *user) {
    b->route_fn = fn;
    b->route_user = user;
}

size_t df_fwd_buf_bytes(const df_model *m, int rows, int max_ctx) {
    dims d = buf_dims(m, rows);
    size_t R = d.R, H = d.H, qd = d.qd, kvd = d.kvd, E = d.E, K = d.K, HG = d.HG;
    /* the forward buffers, plus attention's per-thread score rows */
    return sizeof(float) * (R * (5 * H + 2 * qd + 2 * kvd + 2 * E + 2 * K + K * H) + 2 * HG) +
           sizeof(int) * R * (2 * K + 1) + sizeof(float) * 64 * (size_t)max_ctx;
}

int df_kv_init(df_kv *kv, const df_model *m, int max_ctx, df_error *err) {
    const df_config *c = &m->cfg;
    kv->max_ctx = max_ctx;
    kv->kv_dim = c->num_key_value_heads * c->head_dim;
    size_t n = (size_t)c->num_hidden_layers * (size_t)max_ctx * (size_t)kv->kv_dim;
    kv->k = malloc(sizeof(float) * n);
    kv->v = malloc(sizeof(float) * n);
    if (!kv->k || !kv->v) {
        free(kv->k);
        free(kv->v);
        kv->k = kv->v = NULL;
        return df_fail(err, DF_ERR_NOMEM, "KV cache of %d positions (%.1f MiB) does not fit in memory",
                       max_ctx, 2.0 * sizeof(float) * (double)n / 1048576.0);
    }
    return DF_OK;
}

void df_kv_free(df_kv *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

/* ---- row-local helpers ---------------------------------------------------------- */

/* HF RMSNorm: x * rsqrt(mean(x^2) + eps) * w, in float. */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = df_dot_f32(x, x, n) / (float)n;
    float s = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * s) * w[i];
}

/* NeoX rotary layout: the two halves of a head rotate together. */
static void rope(float *x, int hd, const float *cosv, const float *sinv) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cosv[i] - b * sinv[i];
        x[i + half] = b * cosv[i] + a * sinv[i];
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static void embed_row(const df_model *m, int32_t tok, float *out) {
    const df_weight *e = &m->embed;
    size_t es = df_dtype_size(e->dtype);
    df_to_f32(out, (const char *)e->data + (size_t)tok * (size_t)e->cols * es, e->dtype,
              (size_t)e->cols);
}

static void add_bias(float *y, int ld, const float *bias, int T, int n) {
    if (!bias) return;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * ld + i] += bias[i];
}

static void matmul(df_pool *p, float *y, const float *x, const df_weight *w, int T) {
    df_matmul(p, y, w->rows, x, w->cols, w->data, w->dtype, T, w->rows, w->cols);
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct {
    const df_model *m;
    const df_kv *kv;
    const df_fwd_buf *b;
    int layer, pos0;
} attn_ctx;

/* One (row, head) item per index: scores over positions 0..pos, softmax, then the
 * weighted sum of values in position order. */
static void attn_items(void *vctx, int begin, int end) {
    const attn_ctx *a = vctx;
    const df_config *c = &a->m->cfg;
    int nh = c->num_attention_heads, hd = c->head_dim;
    int group = nh / c->num_key_value_heads, kvd = a->kv->kv_dim;
    int qd = nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    size_t lofs = (size_t)a->layer * (size_t)a->kv->max_ctx * (size_t)kvd;
    float *sc = df_xmalloc(sizeof(float) * (size_t)a->kv->max_ctx);
    for (int it = begin; it < end; it++) {
        int t = it / nh, h = it % nh, g = h / group;
        int pos = a->pos0 + t;
        const float *q = a->b->q + (size_t)t * qd + (size_t)h * hd;
        const float *kbase = a->kv->k + lofs + (size_t)g * hd;
        const float *vbase = a->kv->v + lofs + (size_t)g * hd;
        float mx = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            sc[j] = df_dot_f32(q, kbase + (size_t)j * kvd, hd) * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0.0f;
        for (int j = 0; j <= pos; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = 1.0f / sum;
        float *out = a->b->att + (size_t)t * qd + (size_t)h * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j <= pos; j++) df_axpy_f32(out, sc[j] * inv, vbase + (size_t)j * kvd, hd);
    }
    free(sc);
}

/* The q, k and v projections as one job over their stacked output rows: one
 * pool crossing (and one wait for the slower thread) instead of three. Each
 * output is still one df_matmul_rows element: the same sum as df_matmul. */
typedef struct {
    const df_weight *w[3];
    float *y[3];
    const float *x;
    int T;
} qkv_ctx;

static void qkv_rows(void *vctx, int begin, int end) {
    const qkv_ctx *c = vctx;
    int base = 0;
    for (int j = 0; j < 3; j++) {
        const df_weight *w = c->w[j];
        int r0 = begin - base > 0 ? begin - base : 0;
        int r1 = end - base < w->rows ? end - base : w->rows;
        if (r0 < r1)
            df_matmul_rows(c->y[j], w->rows, c->x, w->cols, w->data, w->dtype, c->T, r0, r1, w->cols);
        base += w->rows;
    }
}

static void attention(const df_model *m, df_pool *pool, df_kv *kv, df_fwd_buf *b, int li,
                      int T, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[li];
    int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    int nkv = c->num_key_value_heads, qd = nh * hd, kvd = nkv * hd;

    for (int t = 0; t < T; t++)
        rmsnorm(b->xb + (size_t)t * H, b->x + (size_t)t * H, L->attn_norm, H, (float)c->rms_norm_eps);
    qkv_ctx qc = {{&L->q, &L->k, &L->v}, {b->q, b->k, b->v}, b->xb, T};
    df_pool_for(pool, qd + 2 * kvd, 16, qkv_rows, &qc);
    add_bias(b->q, qd, L->q_bias, T, qd);
    add_bias(b->k, kvd, L->k_bias, T, kvd);
    add_bias(b->v, kvd, L->v_bias, T, kvd);

    int half = hd / 2;
    float cosv[half > 0 ? half : 1], sinv[half > 0 ? half : 1];
    for (int t = 0; t < T; t++) {
        /* HF: angle = float(pos) * inv_freq in float32, cos/sin scaled by the
         * rope attention factor (YaRN). */
        float p = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float ang = p * m->inv_freq[i];
            cosv[i] = (float)cos((double)ang) * m->rope_attn_factor;
            sinv[i] = (float)sin((double)ang) * m->rope_attn_factor;
        }
        for (int h = 0; h < nh; h++) {
            float *q = b->q + (size_t)t * qd + (size_t)h * hd;
            rmsnorm(q, q, L->q_norm, hd, (float)c->rms_norm_eps);
            rope(q, hd, cosv, sinv);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = b->k + (size_t)t * kvd + (size_t)h * hd;
            rmsnorm(k, k, L->k_norm, hd, (float)c->rms_norm_eps);
            rope(k, hd, cosv, sinv);
        }
        size_t at = ((size_t)li * (size_t)kv->max_ctx + (size_t)(pos0 + t)) * (size_t)kvd;
        memcpy(kv->k + at, b->k + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
        memcpy(kv->v + at, b->v + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
    }

    attn_ctx a = {m, kv, b, li, pos0};
    df_pool_for(pool, T * nh, 1, attn_items, &a);

    matmul(pool, b->xb, b->att, &L->o, T);
    add_bias(b->xb, H, L->o_bias, T, H);
    for (size_t i = 0; i < (size_t)T * H; i++) b->x[i] += b->xb[i];
}

/* ---- feed-forward ----------------------------------------------------------------- */

/* SiLU-gated MLP over n rows of xin, result into yout. */
typedef struct {
    const df_weight *gate, *up;
    const float *x;
    float *hg, *hu;
    int n;
} gate_up_ctx;

/* Gate and up rows [r0, r1) and their SiLU product, in one dispatch: a
 * thread's slice of both matrices streams back to back, and the pool is
 * crossed once instead of twice (this runs for every expert of every token). */
static void gate_up_rows(void *vctx, int r0, int r1) {
    const gate_up_ctx *c = vctx;
    int I = c->gate->rows, H = c->gate->cols;
    df_matmul_rows(c->hg, I, c->x, H, c->gate->data, c->gate->dtype, c->n, r0, r1, H);
    df_matmul_rows(c->hu, I, c->x, H, c->up->data, c->up->dtype, c->n, r0, r1, H);
    for (int t = 0; t < c->n; t++)
        for (int r = r0; r < r1; r++) {
            size_t i = (size_t)t * I + r;
            c->hg[i] = silu(c->hg[i]) * c->hu[i];
        }
}

static void mlp(df_pool *pool, df_fwd_buf *b, const df_weight *gate, const df_weight *up,
                const df_weight *down, const float *xin, float *yout, int n) {
    gate_up_ctx c = {gate, up, xin, b->hg, b->hu, n};
    df_pool_for(pool, gate->rows, 16, gate_up_rows, &c);
    matmul(pool, yout, b->hg, down, n);
}

/* Softmax over all experts (float), top-k by probability (ties: lower id),
 * optionally renormalised to sum to one, as Hugging Face's Qwen3-MoE block.
 * forced (routing replay): these ids instead of the top-k, each weighted by the
 * router's own probability for it, renormalised the same way, so the weights
 * stay the router's and only the choice is replaced. */
static void route(const df_config *c, const float *logits, int *sel, float *w,
                  const int *forced) {
    int E = c->num_experts, K = c->num_experts_per_tok;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++)
        if (logits[e] > mx) mx = logits[e];
    float prob[E], sum = 0.0f;
    for (int e = 0; e < E; e++) {
        prob[e] = expf(logits[e] - mx);
        sum += prob[e];
    }
    for (int e = 0; e < E; e++) prob[e] /= sum;
    for (int k = 0; k < K; k++) {
        if (forced) {
            sel[k] = forced[k];
            w[k] = prob[forced[k]];
            continue;
        }
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
        }
        sel[k] = best;
        w[k] = prob[best];
    }
    if (c->norm_topk_prob) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] /= s;
    }
}

/* Rows of the batch routed to expert e go through it as one batch. */
static void run_expert(df_pool *pool, df_fwd_buf *b, const df_expert *x, int e, int T, int K,
                       int H) {
    int n = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            if (b->sel[t * K + k] == e) {
                memcpy(b->xg + (size_t)n * H, b->xb + (size_t)t * H, sizeof(float) * (size_t)H);
                b->grow[n++] = t * K + k;
            }
    mlp(pool, b, &x->gate, &x->up, &x->down, b->xg, b->yg, n);
    for (int r = 0; r < n; r++)
        memcpy(b->yslot + (size_t)b->grow[r] * H, b->yg + (size_t)r * H, sizeof(float) * (size_t)H);
}

/* One row with resident experts (decode): the K experts' gate/up products
 * run as one parallel job over their stacked rows and their down products as
 * another, instead of two jobs per expert (2 crossings of the pool
 * per layer instead of 2K). In a decode profile the pool's spin-wait for the
 * slower thread was 6-7% of the time; a whole-layer job is split evenly
 * between threads once, not once per 3 MB matrix. Expert k's input is the
 * row itself and its output goes straight to slot k; every output element is
 * the same df_matmul_rows sum as in run_expert, so results do not change.
 * A top-k slot is computed even if an id repeats (routing replay): same
 * result, the slot order is kept. */
typedef struct {
    const df_layer *L;
    const int *sel; /* [K] */
    const float *x; /* [H] */
    float *hg, *hu; /* [K][I] */
    float *y;       /* [K][H] */
    int I, H;
} one_row_ctx;

static void one_row_gate_up(void *vctx, int begin, int end) {
    const one_row_ctx *c = vctx;
    int I = c->I, H = c->H;
    for (int i = begin; i < end;) {
        int k = i / I, r0 = i % I, r1 = r0 + (end - i) < I ? r0 + (end - i) : I;
        const df_expert *x = &c->L->experts[c->sel[k]];
        float *hg = c->hg + (size_t)k * I, *hu = c->hu + (size_t)k * I;
        df_matmul_rows(hg, I, c->x, H, x->gate.data, x->gate.dtype, 1, r0, r1, H);
        df_matmul_rows(hu, I, c->x, H, x->up.data, x->up.dtype, 1, r0, r1, H);
        for (int r = r0; r < r1; r++) hg[r] = silu(hg[r]) * hu[r];
        i += r1 - r0;
    }
}

static void one_row_down(void *vctx, int begin, int end) {
    const one_row_ctx *c = vctx;
    int I = c->I, H = c->H;
    for (int i = begin; i < end;) {
        int k = i / H, r0 = i % H, r1 = r0 + (end - i) < H ? r0 + (end - i) : H;
        const df_weight *d = &c->L->experts[c->sel[k]].down;
        df_matmul_rows(c->y + (size_t)k * H, H, c->hg + (size_t)k * I, I, d->data, d->dtype, 1,
                       r0, r1, I);
        i += r1 - r0;
    }
}

static void moe_one_row(const df_layer *L, df_pool *pool, df_fwd_buf *b, int K, int H) {
    one_row_ctx c = {L, b->sel, b->xb, b->hg, b->hu, b->yslot, L->experts[0].gate.rows, H};
    df_pool_for(pool, K * c.I, 16, one_row_gate_up, &c);
    df_pool_for(pool, K * H, 16, one_row_down, &c);
}

/* ---- router lookahead ------------------------------------------------------------ */

/* The model layer of the n-th MoE layer after model layer `li` (n >= 1), or -1. */
static int moe_after(const df_model *m, int li, int n) {
    for (int l = li + 1; l < m->cfg.num_hidden_layers; l++)
        if (m->layers[l].is_moe && --n == 0) return l;
    return -1;
}

/* Predicts MoE layer `target`'s experts by running its post-attention norm and
 * router on the residual stream as it is now, and lets the store read them
 * ahead. Only the store's reads depend on this: the layer's own routing is
 * computed afresh when it comes, so results do not change. */
static void lookahead(const df_model *m, df_store *store, df_pool *pool, df_fwd_buf *b, int target,
                      int T) {
    if (target < 0) return;
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[target];
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    for (int t = 0; t < T; t++)
        rmsnorm(b->pxb + (size_t)t * H, b->x + (size_t)t * H, L->ffn_norm, H, (float)c->rms_norm_eps);
    matmul(pool, b->prouter, b->pxb, &L->router, T);
    for (int t = 0; t < T; t++)
        route(c, b->prouter + (size_t)t * E, b->psel + (size_t)t * K, b->pselw + (size_t)t * K, NULL);
    df_store_predict(store, target, b->psel, T * K);
}

/* The distinct experts among n routing choices, ascending: each is computed
 * once for all the rows that chose it. Returns how many. */
static int distinct_experts(const int *sel, int n, int E, int *need) {
    bool used[E];
    memset(used, 0, sizeof used);
    for (int i = 0; i < n; i++) used[sel[i]] = true;
    int n_need = 0;
    for (int e = 0; e < E; e++)
        if (used[e]) need[n_need++] = e;
    return n_need;
}

static int moe(const df_model *m, df_store *store, df_pool *pool, df_fwd_buf *b, int li, int T,
               df_error *err) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[li];
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    matmul(pool, b->router, b->xb, &L->router, T);
    for (int t = 0; t < T; t++) {
        int forced[K];
        if (b->route_fn) b->route_fn(b->route_user, li, t, forced);
        route(c, b->router + (size_t)t * E, b->sel + (size_t)t * K, b->selw + (size_t)t * K,
              b->route_fn ? forced : NULL);
    }

    if (!store && T == 1) {
        moe_one_row(L, pool, b, K, H); /* by top-k slot: no list of distinct experts */
    } else if (!store) {
        int need[E], n_need = distinct_experts(b->sel, T * K, E, need);
        for (int i = 0; i < n_need; i++) run_expert(pool, b, &L->experts[need[i]], need[i], T, K, H);
    } else {
        int need[E], n_need = distinct_experts(b->sel, T * K, E, need);
        /* All reads are requested at once; experts come back resident-first. */
        int rc = df_store_begin_layer(store, li, need, n_need, err);
        if (rc) return rc;
        /* this layer's reads are queued; the one `depth` MoE layers on goes next */
        int depth = df_store_lookahead_depth(store);
        if (depth) lookahead(m, store, pool, b, moe_after(m, li, depth), T);
        for (;;) {
            int e;
            df_expert w;
            if ((rc = df_store_next(store, &e, &w, err))) {
                df_store_end_layer(store);
                return rc;
            }
            if (e < 0) break;
            run_expert(pool, b, &w, e, T, K, H);
        }
        df_store_end_layer(store);
    }
    /* Combine per row in top-k slot order: independent of the order above. */
    for (int t = 0; t < T; t++) {
        float *xo = b->x + (size_t)t * H;
        float *acc = b->xb + (size_t)t * H;
        for (int k = 0; k < K; k++) {
            const float *y = b->yslot + ((size_t)t * K + k) * H;
            float w = b->selw[t * K + k];
            if (k == 0)
                for (int i = 0; i < H; i++) acc[i] = w * y[i];
            else
                for (int i = 0; i < H; i++) acc[i] += w * y[i];
        }
        for (int i = 0; i < H; i++) xo[i] += acc[i];
    }
    return DF_OK;
}

static int feed_forward(const df_model *m, df_store *store, df_pool *pool, df_fwd_buf *b, int li,
                        int T, df_error *err) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[li];
    int H = c->hidden_size;
    for (int t = 0; t < T; t++)
        rmsnorm(b->xb + (size_t)t * H, b->x + (size_t)t * H, L->ffn_norm, H, (float)c->rms_norm_eps);
    if (L->is_moe) return moe(m, store, pool, b, li, T, err);
    mlp(pool, b, &L->gate, &L->up, &L->down, b->xb, b->yg, T);
    for (size_t i = 0; i < (size_t)T * H; i++) b->x[i] += b->yg[i];
    return DF_OK;
}

/* ---- the whole pass ------------------------------------------------------------- */

int df_qwen3_forward(const df_model *m, df_store *store, df_pool *pool, df_kv *kv,
                     df_fwd_buf *b, const int32_t *tokens, int T, int pos0, float *logits,
                     bool all_rows, df_layer_cb on_layer, void *user, df_error *err) {
    const df_config *c = &m->cfg;
    int H = c->hidden_size;
    for (int t = 0; t < T; t++) embed_row(m, tokens[t], b->x + (size_t)t * H);
    /* The first MoE layers have no earlier one to predict them from: their
     * routers run on the embeddings. */
    int depth = store ? df_store_lookahead_depth(store) : 0;
    for (int n = 1; n <= depth; n++) lookahead(m, store, pool, b, moe_after(m, -1, n), T);
    for (int li = 0; li < c->num_hidden_layers; li++) {
        attention(m, pool, kv, b, li, T, pos0);
        int rc = feed_forward(m, store, pool, b, li, T, err);
        if (rc) return rc;
        if (on_layer) on_layer(user, li + 1, c->num_hidden_layers, T);
    }
    if (store) df_store_end_step(store, T);
    if (!logits) return DF_OK;
    int first = all_rows ? 0 : T - 1, n = T - first;
    for (int t = first; t < T; t++)
        rmsnorm(b->xb + (size_t)(t - first) * H, b->x + (size_t)t * H, m->final_norm, H,
                (float)c->rms_norm_eps);
    matmul(pool, logits, b->xb, &m->lm_head, n);
    return DF_OK;
}
