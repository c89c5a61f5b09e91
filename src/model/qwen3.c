/*
 * qwen3.c - the Qwen3 family: Qwen3 (dense) and Qwen3-MoE. Everything that is
 * Qwen3's lives here: its config.json fields, its tensor names, its state (a
 * grouped-query key/value cache per layer), its forward pass, its stop token
 * and chat template, and its lines of `deltafin inspect`. The forward pass
 * reads top to bottom over the shared blocks (blocks.h):
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) -> q, k, v projections -> per-head q/k rmsnorm -> rotary
 *       x += o_proj(causal grouped-query attention over the KV cache)
 *       h = rmsnorm(x)
 *       x += dense SiLU-gated MLP(h)        or, on MoE layers,
 *       x += sum_k w_k * expert_k(h)        softmax router over all experts, top-k
 *   logits = lm_head(rmsnorm(x))
 */
#include "model/arch.h"
#include "model/blocks.h"
#include "model/config_json.h"

#include <stdlib.h>

/* ---- config.json ------------------------------------------------------------------- */

static int parse_attention(df_config *c, json_t *root, const df_cfg_ctx *p, bool moe) {
    int rc;
    bool have;
    if ((rc = df_cfg_int(p, root, "num_attention_heads", true, 1, DF_CFG_MAX_HEADS, &c->num_attention_heads,
                         NULL)))
        return rc;
    if ((rc = df_cfg_int(p, root, "num_key_value_heads", false, 1, c->num_attention_heads,
                         &c->num_key_value_heads, &have)))
        return rc;
    if (!have) c->num_key_value_heads = c->num_attention_heads;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field 'num_attention_heads' (%d) must be a multiple of num_key_value_heads (%d)",
                       p->path, c->num_attention_heads, c->num_key_value_heads);
    if ((rc = df_cfg_int(p, root, "head_dim", false, 1, DF_CFG_MAX_HEAD_DIM, &c->head_dim, &have))) return rc;
    if (!have && !moe) {
        /* transformers' Qwen3Config defaults head_dim to 128, not hidden/heads */
        c->head_dim = 128;
    } else if (!have) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field 'head_dim' is absent and hidden_size (%d) is not a multiple of "
                           "num_attention_heads (%d)",
                           p->path, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
        if (c->head_dim > DF_CFG_MAX_HEAD_DIM)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field 'head_dim' is absent and hidden_size / num_attention_heads = %d "
                           "exceeds %d",
                           p->path, c->head_dim, DF_CFG_MAX_HEAD_DIM);
    }
    if (c->head_dim % 2 != 0)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'head_dim' (%d) must be even (RoPE pairs)", p->path,
                       c->head_dim);
    return df_cfg_bool(p, root, "attention_bias", &c->attention_bias);
}

/* Only full attention over every position is implemented. */
static int parse_layer_types(json_t *root, const df_cfg_ctx *p) {
    bool sliding = false;
    int rc = df_cfg_bool(p, root, "use_sliding_window", &sliding);
    if (rc) return rc;
    if (sliding) return df_fail(p->err, DF_ERR_UNSUPPORTED, "%s: use_sliding_window true is not supported", p->path);
    json_t *lt = df_cfg_field(root, "layer_types");
    if (!lt) return DF_OK;
    if (!json_is_array(lt))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'layer_types' must be a list of strings", p->path);
    for (size_t i = 0; i < json_array_size(lt); i++) {
        json_t *x = json_array_get(lt, i);
        if (!json_is_string(x))
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'layer_types' must be a list of strings", p->path);
        if (strcmp(json_string_value(x), "full_attention") != 0)
            return df_fail(p->err, DF_ERR_UNSUPPORTED,
                           "%s: layer_types[%zu] '%.64s' is not supported (supported: full_attention)", p->path,
                           i, json_string_value(x));
    }
    return DF_OK;
}

static int parse_experts(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    if ((rc = df_cfg_int(p, root, "num_experts", true, 0, DF_CFG_MAX_EXPERTS, &c->num_experts, NULL))) return rc;
    if (c->num_experts > 0) {
        if ((rc = df_cfg_int(p, root, "num_experts_per_tok", true, 1, c->num_experts, &c->num_experts_per_tok,
                             NULL)))
            return rc;
        if ((rc = df_cfg_int(p, root, "moe_intermediate_size", true, 1, DF_CFG_MAX_INTER,
                             &c->moe_intermediate_size, NULL)))
            return rc;
    }
    if ((rc = df_cfg_int(p, root, "decoder_sparse_step", false, 1, DF_MAX_LAYERS, &c->decoder_sparse_step, NULL)))
        return rc;
    return df_cfg_bool(p, root, "norm_topk_prob", &c->norm_topk_prob);
}

static int parse_config(df_config *c, json_t *root, const df_cfg_ctx *p) {
    bool moe = strcmp(c->model_type, "qwen3_moe") == 0;
    int rc;
    const char *s;
    if ((rc = df_cfg_str(p, root, "hidden_act", false, &s))) return rc;
    if (s && strcmp(s, "silu") != 0)
        return df_fail(p->err, DF_ERR_UNSUPPORTED, "%s: hidden_act '%.64s' is not supported (supported: silu)",
                       p->path, s);
    bool have_inter;
    /* A MoE model needs the dense size only if some layer is dense (checked below). */
    if ((rc = df_cfg_int(p, root, "intermediate_size", !moe, 1, DF_CFG_MAX_INTER, &c->intermediate_size,
                         &have_inter)))
        return rc;
    if ((rc = parse_attention(c, root, p, moe)) || (rc = parse_layer_types(root, p)) ||
        (rc = df_cfg_rope(c, root, p)))
        return rc;
    if (moe && (rc = parse_experts(c, root, p))) return rc;
    bool mlp_only[DF_MAX_LAYERS] = {0};
    if (moe && (rc = df_cfg_layer_list(p, root, "mlp_only_layers", c->num_hidden_layers, mlp_only))) return rc;
    /* Hugging Face's Qwen3MoeDecoderLayer rule. */
    bool any_dense = false;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        c->layer_is_moe[i] = moe && c->num_experts > 0 && !mlp_only[i] && (i + 1) % c->decoder_sparse_step == 0;
        any_dense |= !c->layer_is_moe[i];
    }
    if (any_dense && !have_inter)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: required field 'intermediate_size' is missing (some layers are dense)", p->path);
    return DF_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

static const df_expert_layout EXPERTS = {
    3, {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}, {{0, -1}, {1, -1}, {2, -1}}, {{0}}, {0}};

static void expert_prefix(const df_config *c, int layer, int e, char *name, size_t n) {
    (void)c;
    snprintf(name, n, "model.layers.%d.mlp.experts.%d.", layer, e);
}

typedef struct layer {
    float *attn_norm, *ffn_norm; /* [H], widened from the stored dtype */
    float *q_norm, *k_norm;      /* [head_dim] */
    df_weight q, k, v, o;
    float *q_bias, *k_bias, *v_bias, *o_bias; /* attention_bias only */
    bool is_moe;
    df_weight gate, up, down;    /* dense MLP */
    df_weight router;            /* [E][H] */
} layer;

typedef struct fam {
    layer *layers;
    df_rope rope;
} fam;

static int load_attention(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256];
    int rc, H = c->hidden_size, hd = c->head_dim;
    int qd = c->num_attention_heads * hd, kvd = c->num_key_value_heads * hd;
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if ((rc = df_model_vector(m, &L->attn_norm, NAME("model.layers.%d.input_layernorm.weight", li), H, err)) ||
        (rc = df_model_vector(m, &L->ffn_norm, NAME("model.layers.%d.post_attention_layernorm.weight", li), H,
                              err)) ||
        (rc = df_model_vector(m, &L->q_norm, NAME("model.layers.%d.self_attn.q_norm.weight", li), hd, err)) ||
        (rc = df_model_vector(m, &L->k_norm, NAME("model.layers.%d.self_attn.k_norm.weight", li), hd, err)) ||
        (rc = df_model_matrix(m, &L->q, NAME("model.layers.%d.self_attn.q_proj.weight", li), qd, H, true, err)) ||
        (rc = df_model_matrix(m, &L->k, NAME("model.layers.%d.self_attn.k_proj.weight", li), kvd, H, true, err)) ||
        (rc = df_model_matrix(m, &L->v, NAME("model.layers.%d.self_attn.v_proj.weight", li), kvd, H, true, err)) ||
        (rc = df_model_matrix(m, &L->o, NAME("model.layers.%d.self_attn.o_proj.weight", li), H, qd, true, err)))
        return rc;
    if (!c->attention_bias) return DF_OK;
    if ((rc = df_model_vector(m, &L->q_bias, NAME("model.layers.%d.self_attn.q_proj.bias", li), qd, err)) ||
        (rc = df_model_vector(m, &L->k_bias, NAME("model.layers.%d.self_attn.k_proj.bias", li), kvd, err)) ||
        (rc = df_model_vector(m, &L->v_bias, NAME("model.layers.%d.self_attn.v_proj.bias", li), kvd, err)))
        return rc;
    /* Qwen3's o_proj takes the same flag in transformers */
    return df_model_vector(m, &L->o_bias, NAME("model.layers.%d.self_attn.o_proj.bias", li), H, err);
}

static int load_ffn(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256];
    int rc, H = c->hidden_size;
    L->is_moe = c->layer_is_moe[li];
    if (L->is_moe)
        return df_model_matrix(m, &L->router, NAME("model.layers.%d.mlp.gate.weight", li), c->num_experts, H,
                               true, err);
    int I = c->intermediate_size;
    if ((rc = df_model_matrix(m, &L->gate, NAME("model.layers.%d.mlp.gate_proj.weight", li), I, H, true, err)) ||
        (rc = df_model_matrix(m, &L->up, NAME("model.layers.%d.mlp.up_proj.weight", li), I, H, true, err)) ||
        (rc = df_model_matrix(m, &L->down, NAME("model.layers.%d.mlp.down_proj.weight", li), H, I, true, err)))
        return rc;
    return DF_OK;
#undef NAME
}

static void unload(df_model *m) {
    fam *f = m->fam;
    if (!f) return;
    for (int li = 0; f->layers && li < m->cfg.num_hidden_layers; li++) {
        layer *L = &f->layers[li];
        free(L->attn_norm), free(L->ffn_norm), free(L->q_norm), free(L->k_norm);
        free(L->q_bias), free(L->k_bias), free(L->v_bias), free(L->o_bias);
    }
    free(f->layers);
    df_rope_free(&f->rope);
    free(f);
    m->fam = NULL;
}

static int load(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    fam *f = df_xcalloc(1, sizeof *f);
    m->fam = f;
    f->layers = df_xcalloc((size_t)c->num_hidden_layers, sizeof(layer));
    int rc = DF_OK;
    for (int li = 0; li < c->num_hidden_layers && !rc; li++)
        if (!(rc = load_attention(m, &f->layers[li], li, err))) rc = load_ffn(m, &f->layers[li], li, err);
    if (!rc && c->num_experts > 0) {
        int I = c->moe_intermediate_size, H = c->hidden_size;
        int rows[3] = {I, I, H}, cols[3] = {H, H, I};
        rc = df_model_check_experts(m, rows, cols, err);
    }
    if (!rc) rc = df_rope_init(&f->rope, c, c->head_dim, err);
    if (rc) unload(m);
    return rc;
}

/* ---- state and work buffers ------------------------------------------------------------ */

static int kv_dim(const df_config *c) { return c->num_key_value_heads * c->head_dim; }

static uint64_t seq_bytes(const df_model *m, int max_ctx) {
    return (uint64_t)m->cfg.num_hidden_layers * df_kv_state_bytes(max_ctx, kv_dim(&m->cfg));
}

static int seq_new(const df_model *m, int max_ctx, df_seq **out, df_error *err) {
    df_seq *s = df_seq_new(m->cfg.num_hidden_layers, max_ctx);
    for (int li = 0; li < m->cfg.num_hidden_layers; li++) {
        df_lstate *kv;
        int rc = df_kv_state_new(&kv, max_ctx, kv_dim(&m->cfg), err);
        if (rc) {
            df_seq_free(s);
            return df_fail(err, rc, "KV cache of %d positions (%.1f MiB) does not fit in memory", max_ctx,
                           (double)seq_bytes(m, max_ctx) / 1048576.0);
        }
        df_seq_set(s, li, kv);
    }
    *out = s;
    return DF_OK;
}

typedef struct work {
    int rows;
    float *x, *xb, *y;   /* [R][H] residual stream, normed input, a sublayer's output */
    float *q, *att;      /* [R][qd] */
    float *k, *v;        /* [R][kvd] */
    float *kvrow;        /* [2 kvd] one row's key and value, as the cache takes it */
    float *hg, *hu;      /* [R][intermediate] dense MLP */
    df_moe_work *moe;    /* NULL for a dense model */
} work;

typedef struct dims { size_t R, H, qd, kvd, I; } dims;

static dims dims_of(const df_model *m, int rows) {
    const df_config *c = &m->cfg;
    return (dims){(size_t)rows, (size_t)c->hidden_size, (size_t)c->num_attention_heads * (size_t)c->head_dim,
                  (size_t)kv_dim(c), (size_t)c->intermediate_size};
}

static void *work_new(const df_model *m, int rows, int max_ctx) {
    (void)max_ctx;
    const df_config *c = &m->cfg;
    dims d = dims_of(m, rows);
    work *w = df_xcalloc(1, sizeof *w);
    w->rows = rows;
    w->x = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->xb = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->y = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->q = df_aligned_alloc(sizeof(float) * d.R * d.qd);
    w->att = df_aligned_alloc(sizeof(float) * d.R * d.qd);
    w->k = df_aligned_alloc(sizeof(float) * d.R * d.kvd);
    w->v = df_aligned_alloc(sizeof(float) * d.R * d.kvd);
    w->kvrow = df_aligned_alloc(sizeof(float) * 2 * d.kvd);
    w->hg = df_aligned_alloc(sizeof(float) * d.R * d.I);
    w->hu = df_aligned_alloc(sizeof(float) * d.R * d.I);
    if (c->num_experts > 0)
        w->moe = df_moe_work_new(rows, c->hidden_size, c->num_experts, c->num_experts_per_tok,
                                 c->moe_intermediate_size);
    return w;
}

static void work_free(void *p) {
    work *w = p;
    if (!w) return;
    free(w->x), free(w->xb), free(w->y), free(w->q), free(w->att), free(w->k), free(w->v), free(w->kvrow);
    free(w->hg), free(w->hu);
    df_moe_work_free(w->moe);
    free(w);
}

static uint64_t work_bytes(const df_model *m, int rows, int max_ctx) {
    const df_config *c = &m->cfg;
    dims d = dims_of(m, rows);
    uint64_t b = sizeof(float) * (d.R * (3 * d.H + 2 * d.qd + 2 * d.kvd + 2 * d.I) + 2 * d.kvd);
    if (c->num_experts > 0)
        b += df_moe_work_bytes(rows, c->hidden_size, c->num_experts, c->num_experts_per_tok,
                               c->moe_intermediate_size);
    return b + sizeof(float) * 64 * (uint64_t)max_ctx; /* attention's per-thread score rows */
}

/* ---- the forward pass -------------------------------------------------------------------- */

static void attention(df_fwd *f, const df_batch *b, int li) {
    const df_config *c = &f->m->cfg;
    const fam *fm = f->m->fam;
    const layer *L = &fm->layers[li];
    work *w = f->work;
    int T = b->n, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    int nkv = c->num_key_value_heads, qd = nh * hd, kvd = nkv * hd;
    float eps = (float)c->rms_norm_eps;

    df_rmsnorm_rows(w->xb, w->x, L->attn_norm, T, H, eps);
    const df_weight *qkv[3] = {&L->q, &L->k, &L->v};
    float *out[3] = {w->q, w->k, w->v};
    df_linear_multi(f->pool, 3, qkv, out, w->xb, T);
    df_add_bias(w->q, qd, L->q_bias, T, qd);
    df_add_bias(w->k, kvd, L->k_bias, T, kvd);
    df_add_bias(w->v, kvd, L->v_bias, T, kvd);

    int half = hd / 2;
    float cosv[half > 0 ? half : 1], sinv[half > 0 ? half : 1];
    for (int t = 0; t < T; t++) {
        df_rope_angles(&fm->rope, b->pos[t], cosv, sinv);
        for (int h = 0; h < nh; h++) {
            float *q = w->q + (size_t)t * qd + (size_t)h * hd;
            df_rmsnorm(q, q, L->q_norm, hd, eps);
            df_rope_neox(q, hd, cosv, sinv);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = w->k + (size_t)t * kvd + (size_t)h * hd;
            df_rmsnorm(k, k, L->k_norm, hd, eps);
            df_rope_neox(k, hd, cosv, sinv);
        }
        memcpy(w->kvrow, w->k + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
        memcpy(w->kvrow + kvd, w->v + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
        df_lstate *st = b->seq[t]->layer[li];
        st->ops->append(st, b->pos[t], w->kvrow);
    }
    df_gqa_attend(f->pool, b, li, w->q, w->att, nh, nkv, hd);
    df_linear(f->pool, w->xb, w->att, &L->o, T);
    df_add_bias(w->xb, H, L->o_bias, T, H);
    df_add(w->x, w->xb, (size_t)T * H);
}

/* Predicts MoE layer `target`'s experts by running its post-attention norm and
 * router on the residual stream as it is now, and hands them to the expert
 * source to read ahead. Only the source's reads depend on this: the layer's
 * own routing is computed afresh when it comes, so results do not change. */
static void predict(df_fwd *f, int target, int T) {
    if (target < 0) return;
    const df_config *c = &f->m->cfg;
    const layer *L = &((const fam *)f->m->fam)->layers[target];
    df_moe_work *mw = ((work *)f->work)->moe;
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    df_rmsnorm_rows(mw->pxb, ((work *)f->work)->x, L->ffn_norm, T, H, (float)c->rms_norm_eps);
    df_linear(f->pool, mw->prouter, mw->pxb, &L->router, T);
    for (int t = 0; t < T; t++)
        df_route_softmax_topk(mw->prouter + (size_t)t * E, E, K, c->norm_topk_prob, mw->psel + (size_t)t * K,
                              mw->pselw + (size_t)t * K, NULL);
    f->experts->ops->predict(f->experts, target, mw->psel, T * K);
}

static int moe(df_fwd *f, const layer *L, int li, int T, df_error *err) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    df_moe_work *mw = w->moe;
    int E = c->num_experts, K = c->num_experts_per_tok;
    df_linear(f->pool, mw->prouter, w->xb, &L->router, T);
    for (int t = 0; t < T; t++) {
        int forced[K];
        if (f->route) f->route(f->route_user, li, t, forced);
        df_route_softmax_topk(mw->prouter + (size_t)t * E, E, K, c->norm_topk_prob, mw->sel + (size_t)t * K,
                              mw->selw + (size_t)t * K, f->route ? forced : NULL);
    }
    return df_moe_experts(f, mw, li, w->xb, w->y, T, K, predict, err);
}

static int feed_forward(df_fwd *f, int li, int T, df_error *err) {
    const df_config *c = &f->m->cfg;
    const layer *L = &((const fam *)f->m->fam)->layers[li];
    work *w = f->work;
    int H = c->hidden_size;
    df_rmsnorm_rows(w->xb, w->x, L->ffn_norm, T, H, (float)c->rms_norm_eps);
    if (L->is_moe) {
        int rc = moe(f, L, li, T, err);
        if (rc) return rc;
    } else {
        df_swiglu(f->pool, &L->gate.v, &L->up.v, &L->down.v, w->xb, w->y, w->hg, w->hu, T);
    }
    df_add(w->x, w->y, (size_t)T * H);
    return DF_OK;
}

static int forward(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err) {
    const df_model *m = f->m;
    const df_config *c = &m->cfg;
    work *w = f->work;
    int T = b->n;
    df_embed_rows(&m->embed, b->tokens, T, w->x);
    /* The first MoE layers have no earlier one to predict them from: their
     * routers run on the embeddings. */
    int depth = c->num_experts > 0 ? df_moe_lookahead_depth(f) : 0;
    df_blk_enter(f, DF_BLK_FFN); /* routers */
    for (int n = 1; n <= depth; n++) predict(f, df_moe_after(c, -1, n), T);
    df_blk_enter(f, DF_BLK_OTHER);
    for (int li = 0; li < c->num_hidden_layers; li++) {
        df_blk_enter(f, DF_BLK_ATTN);
        attention(f, b, li);
        df_blk_enter(f, DF_BLK_FFN);
        int rc = feed_forward(f, li, T, err);
        df_blk_enter(f, DF_BLK_OTHER);
        if (rc) return rc;
        if (f->on_layer) f->on_layer(f->layer_user, li + 1, c->num_hidden_layers, T);
    }
    if (c->num_experts > 0) f->experts->ops->end_step(f->experts, T);
    if (!logits) return DF_OK;
    df_forward_logits(f, w->x, w->xb, T, logits, all_rows);
    return DF_OK;
}

/* ---- inspect ---------------------------------------------------------------------------- */

static void inspect(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    fprintf(f, "attention heads       %d (kv %d, head_dim %d)\n", c->num_attention_heads, c->num_key_value_heads,
            c->head_dim);
    fprintf(f, "intermediate_size     %d\n", c->intermediate_size);
    fprintf(f, "max_position          %d\n", c->max_position_embeddings);
    static const char *const rope[] = {"default", "linear", "dynamic", "yarn"};
    fprintf(f, "rope                  theta %g, scaling %s", c->rope_theta, rope[c->rope_type]);
    if (c->rope_type != DF_ROPE_DEFAULT) fprintf(f, " (factor %g)", c->rope_factor);
    fprintf(f, "\nrms_norm_eps          %g\n", c->rms_norm_eps);
    fprintf(f, "tied embeddings       %s\n", c->tie_word_embeddings ? "yes" : "no");
    if (strcmp(c->model_type, "qwen3_moe") != 0) return;
    fprintf(f, "experts               %d, top-%d, moe_intermediate %d, norm_topk_prob %s\n", c->num_experts,
            c->num_experts_per_tok, c->moe_intermediate_size, c->norm_topk_prob ? "yes" : "no");
    fprintf(f, "MoE layers            %d of %d (decoder_sparse_step %d)\n", df_config_moe_layers(c),
            c->num_hidden_layers, c->decoder_sparse_step);
}

/* ---- sizes from config.json alone (inspect --config-only) ---------------------------------------- */

/* The tensors load() reads, as shipped (norms, biases BF16); the KV cache
 * (seq_bytes) per token. */
static int plan(const df_config *c, const df_quant *q, df_plan *out, df_error *err) {
    df_plan_ctx pc = {c, q, err, 0}, *p = &pc;
    int H = c->hidden_size, hd = c->head_dim, qd = c->num_attention_heads * hd, kvd = kv_dim(c);
    int I = c->intermediate_size;
    int rc = df_plan_spine(p);
    for (int li = 0; li < c->num_hidden_layers && !rc; li++) {
        p->bytes += 2 * (2 * (uint64_t)H + 2 * (uint64_t)hd); /* input, post-attention, q and k norms */
        if (c->attention_bias) p->bytes += 2 * ((uint64_t)qd + 2 * (uint64_t)kvd + (uint64_t)H);
        rc = df_plan_linear(p, qd, H, "model.layers.%d.self_attn.q_proj", li) ||
             df_plan_linear(p, kvd, H, "model.layers.%d.self_attn.k_proj", li) ||
             df_plan_linear(p, kvd, H, "model.layers.%d.self_attn.v_proj", li) ||
             df_plan_linear(p, H, qd, "model.layers.%d.self_attn.o_proj", li) ||
             (c->layer_is_moe[li] ? df_plan_linear(p, c->num_experts, H, "model.layers.%d.mlp.gate", li)
                                  : df_plan_swiglu(p, I, "model.layers.%d.mlp", li));
    }
    if (rc) return err->code;
    out->active = p->bytes;
    p->bytes = 0;
    int first = 0, mI = c->moe_intermediate_size;
    while (first < c->num_hidden_layers && !c->layer_is_moe[first]) first++;
    if (c->num_experts > 0 && first < c->num_hidden_layers &&
        (rc = df_plan_swiglu(p, mI, "model.layers.%d.mlp.experts.0", first)))
        return rc;
    out->expert = p->bytes;
    out->state_fixed = 0;
    out->state_per_token = (uint64_t)c->num_hidden_layers * df_kv_state_bytes(1, kvd);
    return DF_OK;
}

/* ---- the table entries ------------------------------------------------------------------------ */

static const char *const STOP[] = {"<|im_end|>", NULL};

const df_arch df_arch_qwen3 = {
    .model_type = "qwen3", .parse_config = parse_config, .expert_layout = NULL, .expert_prefix = NULL,
    .load = load, .unload = unload, .seq_new = seq_new, .seq_bytes = seq_bytes, .work_new = work_new,
    .work_free = work_free, .work_bytes = work_bytes, .forward = forward, .stop_tokens = STOP,
    .chat = df_chat_render_chatml_spans, .inspect = inspect, .plan = plan};

const df_arch df_arch_qwen3_moe = {
    .model_type = "qwen3_moe", .parse_config = parse_config, .expert_layout = &EXPERTS,
    .expert_prefix = expert_prefix, .load = load, .unload = unload, .seq_new = seq_new, .seq_bytes = seq_bytes,
    .work_new = work_new, .work_free = work_free, .work_bytes = work_bytes, .forward = forward,
    .stop_tokens = STOP, .chat = df_chat_render_chatml_spans, .inspect = inspect, .plan = plan};
