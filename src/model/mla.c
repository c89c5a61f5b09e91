/*
 * mla.c - multi-head latent attention (DeepSeek-V2/V3, Kimi K2/K3): the
 * attention of queries over a sequence's latent cache in the absorbed form
 * (blocks.h has the shape and the contract).
 *
 * One form for every step: prefill rows are computed exactly as decode rows,
 * so a row's output does not depend on the batch. Every reduction has a fixed
 * order per output element: the absorbed query sums kv_b's key rows in row
 * order (one fused multiply-add per element, df_axpy_f32), and the value
 * projection is a df_matmul_rows product.
 *
 * The softmax is online over fixed blocks of MLA_BLOCK positions, aligned to
 * position 0, so the latent cache is read once: a block's scores (df_matmul
 * dot products with the cache rows), e = exp(s - m_b) with its sum l_b
 * (df_softmax_exp_f32) and o_b = sum_j e_j latent_j in position order
 * (df_axpy_rows) are computed while the block is in cache. The blocks are
 * then merged into a running (M, L, O) in block order, whatever thread
 * computed them:
 *     M' = max(M, m_b); a = exp(M - M'); c = exp(m_b - M')
 *     O = fma(c, o_b, O * a) per element; L = L * a + l_b * c
 * starting from (-inf, 0, 0), and o_lat = O * (1 / L). A row's blocks depend
 * only on its position, so its result is the same alone or batched, with any
 * thread count. Work is split over blocks and runs of row-heads, never over
 * a sum.
 */
#include "model/blocks.h"

#include <math.h>
#include <stdlib.h>

#ifndef MLA_BLOCK
/* positions per block (590 KB of a 576-wide F32 cache, kept in L2; 128-512
 * measured within noise of each other); -D for tuning experiments */
#define MLA_BLOCK 256
#endif
#define MLA_RUN 16    /* row-heads per work item */
/* Floats of the scratch for one wave of blocks: a block's scores, partial
 * latent sum, max and sum per row-head (below), for as many row-heads and
 * blocks as fit. */
#define MLA_WAVE_FLOATS ((size_t)1 << 22)

/* Floats per row-head per block: [scores MLA_BLOCK | o_b kvl | m_b | l_b]. */
static size_t slot_floats(const df_mla *a) { return (size_t)MLA_BLOCK + (size_t)a->kvl + 2; }

static size_t wave_cap(const df_mla *a, int rows, int max_ctx) {
    size_t one = (size_t)a->nh * slot_floats(a), blocks = ((size_t)max_ctx + MLA_BLOCK - 1) / MLA_BLOCK;
    size_t all = one * blocks * (size_t)rows;
    size_t cap = all < MLA_WAVE_FLOATS ? all : MLA_WAVE_FLOATS;
    return cap > one ? cap : one;
}

uint64_t df_mla_work_bytes(const df_mla *a, int rows, int max_ctx) {
    uint64_t R = (uint64_t)rows * (uint64_t)a->nh, dim = (uint64_t)a->kvl + (uint64_t)a->rope;
    return sizeof(float) * (R * (dim + (uint64_t)a->kvl + 2) + wave_cap(a, rows, max_ctx)) + sizeof(int) * R;
}

df_mla_work *df_mla_work_new(const df_mla *a, int rows, int max_ctx) {
    df_mla_work *w = df_xcalloc(1, sizeof *w);
    size_t dim = (size_t)a->kvl + (size_t)a->rope, R = (size_t)rows * (size_t)a->nh;
    w->rows = rows;
    w->max_ctx = max_ctx;
    w->qcat = df_aligned_alloc(sizeof(float) * R * dim);
    w->olat = df_aligned_alloc(sizeof(float) * R * (size_t)a->kvl);
    w->ml = df_aligned_alloc(sizeof(float) * R * 2);
    w->wave_cap = wave_cap(a, rows, max_ctx);
    w->wave = df_aligned_alloc(sizeof(float) * w->wave_cap);
    w->len = df_xcalloc(R, sizeof(int));
    return w;
}

void df_mla_work_free(df_mla_work *w) {
    if (!w) return;
    free(w->qcat), free(w->olat), free(w->ml), free(w->wave), free(w->len);
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
    const int *pos;
    const float *cache;
    /* the current group of rows of one sequence, and its wave of blocks */
    int g0, gn, b0, wn, runs;
    bool last;
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

/* Positions of block b that row-head i of the group attends to. */
static int block_len(const mla_ctx *c, int i, int b) {
    int n = c->pos[c->g0 + i / c->a->nh] + 1 - b * MLA_BLOCK;
    return n < 0 ? 0 : n < MLA_BLOCK ? n : MLA_BLOCK;
}

/* The slot of row-head i of the group for wave block w. */
static float *slot(const mla_ctx *c, int w, int i) {
    return c->w->wave + ((size_t)w * (size_t)(c->gn * c->a->nh) + (size_t)i) * slot_floats(c->a);
}

/* Items [k0, k1): item k is run k % runs of the group's row-heads over block
 * b0 + k / runs: scores, e and its sum, o_b. */
static void block_items(void *vctx, int k0, int k1) {
    const mla_ctx *c = vctx;
    const df_mla *a = c->a;
    int dim = a->kvl + a->rope, nrh = c->gn * a->nh, ld = (int)slot_floats(a);
    for (int k = k0; k < k1; k++) {
        int w = k / c->runs, b = c->b0 + w, i0 = (k % c->runs) * MLA_RUN;
        int i1 = i0 + MLA_RUN < nrh ? i0 + MLA_RUN : nrh, n[MLA_RUN], nb = 0;
        /* skip the run's leading row-heads that end before the block (rows
         * come in position order, so these are most of the ones that do) */
        while (i0 < i1 && block_len(c, i0, b) == 0) i0++;
        if (i0 == i1) continue;
        for (int i = i0; i < i1; i++) {
            n[i - i0] = block_len(c, i, b);
            if (n[i - i0] > nb) nb = n[i - i0];
        }
        const float *blk = c->cache + (size_t)b * MLA_BLOCK * (size_t)dim;
        df_wview cv = {{DF_EL_F32, DF_SC_NONE, 0, 0}, blk, NULL, nb, dim, 0, NULL};
        float *s0 = slot(c, w, i0);
        df_matmul_rows(s0, ld, c->w->qcat + ((size_t)c->g0 * a->nh + (size_t)i0) * dim, dim, &cv, i1 - i0, 0, nb);
        for (int i = i0; i < i1; i++) {
            float *sl = slot(c, w, i), *ol = sl + MLA_BLOCK;
            ol[a->kvl] = df_softmax_exp_f32(sl, n[i - i0], a->scale, &ol[a->kvl + 1]);
            memset(ol, 0, sizeof(float) * (size_t)a->kvl);
        }
        df_axpy_rows(s0 + MLA_BLOCK, ld, s0, ld, blk, DF_DT_F32, dim, i1 - i0, n, 0, a->kvl);
    }
}

/* Row-heads [i0, i1) of the group: merge the wave's blocks in block order
 * into the running (M, L, O = o_lat); after the last wave, o_lat = O / L. */
static void merge_items(void *vctx, int i0, int i1) {
    const mla_ctx *c = vctx;
    const df_mla *a = c->a;
    for (int i = i0; i < i1; i++) {
        size_t r = (size_t)c->g0 * a->nh + (size_t)i;
        float *O = c->w->olat + r * a->kvl, *ml = c->w->ml + 2 * r;
        for (int w = 0; w < c->wn && block_len(c, i, c->b0 + w) > 0; w++) {
            const float *ob = slot(c, w, i) + MLA_BLOCK;
            float mb = ob[a->kvl], lb = ob[a->kvl + 1], M = ml[0] > mb ? ml[0] : mb;
            float sa = df_exp_f32(ml[0] - M), sc = df_exp_f32(mb - M);
            if (sa != 1.0f) df_scale_f32(O, a->kvl, sa); /* x * 1 is x: skipping it changes no bit */
            df_axpy_f32(O, sc, ob, a->kvl);
            ml[0] = M, ml[1] = ml[1] * sa + lb * sc;
        }
        if (c->last) df_scale_f32(O, a->kvl, 1.0f / ml[1]);
    }
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

/* Rows [g0, g0 + gn) of one sequence over its first L positions, in waves of
 * as many blocks as the scratch holds. */
static void attend_group(df_pool *p, mla_ctx *c, int g0, int gn, int L) {
    const df_mla *a = c->a;
    int nrh = gn * a->nh, blocks = (L + MLA_BLOCK - 1) / MLA_BLOCK;
    size_t per_block = (size_t)nrh * slot_floats(a), fit = c->w->wave_cap / per_block;
    int wave = fit < (size_t)blocks ? (int)fit : blocks;
    c->g0 = g0, c->gn = gn, c->runs = (nrh + MLA_RUN - 1) / MLA_RUN;
    for (int i = 0; i < nrh; i++) {
        size_t r = (size_t)g0 * a->nh + (size_t)i;
        c->w->ml[2 * r] = -INFINITY, c->w->ml[2 * r + 1] = 0.0f;
        memset(c->w->olat + r * a->kvl, 0, sizeof(float) * (size_t)a->kvl);
    }
    for (int b0 = 0; b0 < blocks; b0 += wave) {
        c->b0 = b0, c->wn = blocks - b0 < wave ? blocks - b0 : wave, c->last = b0 + c->wn == blocks;
        df_pool_for(p, c->wn * c->runs, 1, block_items, c);
        df_pool_for(p, nrh, 1, merge_items, c);
    }
}

void df_mla_attend(df_pool *p, const df_batch *b, int li, const df_mla *a, const df_weight *kv_b,
                   const float *q, float *out, df_mla_work *w) {
    mla_ctx c = {.a = a, .kv_b = kv_b, .q = q, .w = w, .out = out, .T = b->n, .pos = b->pos};
    for (int t = 0; t < b->n; t++) w->len[t] = a->nope; /* every row sums all nope key rows */
    df_pool_for(p, a->nh, 1, absorb_heads, &c);
    /* Rows of one sequence are consecutive: take them in groups small enough
     * that a wave holds a few blocks of each. */
    size_t per_row = (size_t)a->nh * slot_floats(a) * 4;
    int gmax = w->wave_cap / per_row > 0 ? (int)(w->wave_cap / per_row) : 1;
    for (int t = 0; t < b->n;) {
        const df_seq *s = b->seq[t];
        c.cache = df_latent_of(s->layer[li])->row;
        int end = t;
        while (end < b->n && b->seq[end] == s) end++;
        while (t < end) {
            int gn = end - t < gmax ? end - t : gmax, L = 0;
            for (int i = t; i < t + gn; i++) L = b->pos[i] + 1 > L ? b->pos[i] + 1 : L;
            attend_group(p, &c, t, gn, L);
            t += gn;
        }
    }
    df_pool_for(p, a->nh, 1, value_heads, &c);
}
