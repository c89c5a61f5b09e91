/*
 * mla.c - multi-head latent attention (DeepSeek-V2/V3, Kimi K2/K3): the
 * attention of queries over a sequence's latent cache in the absorbed form
 * (blocks.h has the shape and the contract).
 *
 * One form for every step: prefill rows are computed exactly as decode rows,
 * so a row's output does not depend on the batch. Every reduction has a fixed
 * order per output element: the absorbed query sums kv_b's key rows in row
 * order (one fused multiply-add per element, df_axpy_f32), scores are
 * df_matmul dot products of the query with cache rows, the weighted latent
 * sums positions in order (df_axpy_f32), and the value projection is a
 * df_matmul_rows product. Work is split over heads, positions or latent
 * columns, never over a sum.
 *
 * The cache is read twice per group of rows (scores, then the weighted sum),
 * for all heads at once, rather than once per head.
 */
#include "model/blocks.h"

#include <stdlib.h>

/* Score rows (row x head x position) computed at once: the cache is streamed
 * once per group of rows that fits. */
#define MLA_SCORE_FLOATS ((size_t)1 << 22)

static size_t score_cap(const df_mla *a, int rows, int max_ctx) {
    size_t one = (size_t)a->nh * (size_t)max_ctx, all = one * (size_t)rows;
    size_t cap = all < MLA_SCORE_FLOATS ? all : MLA_SCORE_FLOATS;
    return cap > one ? cap : one;
}

uint64_t df_mla_work_bytes(const df_mla *a, int rows, int max_ctx) {
    size_t dim = (size_t)a->kvl + (size_t)a->rope;
    return sizeof(float) * ((uint64_t)rows * (uint64_t)a->nh * (dim + (uint64_t)a->kvl) +
                            score_cap(a, rows, max_ctx)) +
           sizeof(int) * (uint64_t)rows * (uint64_t)a->nh;
}

df_mla_work *df_mla_work_new(const df_mla *a, int rows, int max_ctx) {
    df_mla_work *w = df_xcalloc(1, sizeof *w);
    size_t dim = (size_t)a->kvl + (size_t)a->rope, R = (size_t)rows * (size_t)a->nh;
    w->rows = rows;
    w->max_ctx = max_ctx;
    w->qcat = df_aligned_alloc(sizeof(float) * R * dim);
    w->olat = df_aligned_alloc(sizeof(float) * R * (size_t)a->kvl);
    w->score_cap = score_cap(a, rows, max_ctx);
    w->score = df_aligned_alloc(sizeof(float) * w->score_cap);
    w->len = df_xcalloc(R, sizeof(int));
    return w;
}

void df_mla_work_free(df_mla_work *w) {
    if (!w) return;
    free(w->qcat), free(w->olat), free(w->score), free(w->len);
    free(w);
}

/* A view of rows [r0, r0 + n) of a weight (a scaled one keeps its grid). */
static df_wview rows_of(const df_weight *w, int r0, int n) { return df_wview_rows(&w->v, r0, n); }

typedef struct {
    const df_mla *a;
    const df_weight *kv_b;
    const float *q;
    df_mla_work *w;
    float *out;
    int T;
    /* the current group of rows of one sequence */
    int g0, gn, L;
    const int *pos;
    const float *cache;
} mla_ctx;

/* Heads [h0, h1): qcat = [W_UK^T q_nope | q_pe] for every row. The latent part
 * is df_axpy_rows over the head's nope key rows of kv_b (read once for all
 * rows, widened in registers): each element sums the nope rows in row order,
 * whatever the batch. */
static void absorb_heads(void *vctx, int h0, int h1) {
    const mla_ctx *c = vctx;
    const df_mla *a = c->a;
    int dim = a->kvl + a->rope, qd = a->nope + a->rope;
    float *dec = c->kv_b->v.fmt.scale != DF_SC_NONE
                     ? df_xmalloc(sizeof(float) * (size_t)a->nope * (size_t)a->kvl) : NULL;
    for (int h = h0; h < h1; h++) {
        for (int t = 0; t < c->T; t++) {
            float *qc = c->w->qcat + ((size_t)t * a->nh + h) * dim;
            memset(qc, 0, sizeof(float) * (size_t)a->kvl);
            memcpy(qc + a->kvl, c->q + ((size_t)t * a->nh + h) * qd + a->nope, sizeof(float) * (size_t)a->rope);
        }
        df_wview kr = rows_of(c->kv_b, h * (a->nope + a->v), a->nope);
        const void *x = kr.data;
        df_dtype xt = c->kv_b->t->dtype;
        if (dec) { /* FP8 and 4-bit rows as the numbers the kernels multiply by */
            df_wview_decode_rows(dec, &c->kv_b->v, h * (a->nope + a->v), a->nope);
            x = dec, xt = DF_DT_F32;
        }
        df_axpy_rows(c->w->qcat + (size_t)h * dim, a->nh * dim, c->q + (size_t)h * qd, a->nh * qd, x, xt,
                     a->kvl, c->T, c->w->len, 0, a->kvl);
    }
    free(dec);
}

/* Row-heads [i0, i1) of the group: scale, causal mask, softmax in place. */
static void softmax_items(void *vctx, int i0, int i1) {
    const mla_ctx *c = vctx;
    for (int i = i0; i < i1; i++)
        df_softmax_f32(c->w->score + (size_t)i * c->L, c->pos[c->g0 + i / c->a->nh] + 1, c->a->scale);
}

/* Latent columns [c0, c1): o_lat = sum_j p_j latent_j over each row's
 * positions, in position order (df_axpy_rows: the cache is read once for all
 * the group's row-heads). */
static void latent_sum(void *vctx, int c0, int c1) {
    const mla_ctx *c = vctx;
    const df_mla *a = c->a;
    int dim = a->kvl + a->rope, nrh = c->gn * a->nh;
    float *olat = c->w->olat + (size_t)c->g0 * a->nh * a->kvl;
    for (int i = 0; i < nrh; i++) memset(olat + (size_t)i * a->kvl + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    df_axpy_rows(olat, a->kvl, c->w->score, c->L, c->cache, DF_DT_F32, dim, nrh, c->w->len, c0, c1);
}

/* Heads [h0, h1): out = W_UV o_lat for every row. */
static void value_heads(void *vctx, int h0, int h1) {
    const mla_ctx *c = vctx;
    const df_mla *a = c->a;
    for (int h = h0; h < h1; h++) {
        df_wview uv = rows_of(c->kv_b, h * (a->nope + a->v) + a->nope, a->v);
        df_matmul_rows(c->out + (size_t)h * a->v, a->nh * a->v, c->w->olat + (size_t)h * a->kvl, a->nh * a->kvl,
                       &uv, c->T, 0, a->v);
    }
}

/* Rows [g0, g0 + gn) of one sequence over its first L positions. */
static void attend_group(df_pool *p, mla_ctx *c, int g0, int gn, int L) {
    const df_mla *a = c->a;
    int dim = a->kvl + a->rope;
    c->g0 = g0, c->gn = gn, c->L = L;
    df_wview cv = {{DF_EL_F32, DF_SC_NONE, 0, 0}, c->cache, NULL, L, dim, 0};
    df_matmul(p, c->w->score, L, c->w->qcat + (size_t)g0 * a->nh * dim, dim, &cv, gn * a->nh);
    df_pool_for(p, gn * a->nh, 1, softmax_items, c);
    for (int i = 0; i < gn * a->nh; i++) c->w->len[i] = c->pos[g0 + i / a->nh] + 1;
    /* whole 64-column tiles per thread where the width allows */
    df_pool_for(p, a->kvl, a->kvl % 64 == 0 ? 64 : 16, latent_sum, c);
}

void df_mla_attend(df_pool *p, const df_batch *b, int li, const df_mla *a, const df_weight *kv_b,
                   const float *q, float *out, df_mla_work *w) {
    mla_ctx c = {.a = a, .kv_b = kv_b, .q = q, .w = w, .out = out, .T = b->n, .pos = b->pos};
    for (int t = 0; t < b->n; t++) w->len[t] = a->nope; /* every row sums all nope key rows */
    df_pool_for(p, a->nh, 1, absorb_heads, &c);
    /* Rows of one sequence are consecutive: take them in groups whose scores
     * fit the buffer. */
    for (int t = 0; t < b->n;) {
        const df_seq *s = b->seq[t];
        c.cache = df_latent_of(s->layer[li])->row;
        int end = t;
        while (end < b->n && b->seq[end] == s) end++;
        while (t < end) {
            int gn = 0, L = 0;
            while (t + gn < end) {
                int L2 = b->pos[t + gn] + 1;
                if ((size_t)(gn + 1) * a->nh * (size_t)L2 > w->score_cap && gn > 0) break;
                L = L2, gn++;
            }
            attend_group(p, &c, t, gn, L);
            t += gn;
        }
    }
    df_pool_for(p, a->nh, 1, value_heads, &c);
}
