/*
 * deepseek.c - the DeepSeek-V3 family: DeepSeek-V2, DeepSeek-V3/R1 and Kimi K2
 * (the DeepseekV3 architecture with model_type kimi_k2, also as the text model
 * of a Kimi K2.5-style wrapper). Everything that is this family's lives here:
 * its config.json fields, its tensor names, its state (a latent cache per
 * layer), its forward pass, its stop tokens and chat templates, and its lines
 * of `deltafin inspect`. The forward pass reads top to bottom over the shared
 * blocks (blocks.h):
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x)
 *       q = q_b(rmsnorm(q_a(h)))  or q_proj(h)          per head [nope | rope]
 *       [c | k_rope] = kv_a_proj_with_mqa(h); c = rmsnorm(c)   (the cached latent)
 *       interleaved rotary on q's rope part and on k_rope (shared by all heads)
 *       x += o_proj(multi-head latent attention over the latent cache)
 *       h = rmsnorm(x)
 *       x += dense SiLU-gated MLP(h)                       the first layers, or
 *       x += sum_k w_k * expert_k(h) + shared_experts(h)   scored router, top-k
 *   logits = lm_head(rmsnorm(x))
 *
 * MTP layers (num_nextn_predict_layers, numbered after the last layer),
 * rotary_emb.inv_freq buffers and a wrapper's vision tensors are never read.
 */
#include "model/arch.h"
#include "model/blocks.h"
#include "model/config_json.h"

#include <stdlib.h>

/* Hugging Face builds q_a_layernorm and kv_a_layernorm without an eps
 * argument: RMSNorm's default, whatever rms_norm_eps says. */
#define LATENT_NORM_EPS 1e-6f

/* ---- config.json ------------------------------------------------------------------- */

static int parse_mla(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    bool have;
    if ((rc = df_cfg_int(p, root, "num_attention_heads", true, 1, DF_CFG_MAX_HEADS, &c->num_attention_heads,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "q_lora_rank", false, 1, DF_CFG_MAX_HIDDEN, &c->q_lora_rank, NULL)) ||
        (rc = df_cfg_int(p, root, "kv_lora_rank", true, 1, DF_CFG_MAX_HEAD_DIM * 16, &c->kv_lora_rank, NULL)) ||
        (rc = df_cfg_int(p, root, "qk_nope_head_dim", true, 1, DF_CFG_MAX_HEAD_DIM, &c->qk_nope_head_dim,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "qk_rope_head_dim", true, 2, DF_CFG_MAX_HEAD_DIM, &c->qk_rope_head_dim,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "v_head_dim", true, 1, DF_CFG_MAX_HEAD_DIM, &c->v_head_dim, NULL)))
        return rc;
    if (c->qk_rope_head_dim % 2 != 0)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%sqk_rope_head_dim' (%d) must be even (rotary pairs)",
                       p->path, p->prefix, c->qk_rope_head_dim);
    /* every head reads the one latent: num_key_value_heads, if given, is informative */
    int kv = c->num_attention_heads;
    if ((rc = df_cfg_int(p, root, "num_key_value_heads", false, 1, DF_CFG_MAX_HEADS, &kv, &have))) return rc;
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
    bool bias = false;
    if ((rc = df_cfg_bool(p, root, "attention_bias", &bias))) return rc;
    if (bias)
        return df_fail(p->err, DF_ERR_UNSUPPORTED, "%s: field '%sattention_bias' true is not supported", p->path,
                       p->prefix);
    return DF_OK;
}

static int parse_enum(const df_cfg_ctx *p, json_t *root, const char *key, const char *const *names, int n,
                      int dflt, int *out) {
    const char *s;
    int rc = df_cfg_str(p, root, key, false, &s);
    if (rc) return rc;
    *out = dflt;
    if (!s) return DF_OK;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return *out = i, DF_OK;
    char list[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    return df_fail(p->err, DF_ERR_UNSUPPORTED, "%s: field '%s%s' '%.64s' is not supported (supported: %s)",
                   p->path, p->prefix, key, s, list);
}

static int parse_router(df_config *c, json_t *root, const df_cfg_ctx *p) {
    static const char *const SCORING[] = {"softmax", "sigmoid"};
    static const char *const METHOD[] = {"greedy", "group_limited_greedy", "noaux_tc"};
    bool v2 = strcmp(c->model_type, "deepseek_v2") == 0;
    int rc, s, m;
    double scale = 1.0;
    if ((rc = parse_enum(p, root, "scoring_func", SCORING, 2, v2 ? DF_SCORE_SOFTMAX : DF_SCORE_SIGMOID, &s)) ||
        (rc = parse_enum(p, root, "topk_method", METHOD, 3, v2 ? DF_TOPK_GREEDY : DF_TOPK_NOAUX_TC, &m)) ||
        (rc = df_cfg_int(p, root, "n_group", false, 1, DF_CFG_MAX_EXPERTS, &c->n_group, NULL)) ||
        (rc = df_cfg_int(p, root, "topk_group", false, 1, DF_CFG_MAX_EXPERTS, &c->topk_group, NULL)) ||
        (rc = df_cfg_num(p, root, "routed_scaling_factor", false, true, &scale, NULL)) ||
        (rc = df_cfg_bool(p, root, "norm_topk_prob", &c->norm_topk_prob)))
        return rc;
    c->scoring = (df_score_fn)s, c->topk_method = (df_topk_method)m, c->routed_scaling_factor = scale;
    int E = c->num_experts, G = c->n_group;
    if (E % G != 0)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%sn_group' (%d) must divide n_routed_experts (%d)",
                       p->path, p->prefix, G, E);
    if (c->topk_group > G)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%stopk_group' (%d) exceeds n_group (%d)", p->path,
                       p->prefix, c->topk_group, G);
    bool grouped = c->topk_method != DF_TOPK_GREEDY && G > 1;
    int reach = grouped ? c->topk_group * (E / G) : E;
    if (c->num_experts_per_tok > reach)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field '%snum_experts_per_tok' (%d) exceeds the %d experts of topk_group groups",
                       p->path, p->prefix, c->num_experts_per_tok, reach);
    if (grouped && c->topk_method == DF_TOPK_NOAUX_TC && E / G < 2)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field '%sn_group' (%d): noaux_tc scores a group by its best two experts, "
                       "so each group needs two",
                       p->path, p->prefix, G);
    return DF_OK;
}

static int parse_experts(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc, first_dense = 0, freq = 1;
    if ((rc = df_cfg_int(p, root, "n_routed_experts", false, 0, DF_CFG_MAX_EXPERTS, &c->num_experts, NULL)))
        return rc;
    if (c->num_experts > 0) {
        if ((rc = df_cfg_int(p, root, "num_experts_per_tok", true, 1, c->num_experts, &c->num_experts_per_tok,
                             NULL)) ||
            (rc = df_cfg_int(p, root, "moe_intermediate_size", true, 1, DF_CFG_MAX_INTER,
                             &c->moe_intermediate_size, NULL)) ||
            (rc = df_cfg_int(p, root, "n_shared_experts", false, 0, 64, &c->n_shared_experts, NULL)) ||
            (rc = parse_router(c, root, p)))
            return rc;
    }
    if ((rc = df_cfg_int(p, root, "first_k_dense_replace", false, 0, DF_MAX_LAYERS, &first_dense, NULL)) ||
        (rc = df_cfg_int(p, root, "moe_layer_freq", false, 1, DF_MAX_LAYERS, &freq, NULL)))
        return rc;
    c->decoder_sparse_step = freq;
    for (int i = 0; i < c->num_hidden_layers; i++)
        c->layer_is_moe[i] = c->num_experts > 0 && i >= first_dense && i % freq == 0;
    return DF_OK;
}

static int parse_config(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc, mtp = 0;
    const char *s;
    if ((rc = df_cfg_str(p, root, "hidden_act", false, &s))) return rc;
    if (s && strcmp(s, "silu") != 0)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: field '%shidden_act' '%.64s' is not supported (supported: silu)", p->path, p->prefix, s);
    if ((rc = df_cfg_int(p, root, "intermediate_size", true, 1, DF_CFG_MAX_INTER, &c->intermediate_size, NULL)) ||
        (rc = parse_mla(c, root, p)) || (rc = df_cfg_rope(c, root, p)) || (rc = parse_experts(c, root, p)) ||
        (rc = df_cfg_int(p, root, "num_nextn_predict_layers", false, 0, 16, &mtp, NULL)))
        return rc;
    return DF_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

static const df_expert_layout EXPERTS = {
    3, {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}, {{0, -1}, {1, -1}, {2, -1}}, {{0}}, {0}};

static void expert_prefix(const df_config *c, int layer, int e, char *name, size_t n) {
    snprintf(name, n, "%smodel.layers.%d.mlp.experts.%d.", c->tensor_prefix, layer, e);
}

typedef struct layer {
    float *attn_norm, *ffn_norm;      /* [H] */
    float *q_a_norm, *kv_a_norm;      /* [q_lora_rank], [kv_lora_rank] */
    df_weight q, q_a, q_b;            /* q_proj, or q_a_proj and q_b_proj (q-LoRA) */
    df_weight kv_a, kv_b, o;
    bool is_moe;
    df_weight gate, up, down;         /* dense MLP, or the shared experts on MoE layers */
    df_weight router;                 /* [E][H] */
    float *router_bias;               /* [E] e_score_correction_bias (noaux_tc) */
} layer;

typedef struct fam {
    layer *layers;
    df_rope rope;
    df_mla mla;
    df_router router;
} fam;

#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)

static int load_attention(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    const char *pre = c->tensor_prefix;
    char n[256];
    int rc, H = c->hidden_size, nh = c->num_attention_heads, qd = nh * (c->qk_nope_head_dim + c->qk_rope_head_dim);
    int kvl = c->kv_lora_rank;
    if ((rc = df_model_vector(m, &L->attn_norm, NAME("%smodel.layers.%d.input_layernorm.weight", pre, li), H,
                              err)) ||
        (rc = df_model_vector(m, &L->ffn_norm, NAME("%smodel.layers.%d.post_attention_layernorm.weight", pre, li),
                              H, err)))
        return rc;
    if (c->q_lora_rank) {
        int r = c->q_lora_rank;
        if ((rc = df_model_matrix(m, &L->q_a, NAME("%smodel.layers.%d.self_attn.q_a_proj.weight", pre, li), r, H,
                                  true, err)) ||
            (rc = df_model_vector(m, &L->q_a_norm,
                                  NAME("%smodel.layers.%d.self_attn.q_a_layernorm.weight", pre, li), r, err)) ||
            (rc = df_model_matrix(m, &L->q_b, NAME("%smodel.layers.%d.self_attn.q_b_proj.weight", pre, li), qd, r,
                                  true, err)))
            return rc;
    } else if ((rc = df_model_matrix(m, &L->q, NAME("%smodel.layers.%d.self_attn.q_proj.weight", pre, li), qd, H,
                                     true, err))) {
        return rc;
    }
    if ((rc = df_model_matrix(m, &L->kv_a, NAME("%smodel.layers.%d.self_attn.kv_a_proj_with_mqa.weight", pre, li),
                              kvl + c->qk_rope_head_dim, H, true, err)) ||
        (rc = df_model_vector(m, &L->kv_a_norm, NAME("%smodel.layers.%d.self_attn.kv_a_layernorm.weight", pre, li),
                              kvl, err)) ||
        (rc = df_model_matrix(m, &L->kv_b, NAME("%smodel.layers.%d.self_attn.kv_b_proj.weight", pre, li),
                              nh * (c->qk_nope_head_dim + c->v_head_dim), kvl, true, err)) ||
        (rc = df_model_matrix(m, &L->o, NAME("%smodel.layers.%d.self_attn.o_proj.weight", pre, li), H,
                              nh * c->v_head_dim, true, err)))
        return rc;
    return DF_OK;
}

/* gate/up/down of width I under `what` ("mlp" or "mlp.shared_experts"). */
static int load_swiglu(df_model *m, layer *L, int li, const char *what, int I, df_error *err) {
    const df_config *c = &m->cfg;
    const char *pre = c->tensor_prefix;
    char n[256];
    int rc, H = c->hidden_size;
    if ((rc = df_model_matrix(m, &L->gate, NAME("%smodel.layers.%d.%s.gate_proj.weight", pre, li, what), I, H, true,
                              err)) ||
        (rc = df_model_matrix(m, &L->up, NAME("%smodel.layers.%d.%s.up_proj.weight", pre, li, what), I, H, true,
                              err)) ||
        (rc = df_model_matrix(m, &L->down, NAME("%smodel.layers.%d.%s.down_proj.weight", pre, li, what), H, I, true,
                              err)))
        return rc;
    return DF_OK;
}

static int load_ffn(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    const char *pre = c->tensor_prefix;
    char n[256];
    int rc;
    L->is_moe = c->layer_is_moe[li];
    if (!L->is_moe) return load_swiglu(m, L, li, "mlp", c->intermediate_size, err);
    if ((rc = df_model_param(m, &L->router, NAME("%smodel.layers.%d.mlp.gate.weight", pre, li), c->num_experts,
                              c->hidden_size, true, err)))
        return rc;
    if (c->topk_method == DF_TOPK_NOAUX_TC &&
        (rc = df_model_vector(m, &L->router_bias, NAME("%smodel.layers.%d.mlp.gate.e_score_correction_bias", pre, li),
                              c->num_experts, err)))
        return rc;
    if (c->n_shared_experts)
        return load_swiglu(m, L, li, "mlp.shared_experts", c->n_shared_experts * c->moe_intermediate_size, err);
    return DF_OK;
}
#undef NAME

static void unload(df_model *m) {
    fam *f = m->fam;
    if (!f) return;
    for (int li = 0; f->layers && li < m->cfg.num_hidden_layers; li++) {
        layer *L = &f->layers[li];
        free(L->attn_norm), free(L->ffn_norm), free(L->q_a_norm), free(L->kv_a_norm), free(L->router_bias);
    }
    free(f->layers);
    df_rope_free(&f->rope);
    free(f);
    m->fam = NULL;
}

/* 1/sqrt(q head dim), times YaRN's mscale^2 when rope_scaling gives
 * mscale_all_dim (Hugging Face's DeepseekV3Attention), in double as there. */
static float softmax_scale(const df_config *c) {
    double s = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    if (c->rope_type == DF_ROPE_YARN && c->yarn_mscale_all_dim > 0 && c->rope_factor > 1) {
        double ms = 0.1 * c->yarn_mscale_all_dim * log(c->rope_factor) + 1.0;
        s = s * ms * ms;
    }
    return (float)s;
}

static df_mla mla_of(const df_config *c) {
    return (df_mla){c->num_attention_heads, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim,
                    c->kv_lora_rank, softmax_scale(c)};
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
    if (!rc) rc = df_rope_init(&f->rope, c, c->qk_rope_head_dim, err);
    if (rc) {
        unload(m);
        return rc;
    }
    f->mla = mla_of(c);
    /* DeepSeek-V2 scales only weights it did not renormalise */
    f->router = (df_router){c->scoring, c->topk_method, c->n_group, c->topk_group, c->norm_topk_prob,
                            strcmp(c->model_type, "deepseek_v2") != 0, (float)c->routed_scaling_factor};
    return DF_OK;
}

/* ---- state and work buffers ------------------------------------------------------------ */

/* A cache row: the normalised latent, then the rotated shared rope key. */
static int cache_dim(const df_config *c) { return c->kv_lora_rank + c->qk_rope_head_dim; }

static uint64_t seq_bytes(const df_model *m, int max_ctx) {
    return (uint64_t)m->cfg.num_hidden_layers * df_latent_state_bytes(max_ctx, cache_dim(&m->cfg));
}

static int seq_new(const df_model *m, int max_ctx, df_seq **out, df_error *err) {
    df_seq *s = df_seq_new(m->cfg.num_hidden_layers, max_ctx);
    for (int li = 0; li < m->cfg.num_hidden_layers; li++) {
        df_lstate *st;
        int rc = df_latent_state_new(&st, max_ctx, cache_dim(&m->cfg), err);
        if (rc) {
            df_seq_free(s);
            return df_fail(err, rc, "latent cache of %d positions (%.1f MiB) does not fit in memory", max_ctx,
                           (double)seq_bytes(m, max_ctx) / 1048576.0);
        }
        df_seq_set(s, li, st);
    }
    *out = s;
    return DF_OK;
}

typedef struct work {
    int rows;
    float *x, *xb, *y, *ys;  /* [R][H] residual stream, normed input, a sublayer's output, shared experts' */
    float *cq;               /* [R][q_lora_rank] */
    float *q;                /* [R][nh][nope + rope] */
    float *ckv;              /* [R][kv_lora_rank + rope] */
    float *att;              /* [R][nh * v] */
    float *hg, *hu;          /* [R][max(dense, shared width)] */
    df_moe_work *moe;        /* NULL for a dense model */
    df_mla_work *mla;
} work;

typedef struct dims { size_t R, H, qlr, qd, cd, vd, I; } dims;

static dims dims_of(const df_config *c, int rows) {
    size_t I = (size_t)c->intermediate_size, sI = (size_t)c->n_shared_experts * (size_t)c->moe_intermediate_size;
    return (dims){(size_t)rows, (size_t)c->hidden_size, (size_t)c->q_lora_rank,
                  (size_t)c->num_attention_heads * (size_t)c->head_dim, (size_t)cache_dim(c),
                  (size_t)c->num_attention_heads * (size_t)c->v_head_dim, I > sI ? I : sI};
}


static void *work_new(const df_model *m, int rows, int max_ctx) {
    const df_config *c = &m->cfg;
    dims d = dims_of(c, rows);
    work *w = df_xcalloc(1, sizeof *w);
    w->rows = rows;
    w->x = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->xb = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->y = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->ys = df_aligned_alloc(sizeof(float) * d.R * d.H);
    w->cq = df_aligned_alloc(sizeof(float) * d.R * (d.qlr ? d.qlr : 1));
    w->q = df_aligned_alloc(sizeof(float) * d.R * d.qd);
    w->ckv = df_aligned_alloc(sizeof(float) * d.R * d.cd);
    w->att = df_aligned_alloc(sizeof(float) * d.R * d.vd);
    w->hg = df_aligned_alloc(sizeof(float) * d.R * d.I);
    w->hu = df_aligned_alloc(sizeof(float) * d.R * d.I);
    if (c->num_experts > 0)
        w->moe = df_moe_work_new(rows, c->hidden_size, c->num_experts, c->num_experts_per_tok,
                                 c->moe_intermediate_size);
    df_mla a = mla_of(c);
    w->mla = df_mla_work_new(&a, rows, max_ctx);
    return w;
}

static void work_free(void *p) {
    work *w = p;
    if (!w) return;
    free(w->x), free(w->xb), free(w->y), free(w->ys), free(w->cq), free(w->q), free(w->ckv), free(w->att);
    free(w->hg), free(w->hu);
    df_moe_work_free(w->moe);
    df_mla_work_free(w->mla);
    free(w);
}

static uint64_t work_bytes(const df_model *m, int rows, int max_ctx) {
    const df_config *c = &m->cfg;
    dims d = dims_of(c, rows);
    uint64_t b = sizeof(float) * d.R * (4 * d.H + (d.qlr ? d.qlr : 1) + d.qd + d.cd + d.vd + 2 * d.I);
    if (c->num_experts > 0)
        b += df_moe_work_bytes(rows, c->hidden_size, c->num_experts, c->num_experts_per_tok,
                               c->moe_intermediate_size);
    df_mla a = mla_of(c);
    return b + df_mla_work_bytes(&a, rows, max_ctx);
}

/* ---- the forward pass -------------------------------------------------------------------- */

/* Queries [T][nh][nope | rope] and cache rows [T][latent | rope key] of the
 * batch, rotated and normalised; each row's cache row is appended. */
static void mla_inputs(df_fwd *f, const df_batch *b, const layer *L, int li) {
    const df_config *c = &f->m->cfg;
    const fam *fm = f->m->fam;
    work *w = f->work;
    int T = b->n, nh = c->num_attention_heads, qk = c->head_dim, nope = c->qk_nope_head_dim;
    int rope = c->qk_rope_head_dim, kvl = c->kv_lora_rank, cd = cache_dim(c);
    if (c->q_lora_rank) {
        const df_weight *a[2] = {&L->q_a, &L->kv_a};
        float *out[2] = {w->cq, w->ckv};
        df_linear_multi(f->pool, 2, a, out, w->xb, T);
        df_rmsnorm_rows(w->cq, w->cq, L->q_a_norm, T, c->q_lora_rank, LATENT_NORM_EPS);
        df_linear(f->pool, w->q, w->cq, &L->q_b, T);
    } else {
        const df_weight *a[2] = {&L->q, &L->kv_a};
        float *out[2] = {w->q, w->ckv};
        df_linear_multi(f->pool, 2, a, out, w->xb, T);
    }
    float cosv[rope / 2], sinv[rope / 2];
    for (int t = 0; t < T; t++) {
        df_rope_angles(&fm->rope, b->pos[t], cosv, sinv);
        float *ckv = w->ckv + (size_t)t * cd;
        df_rmsnorm(ckv, ckv, L->kv_a_norm, kvl, LATENT_NORM_EPS);
        df_rope_interleaved(ckv + kvl, rope, cosv, sinv);
        for (int h = 0; h < nh; h++) df_rope_interleaved(w->q + ((size_t)t * nh + h) * qk + nope, rope, cosv, sinv);
        df_lstate *st = b->seq[t]->layer[li];
        st->ops->append(st, b->pos[t], ckv);
    }
}

static void attention(df_fwd *f, const df_batch *b, int li) {
    const df_config *c = &f->m->cfg;
    const fam *fm = f->m->fam;
    const layer *L = &fm->layers[li];
    work *w = f->work;
    int T = b->n, H = c->hidden_size;
    df_rmsnorm_rows(w->xb, w->x, L->attn_norm, T, H, (float)c->rms_norm_eps);
    mla_inputs(f, b, L, li);
    df_mla_attend(f->pool, b, li, &fm->mla, &L->kv_b, w->q, w->att, w->mla);
    df_linear(f->pool, w->xb, w->att, &L->o, T);
    df_add(w->x, w->xb, (size_t)T * H);
}

/* Layer L's router on rows xb: top-k into sel/selw (forced by routing replay
 * when f->route is set and `replay`). */
static void route(df_fwd *f, const layer *L, int li, const float *xb, float *logits, int *sel, float *selw, int T,
                  bool replay) {
    const fam *fm = f->m->fam;
    df_route_scored_rows(f, &fm->router, &L->router, L->router_bias, li, xb, logits, sel, selw, T, replay);
}

/* Predicts MoE layer `target`'s experts by running its post-attention norm and
 * router on the residual stream as it is now, and hands them to the expert
 * source to read ahead. Only reads depend on it: results do not change. */
static void predict(df_fwd *f, int target, int T) {
    if (target < 0) return;
    const df_config *c = &f->m->cfg;
    const layer *L = &((const fam *)f->m->fam)->layers[target];
    work *w = f->work;
    df_moe_work *mw = w->moe;
    df_rmsnorm_rows(mw->pxb, w->x, L->ffn_norm, T, c->hidden_size, (float)c->rms_norm_eps);
    route(f, L, target, mw->pxb, mw->prouter, mw->psel, mw->pselw, T, false);
    f->experts->ops->predict(f->experts, target, mw->psel, T * c->num_experts_per_tok);
}

/* y = routed experts + shared experts (Hugging Face's order). */
static int moe(df_fwd *f, const layer *L, int li, int T, df_error *err) {
    const df_config *c = &f->m->cfg;
    work *w = f->work;
    df_moe_work *mw = w->moe;
    route(f, L, li, w->xb, mw->prouter, mw->sel, mw->selw, T, true);
    int rc = df_moe_experts(f, mw, li, w->xb, w->y, T, c->num_experts_per_tok, predict, err);
    if (rc || !c->n_shared_experts) return rc;
    df_swiglu(f->pool, &L->gate.v, &L->up.v, &L->down.v, w->xb, w->ys, w->hg, w->hu, T);
    df_add(w->y, w->ys, (size_t)T * c->hidden_size);
    return DF_OK;
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
    /* the first MoE layers are predicted from the embeddings */
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

/* Bytes of the SwiGLU matrices of the MoE layers (the shared experts) or of
 * the dense layers (their MLPs): always-active, both. */
static uint64_t swiglu_bytes(const df_model *m, bool moe) {
    const fam *f = m->fam;
    uint64_t b = 0;
    for (int li = 0; li < m->cfg.num_hidden_layers; li++) {
        const layer *L = &f->layers[li];
        if (L->is_moe == moe && L->gate.t) b += L->gate.t->nbytes + L->up.t->nbytes + L->down.t->nbytes;
    }
    return b;
}

static void inspect_experts(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    static const char *const SC[] = {"softmax", "sigmoid"}, *const TK[] = {"greedy", "group_limited_greedy",
                                                                            "noaux_tc"};
    char b[32];
    fprintf(f, "experts               %d routed, top-%d, %d shared, moe_intermediate %d\n", c->num_experts,
            c->num_experts_per_tok, c->n_shared_experts, c->moe_intermediate_size);
    df_fmt_bytes_iec(b, sizeof b, swiglu_bytes(m, true));
    fprintf(f, "shared experts        %d per MoE layer, always-active: %s\n", c->n_shared_experts, b);
    fprintf(f, "router                %s, %s", SC[c->scoring], TK[c->topk_method]);
    if (c->topk_method != DF_TOPK_GREEDY && c->n_group > 1)
        fprintf(f, ", %d groups keep %d", c->n_group, c->topk_group);
    fprintf(f, ", norm_topk_prob %s, routed_scaling_factor %g", c->norm_topk_prob ? "yes" : "no",
            c->routed_scaling_factor);
    if (c->topk_method == DF_TOPK_NOAUX_TC) fprintf(f, ", selection on score + e_score_correction_bias");
    int first = 0;
    while (first < c->num_hidden_layers && !c->layer_is_moe[first]) first++;
    fprintf(f, "\nMoE layers            %d of %d (first dense %d, moe_layer_freq %d)\n", df_config_moe_layers(c),
            c->num_hidden_layers, first, c->decoder_sparse_step);
}

static void inspect(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    char b[32];
    if (c->tensor_prefix[0]) fprintf(f, "text model            text_config, tensors under '%s'\n", c->tensor_prefix);
    char q[32] = "q_proj";
    if (c->q_lora_rank) snprintf(q, sizeof q, "q-LoRA %d", c->q_lora_rank);
    fprintf(f, "attention             MLA, %d heads, %s, kv_lora_rank %d, qk nope %d + rope %d, v %d\n",
            c->num_attention_heads, q, c->kv_lora_rank, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim);
    /* expanded: every head's key (nope + rope) and value */
    uint64_t cd = (uint64_t)cache_dim(c);
    uint64_t ex = (uint64_t)c->num_attention_heads * (uint64_t)(c->head_dim + c->v_head_dim);
    fprintf(f, "latent cache          %llu values per token per layer (%llu B as F32); expanded K/V: %llu (%.1fx)\n",
            (unsigned long long)cd, (unsigned long long)(4 * cd), (unsigned long long)ex, (double)ex / (double)cd);
    fprintf(f, "intermediate_size     %d (dense layers)\n", c->intermediate_size);
    df_fmt_bytes_iec(b, sizeof b, swiglu_bytes(m, false));
    fprintf(f, "dense layers          %d, MLPs always-active: %s\n", c->num_hidden_layers - df_config_moe_layers(c), b);
    fprintf(f, "max_position          %d\n", c->max_position_embeddings);
    static const char *const rope[] = {"default", "linear", "dynamic", "yarn"};
    fprintf(f, "rope                  theta %g, interleaved, scaling %s", c->rope_theta, rope[c->rope_type]);
    if (c->rope_type != DF_ROPE_DEFAULT) fprintf(f, " (factor %g)", c->rope_factor);
    fprintf(f, "\nsoftmax scale         %.6f\n", (double)softmax_scale(c));
    fprintf(f, "rms_norm_eps          %g (latent norms 1e-6)\n", c->rms_norm_eps);
    if (c->num_experts > 0) inspect_experts(m, f);
}

/* ---- sizes from config.json alone (inspect --config-only) ---------------------------------------- */

/* load_attention's tensors as shipped (norms BF16). */
static int plan_attention(df_plan_ctx *p, int li) {
    const df_config *c = p->c;
    const char *pre = c->tensor_prefix;
    int H = c->hidden_size, nh = c->num_attention_heads, qd = nh * c->head_dim, kvl = c->kv_lora_rank;
    p->bytes += 2 * (2 * (uint64_t)H + (uint64_t)c->q_lora_rank + (uint64_t)kvl);
    int r = c->q_lora_rank, kv = nh * (c->qk_nope_head_dim + c->v_head_dim);
#define LIN(rows, cols, name) df_plan_linear(p, rows, cols, "%smodel.layers.%d.self_attn." name, pre, li)
    int rc = (r ? LIN(r, H, "q_a_proj") || LIN(qd, r, "q_b_proj") : LIN(qd, H, "q_proj")) ||
             LIN(kvl + c->qk_rope_head_dim, H, "kv_a_proj_with_mqa") || LIN(kv, kvl, "kv_b_proj") ||
             LIN(H, nh * c->v_head_dim, "o_proj");
#undef LIN
    return rc ? p->err->code : DF_OK;
}

/* The tensors load() reads, as shipped (the router BF16, its bias F32), the
 * latent cache (seq_bytes) per token. */
static int plan(const df_config *c, const df_quant *q, df_plan *out, df_error *err) {
    df_plan_ctx pc = {c, q, err, 0}, *p = &pc;
    int rc = df_plan_spine(p), first = -1, S = c->n_shared_experts * c->moe_intermediate_size;
    for (int li = 0; li < c->num_hidden_layers && !rc; li++) {
        if ((rc = plan_attention(p, li))) break;
        if (!c->layer_is_moe[li]) {
            rc = df_plan_swiglu(p, c->intermediate_size, "%smodel.layers.%d.mlp", c->tensor_prefix, li);
            continue;
        }
        if (first < 0) first = li;
        p->bytes += 2 * (uint64_t)c->num_experts * (uint64_t)c->hidden_size;
        if (c->topk_method == DF_TOPK_NOAUX_TC) p->bytes += 4 * (uint64_t)c->num_experts;
        if (S) rc = df_plan_swiglu(p, S, "%smodel.layers.%d.mlp.shared_experts", c->tensor_prefix, li);
    }
    if (rc) return rc;
    out->active = p->bytes;
    p->bytes = 0;
    if (first >= 0 && c->num_experts > 0 &&
        (rc = df_plan_swiglu(p, c->moe_intermediate_size, "%smodel.layers.%d.mlp.experts.0", c->tensor_prefix, first)))
        return rc;
    out->expert = p->bytes;
    out->state_fixed = 0;
    out->state_per_token = (uint64_t)c->num_hidden_layers * df_latent_state_bytes(1, cache_dim(c));
    return DF_OK;
}

/* ---- the table entries ------------------------------------------------------------------------ */

static const char *const DS_STOP[] = {"<｜end▁of▁sentence｜>", NULL};
/* Kimi K2 ends a turn with <|im_end|>; [EOS] and [EOT] end the text (the
 * stop ids of ARCHITECTURES.md 3.3: 163586, 163585, 163593). */
static const char *const KIMI_STOP[] = {"<|im_end|>", "[EOS]", "[EOT]", NULL};

#define FAMILY(type, stop, tmpl)                                                                              \
    {.model_type = type, .parse_config = parse_config, .expert_layout = &EXPERTS,                           \
     .expert_prefix = expert_prefix, .load = load, .unload = unload, .seq_new = seq_new,                     \
     .seq_bytes = seq_bytes, .work_new = work_new, .work_free = work_free, .work_bytes = work_bytes,         \
     .forward = forward, .stop_tokens = stop, .chat = tmpl, .inspect = inspect, .plan = plan}

const df_arch df_arch_deepseek_v2 = FAMILY("deepseek_v2", DS_STOP, df_chat_render_deepseek_v2);
const df_arch df_arch_deepseek_v3 = FAMILY("deepseek_v3", DS_STOP, df_chat_render_deepseek_v3);
const df_arch df_arch_kimi_k2 = FAMILY("kimi_k2", KIMI_STOP, df_chat_render_kimi_k2);
