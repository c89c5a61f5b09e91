/*
 * blocks.c - the shared building blocks of blocks.h. The exactness rules are
 * in the header; each block says how it keeps them where it is not obvious.
 */
#include "model/blocks.h"

#include <stdlib.h>

/* ---- row-local ------------------------------------------------------------------ */

void df_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = df_dot_f32(x, x, n) / (float)n;
    float s = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * s) * w[i];
}

void df_rmsnorm_rows(float *out, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) df_rmsnorm(out + (size_t)t * n, x + (size_t)t * n, w, n, eps);
}

void df_add_bias(float *y, int ld, const float *bias, int T, int n) {
    if (!bias) return;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * ld + i] += bias[i];
}

void df_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* ---- embeddings and linear layers ------------------------------------------------ */

void df_embed_rows(const df_weight *e, const int32_t *tokens, int T, float *out) {
    size_t rb = df_wfmt_row_bytes(e->v.fmt, e->v.cols);
    for (int t = 0; t < T; t++) {
        df_dtype dt = e->t->dtype;
        df_to_f32(out + (size_t)t * (size_t)e->v.cols, (const char *)e->v.data + (size_t)tokens[t] * rb, dt,
                  (size_t)e->v.cols);
    }
}

void df_linear(df_pool *p, float *y, const float *x, const df_weight *w, int T) {
    df_matmul(p, y, w->v.rows, x, w->v.cols, &w->v, T);
}

typedef struct {
    int n;
    const df_weight *const *w;
    float *const *y;
    const float *x;
    int T;
} multi_ctx;

static void multi_rows(void *vctx, int begin, int end) {
    const multi_ctx *c = vctx;
    int base = 0;
    for (int j = 0; j < c->n; j++) {
        const df_wview *w = &c->w[j]->v;
        int r0 = begin - base > 0 ? begin - base : 0;
        int r1 = end - base < w->rows ? end - base : w->rows;
        if (r0 < r1) df_matmul_rows(c->y[j], w->rows, c->x, w->cols, w, c->T, r0, r1);
        base += w->rows;
    }
}

void df_linear_multi(df_pool *p, int n, const df_weight *const *w, float *const *y, const float *x, int T) {
    int rows = 0;
    for (int j = 0; j < n; j++) rows += w[j]->v.rows;
    multi_ctx c = {n, w, y, x, T};
    df_pool_for(p, rows, 16, multi_rows, &c);
}

/* ---- rotary position embedding ----------------------------------------------------
 * Follows Hugging Face's rope initialisation, which computes in float32: the
 * stored inv_freq values are what a transformers run uses, so we reproduce
 * them in float rather than in double. */

static double yarn_correction_dim(double rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static void rope_yarn(df_rope *r, const df_config *c) {
    int dim = r->dim, half = dim / 2;
    float base = (float)c->rope_theta;
    double factor = c->rope_factor;
    double orig = c->rope_original_max_position_embeddings > 0 ? c->rope_original_max_position_embeddings
                                                               : c->max_position_embeddings;
    double af = c->yarn_attention_factor;
    if (af <= 0) {
        if (c->yarn_mscale > 0 && c->yarn_mscale_all_dim > 0)
            af = yarn_get_mscale(factor, c->yarn_mscale) / yarn_get_mscale(factor, c->yarn_mscale_all_dim);
        else
            af = yarn_get_mscale(factor, 1.0);
    }
    double low = yarn_correction_dim(c->yarn_beta_fast, dim, c->rope_theta, orig);
    double high = yarn_correction_dim(c->yarn_beta_slow, dim, c->rope_theta, orig);
    if (c->yarn_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int i = 0; i < half; i++) {
        float pos_freq = powf(base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq;
        float inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((float)i - (float)low) / (float)(high - low));
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float extra_factor = 1.0f - ramp;
        r->inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
    r->attn_factor = (float)af;
}

int df_rope_init(df_rope *r, const df_config *c, int dim, df_error *err) {
    int half = dim / 2;
    float base = (float)c->rope_theta;
    r->dim = dim;
    r->inv_freq = df_xmalloc(sizeof(float) * (size_t)(half > 0 ? half : 1));
    r->attn_factor = 1.0f;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)dim;
        r->inv_freq[i] = 1.0f / powf(base, expo);
    }
    switch (c->rope_type) {
    case DF_ROPE_DEFAULT:
        break;
    case DF_ROPE_LINEAR:
        for (int i = 0; i < half; i++) r->inv_freq[i] /= (float)c->rope_factor;
        break;
    case DF_ROPE_YARN:
        rope_yarn(r, c);
        break;
    case DF_ROPE_DYNAMIC:
        df_rope_free(r);
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "config.json: rope_scaling type 'dynamic' is not supported: its "
                       "frequencies change with sequence length, so cached keys would "
                       "not stay valid");
    }
    return DF_OK;
}

void df_rope_free(df_rope *r) {
    free(r->inv_freq);
    r->inv_freq = NULL;
}

/* HF: angle = float(pos) * inv_freq in float32, cos/sin scaled by the rope
 * attention factor (YaRN). */
void df_rope_angles(const df_rope *r, int pos, float *cosv, float *sinv) {
    float p = (float)pos;
    for (int i = 0; i < r->dim / 2; i++) {
        float ang = p * r->inv_freq[i];
        cosv[i] = (float)cos((double)ang) * r->attn_factor;
        sinv[i] = (float)sin((double)ang) * r->attn_factor;
    }
}

void df_rope_neox(float *x, int dim, const float *cosv, const float *sinv) {
    int half = dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cosv[i] - b * sinv[i];
        x[i + half] = b * cosv[i] + a * sinv[i];
    }
}

void df_rope_interleaved(float *x, int dim, const float *cosv, const float *sinv) {
    for (int i = 0; i < dim / 2; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * cosv[i] - b * sinv[i];
        x[2 * i + 1] = b * cosv[i] + a * sinv[i];
    }
}

/* ---- grouped-query attention ------------------------------------------------------- */

typedef struct {
    const df_batch *b;
    const float *q;
    float *out;
    int li, nh, nkv, hd, max_ctx;
} attn_ctx;

/* One (row, head) item per index: scores over positions 0..pos, softmax, then the
 * weighted sum of values in position order. */
static void attn_items(void *vctx, int begin, int end) {
    const attn_ctx *a = vctx;
    int nh = a->nh, hd = a->hd, group = nh / a->nkv, kvd = a->nkv * hd, qd = nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = df_xmalloc(sizeof(float) * (size_t)a->max_ctx);
    for (int it = begin; it < end; it++) {
        int t = it / nh, h = it % nh, g = h / group;
        int pos = a->b->pos[t];
        const df_kv_state *kv = df_kv_of(a->b->seq[t]->layer[a->li]);
        const float *q = a->q + (size_t)t * qd + (size_t)h * hd;
        const float *kbase = kv->k + (size_t)g * hd;
        const float *vbase = kv->v + (size_t)g * hd;
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
        float *out = a->out + (size_t)t * qd + (size_t)h * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j <= pos; j++) df_axpy_f32(out, sc[j] * inv, vbase + (size_t)j * kvd, hd);
    }
    free(sc);
}

void df_gqa_attend(df_pool *p, const df_batch *b, int li, const float *q, float *out, int nh, int nkv,
                   int hd) {
    int max_ctx = 1;
    for (int t = 0; t < b->n; t++)
        if (b->pos[t] + 1 > max_ctx) max_ctx = b->pos[t] + 1;
    attn_ctx a = {b, q, out, li, nh, nkv, hd, max_ctx};
    df_pool_for(p, b->n * nh, 1, attn_items, &a);
}

/* ---- feed-forward ------------------------------------------------------------------- */

typedef struct {
    const df_wview *gate, *up;
    const float *x;
    float *hg, *hu;
    int n;
    const df_act *act;
} gate_up_ctx;

/* Gate and up rows [r0, r1) and their SiLU product, in one dispatch: a
 * thread's slice of both matrices streams back to back, and the pool is
 * crossed once instead of twice. */
static void gate_up_rows(void *vctx, int r0, int r1) {
    const gate_up_ctx *c = vctx;
    int I = c->gate->rows, H = c->gate->cols;
    df_matmul_rows(c->hg, I, c->x, H, c->gate, c->n, r0, r1);
    df_matmul_rows(c->hu, I, c->x, H, c->up, c->n, r0, r1);
    for (int t = 0; t < c->n; t++)
        for (int r = r0; r < r1; r++) {
            size_t i = (size_t)t * I + r;
            c->hg[i] = df_glu(c->act, c->hg[i], c->hu[i]);
        }
}

void df_gated_mlp(df_pool *p, const df_act *act, const df_wview *gate, const df_wview *up, const df_wview *down,
                  const float *x, float *y, float *hg, float *hu, int n) {
    gate_up_ctx c = {gate, up, x, hg, hu, n, act};
    df_pool_for(p, gate->rows, 16, gate_up_rows, &c);
    df_matmul(p, y, down->rows, hg, down->cols, down, n);
}

void df_swiglu(df_pool *p, const df_wview *gate, const df_wview *up, const df_wview *down, const float *x,
               float *y, float *hg, float *hu, int n) {
    static const df_act SILU = {DF_ACT_SILU, 0, 0};
    df_gated_mlp(p, &SILU, gate, up, down, x, y, hg, hu, n);
}

/* ---- mixture of experts -------------------------------------------------------------- */

void df_route_softmax_topk(const float *logits, int E, int K, bool norm, int *sel, float *w,
                           const int *forced) {
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
    if (norm) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] /= s;
    }
}

uint64_t df_moe_work_bytes(int rows, int H, int E, int K, int I) {
    uint64_t R = (uint64_t)rows;
    return sizeof(float) * R * (4 * (uint64_t)H + 2 * (uint64_t)I + 2 * (uint64_t)E + 2 * (uint64_t)K +
                                (uint64_t)K * (uint64_t)H) +
           sizeof(int) * R * (3 * (uint64_t)K + 1);
}

df_moe_work *df_moe_work_new(int rows, int H, int E, int K, int I) {
    df_moe_work *w = df_xcalloc(1, sizeof *w);
    size_t R = (size_t)rows;
    *w = (df_moe_work){.rows = rows, .H = H, .E = E, .K = K, .I = I};
    w->sel = df_xcalloc(R * (size_t)K, sizeof(int));
    w->lsel = df_xcalloc(R * (size_t)K, sizeof(int));
    w->selw = df_aligned_alloc(sizeof(float) * R * (size_t)K);
    w->xg = df_aligned_alloc(sizeof(float) * R * (size_t)H);
    w->yg = df_aligned_alloc(sizeof(float) * R * (size_t)H);
    w->grow = df_xcalloc(R, sizeof(int));
    w->hg = df_aligned_alloc(sizeof(float) * R * (size_t)I);
    w->hu = df_aligned_alloc(sizeof(float) * R * (size_t)I);
    w->yslot = df_aligned_alloc(sizeof(float) * R * (size_t)K * (size_t)H);
    w->pxb = df_aligned_alloc(sizeof(float) * R * (size_t)H);
    w->prouter = df_aligned_alloc(sizeof(float) * R * (size_t)E);
    w->psel = df_xcalloc(R * (size_t)K, sizeof(int));
    w->pselw = df_aligned_alloc(sizeof(float) * R * (size_t)K);
    return w;
}

void df_moe_work_free(df_moe_work *w) {
    if (!w) return;
    free(w->sel); free(w->lsel); free(w->selw); free(w->xg); free(w->yg); free(w->grow);
    free(w->hg); free(w->hu); free(w->yslot);
    free(w->pxb); free(w->prouter); free(w->psel); free(w->pselw);
    free(w);
}

int df_moe_after(const df_config *c, int li, int n) {
    for (int l = li + 1; l < c->num_hidden_layers; l++)
        if (c->layer_is_moe[l] && --n == 0) return l;
    return -1;
}

int df_moe_lookahead_depth(df_fwd *f) {
    return f->experts->ops->lookahead_depth ? f->experts->ops->lookahead_depth(f->experts) : 0;
}


/* The distinct experts among n routing choices, ascending, and how many rows
 * chose each. Returns how many. */
static int distinct_experts(const int *sel, int n, int E, int *need, int *count) {
    int used[E];
    memset(used, 0, sizeof used);
    for (int i = 0; i < n; i++)
        if (sel[i] >= 0) used[sel[i]]++; /* -1: a slot computed elsewhere */
    int n_need = 0;
    for (int e = 0; e < E; e++)
        if (used[e]) count[n_need] = used[e], need[n_need++] = e;
    return n_need;
}

/* How many experts one job may take: the most m such that the m largest row
 * counts fit the gathered-row buffers, so any m experts do. */
static int job_cap(const int *count, int n, int rows) {
    int c[n > 0 ? n : 1];
    memcpy(c, count, sizeof(int) * (size_t)n);
    for (int i = 1; i < n; i++) /* insertion sort, descending: n is at most E */
        for (int j = i; j > 0 && c[j] > c[j - 1]; j--) {
            int t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    int m = 0, sum = 0;
    while (m < n && sum + c[m] <= rows) sum += c[m++];
    return m > 0 ? m : 1;
}

/* A job: several experts, each with its own gathered rows, computed as one
 * gate/up dispatch over their stacked output rows and one down dispatch
 * (2 pool crossings per job instead of 2 per expert). Every output element
 * is the same df_matmul_rows sum as for one expert alone. */
typedef struct {
    const df_expert_w *w;
    const int *off, *n;   /* [experts] first gathered row, row count */
    int n_exp;
    df_moe_work *mw;
} job_ctx;

static void job_gate_up(void *vctx, int begin, int end) {
    const job_ctx *c = vctx;
    int I = c->mw->I, H = c->mw->H;
    for (int i = begin; i < end;) {
        int j = i / I, r0 = i % I, r1 = r0 + (end - i) < I ? r0 + (end - i) : I;
        float *hg = c->mw->hg + (size_t)c->off[j] * I, *hu = c->mw->hu + (size_t)c->off[j] * I;
        const float *x = c->mw->xg + (size_t)c->off[j] * H;
        df_matmul_rows(hg, I, x, H, &c->w[j].mat[DF_XM_GATE], c->n[j], r0, r1);
        df_matmul_rows(hu, I, x, H, &c->w[j].mat[DF_XM_UP], c->n[j], r0, r1);
        for (int t = 0; t < c->n[j]; t++)
            for (int r = r0; r < r1; r++) {
                size_t k = (size_t)t * I + r;
                hg[k] = df_glu(&c->mw->act, hg[k], hu[k]);
            }
        i += r1 - r0;
    }
}

static void job_down(void *vctx, int begin, int end) {
    const job_ctx *c = vctx;
    int I = c->mw->I, H = c->mw->H;
    for (int i = begin; i < end;) {
        int j = i / H, r0 = i % H, r1 = r0 + (end - i) < H ? r0 + (end - i) : H;
        df_matmul_rows(c->mw->yg + (size_t)c->off[j] * H, H, c->mw->hg + (size_t)c->off[j] * I, I,
                       &c->w[j].mat[DF_XM_DOWN], c->n[j], r0, r1);
        i += r1 - r0;
    }
}

/* Gathers the rows routed to each expert of the job (a row appears once per
 * top-k slot that chose the expert, so a repeated id under routing replay is
 * computed per slot), runs the job, and files each output under its slot. */
static void run_job(df_pool *p, df_moe_work *mw, const int *sel, const int *ids, const df_expert_w *w,
                    int n_exp, const float *xin, int T) {
    int K = mw->K, H = mw->H;
    int off[n_exp], cnt[n_exp], g = 0;
    for (int j = 0; j < n_exp; j++) {
        off[j] = g;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (sel[t * K + k] == ids[j]) {
                    memcpy(mw->xg + (size_t)g * H, xin + (size_t)t * H, sizeof(float) * (size_t)H);
                    mw->grow[g++] = t * K + k;
                }
        cnt[j] = g - off[j];
    }
    job_ctx c = {w, off, cnt, n_exp, mw};
    df_pool_for(p, n_exp * mw->I, 16, job_gate_up, &c);
    df_pool_for(p, n_exp * H, 16, job_down, &c);
    for (int r = 0; r < g; r++)
        memcpy(mw->yslot + (size_t)mw->grow[r] * H, mw->yg + (size_t)r * H, sizeof(float) * (size_t)H);
}

/* out = sum_k w_k * yslot[k] per row, in slot order. */
static void combine(const df_moe_work *mw, float *out, int T) {
    int K = mw->K, H = mw->H;
    for (int t = 0; t < T; t++) {
        float *acc = out + (size_t)t * H;
        for (int k = 0; k < K; k++) {
            const float *y = mw->yslot + ((size_t)t * K + k) * H;
            float w = mw->selw[t * K + k];
            if (k == 0)
                for (int i = 0; i < H; i++) acc[i] = w * y[i];
            else
                for (int i = 0; i < H; i++) acc[i] += w * y[i];
        }
    }
}

int df_moe_compute(df_pool *p, df_xsource *src, df_moe_work *mw, int li, const int *sel, const float *xin,
                   int T, void (*queued)(void *ctx), void *ctx, df_error *err) {
    int E = mw->E, K = mw->K;
    int need[E], count[E];
    int n_need = distinct_experts(sel, T * K, E, need, count);
    /* All reads are requested at once; experts come back resident-first. */
    int rc = src->ops->begin_layer(src, li, need, n_need, err);
    if (rc) return rc;
    if (queued) queued(ctx);
    int cap = job_cap(count, n_need, mw->rows);
    int ids[cap];
    df_expert_w w[cap];
    for (;;) {
        int n;
        if ((rc = src->ops->next(src, cap, ids, w, &n, err))) break;
        if (n == 0) break;
        run_job(p, mw, sel, ids, w, n, xin, T);
    }
    src->ops->end_layer(src);
    return rc;
}

typedef struct {
    df_fwd *f;
    int li, T;
    df_predict_fn predict;
} lookahead_ctx;

/* Once layer li's reads are queued: the MoE layer `depth` on goes next. */
static void lookahead(void *vctx) {
    lookahead_ctx *c = vctx;
    int depth = df_moe_lookahead_depth(c->f);
    if (!depth) return;
    df_blk outer = df_blk_enter(c->f, DF_BLK_FFN);
    c->predict(c->f, df_moe_after(&c->f->m->cfg, c->li, depth), c->T);
    df_blk_enter(c->f, outer);
}

int df_moe_experts(df_fwd *f, df_moe_work *mw, int li, const float *xin, float *out, int T, int K,
                   df_predict_fn predict, df_error *err) {
    df_blk outer = df_blk_enter(f, DF_BLK_EXPERTS);
    df_xsource *src = f->experts;
    const int *sel = mw->sel;
    int rc = DF_OK;
    /* A source that spreads experts over other processes sends them their
     * slots first (marked -1 in lsel), so that their work overlaps ours. */
    bool remote = src->ops->remote_begin != NULL;
    if (remote) {
        memcpy(mw->lsel, mw->sel, sizeof(int) * (size_t)T * (size_t)K);
        if ((rc = src->ops->remote_begin(src, li, xin, mw->lsel, T, K, mw->H, err))) {
            df_blk_enter(f, outer);
            return rc;
        }
        sel = mw->lsel;
    }
    lookahead_ctx lc = {f, li, T, predict};
    rc = df_moe_compute(f->pool, src, mw, li, sel, xin, T, predict ? lookahead : NULL, &lc, err);
    if (remote) {
        df_error rerr;
        int rrc = src->ops->remote_end(src, mw->yslot, &rerr);
        if (!rc && rrc) rc = rrc, *err = rerr;
    }
    if (!rc) combine(mw, out, T); /* per row in top-k slot order: independent of the order above */
    df_blk_enter(f, outer);
    return rc;
}
