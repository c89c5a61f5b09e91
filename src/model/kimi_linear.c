/*
 * kimi_linear.c - the Kimi-Linear family: Kimi-Linear-48B-A3B (model_type
 * kimi_linear) and Kimi K3 (the text_config of a kimi_k3 wrapper, tensors
 * under language_model.). A hybrid of Kimi Delta Attention layers (a
 * recurrent state per sequence) and multi-head latent attention without
 * rotary embeddings, with MoE feed-forward layers; K3 adds attention
 * residuals, a latent MoE, SiTU activations and MXFP4 experts. Everything
 * that is this family's lives here: config fields, tensor names, state,
 * forward pass, stop tokens, inspect lines. The forward pass reads top to
 * bottom over the shared blocks (blocks.h):
 *
 *   x = embed(tokens)                              (K3: the first anchor)
 *   for each layer:
 *       a = x, or K3: AttnRes(anchors, x) and a new depth block every B layers
 *       h = rmsnorm(a)
 *       KDA:  q,k,v,gates = proj(h); delta rule per head; o_proj(gated norm)
 *       MLA:  latent attention, no rotary; K3: out * sigmoid(g_proj h)
 *       x += attention output
 *       h = rmsnorm(x, or K3: AttnRes(anchors, x))
 *       x += dense MLP(h), or routed experts + shared experts:
 *            sigmoid router (+ correction bias) on h; experts on h or, K3,
 *            on down(h) in a latent width, their sum normalised and up(.)
 *   logits = lm_head(rmsnorm(x, or K3: AttnRes(anchors, x)))
 *
 * Details: ARCHITECTURES.md section 4. Where the notes leave a question open
 * (K3's A_log per head or per key channel) the tensor's shape decides: see
 * load_a.
 */
#include "model/kimi_linear.h"

#include "model/config_json.h"

#include <stdlib.h>

/* Snapshots a recurrent sequence keeps (df_seq max_keep): the prompt's end
 * and a few more. Each costs one copy of every KDA layer's state; speculative
 * decoding drafts within it or recomputes (decode/speculative.c). */
#define KEEP_SNAPSHOTS 4

/* ---- config.json ------------------------------------------------------------------- */

/* One of kda_layers / full_attn_layers (1-based) into owner[] (1: KDA, 2: MLA). */
static int parse_layer_list(const df_cfg_ctx *p, json_t *lac, const char *key, int L, int tag, int *owner) {
    json_t *a = df_cfg_field(lac, key);
    if (!a) return DF_OK;
    if (!json_is_array(a))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a list of layer numbers", p->path,
                       p->prefix, key);
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > L)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field '%s%s' entry %zu must be a layer number in 1..%d (the list is 1-based)",
                           p->path, p->prefix, key, i, L);
        int l = (int)json_integer_value(x) - 1;
        if (owner[l])
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s%s': layer %d is listed twice", p->path, p->prefix,
                           key, l + 1);
        owner[l] = tag;
    }
    return DF_OK;
}

static int parse_linear(df_config *c, json_t *root, const df_cfg_ctx *p) {
    json_t *lac = df_cfg_field(root, "linear_attn_config");
    if (!lac || !json_is_object(lac))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%slinear_attn_config' must be an object", p->path,
                       p->prefix);
    char pre[64];
    snprintf(pre, sizeof pre, "%slinear_attn_config.", p->prefix);
    df_cfg_ctx lp = {p->path, pre, p->err};
    int L = c->num_hidden_layers, owner[DF_MAX_LAYERS] = {0}, rc;
    if ((rc = parse_layer_list(&lp, lac, "kda_layers", L, 1, owner)) ||
        (rc = parse_layer_list(&lp, lac, "full_attn_layers", L, 2, owner)))
        return rc;
    for (int l = 0; l < L; l++) {
        if (!owner[l])
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field '%skda_layers': layer %d is in neither kda_layers nor full_attn_layers",
                           p->path, pre, l + 1);
        c->layer_is_linear[l] = owner[l] == 1;
    }
    double lb = 0;
    bool have_lb = false;
    c->linear_conv = 4;
    if ((rc = df_cfg_int(&lp, lac, "num_heads", true, 1, DF_CFG_MAX_HEADS, &c->linear_heads, NULL)) ||
        (rc = df_cfg_int(&lp, lac, "head_dim", true, 1, DF_CFG_MAX_HEAD_DIM, &c->linear_head_dim, NULL)) ||
        (rc = df_cfg_int(&lp, lac, "short_conv_kernel_size", false, 1, 16, &c->linear_conv, NULL)) ||
        (rc = df_cfg_num(&lp, lac, "gate_lower_bound", false, false, &lb, &have_lb)) ||
        (rc = df_cfg_bool(&lp, lac, "use_full_rank_gate", &c->linear_full_rank_gate)))
        return rc;
    if (have_lb && !(lb < 0))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%sgate_lower_bound' must be negative (got %g)", p->path,
                       pre, lb);
    c->linear_lower_bound_form = have_lb;
    c->linear_lower_bound = (float)lb;
    return DF_OK;
}

static int parse_mla(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    bool nope = false;
    if ((rc = df_cfg_int(p, root, "num_attention_heads", true, 1, DF_CFG_MAX_HEADS, &c->num_attention_heads,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "q_lora_rank", false, 1, DF_CFG_MAX_HIDDEN, &c->q_lora_rank, NULL)) ||
        (rc = df_cfg_int(p, root, "kv_lora_rank", true, 1, DF_CFG_MAX_HEAD_DIM * 16, &c->kv_lora_rank, NULL)) ||
        (rc = df_cfg_int(p, root, "qk_nope_head_dim", true, 1, DF_CFG_MAX_HEAD_DIM, &c->qk_nope_head_dim,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "qk_rope_head_dim", true, 0, DF_CFG_MAX_HEAD_DIM, &c->qk_rope_head_dim,
                         NULL)) ||
        (rc = df_cfg_int(p, root, "v_head_dim", true, 1, DF_CFG_MAX_HEAD_DIM, &c->v_head_dim, NULL)) ||
        (rc = df_cfg_bool(p, root, "mla_use_nope", &nope)) ||
        (rc = df_cfg_bool(p, root, "mla_use_output_gate", &c->mla_output_gate)))
        return rc;
    if (!nope)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: field '%smla_use_nope' must be true (Kimi-Linear's MLA has no rotary embedding)",
                       p->path, p->prefix);
    c->mla_nope = true;
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
    return DF_OK;
}

static int parse_act(df_config *c, json_t *root, const df_cfg_ctx *p) {
    const char *s;
    int rc = df_cfg_str(p, root, "hidden_act", false, &s);
    if (rc) return rc;
    if (!s || strcmp(s, "silu") == 0) return c->act = DF_ACT_SILU, DF_OK;
    if (strcmp(s, "situ") != 0)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: field '%shidden_act' '%.64s' is not supported (supported: silu, situ)", p->path,
                       p->prefix, s);
    double b = 0, lb = 0;
    if ((rc = df_cfg_num(p, root, "activation_situ_beta", true, true, &b, NULL)) ||
        (rc = df_cfg_num(p, root, "activation_situ_linear_beta", true, true, &lb, NULL)))
        return rc;
    c->act = DF_ACT_SITU, c->act_beta = (float)b, c->act_lbeta = (float)lb;
    return DF_OK;
}

static int parse_router(df_config *c, json_t *root, const df_cfg_ctx *p) {
    const char *s;
    bool grouped = false;
    double scale = 1.0;
    int rc;
    if ((rc = df_cfg_str(p, root, "moe_router_activation_func", false, &s))) return rc;
    if (s && strcmp(s, "sigmoid") != 0)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: field '%smoe_router_activation_func' '%.64s' is not supported (supported: sigmoid)",
                       p->path, p->prefix, s);
    c->norm_topk_prob = true;
    if ((rc = df_cfg_bool(p, root, "moe_renormalize", &c->norm_topk_prob)) ||
        (rc = df_cfg_num(p, root, "routed_scaling_factor", false, true, &scale, NULL)) ||
        (rc = df_cfg_bool(p, root, "use_grouped_topk", &grouped)) ||
        (rc = df_cfg_int(p, root, "num_expert_group", false, 1, DF_CFG_MAX_EXPERTS, &c->n_group, NULL)) ||
        (rc = df_cfg_int(p, root, "topk_group", false, 1, DF_CFG_MAX_EXPERTS, &c->topk_group, NULL)))
        return rc;
    c->scoring = DF_SCORE_SIGMOID, c->topk_method = DF_TOPK_NOAUX_TC, c->routed_scaling_factor = scale;
    if (!grouped) c->n_group = c->topk_group = 1;
    int E = c->num_experts, G = c->n_group;
    if (E % G != 0 || c->topk_group > G || (G > 1 && E / G < 2))
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field '%snum_expert_group' (%d) must divide num_experts (%d) into groups of two or "
                       "more, and topk_group (%d) may not exceed it",
                       p->path, p->prefix, G, E, c->topk_group);
    if (c->num_experts_per_tok > c->topk_group * (E / G))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%snum_experts_per_token' (%d) exceeds the experts of "
                       "topk_group groups", p->path, p->prefix, c->num_experts_per_tok);
    return DF_OK;
}

static int parse_experts(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc, first_dense = 0, freq = 1;
    if ((rc = df_cfg_int(p, root, "num_experts", false, 0, DF_CFG_MAX_EXPERTS, &c->num_experts, NULL))) return rc;
    if (c->num_experts > 0) {
        if ((rc = df_cfg_int(p, root, "num_experts_per_token", true, 1, c->num_experts, &c->num_experts_per_tok,
                             NULL)) ||
            (rc = df_cfg_int(p, root, "moe_intermediate_size", true, 1, DF_CFG_MAX_INTER,
                             &c->moe_intermediate_size, NULL)) ||
            (rc = df_cfg_int(p, root, "num_shared_experts", false, 0, 64, &c->n_shared_experts, NULL)) ||
            (rc = df_cfg_int(p, root, "routed_expert_hidden_size", false, 1, DF_CFG_MAX_HIDDEN,
                             &c->moe_latent_size, NULL)) ||
            (rc = df_cfg_bool(p, root, "latent_moe_use_norm", &c->moe_latent_norm)) ||
            (rc = parse_router(c, root, p)))
            return rc;
        if (!c->moe_latent_size) c->moe_latent_norm = false;
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
    bool have_pos = false;
    if ((rc = df_cfg_int(p, root, "max_position_embeddings", false, 1, DF_CFG_MAX_POS, &c->max_position_embeddings,
                         &have_pos)) ||
        (!have_pos && (rc = df_cfg_int(p, root, "model_max_length", false, 1, DF_CFG_MAX_POS,
                                       &c->max_position_embeddings, NULL))) ||
        (rc = df_cfg_int(p, root, "intermediate_size", true, 1, DF_CFG_MAX_INTER, &c->intermediate_size, NULL)) ||
        (rc = parse_act(c, root, p)) || (rc = parse_linear(c, root, p)) || (rc = parse_mla(c, root, p)) ||
        (rc = parse_experts(c, root, p)) ||
        (rc = df_cfg_int(p, root, "attn_res_block_size", false, 1, DF_MAX_LAYERS, &c->attn_res_block, NULL)) ||
        (rc = df_cfg_int(p, root, "num_nextn_predict_layers", false, 0, 0, &mtp, NULL)))
        return rc;
    return DF_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

static const df_expert_layout EXPERTS = {
    3, {"w1.weight", "w3.weight", "w2.weight"}, {{0, -1}, {1, -1}, {2, -1}}, {{0}}, {0}};

static void expert_prefix(const df_config *c, int layer, int e, char *name, size_t n) {
    snprintf(name, n, "%smodel.layers.%d.block_sparse_moe.experts.%d.", c->tensor_prefix, layer, e);
}

#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)

/* exp(A_log): per head when it holds one value per head (any shape), or when
 * it is [head_dim] with a zero tail past the heads (K3's zero-padded layout);
 * per key channel, shared by the heads, when [head_dim] otherwise. */
static int load_a(df_model *m, layer *L, const char *name, df_error *err) {
    const df_config *c = &m->cfg;
    int nh = c->linear_heads, dk = c->linear_head_dim;
    const df_tensor *t = df_st_find(m->st, name);
    int64_t per_head[4] = {1, 1, nh, 1}, chan[1] = {dk};
    int rc;
    if (t && t->ndim == 4) rc = df_model_array(m, &L->a, name, 4, per_head, err);
    else if (t && t->ndim == 1 && t->shape[0] == dk && dk != nh) rc = df_model_array(m, &L->a, name, 1, chan, err);
    else rc = df_model_array(m, &L->a, name, 1, (int64_t[]){nh}, err);
    if (rc) return rc;
    L->kda.a_per_channel = t->ndim == 1 && t->shape[0] == dk && dk != nh;
    if (L->kda.a_per_channel && nh < dk) {
        bool zero_tail = true;
        for (int i = nh; i < dk; i++) zero_tail &= L->a[i] == 0.0f;
        if (zero_tail) L->kda.a_per_channel = false;
    }
    int n = L->kda.a_per_channel ? dk : nh;
    for (int i = 0; i < n; i++) L->a[i] = expf(L->a[i]);
    return DF_OK;
}

static int load_kda(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256], base[128];
    int rc, H = c->hidden_size, nh = c->linear_heads, dk = c->linear_head_dim, C = nh * dk, K = c->linear_conv;
    snprintf(base, sizeof base, "%smodel.layers.%d.self_attn", c->tensor_prefix, li);
    static const char *const CONV[3] = {"q_conv1d", "k_conv1d", "v_conv1d"};
    if ((rc = df_model_matrix(m, &L->q, NAME("%s.q_proj.weight", base), C, H, true, err)) ||
        (rc = df_model_matrix(m, &L->k, NAME("%s.k_proj.weight", base), C, H, true, err)) ||
        (rc = df_model_matrix(m, &L->v, NAME("%s.v_proj.weight", base), C, H, true, err)) ||
        (rc = df_model_matrix(m, &L->f_a, NAME("%s.f_a_proj.weight", base), dk, H, true, err)) ||
        (rc = df_model_matrix(m, &L->f_b, NAME("%s.f_b_proj.weight", base), C, dk, true, err)) ||
        (rc = df_model_matrix(m, &L->beta, NAME("%s.b_proj.weight", base), nh, H, true, err)) ||
        (rc = df_model_matrix(m, &L->o, NAME("%s.o_proj.weight", base), H, C, true, err)))
        return rc;
    if (c->linear_full_rank_gate)
        rc = df_model_matrix(m, &L->g, NAME("%s.g_proj.weight", base), C, H, true, err);
    else if (!(rc = df_model_matrix(m, &L->g_a, NAME("%s.g_a_proj.weight", base), dk, H, true, err)))
        rc = df_model_matrix(m, &L->g_b, NAME("%s.g_b_proj.weight", base), C, dk, true, err);
    if (rc) return rc;
    for (int i = 0; i < 3; i++)
        if ((rc = df_model_array(m, &L->conv[i], NAME("%s.%s.weight", base, CONV[i]), 3, (int64_t[]){C, 1, K}, err)))
            return rc;
    if ((rc = load_a(m, L, NAME("%s.A_log", base), err)) ||
        (rc = df_model_vector(m, &L->dt_bias, NAME("%s.dt_bias", base), C, err)) ||
        (rc = df_model_vector(m, &L->o_norm, NAME("%s.o_norm.weight", base), dk, err)))
        return rc;
    df_kda *k = &L->kda;
    k->nh = nh, k->dk = dk, k->kernel = K;
    k->lower_bound_form = c->linear_lower_bound_form, k->lower_bound = c->linear_lower_bound;
    k->a = L->a, k->dt_bias = L->dt_bias, k->o_norm = L->o_norm, k->eps = (float)c->rms_norm_eps;
    for (int i = 0; i < 3; i++) k->conv[i] = L->conv[i];
    return DF_OK;
}

static int load_mla(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256], base[128];
    int rc, H = c->hidden_size, nh = c->num_attention_heads, qd = nh * c->head_dim, kvl = c->kv_lora_rank;
    snprintf(base, sizeof base, "%smodel.layers.%d.self_attn", c->tensor_prefix, li);
    if (c->q_lora_rank) {
        int r = c->q_lora_rank;
        if ((rc = df_model_matrix(m, &L->q_a, NAME("%s.q_a_proj.weight", base), r, H, true, err)) ||
            (rc = df_model_vector(m, &L->q_a_norm, NAME("%s.q_a_layernorm.weight", base), r, err)) ||
            (rc = df_model_matrix(m, &L->q_b, NAME("%s.q_b_proj.weight", base), qd, r, true, err)))
            return rc;
    } else if ((rc = df_model_matrix(m, &L->q, NAME("%s.q_proj.weight", base), qd, H, true, err))) {
        return rc;
    }
    if ((rc = df_model_matrix(m, &L->kv_a, NAME("%s.kv_a_proj_with_mqa.weight", base), kvl + c->qk_rope_head_dim,
                              H, true, err)) ||
        (rc = df_model_vector(m, &L->kv_a_norm, NAME("%s.kv_a_layernorm.weight", base), kvl, err)) ||
        (rc = df_model_matrix(m, &L->kv_b, NAME("%s.kv_b_proj.weight", base),
                              nh * (c->qk_nope_head_dim + c->v_head_dim), kvl, true, err)) ||
        (rc = df_model_matrix(m, &L->o, NAME("%s.o_proj.weight", base), H, nh * c->v_head_dim, true, err)))
        return rc;
    if (c->mla_output_gate &&
        (rc = df_model_matrix(m, &L->mg, NAME("%s.g_proj.weight", base), nh * c->v_head_dim, H, true, err)))
        return rc;
    return DF_OK;
}

/* gate/up/down of width I under `what`. */
static int load_mlp(df_model *m, layer *L, int li, const char *what, int I, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256];
    int rc, H = c->hidden_size;
    const char *pre = c->tensor_prefix;
    if ((rc = df_model_matrix(m, &L->gate, NAME("%smodel.layers.%d.%s.gate_proj.weight", pre, li, what), I, H,
                              true, err)) ||
        (rc = df_model_matrix(m, &L->up, NAME("%smodel.layers.%d.%s.up_proj.weight", pre, li, what), I, H, true,
                              err)) ||
        (rc = df_model_matrix(m, &L->down, NAME("%smodel.layers.%d.%s.down_proj.weight", pre, li, what), H, I,
                              true, err)))
        return rc;
    return DF_OK;
}

static int load_ffn(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256], base[128];
    int rc, H = c->hidden_size, X = c->moe_latent_size;
    L->is_moe = c->layer_is_moe[li];
    if (!L->is_moe) return load_mlp(m, L, li, "mlp", c->intermediate_size, err);
    snprintf(base, sizeof base, "%smodel.layers.%d.block_sparse_moe", c->tensor_prefix, li);
    if ((rc = df_model_param(m, &L->router, NAME("%s.gate.weight", base), c->num_experts, H, true, err)) ||
        (rc = df_model_vector(m, &L->router_bias, NAME("%s.gate.e_score_correction_bias", base), c->num_experts,
                              err)))
        return rc;
    if (X && ((rc = df_model_matrix(m, &L->lat_down, NAME("%s.routed_expert_down_proj.weight", base), X, H, true,
                                    err)) ||
              (rc = df_model_matrix(m, &L->lat_up, NAME("%s.routed_expert_up_proj.weight", base), H, X, true,
                                    err)) ||
              (c->moe_latent_norm &&
               (rc = df_model_vector(m, &L->lat_norm, NAME("%s.routed_expert_norm.weight", base), X, err)))))
        return rc;
    if (c->n_shared_experts)
        return load_mlp(m, L, li, "block_sparse_moe.shared_experts", c->n_shared_experts * c->moe_intermediate_size,
                        err);
    return DF_OK;
}

/* An AttnRes site's pseudo-query: its norm weight times its [1][H] projection. */
static int load_res(df_model *m, float **out, const char *site, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256];
    float *w = NULL, *p = NULL;
    int rc = df_model_vector(m, &w, NAME("%s_norm.weight", site), c->hidden_size, err);
    if (!rc) rc = df_model_array(m, &p, NAME("%s_proj.weight", site), 2, (int64_t[]){1, c->hidden_size}, err);
    if (!rc)
        for (int i = 0; i < c->hidden_size; i++) w[i] *= p[i];
    free(p);
    if (rc) free(w), w = NULL;
    *out = w;
    return rc;
}
#undef NAME

static int load_layer(df_model *m, layer *L, int li, df_error *err) {
    const df_config *c = &m->cfg;
    char n[256];
    int rc, H = c->hidden_size;
    L->linear = c->layer_is_linear[li];
    snprintf(n, sizeof n, "%smodel.layers.%d.input_layernorm.weight", c->tensor_prefix, li);
    if ((rc = df_model_vector(m, &L->attn_norm, n, H, err))) return rc;
    snprintf(n, sizeof n, "%smodel.layers.%d.post_attention_layernorm.weight", c->tensor_prefix, li);
    if ((rc = df_model_vector(m, &L->ffn_norm, n, H, err))) return rc;
    if (c->attn_res_block) {
        char site[128];
        snprintf(site, sizeof site, "%smodel.layers.%d.self_attention_res", c->tensor_prefix, li);
        if ((rc = load_res(m, &L->attn_res_q, site, err))) return rc;
        snprintf(site, sizeof site, "%smodel.layers.%d.mlp_res", c->tensor_prefix, li);
        if ((rc = load_res(m, &L->mlp_res_q, site, err))) return rc;
    }
    if ((rc = L->linear ? load_kda(m, L, li, err) : load_mla(m, L, li, err))) return rc;
    return load_ffn(m, L, li, err);
}

static void unload(df_model *m) {
    fam *f = m->fam;
    if (!f) return;
    for (int li = 0; f->layers && li < m->cfg.num_hidden_layers; li++) {
        layer *L = &f->layers[li];
        free(L->attn_norm), free(L->ffn_norm), free(L->attn_res_q), free(L->mlp_res_q);
        for (int i = 0; i < 3; i++) free(L->conv[i]);
        free(L->a), free(L->dt_bias), free(L->o_norm), free(L->q_a_norm), free(L->kv_a_norm);
        free(L->router_bias), free(L->lat_norm);
    }
    free(f->layers);
    free(f->out_res_q);
    free(f);
    m->fam = NULL;
}

static df_mla mla_of(const df_config *c) {
    return (df_mla){c->num_attention_heads, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim,
                    c->kv_lora_rank, (float)(1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim)))};
}

static int load(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    fam *f = df_xcalloc(1, sizeof *f);
    m->fam = f;
    f->layers = df_xcalloc((size_t)c->num_hidden_layers, sizeof(layer));
    int rc = DF_OK;
    for (int li = 0; li < c->num_hidden_layers && !rc; li++) rc = load_layer(m, &f->layers[li], li, err);
    if (!rc && c->attn_res_block) {
        char site[96];
        snprintf(site, sizeof site, "%smodel.output_attn_res", c->tensor_prefix);
        rc = load_res(m, &f->out_res_q, site, err);
    }
    if (!rc && c->num_experts > 0) {
        int I = c->moe_intermediate_size, X = c->moe_latent_size ? c->moe_latent_size : c->hidden_size;
        int rows[3] = {I, I, X}, cols[3] = {X, X, I};
        rc = df_model_check_experts(m, rows, cols, err);
    }
    if (rc) {
        unload(m);
        return rc;
    }
    f->mla = mla_of(c);
    f->router = (df_router){c->scoring, c->topk_method, c->n_group, c->topk_group, c->norm_topk_prob, true,
                            (float)c->routed_scaling_factor};
    return DF_OK;
}

/* ---- state and work buffers ------------------------------------------------------------ */


static size_t kda_floats(const df_config *c) {
    df_kda k = {.nh = c->linear_heads, .dk = c->linear_head_dim, .kernel = c->linear_conv};
    return df_kda_state_floats(&k);
}

static uint64_t seq_bytes(const df_model *m, int max_ctx) {
    const df_config *c = &m->cfg;
    uint64_t b = 0;
    for (int li = 0; li < c->num_hidden_layers; li++)
        b += c->layer_is_linear[li] ? df_rec_state_bytes(kda_floats(c), KEEP_SNAPSHOTS)
                                    : df_latent_state_bytes(max_ctx, kl_cache_dim(c));
    return b;
}

static int seq_new(const df_model *m, int max_ctx, df_seq **out, df_error *err) {
    const df_config *c = &m->cfg;
    df_seq *s = df_seq_new(c->num_hidden_layers, max_ctx);
    s->max_keep = KEEP_SNAPSHOTS;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        df_lstate *st;
        int rc = c->layer_is_linear[li] ? df_rec_state_new(&st, kda_floats(c), KEEP_SNAPSHOTS, err)
                                        : df_latent_state_new(&st, max_ctx, kl_cache_dim(c), err);
        if (rc) {
            df_seq_free(s);
            return df_fail(err, rc, "the state of a %d-token sequence (%.1f MiB) does not fit in memory", max_ctx,
                           (double)seq_bytes(m, max_ctx) / 1048576.0);
        }
        df_seq_set(s, li, st);
    }
    *out = s;
    return DF_OK;
}


/* ---- inspect ---------------------------------------------------------------------------- */

static void inspect_attention(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    const fam *fm = m->fam;
    int n_lin = 0;
    for (int li = 0; li < c->num_hidden_layers; li++) n_lin += c->layer_is_linear[li];
    fprintf(f, "layer schedule        %d KDA, %d MLA (1-based MLA layers:", n_lin, c->num_hidden_layers - n_lin);
    for (int li = 0; li < c->num_hidden_layers; li++)
        if (!c->layer_is_linear[li]) fprintf(f, " %d", li + 1);
    fprintf(f, ")\n");
    if (n_lin) {
        const layer *L = NULL;
        for (int li = 0; li < c->num_hidden_layers && !L; li++)
            if (c->layer_is_linear[li]) L = &fm->layers[li];
        char g[48] = "softplus, -exp(A_log) softplus(x)";
        if (c->linear_lower_bound_form) snprintf(g, sizeof g, "lower bound %g sigmoid", (double)c->linear_lower_bound);
        fprintf(f, "KDA                   %d heads x %d, conv %d, decay %s, A_log per %s, output gate %s\n",
                c->linear_heads, c->linear_head_dim, c->linear_conv, g, L->kda.a_per_channel ? "key channel" : "head",
                c->linear_full_rank_gate ? "g_proj (full rank)" : "g_a_proj/g_b_proj (low rank)");
        char b[32];
        uint64_t state = (uint64_t)n_lin * sizeof(float) * kda_floats(c);
        df_fmt_bytes_iec(b, sizeof b, state);
        fprintf(f, "KDA state             %s (%llu B) per sequence (fixed; up to %d snapshots more)\n", b,
                (unsigned long long)state, KEEP_SNAPSHOTS);
    }
    char q[32] = "q_proj";
    if (c->q_lora_rank) snprintf(q, sizeof q, "q-LoRA %d", c->q_lora_rank);
    fprintf(f, "attention             MLA without rotary (NoPE), %d heads, %s, kv_lora_rank %d, qk %d + %d, v %d%s\n",
            c->num_attention_heads, q, c->kv_lora_rank, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim,
            c->mla_output_gate ? ", sigmoid output gate" : "");
    fprintf(f, "latent cache          %d values per token per MLA layer (%llu B as F32)\n", kl_cache_dim(c),
            (unsigned long long)(sizeof(float) * (size_t)kl_cache_dim(c)));
}

static void inspect(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    if (c->tensor_prefix[0]) fprintf(f, "text model            text_config, tensors under '%s'\n", c->tensor_prefix);
    inspect_attention(m, f);
    if (c->act == DF_ACT_SITU)
        fprintf(f, "activation            SiTU (beta %g, linear beta %g)\n", (double)c->act_beta, (double)c->act_lbeta);
    else
        fprintf(f, "activation            SiLU\n");
    if (c->attn_res_block) fprintf(f, "attention residuals   depth blocks of %d layers\n", c->attn_res_block);
    fprintf(f, "intermediate_size     %d (dense layers)\n", c->intermediate_size);
    if (c->num_experts > 0) {
        fprintf(f, "experts               %d routed, top-%d, %d shared, moe_intermediate %d", c->num_experts,
                c->num_experts_per_tok, c->n_shared_experts, c->moe_intermediate_size);
        if (c->moe_latent_size)
            fprintf(f, ", latent width %d%s", c->moe_latent_size, c->moe_latent_norm ? " (normed sum)" : "");
        fprintf(f, "\nrouter                sigmoid + e_score_correction_bias, renormalise %s, routed_scaling_factor %g",
                c->norm_topk_prob ? "yes" : "no", c->routed_scaling_factor);
        if (c->n_group > 1) fprintf(f, ", %d groups keep %d", c->n_group, c->topk_group);
        fprintf(f, "\nMoE layers            %d of %d\n", df_config_moe_layers(c), c->num_hidden_layers);
    }
    fprintf(f, "rms_norm_eps          %g (every norm)\n", c->rms_norm_eps);
}

/* ---- sizes from config.json alone ---------------------------------------------------------------- */

#define PM(rows, cols, ...) df_plan_linear(p, rows, cols, __VA_ARGS__)

static int plan_attention(df_plan_ctx *p, int li) {
    const df_config *c = p->c;
    char b[160];
    int rc, H = c->hidden_size;
    snprintf(b, sizeof b, "%smodel.layers.%d.self_attn", c->tensor_prefix, li);
    if (c->layer_is_linear[li]) {
        int nh = c->linear_heads, dk = c->linear_head_dim, C = nh * dk;
        rc = PM(C, H, "%s.q_proj", b) || PM(C, H, "%s.k_proj", b) || PM(C, H, "%s.v_proj", b) ||
             PM(dk, H, "%s.f_a_proj", b) || PM(C, dk, "%s.f_b_proj", b) || PM(nh, H, "%s.b_proj", b) ||
             PM(H, C, "%s.o_proj", b) ||
             (c->linear_full_rank_gate ? PM(C, H, "%s.g_proj", b)
                                       : (PM(dk, H, "%s.g_a_proj", b) || PM(C, dk, "%s.g_b_proj", b)));
        /* F32: the three short convolutions, dt_bias [C], o_norm [dk], A_log [nh] */
        p->bytes += 4 * ((uint64_t)3 * (uint64_t)C * (uint64_t)c->linear_conv + (uint64_t)C + (uint64_t)dk + (uint64_t)nh);
        return rc ? p->err->code : DF_OK;
    }
    int nh = c->num_attention_heads, qd = nh * c->head_dim, kvl = c->kv_lora_rank, vd = nh * c->v_head_dim;
    rc = (c->q_lora_rank ? (PM(c->q_lora_rank, H, "%s.q_a_proj", b) || PM(qd, c->q_lora_rank, "%s.q_b_proj", b))
                         : PM(qd, H, "%s.q_proj", b)) ||
         PM(kvl + c->qk_rope_head_dim, H, "%s.kv_a_proj_with_mqa", b) ||
         PM(nh * (c->qk_nope_head_dim + c->v_head_dim), kvl, "%s.kv_b_proj", b) || PM(H, vd, "%s.o_proj", b) ||
         (c->mla_output_gate && PM(vd, H, "%s.g_proj", b));
    p->bytes += 2 * ((uint64_t)c->q_lora_rank + (uint64_t)kvl);
    return rc ? p->err->code : DF_OK;
}

static int plan_ffn(df_plan_ctx *p, int li) {
    const df_config *c = p->c;
    char b[160];
    int rc, H = c->hidden_size, X = c->moe_latent_size;
    if (!c->layer_is_moe[li])
        return df_plan_swiglu(p, c->intermediate_size, "%smodel.layers.%d.mlp", c->tensor_prefix, li);
    int S = c->n_shared_experts * c->moe_intermediate_size;
    snprintf(b, sizeof b, "%smodel.layers.%d.block_sparse_moe", c->tensor_prefix, li);
    p->bytes += 2 * (uint64_t)c->num_experts * (uint64_t)H + 4 * (uint64_t)c->num_experts; /* router, bias */
    if (S && (rc = df_plan_swiglu(p, S, "%s.shared_experts", b))) return rc;
    rc = X && (PM(X, H, "%s.routed_expert_down_proj", b) || PM(H, X, "%s.routed_expert_up_proj", b));
    if (X && c->moe_latent_norm) p->bytes += 2 * (uint64_t)X;
    return rc ? p->err->code : DF_OK;
}

static int plan(const df_config *c, const df_quant *q, df_plan *out, df_error *err) {
    df_plan_ctx pc = {c, q, err, 0}, *p = &pc;
    int rc, H = c->hidden_size, V = c->vocab_size;
    uint64_t sites = c->attn_res_block ? 2 : 0; /* AttnRes norm + proj per site */
    p->bytes = 2 * (uint64_t)V * (uint64_t)H + 2 * (uint64_t)H * (1 + sites);  /* embedding, final norm */
    if ((rc = PM(V, H, "%slm_head", c->tensor_prefix))) return rc;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        p->bytes += 2 * (uint64_t)H * (2 + 2 * sites);
        if ((rc = plan_attention(p, li)) || (rc = plan_ffn(p, li))) return rc;
    }
    out->active = p->bytes;
    uint64_t e = 0;
    if (c->num_experts > 0) {
        int first = 0;
        while (!c->layer_is_moe[first]) first++;
        int I = c->moe_intermediate_size, X = c->moe_latent_size ? c->moe_latent_size : H;
        char pre[200];
        expert_prefix(c, first, 0, pre, sizeof pre);
        p->bytes = 0;
        if ((rc = PM(I, X, "%sw1", pre)) || (rc = PM(I, X, "%sw3", pre)) || (rc = PM(X, I, "%sw2", pre))) return rc;
        e = p->bytes;
    }
    out->expert = e;
    int n_lin = 0;
    for (int li = 0; li < c->num_hidden_layers; li++) n_lin += c->layer_is_linear[li];
    out->state_fixed = (uint64_t)n_lin * sizeof(float) * kda_floats(c);
    out->state_per_token = (uint64_t)(c->num_hidden_layers - n_lin) * sizeof(float) * (uint64_t)kl_cache_dim(c);
    return DF_OK;
}
#undef PM

/* ---- the table entries ------------------------------------------------------------------------ */

/* Kimi-Linear ends a turn with <|im_end|> (K2's template), K3 with
 * <|end_of_msg|> (163586); [EOS] and [EOT] end the text. */
static const char *const STOP[] = {"<|im_end|>", "<|end_of_msg|>", "[EOS]", "[EOT]", NULL};

#define FAMILY(type)                                                                                          \
    {.model_type = type, .parse_config = parse_config, .expert_layout = &EXPERTS,                           \
     .expert_prefix = expert_prefix, .load = load, .unload = unload, .seq_new = seq_new,                     \
     .seq_bytes = seq_bytes, .work_new = kl_work_new, .work_free = kl_work_free, .work_bytes = kl_work_bytes, \
     .forward = kl_forward, .stop_tokens = STOP, .chat = df_chat_render_kimi_k2, .inspect = inspect, \
     .plan = plan}

const df_arch df_arch_kimi_linear = FAMILY("kimi_linear");
/* a kimi_k3 text_config may name its own type */
const df_arch df_arch_kimi_k3 = FAMILY("kimi_k3");
