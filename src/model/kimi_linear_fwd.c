/*
 * kimi_linear_fwd.c - the Kimi-Linear family's forward pass (kimi_linear.c
 * has the overview, the config and the tensors): its work buffers, the two
 * attention layers (Kimi Delta Attention, gated NoPE latent attention), the
 * feed-forward layers (dense, MoE, K3's latent MoE), attention residuals,
 * and the pass itself, top to bottom.
 *
 * Exactness: every product is a kernel (fixed order per output element), the
 * recurrence absorbs a sequence's rows one by one in position order (kda.c),
 * AttnRes and the norms are sequential loops over one row, and the MoE block
 * combines in top-k slot order; so a row's logits do not depend on the batch,
 * the threads, the ISA or where experts came from.
 */
#include "model/kimi_linear.h"

#include <stdlib.h>

/* ---- work buffers ----------------------------------------------------------------------- */

typedef struct work {
    int rows, n_anchor;
    float *x, *xb, *y, *ys, *pre, *ain; /* [R][H]: residual (K3: part), normed input, outputs, pre, a site's input */
    float *anchor;                      /* [R][n_anchor][H] AttnRes block anchors */
    float *kq, *kk, *kv, *kg, *kf;      /* [R][C] KDA: q, k, v, output gate, decay input */
    float *kb, *klow;                   /* [R][nh], [R][2][dk]: beta logits, low-rank intermediates */
    float *katt;                        /* [R][C] */
    float *cq, *q, *ckv, *att, *mg;     /* MLA: [R][qlr], [R][nh][qk], [R][cache], [R][nh*v] x2 */
    float *hg, *hu;                     /* [R][max(dense, shared width)] */
    float *lat_in, *lat_out;            /* [R][latent] */
    float *pxb;                         /* [R][H] a later layer's router input (read-ahead) */
    df_moe_work *moe;
    df_mla_work *mla;
} work;

typedef struct dims { size_t R, H, C, nh, dk, qlr, qd, cd, vd, I, X, A; } dims;

static dims dims_of(const df_config *c, int rows) {
    size_t I = (size_t)c->intermediate_size, sI = (size_t)c->n_shared_experts * (size_t)c->moe_intermediate_size;
    size_t nh = (size_t)c->linear_heads, dk = (size_t)c->linear_head_dim;
    size_t A = c->attn_res_block ? (size_t)((c->num_hidden_layers + c->attn_res_block - 1) / c->attn_res_block) : 0;
    return (dims){(size_t)rows, (size_t)c->hidden_size, nh * dk, nh ? nh : 1, dk ? dk : 1,
                  (size_t)(c->q_lora_rank ? c->q_lora_rank : 1), (size_t)c->num_attention_heads * (size_t)c->head_dim,
                  (size_t)kl_cache_dim(c), (size_t)c->num_attention_heads * (size_t)c->v_head_dim,
                  I > sI ? I : sI, (size_t)(c->moe_latent_size ? c->moe_latent_size : 1), A};
}

/* floats of the buffers above, in their order */
static size_t work_floats(const dims *d) {
    return d->R * (6 * d->H + d->A * d->H + 6 * d->C + d->nh + 2 * d->dk + d->qlr + d->qd + d->cd + 2 * d->vd +
                   2 * d->I + 2 * d->X + d->H);
}

static float *take(float **p, size_t n) {
    float *r = *p;
    *p += n;
    return r;
}

void *kl_work_new(const df_model *m, int rows, int max_ctx) {
    const df_config *c = &m->cfg;
    const fam *fm = m->fam;
    dims d = dims_of(c, rows);
    work *w = df_xcalloc(1, sizeof *w);
    w->rows = rows, w->n_anchor = (int)d.A;
    /* one region, carved in order (each piece a multiple of 4 floats apart
     * is not needed: the kernels take any alignment) */
    float *p = df_aligned_alloc(sizeof(float) * work_floats(&d));
    w->x = take(&p, d.R * d.H), w->xb = take(&p, d.R * d.H), w->y = take(&p, d.R * d.H);
    w->ys = take(&p, d.R * d.H), w->pre = take(&p, d.R * d.H), w->ain = take(&p, d.R * d.H);
    w->anchor = take(&p, d.R * d.A * d.H);
    w->kq = take(&p, d.R * d.C), w->kk = take(&p, d.R * d.C), w->kv = take(&p, d.R * d.C);
    w->kg = take(&p, d.R * d.C), w->kf = take(&p, d.R * d.C), w->katt = take(&p, d.R * d.C);
    w->kb = take(&p, d.R * d.nh), w->klow = take(&p, d.R * 2 * d.dk);
    w->cq = take(&p, d.R * d.qlr), w->q = take(&p, d.R * d.qd), w->ckv = take(&p, d.R * d.cd);
    w->att = take(&p, d.R * d.vd), w->mg = take(&p, d.R * d.vd);
    w->hg = take(&p, d.R * d.I), w->hu = take(&p, d.R * d.I);
    w->lat_in = take(&p, d.R * d.X), w->lat_out = take(&p, d.R * d.X);
    w->pxb = take(&p, d.R * d.H);
    if (c->num_experts > 0) {
        int X = c->moe_latent_size ? c->moe_latent_size : c->hidden_size;
        w->moe = df_moe_work_new(rows, X, c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size);
        w->moe->act = df_act_of(c);
    }
    w->mla = df_mla_work_new(&fm->mla, rows, max_ctx);
    return w;
}

void kl_work_free(void *p) {
    work *w = p;
    if (!w) return;
    free(w->x); /* the start of the region */
    df_moe_work_free(w->moe);
    df_mla_work_free(w->mla);
    free(w);
}

uint64_t kl_work_bytes(const df_model *m, int rows, int max_ctx) {
    const df_config *c = &m->cfg;
    dims d = dims_of(c, rows);
    uint64_t b = sizeof(float) * work_floats(&d);
    if (c->num_experts > 0)
        b += df_moe_work_bytes(rows, c->moe_latent_size ? c->moe_latent_size : c->hidden_size, c->num_experts,
                               c->num_experts_per_tok, c->moe_intermediate_size);
    return b + df_mla_work_bytes(&((const fam *)m->fam)->mla, rows, max_ctx);
}

/* ---- attention residuals ------------------------------------------------------------------ */

/* AttnRes over candidates anchors[0..n) and v of row t (ARCHITECTURES.md 4.3):
 * scores from the RMS-normalised candidates (no weight, eps 1e-5) dotted with
 * the site's pseudo-query, softmax, the weighted sum of the candidates as
 * they are. In candidate order, sequentially. */
static void attn_res_row(const work *w, int t, int n, const float *v, const float *pq, int H, float *out) {
    float score[n + 1];
    const float *cand[n + 1];
    for (int i = 0; i < n; i++) cand[i] = w->anchor + ((size_t)t * (size_t)w->n_anchor + (size_t)i) * (size_t)H;
    cand[n] = v;
    float mx = -INFINITY;
    for (int i = 0; i <= n; i++) {
        float ss = 0.0f, dot = 0.0f;
        for (int d = 0; d < H; d++) ss += cand[i][d] * cand[i][d];
        float r = 1.0f / sqrtf(ss / (float)H + 1e-5f);
        for (int d = 0; d < H; d++) dot += cand[i][d] * r * pq[d];
        score[i] = dot;
        if (dot > mx) mx = dot;
    }
    float sum = 0.0f;
    for (int i = 0; i <= n; i++) sum += score[i] = expf(score[i] - mx);
    for (int d = 0; d < H; d++) out[d] = 0.0f;
    for (int i = 0; i <= n; i++) {
        float p = score[i] / sum;
        for (int d = 0; d < H; d++) out[d] += p * cand[i][d];
    }
}

/* out[t] = AttnRes(anchors of row t ++ [v[t]]) for every row. */
static void attn_res(const work *w, int T, int n, const float *v, const float *pq, int H, float *out) {
    for (int t = 0; t < T; t++)
        attn_res_row(w, t, n, v + (size_t)t * (size_t)H, pq, H, out + (size_t)t * (size_t)H);
}

/* ---- attention ---------------------------------------------------------------------------- */

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Kimi Delta Attention of the normed rows w->xb into w->y. */
static void kda(df_fwd *f, const df_batch *b, const layer *L, int li) {
    work *w = f->work;
    int T = b->n, dk = L->kda.dk;
    float *fa = w->klow, *ga = w->klow + (size_t)T * (size_t)dk;
    if (L->g.t) {
        const df_weight *ws[6] = {&L->q, &L->k, &L->v, &L->g, &L->f_a, &L->beta};
        float *out[6] = {w->kq, w->kk, w->kv, w->kg, fa, w->kb};
        df_linear_multi(f->pool, 6, ws, out, w->xb, T);
    } else {
        const df_weight *ws[6] = {&L->q, &L->k, &L->v, &L->g_a, &L->f_a, &L->beta};
        float *out[6] = {w->kq, w->kk, w->kv, ga, fa, w->kb};
        df_linear_multi(f->pool, 6, ws, out, w->xb, T);
        df_linear(f->pool, w->kg, ga, &L->g_b, T);
    }
    df_linear(f->pool, w->kf, fa, &L->f_b, T);
    df_kda_rows(f->pool, b, li, &L->kda, w->kq, w->kk, w->kv, w->kf, w->kb, w->kg, w->katt);
    df_linear(f->pool, w->y, w->katt, &L->o, T);
}

/* Latent attention without rotary embeddings (the shared key part is used as
 * it is), K3's sigmoid output gate, of the normed rows w->xb into w->y. */
static void mla(df_fwd *f, const df_batch *b, const layer *L, int li) {
    const df_config *c = &f->m->cfg;
    const fam *fm = f->m->fam;
    work *w = f->work;
    int T = b->n, kvl = c->kv_lora_rank, cd = kl_cache_dim(c), vd = c->num_attention_heads * c->v_head_dim;
    const df_weight *ws[3] = {c->q_lora_rank ? &L->q_a : &L->q, &L->kv_a, &L->mg};
    float *out[3] = {c->q_lora_rank ? w->cq : w->q, w->ckv, w->mg};
    df_linear_multi(f->pool, c->mla_output_gate ? 3 : 2, ws, out, w->xb, T);
    if (c->q_lora_rank) {
        df_rmsnorm_rows(w->cq, w->cq, L->q_a_norm, T, c->q_lora_rank, (float)c->rms_norm_eps);
        df_linear(f->pool, w->q, w->cq, &L->q_b, T);
    }
    for (int t = 0; t < T; t++) {
        float *ckv = w->ckv + (size_t)t * (size_t)cd;
        df_rmsnorm(ckv, ckv, L->kv_a_norm, kvl, (float)c->rms_norm_eps);
        df_lstate *st = b->seq[t]->layer[li];
        st->ops->append(st, b->pos[t], ckv);
    }
    df_mla_attend(f->pool, b, li, &fm->mla, &L->kv_b, w->q, w->att, w->mla);
    if (c->mla_output_gate)
        for (size_t i = 0; i < (size_t)T * (size_t)vd; i++) w->att[i] *= sigmoidf(w->mg[i]);
    df_linear(f->pool, w->y, w->att, &L->o, T);
}

/* ---- feed-forward ------------------------------------------------------------------------ */

/* Layer L's router on rows xb: top-k into sel/selw (forced by routing replay
 * when f->route is set and `replay`). */
static void route(df_fwd *f, const layer *L, int li, const float *xb, float *logits, int *sel, float *selw, int T,
                  bool replay) {
    const fam *fm = f->m->fam;
    df_route_scored_rows(f, &fm->router, &L->router, L->router_bias, li, xb, logits, sel, selw, T, replay);
}

/* Hands the expert source MoE layer `target`'s experts as its router picks
 * them on the residual stream as it is now (reads only; results do not
 * change). */
static void predict(df_fwd *f, int target, int T) {
    if (target < 0) return;
    const df_config *c = &f->m->cfg;
    const layer *L = &((const fam *)f->m->fam)->layers[target];
    work *w = f->work;
    df_moe_work *mw = w->moe;
    df_rmsnorm_rows(w->pxb, w->x, L->ffn_norm, T, c->hidden_size, (float)c->rms_norm_eps);
    route(f, L, target, w->pxb, mw->prouter, mw->psel, mw->pselw, T, false);
    f->experts->ops->predict(f->experts, target, mw->psel, T * c->num_experts_per_tok);
}

/* w->y = routed experts (in the latent width: down, experts, norm, up) +
 * shared experts, of the normed rows w->xb. */
static int moe(df_fwd *f, const layer *L, int li, int T, df_error *err) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    df_moe_work *mw = w->moe;
    df_act act = df_act_of(c);
    route(f, L, li, w->xb, mw->prouter, mw->sel, mw->selw, T, true);
    int rc, X = c->moe_latent_size;
    if (X) {
        df_linear(f->pool, w->lat_in, w->xb, &L->lat_down, T);
        if ((rc = df_moe_experts(f, mw, li, w->lat_in, w->lat_out, T, c->num_experts_per_tok, predict, err)))
            return rc;
        if (L->lat_norm) df_rmsnorm_rows(w->lat_out, w->lat_out, L->lat_norm, T, X, (float)c->rms_norm_eps);
        df_linear(f->pool, w->y, w->lat_out, &L->lat_up, T);
    } else if ((rc = df_moe_experts(f, mw, li, w->xb, w->y, T, c->num_experts_per_tok, predict, err))) {
        return rc;
    }
    if (!c->n_shared_experts) return DF_OK;
    df_gated_mlp(f->pool, &act, &L->gate.v, &L->up.v, &L->down.v, w->xb, w->ys, w->hg, w->hu, T);
    df_add(w->y, w->ys, (size_t)T * c->hidden_size);
    return DF_OK;
}

/* w->y = FFN(rmsnorm(in)), its time charged to DF_BLK_FFN (the routed
 * experts' to DF_BLK_EXPERTS) */
static int feed_forward(df_fwd *f, const layer *L, int li, const float *in, int T, df_error *err) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    df_blk_enter(f, DF_BLK_FFN);
    df_rmsnorm_rows(w->xb, in, L->ffn_norm, T, c->hidden_size, (float)c->rms_norm_eps);
    int rc = DF_OK;
    if (L->is_moe) {
        rc = moe(f, L, li, T, err);
    } else {
        df_act act = df_act_of(c);
        df_gated_mlp(f->pool, &act, &L->gate.v, &L->up.v, &L->down.v, w->xb, w->y, w->hg, w->hu, T);
    }
    df_blk_enter(f, DF_BLK_OTHER);
    return rc;
}

/* w->y = Attn(rmsnorm(in)), its time charged to DF_BLK_KDA or DF_BLK_ATTN */
static void attention(df_fwd *f, const df_batch *b, const layer *L, int li, const float *in) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    df_blk_enter(f, L->linear ? DF_BLK_KDA : DF_BLK_ATTN);
    df_rmsnorm_rows(w->xb, in, L->attn_norm, b->n, c->hidden_size, (float)c->rms_norm_eps);
    if (L->linear) kda(f, b, L, li);
    else mla(f, b, L, li);
    df_blk_enter(f, DF_BLK_OTHER);
}

/* ---- the forward pass ------------------------------------------------------------------- */

/* A pre-norm layer: x += Attn(norm(x)); x += FFN(norm(x)). */
static int layer_plain(df_fwd *f, const df_batch *b, const layer *L, int li, df_error *err) {
    work *w = f->work;
    size_t n = (size_t)b->n * (size_t)f->m->cfg.hidden_size;
    attention(f, b, L, li, w->x);
    df_add(w->x, w->y, n);
    int rc = feed_forward(f, L, li, w->x, b->n, err);
    if (!rc) df_add(w->x, w->y, n);
    return rc;
}

/* A layer with attention residuals (K3): w->x is the block's running sum
 * `part`; the sublayers read softmax mixes of the block anchors and it. */
static int layer_attn_res(df_fwd *f, const df_batch *b, const layer *L, int li, int *n_anchor, df_error *err) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    int T = b->n, H = c->hidden_size;
    size_t n = (size_t)T * (size_t)H;
    if (*n_anchor == 0) memcpy(w->ain, w->x, sizeof(float) * n);
    else attn_res(w, T, *n_anchor, w->x, L->attn_res_q, H, w->ain);
    if (li % c->attn_res_block == 0) { /* a new depth block: part becomes an anchor */
        for (int t = 0; t < T; t++)
            memcpy(w->anchor + ((size_t)t * (size_t)w->n_anchor + (size_t)*n_anchor) * (size_t)H,
                   w->x + (size_t)t * (size_t)H, sizeof(float) * (size_t)H);
        ++*n_anchor;
        memset(w->pre, 0, sizeof(float) * n);
    } else {
        memcpy(w->pre, w->x, sizeof(float) * n);
    }
    attention(f, b, L, li, w->ain);
    df_add(w->pre, w->y, n);
    attn_res(w, T, *n_anchor, w->pre, L->mlp_res_q, H, w->ain);
    int rc = feed_forward(f, L, li, w->ain, T, err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) w->x[i] = w->pre[i] + w->y[i];
    return DF_OK;
}

int kl_forward(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err) {
    const df_model *m = f->m;
    const df_config *c = &m->cfg;
    const fam *fm = m->fam;
    work *w = f->work;
    int T = b->n, H = c->hidden_size, n_anchor = 0;
    df_embed_rows(&m->embed, b->tokens, T, w->x);
    int depth = c->num_experts > 0 ? df_moe_lookahead_depth(f) : 0;
    df_blk_enter(f, DF_BLK_FFN); /* routers */
    for (int n = 1; n <= depth; n++) predict(f, df_moe_after(c, -1, n), T);
    df_blk_enter(f, DF_BLK_OTHER);
    for (int li = 0; li < c->num_hidden_layers; li++) {
        const layer *L = &fm->layers[li];
        int rc = c->attn_res_block ? layer_attn_res(f, b, L, li, &n_anchor, err) : layer_plain(f, b, L, li, err);
        if (rc) return rc;
        if (f->on_layer) f->on_layer(f->layer_user, li + 1, c->num_hidden_layers, T);
    }
    if (c->num_experts > 0) f->experts->ops->end_step(f->experts, T);
    if (!logits) return DF_OK;
    const float *x = w->x;
    if (c->attn_res_block) {
        attn_res(w, T, n_anchor, w->x, fm->out_res_q, H, w->ain);
        x = w->ain;
    }
    df_forward_logits(f, x, w->xb, T, logits, all_rows);
    return DF_OK;
}
