/*
 * kda.c - Kimi Delta Attention (Kimi-Linear, Kimi K3): the short causal
 * convolutions, the per-head normalisations and gates, the delta-rule
 * recurrence over each sequence's fixed-size state, and the gated output norm
 * (blocks.h has the contract; ARCHITECTURES.md 4.4 the math).
 *
 * One order for every row: a sequence's rows are absorbed one at a time, in
 * position order, whatever the batch (a prompt prefilled as T rows gives the
 * same bits as T single-token steps; there is no chunked form). Heads are
 * independent, so threads split heads; within a head every sum runs in a
 * fixed order (the state's rows by key channel, each an element-wise
 * df_axpy_f32 over the value channels).
 *
 * The state of one sequence and layer (a df_rec_state): per head the key x
 * value matrix S (rows: key channels), then per projection (q, k, v) and
 * channel the kernel-1 previous inputs of its convolution, oldest first.
 */
#include "model/blocks.h"

#include <stdlib.h>

size_t df_kda_state_floats(const df_kda *k) {
    size_t C = (size_t)k->nh * (size_t)k->dk;
    return C * (size_t)k->dk + 3 * C * (size_t)(k->kernel - 1);
}

typedef struct {
    const df_batch *b;
    int li;
    const df_kda *k;
    const float *in[3]; /* q, k, v before the convolutions [T][C] */
    const float *graw, *braw, *gate;
    float *out;
    float *const *slot; /* [T]: the snapshot after row t, or NULL */
} kda_ctx;

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Channel c's convolution over its window and the new input x (oldest input
 * first, the current one last), then SiLU; the window moves on by one. */
static float conv_step(float *win, const float *w, int K, float x) {
    float y = 0.0f;
    for (int j = 0; j < K - 1; j++) y += w[j] * win[j];
    y += w[K - 1] * x;
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    if (K > 1) win[K - 2] = x;
    return df_silu(y);
}

/* x * rsqrt(sum x^2 + 1e-6) * scale */
static void l2norm(float *x, int n, float scale) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* The log-decay of key channel d of head h for input graw + dt_bias. */
static float log_decay(const df_kda *k, int h, int d, float x) {
    float a = k->a_per_channel ? k->a[d] : k->a[h];
    if (k->lower_bound_form) return k->lower_bound * sigmoidf(a * x);
    return -a * softplusf(x);
}

/* Row t of head h: the convolutions, the recurrence on this row's sequence's
 * state, the head's output. */
static void head_row(const kda_ctx *c, int h, int t, float *q, float *kk, float *v, float *u) {
    const df_kda *k = c->k;
    int dk = k->dk, K = k->kernel;
    size_t C = (size_t)k->nh * (size_t)dk, c0 = (size_t)h * (size_t)dk;
    df_rec_state *st = df_rec_of(c->b->seq[t]->layer[c->li]);
    float *S = st->data + c0 * (size_t)dk;
    float *win = st->data + C * (size_t)dk;
    float *vec[3] = {q, kk, v};
    for (int m = 0; m < 3; m++)
        for (int d = 0; d < dk; d++) {
            size_t ch = c0 + (size_t)d;
            vec[m][d] = conv_step(win + ((size_t)m * C + ch) * (size_t)(K - 1), k->conv[m] + ch * (size_t)K, K,
                                  c->in[m][(size_t)t * C + ch]);
        }
    l2norm(q, dk, 1.0f / sqrtf((float)dk));
    l2norm(kk, dk, 1.0f);
    float beta = sigmoidf(c->braw[(size_t)t * (size_t)k->nh + (size_t)h]);
    const float *graw = c->graw + (size_t)t * C + c0;
    for (int d = 0; d < dk; d++) {
        float decay = expf(log_decay(k, h, d, graw[d] + k->dt_bias[c0 + (size_t)d]));
        float *row = S + (size_t)d * (size_t)dk;
        for (int j = 0; j < dk; j++) row[j] *= decay;
    }
    /* u = beta (v - S^T k); S += k u^T; o = S^T q */
    memset(u, 0, sizeof(float) * (size_t)dk);
    for (int d = 0; d < dk; d++) df_axpy_f32(u, kk[d], S + (size_t)d * (size_t)dk, dk);
    for (int j = 0; j < dk; j++) u[j] = beta * (v[j] - u[j]);
    for (int d = 0; d < dk; d++) df_axpy_f32(S + (size_t)d * (size_t)dk, kk[d], u, dk);
    float *o = c->out + (size_t)t * C + c0;
    memset(o, 0, sizeof(float) * (size_t)dk);
    for (int d = 0; d < dk; d++) df_axpy_f32(o, q[d], S + (size_t)d * (size_t)dk, dk);
    df_rmsnorm(o, o, k->o_norm, dk, k->eps);
    const float *g = c->gate + (size_t)t * C + c0;
    for (int j = 0; j < dk; j++) o[j] *= sigmoidf(g[j]);
    if (c->slot[t]) { /* this head's part of the snapshot after row t */
        memcpy(c->slot[t] + c0 * (size_t)dk, S, sizeof(float) * (size_t)dk * (size_t)dk);
        for (int m = 0; m < 3; m++) {
            size_t at = ((size_t)m * C + c0) * (size_t)(K - 1);
            memcpy(c->slot[t] + C * (size_t)dk + at, win + at, sizeof(float) * (size_t)dk * (size_t)(K - 1));
        }
    }
}

static void heads(void *vctx, int h0, int h1) {
    const kda_ctx *c = vctx;
    int dk = c->k->dk;
    float q[dk], kk[dk], v[dk], u[dk];
    for (int h = h0; h < h1; h++)
        for (int t = 0; t < c->b->n; t++) head_row(c, h, t, q, kk, v, u);
}

void df_kda_rows(df_pool *p, const df_batch *b, int li, const df_kda *k, const float *q, const float *kk,
                 const float *v, const float *graw, const float *braw, const float *gate, float *out) {
    int T = b->n;
    float *slot[T];
    /* snapshot slots are taken serially, before the heads fill them */
    for (int t = 0; t < T; t++) slot[t] = df_rec_prepare(b->seq[t]->layer[li], b->seq[t], b->pos[t] + 1);
    kda_ctx c = {b, li, k, {q, kk, v}, graw, braw, gate, out, slot};
    df_pool_for(p, k->nh, 1, heads, &c);
}
