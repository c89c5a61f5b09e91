/*
 * config.c - owns the reading of a Hugging Face config.json and
 * generation_config.json into a df_config: type checks on every field we use,
 * Hugging Face's defaults for the fields a file may leave out (Qwen3Config /
 * Qwen3MoeConfig), range checks that keep later size arithmetic in int, and
 * the derived per-layer MoE map.
 *
 * Conventions: a JSON null counts as absent (HF writes "sliding_window": null
 * and the like). Integer fields accept JSON integers and integral reals
 * (1.0), and reject anything else with "field 'x' must be an integer".
 * The output is only written on success.
 */
#include "model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Upper bounds far above any real model, low enough that products of two of
 * them (heads * head_dim, experts * size) stay far inside int64 and that
 * hidden/intermediate/vocab each fit an int. */
#define MAX_VOCAB (1 << 24)
#define MAX_HIDDEN (1 << 18)
#define MAX_INTER (1 << 20)
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_POS (1 << 26)
#define MAX_EXPERTS 4096

typedef struct pctx {
    const char *path;
    const char *prefix; /* "" or "rope_scaling." for nested fields */
    df_error *err;
} pctx;

/* NULL when absent or null. */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Integer field. Returns DF_OK and sets *present (if non-NULL); a required
 * field that is absent is an error. */
static int get_int(const pctx *c, json_t *obj, const char *key, bool required, long long lo,
                   long long hi, int *out, bool *present) {
    json_t *v = field(obj, key);
    if (present) *present = v != NULL;
    if (!v) {
        if (required)
            return df_fail(c->err, DF_ERR_FORMAT, "%s: required field '%s%s' is missing", c->path,
                           c->prefix, key);
        return DF_OK;
    }
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d) && fabs(d) < 9e15))
            return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be an integer", c->path,
                           c->prefix, key);
        x = (long long)d;
    } else {
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be an integer", c->path,
                       c->prefix, key);
    }
    if (x < lo || x > hi)
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be between %lld and %lld (got %lld)",
                       c->path, c->prefix, key, lo, hi, x);
    *out = (int)x;
    return DF_OK;
}

/* Number field; `positive` demands > 0. */
static int get_num(const pctx *c, json_t *obj, const char *key, bool required, bool positive,
                   double *out, bool *present) {
    json_t *v = field(obj, key);
    if (present) *present = v != NULL;
    if (!v) {
        if (required)
            return df_fail(c->err, DF_ERR_FORMAT, "%s: required field '%s%s' is missing", c->path,
                           c->prefix, key);
        return DF_OK;
    }
    if (!json_is_number(v))
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a number", c->path,
                       c->prefix, key);
    double d = json_number_value(v);
    if (!isfinite(d) || (positive && !(d > 0)))
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a positive number (got %g)",
                       c->path, c->prefix, key, d);
    *out = d;
    return DF_OK;
}

static int get_bool(const pctx *c, json_t *obj, const char *key, bool *out) {
    json_t *v = field(obj, key);
    if (!v) return DF_OK;
    if (!json_is_boolean(v))
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a boolean", c->path,
                       c->prefix, key);
    *out = json_is_true(v);
    return DF_OK;
}

/* String field; *out stays NULL when absent. */
static int get_str(const pctx *c, json_t *obj, const char *key, bool required, const char **out) {
    json_t *v = field(obj, key);
    *out = NULL;
    if (!v) {
        if (required)
            return df_fail(c->err, DF_ERR_FORMAT, "%s: required field '%s%s' is missing", c->path,
                           c->prefix, key);
        return DF_OK;
    }
    if (!json_is_string(v))
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a string", c->path,
                       c->prefix, key);
    *out = json_string_value(v);
    return DF_OK;
}

static json_t *load_object(const char *json, size_t len, const char *path, df_error *err,
                           int *rc) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        *rc = df_fail(err, DF_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", path,
                      je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *rc = df_fail(err, DF_ERR_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    *rc = DF_OK;
    return root;
}

/* rope_scaling (or transformers v5's rope_parameters): `name` is its key. */
static int parse_rope(df_config *c, json_t *rs, const char *name, const pctx *top) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", name);
    pctx pc = {top->path, prefix, top->err};
    const pctx *p = &pc;
    int rc;

    if (!json_is_object(rs))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s' must be an object or null", p->path,
                       name);
    const char *type;
    if ((rc = get_str(p, rs, "rope_type", false, &type))) return rc;
    if (!type && (rc = get_str(p, rs, "type", false, &type))) return rc; /* older spelling */
    if (!type)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: required field '%srope_type' is missing",
                       p->path, prefix);

    if (strcmp(type, "default") == 0) {
        c->rope_type = DF_ROPE_DEFAULT;
        return DF_OK;
    }
    if (strcmp(type, "linear") == 0) c->rope_type = DF_ROPE_LINEAR;
    else if (strcmp(type, "dynamic") == 0) c->rope_type = DF_ROPE_DYNAMIC;
    else if (strcmp(type, "yarn") == 0) c->rope_type = DF_ROPE_YARN;
    else
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: %s type '%.64s' is not supported (supported: default, linear, dynamic, "
                       "yarn)",
                       p->path, name, type);
    if ((rc = get_num(p, rs, "factor", true, true, &c->rope_factor, NULL))) return rc;
    if (c->rope_type != DF_ROPE_YARN) return DF_OK;

    if ((rc = get_int(p, rs, "original_max_position_embeddings", false, 1, MAX_POS,
                      &c->rope_original_max_position_embeddings, NULL)))
        return rc;
    if ((rc = get_num(p, rs, "beta_fast", false, false, &c->yarn_beta_fast, NULL))) return rc;
    if ((rc = get_num(p, rs, "beta_slow", false, false, &c->yarn_beta_slow, NULL))) return rc;
    if ((rc = get_num(p, rs, "attention_factor", false, true, &c->yarn_attention_factor, NULL)))
        return rc;
    if ((rc = get_num(p, rs, "mscale", false, false, &c->yarn_mscale, NULL))) return rc;
    if ((rc = get_num(p, rs, "mscale_all_dim", false, false, &c->yarn_mscale_all_dim, NULL)))
        return rc;
    if ((rc = get_bool(p, rs, "truncate", &c->yarn_truncate))) return rc;
    return DF_OK;
}

/* bos_token_id / eos_token_id: an id, or (eos) a list of up to 8 ids. */
static int parse_token_ids(df_config *c, json_t *root, const pctx *p) {
    int rc;
    bool present;
    int bos = -1;
    if ((rc = get_int(p, root, "bos_token_id", false, 0, c->vocab_size - 1, &bos, &present)))
        return rc;
    if (present) c->bos_token_id = bos;

    json_t *e = field(root, "eos_token_id");
    if (!e) return DF_OK;
    int ids[8], n = 0;
    if (json_is_array(e)) {
        size_t ne = json_array_size(e);
        if (ne > 8)
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'eos_token_id' lists %zu ids (max 8)",
                           p->path, ne);
        for (size_t i = 0; i < ne; i++) {
            json_t *x = json_array_get(e, i);
            long long v;
            if (json_is_integer(x)) v = json_integer_value(x);
            else if (json_is_real(x) && json_real_value(x) == floor(json_real_value(x)) &&
                     fabs(json_real_value(x)) < 9e15)
                v = (long long)json_real_value(x);
            else
                return df_fail(p->err, DF_ERR_FORMAT,
                               "%s: field 'eos_token_id' must be an integer or a list of integers",
                               p->path);
            if (v < 0 || v >= c->vocab_size)
                return df_fail(p->err, DF_ERR_FORMAT,
                               "%s: field 'eos_token_id' id %lld is outside the vocabulary (%d)",
                               p->path, v, c->vocab_size);
            ids[n++] = (int)v;
        }
    } else if (json_is_number(e)) {
        int v;
        if ((rc = get_int(p, root, "eos_token_id", true, 0, c->vocab_size - 1, &v, NULL)))
            return rc;
        ids[n++] = v;
    } else {
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field 'eos_token_id' must be an integer or a list of integers", p->path);
    }
    memcpy(c->eos_token_ids, ids, sizeof ids);
    c->n_eos_token_ids = n;
    return DF_OK;
}

static int parse_config(df_config *c, json_t *root, const pctx *p) {
    int rc;
    const char *s;

    if ((rc = get_str(p, root, "model_type", true, &s))) return rc;
    if (strcmp(s, "qwen3") == 0) c->arch = DF_ARCH_QWEN3;
    else if (strcmp(s, "qwen3_moe") == 0) c->arch = DF_ARCH_QWEN3_MOE;
    else
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: model_type '%.64s' is not supported (supported: qwen3, qwen3_moe)",
                       p->path, s);
    snprintf(c->model_type, sizeof c->model_type, "%s", s);
    bool moe = c->arch == DF_ARCH_QWEN3_MOE;

    if ((rc = get_str(p, root, "hidden_act", false, &s))) return rc;
    if (s && strcmp(s, "silu") != 0)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: hidden_act '%.64s' is not supported (supported: silu)", p->path, s);
    json_t *q = field(root, "quantization_config");
    if (q) {
        json_t *m = json_is_object(q) ? json_object_get(q, "quant_method") : NULL;
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: quantization_config (quant_method '%.32s') is not supported "
                       "(deltafin runs BF16/F16/F32 checkpoints)",
                       p->path, json_is_string(m) ? json_string_value(m) : "?");
    }
    if ((rc = get_str(p, root, "torch_dtype", false, &s))) return rc;
    if (!s && (rc = get_str(p, root, "dtype", false, &s))) return rc; /* transformers v5 */
    if (s) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", s);

    if ((rc = get_int(p, root, "vocab_size", true, 1, MAX_VOCAB, &c->vocab_size, NULL))) return rc;
    if ((rc = get_int(p, root, "hidden_size", true, 1, MAX_HIDDEN, &c->hidden_size, NULL)))
        return rc;
    bool have_inter;
    /* A MoE model needs the dense size only if some layer is dense (checked below). */
    if ((rc = get_int(p, root, "intermediate_size", !moe, 1, MAX_INTER, &c->intermediate_size,
                      &have_inter)))
        return rc;
    if ((rc = get_int(p, root, "num_hidden_layers", true, 1, DF_MAX_LAYERS, &c->num_hidden_layers,
                      NULL)))
        return rc;
    if ((rc = get_int(p, root, "num_attention_heads", true, 1, MAX_HEADS, &c->num_attention_heads,
                      NULL)))
        return rc;
    bool have;
    if ((rc = get_int(p, root, "num_key_value_heads", false, 1, c->num_attention_heads,
                      &c->num_key_value_heads, &have)))
        return rc;
    if (!have) c->num_key_value_heads = c->num_attention_heads;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: field 'num_attention_heads' (%d) must be a multiple of "
                       "num_key_value_heads (%d)",
                       p->path, c->num_attention_heads, c->num_key_value_heads);
    if ((rc = get_int(p, root, "head_dim", false, 1, MAX_HEAD_DIM, &c->head_dim, &have))) return rc;
    if (!have && c->arch == DF_ARCH_QWEN3) {
        /* transformers' Qwen3Config defaults head_dim to 128, not hidden/heads */
        c->head_dim = 128;
    } else if (!have) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field 'head_dim' is absent and hidden_size (%d) is not a multiple "
                           "of num_attention_heads (%d)",
                           p->path, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
        if (c->head_dim > MAX_HEAD_DIM)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field 'head_dim' is absent and hidden_size / num_attention_heads "
                           "= %d exceeds %d",
                           p->path, c->head_dim, MAX_HEAD_DIM);
    }
    if (c->head_dim % 2 != 0)
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'head_dim' (%d) must be even (RoPE pairs)",
                       p->path, c->head_dim);
    if ((rc = get_int(p, root, "max_position_embeddings", false, 1, MAX_POS,
                      &c->max_position_embeddings, NULL)))
        return rc;
    double eps = c->rms_norm_eps;
    if ((rc = get_num(p, root, "rms_norm_eps", false, true, &eps, NULL))) return rc;
    if (!(eps < 1))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'rms_norm_eps' must be below 1 (got %g)",
                       p->path, eps);
    c->rms_norm_eps = eps;
    if ((rc = get_num(p, root, "rope_theta", false, true, &c->rope_theta, NULL))) return rc;
    if ((rc = get_bool(p, root, "tie_word_embeddings", &c->tie_word_embeddings))) return rc;
    if ((rc = get_bool(p, root, "attention_bias", &c->attention_bias))) return rc;

    bool sliding = false;
    if ((rc = get_bool(p, root, "use_sliding_window", &sliding))) return rc;
    if (sliding)
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: use_sliding_window true is not supported", p->path);
    json_t *lt = field(root, "layer_types");
    if (lt) {
        if (!json_is_array(lt))
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'layer_types' must be a list of strings",
                           p->path);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            json_t *x = json_array_get(lt, i);
            if (!json_is_string(x))
                return df_fail(p->err, DF_ERR_FORMAT,
                               "%s: field 'layer_types' must be a list of strings", p->path);
            if (strcmp(json_string_value(x), "full_attention") != 0)
                return df_fail(p->err, DF_ERR_UNSUPPORTED,
                               "%s: layer_types[%zu] '%.64s' is not supported (supported: "
                               "full_attention)",
                               p->path, i, json_string_value(x));
        }
    }

    /* RoPE: every scaling type is relative to the trained context length. */
    c->rope_original_max_position_embeddings = c->max_position_embeddings;
    json_t *rs = field(root, "rope_scaling");
    if (rs) {
        if ((rc = parse_rope(c, rs, "rope_scaling", p))) return rc;
    } else if ((rs = field(root, "rope_parameters"))) {
        if ((rc = parse_rope(c, rs, "rope_parameters", p))) return rc;
        pctx pc = {p->path, "rope_parameters.", p->err};
        if ((rc = get_num(&pc, rs, "rope_theta", false, true, &c->rope_theta, NULL))) return rc;
    }

    if (moe) {
        if ((rc = get_int(p, root, "num_experts", true, 0, MAX_EXPERTS, &c->num_experts, NULL)))
            return rc;
        if (c->num_experts > 0) {
            if ((rc = get_int(p, root, "num_experts_per_tok", true, 1, c->num_experts,
                              &c->num_experts_per_tok, NULL)))
                return rc;
            if ((rc = get_int(p, root, "moe_intermediate_size", true, 1, MAX_INTER,
                              &c->moe_intermediate_size, NULL)))
                return rc;
        }
        if ((rc = get_int(p, root, "decoder_sparse_step", false, 1, DF_MAX_LAYERS,
                          &c->decoder_sparse_step, NULL)))
            return rc;
        if ((rc = get_bool(p, root, "norm_topk_prob", &c->norm_topk_prob))) return rc;
    }
    bool mlp_only[DF_MAX_LAYERS] = {0};
    json_t *mo = moe ? field(root, "mlp_only_layers") : NULL;
    if (mo) {
        if (!json_is_array(mo))
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field 'mlp_only_layers' must be a list of integers", p->path);
        for (size_t i = 0; i < json_array_size(mo); i++) {
            json_t *x = json_array_get(mo, i);
            if (!json_is_integer(x))
                return df_fail(p->err, DF_ERR_FORMAT,
                               "%s: field 'mlp_only_layers' must be a list of integers", p->path);
            long long l = json_integer_value(x);
            if (l < 0 || l >= c->num_hidden_layers)
                return df_fail(p->err, DF_ERR_FORMAT,
                               "%s: field 'mlp_only_layers' entry %lld is out of range "
                               "(num_hidden_layers %d)",
                               p->path, l, c->num_hidden_layers);
            mlp_only[l] = true;
        }
    }
    /* Hugging Face's Qwen3MoeDecoderLayer rule. */
    bool any_dense = false;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        c->layer_is_moe[i] = moe && c->num_experts > 0 && !mlp_only[i] &&
                             (i + 1) % c->decoder_sparse_step == 0;
        any_dense |= !c->layer_is_moe[i];
    }
    if (any_dense && !have_inter)
        return df_fail(p->err, DF_ERR_FORMAT,
                       "%s: required field 'intermediate_size' is missing (some layers are dense)",
                       p->path);

    return parse_token_ids(c, root, p);
}

static void set_defaults(df_config *c) {
    memset(c, 0, sizeof *c);
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->rope_type = DF_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->yarn_beta_fast = 32.0;
    c->yarn_beta_slow = 1.0;
    c->yarn_truncate = true;
    c->decoder_sparse_step = 1;
    c->bos_token_id = -1;
    c->gen_temperature = -1;
    c->gen_top_p = -1;
    c->gen_top_k = -1;
}

int df_config_parse(df_config *out, const char *json, size_t len, const char *path,
                    df_error *err) {
    if (!path) path = "config.json";
    if (!out || (!json && len))
        return df_fail(err, DF_ERR_ARG, "%s: df_config_parse: bad arguments", path);
    int rc;
    json_t *root = load_object(json ? json : "", len, path, err, &rc);
    if (!root) return rc;
    df_config *c = df_xmalloc(sizeof *c); /* ~1 KB; not on the caller's stack twice */
    set_defaults(c);
    pctx p = {path, "", err};
    rc = parse_config(c, root, &p);
    json_decref(root);
    if (rc == DF_OK) *out = *c;
    free(c);
    return rc;
}

int df_config_parse_generation(df_config *out, const char *json, size_t len, const char *path,
                               df_error *err) {
    if (!path) path = "generation_config.json";
    if (!out) return df_fail(err, DF_ERR_ARG, "%s: df_config_parse_generation: bad arguments", path);
    if (!json) return DF_OK; /* no generation_config.json: config.json's ids stand */
    int rc;
    json_t *root = load_object(json, len, path, err, &rc);
    if (!root) return rc;
    df_config *c = df_xmalloc(sizeof *c);
    *c = *out;
    pctx p = {path, "", err};
    rc = parse_token_ids(c, root, &p);
    double t = 0, tp = 1;
    bool have_t = false, have_tp = false;
    if (!rc) rc = get_num(&p, root, "temperature", false, false, &t, &have_t);
    if (!rc && have_t && t < 0)
        rc = df_fail(err, DF_ERR_FORMAT, "%s: field 'temperature' must not be negative (got %g)",
                     path, t);
    if (!rc && have_t) c->gen_temperature = t;
    if (!rc) rc = get_num(&p, root, "top_p", false, true, &tp, &have_tp);
    if (!rc && have_tp && tp > 1)
        rc = df_fail(err, DF_ERR_FORMAT, "%s: field 'top_p' must be at most 1 (got %g)", path, tp);
    if (!rc && have_tp) c->gen_top_p = tp;
    if (!rc) rc = get_int(&p, root, "top_k", false, 0, 1 << 30, &c->gen_top_k, NULL);
    json_decref(root);
    if (rc == DF_OK) *out = *c;
    free(c);
    return rc;
}

int df_config_load_dir(df_config *c, const char *dir, df_error *err) {
    if (!c || !dir) return df_fail(err, DF_ERR_ARG, "df_config_load_dir: bad arguments");
    char *path = df_path_join(dir, "config.json");
    char *text;
    size_t len;
    int rc = df_read_file(path, &text, &len, err);
    if (rc == DF_OK) {
        df_config tmp;
        rc = df_config_parse(&tmp, text, len, path, err);
        free(text);
        free(path);
        if (rc) return rc;
        path = df_path_join(dir, "generation_config.json");
        if (access(path, F_OK) == 0) {
            rc = df_read_file(path, &text, &len, err);
            if (rc == DF_OK) {
                rc = df_config_parse_generation(&tmp, text, len, path, err);
                free(text);
            }
        }
        if (rc == DF_OK) *c = tmp;
    }
    free(path);
    return rc;
}
