/*
 * config.c - owns the reading of a Hugging Face config.json into a df_config:
 * the typed field readers (config_json.h) every family's parser uses, the
 * fields all families share, the architecture lookup by model_type, and the
 * token ids. The family's own fields (attention shape, experts, which layers
 * are sparse) are read by its parse_config (arch.h). Range checks keep later
 * size arithmetic in int. The output is only written on success.
 */
#include "model/config.h"

#include "model/arch.h"
#include "model/config_json.h"
#include "model/quant.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* NULL when absent or null. */
json_t *df_cfg_field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Integer field. Returns DF_OK and sets *present (if non-NULL); a required
 * field that is absent is an error. */
int df_cfg_int(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, long long lo,
                   long long hi, int *out, bool *present) {
    json_t *v = df_cfg_field(obj, key);
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
int df_cfg_num(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, bool positive,
                   double *out, bool *present) {
    json_t *v = df_cfg_field(obj, key);
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

int df_cfg_bool(const df_cfg_ctx *c, json_t *obj, const char *key, bool *out) {
    json_t *v = df_cfg_field(obj, key);
    if (!v) return DF_OK;
    if (!json_is_boolean(v))
        return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a boolean", c->path,
                       c->prefix, key);
    *out = json_is_true(v);
    return DF_OK;
}

/* String field; *out stays NULL when absent. */
int df_cfg_str(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, const char **out) {
    json_t *v = df_cfg_field(obj, key);
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

json_t *df_json_object(const char *json, size_t len, const char *path, df_error *err,
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
static int parse_rope(df_config *c, json_t *rs, const char *name, const df_cfg_ctx *top) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", name);
    df_cfg_ctx pc = {top->path, prefix, top->err};
    const df_cfg_ctx *p = &pc;
    int rc;

    if (!json_is_object(rs))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s' must be an object or null", p->path,
                       name);
    const char *type;
    if ((rc = df_cfg_str(p, rs, "rope_type", false, &type))) return rc;
    if (!type && (rc = df_cfg_str(p, rs, "type", false, &type))) return rc; /* older spelling */
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
    if ((rc = df_cfg_num(p, rs, "factor", true, true, &c->rope_factor, NULL))) return rc;
    if (c->rope_type != DF_ROPE_YARN) return DF_OK;

    if ((rc = df_cfg_int(p, rs, "original_max_position_embeddings", false, 1, DF_CFG_MAX_POS,
                      &c->rope_original_max_position_embeddings, NULL)))
        return rc;
    if ((rc = df_cfg_num(p, rs, "beta_fast", false, false, &c->yarn_beta_fast, NULL))) return rc;
    if ((rc = df_cfg_num(p, rs, "beta_slow", false, false, &c->yarn_beta_slow, NULL))) return rc;
    if ((rc = df_cfg_num(p, rs, "attention_factor", false, true, &c->yarn_attention_factor, NULL)))
        return rc;
    if ((rc = df_cfg_num(p, rs, "mscale", false, false, &c->yarn_mscale, NULL))) return rc;
    if ((rc = df_cfg_num(p, rs, "mscale_all_dim", false, false, &c->yarn_mscale_all_dim, NULL)))
        return rc;
    if ((rc = df_cfg_bool(p, rs, "truncate", &c->yarn_truncate))) return rc;
    return DF_OK;
}

/* bos_token_id / eos_token_id: an id, or (eos) a list of up to 8 ids. */
static int parse_token_ids(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    bool present;
    int bos = -1;
    if ((rc = df_cfg_int(p, root, "bos_token_id", false, 0, c->vocab_size - 1, &bos, &present)))
        return rc;
    if (present) c->bos_token_id = bos;

    json_t *e = df_cfg_field(root, "eos_token_id");
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
        if ((rc = df_cfg_int(p, root, "eos_token_id", true, 0, c->vocab_size - 1, &v, NULL)))
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

static int parse_fields(df_config *c, json_t *root, const df_cfg_ctx *p);

/* The fields every family shares, then the family's own, then the token ids. */
static int parse_config(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    const char *s;

    if ((rc = df_cfg_str(p, root, "model_type", true, &s))) return rc;
    /* A multimodal wrapper (Kimi K2.5 style): the text model's config is its
     * text_config and its tensors carry the language_model. prefix; the
     * vision tower is not used. (Kimi K3's wrapper is model_type kimi_k3
     * around a text_config: a known type without its own hidden_size.) */
    json_t *text = df_cfg_field(root, "text_config");
    if (text && (!df_arch_find(s) || !df_cfg_field(root, "hidden_size"))) {
        if (!json_is_object(text))
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'text_config' must be an object", p->path);
        df_cfg_ctx tp = {p->path, "text_config.", p->err};
        snprintf(c->tensor_prefix, sizeof c->tensor_prefix, "language_model.");
        if ((rc = parse_fields(c, text, &tp))) return rc;
        /* token ids may sit on the wrapper */
        return parse_token_ids(c, df_cfg_field(text, "eos_token_id") ? text : root,
                               df_cfg_field(text, "eos_token_id") ? &tp : p);
    }
    if ((rc = parse_fields(c, root, p))) return rc;
    return parse_token_ids(c, root, p);
}

/* The fields of the text model's config (root, or a wrapper's text_config). */
static int parse_fields(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    const char *s;

    if ((rc = df_cfg_str(p, root, "model_type", true, &s))) return rc;
    c->arch = df_arch_find(s);
    if (!c->arch) {
        char names[256];
        df_arch_names(names, sizeof names);
        return df_fail(p->err, DF_ERR_UNSUPPORTED,
                       "%s: model_type '%.64s' is not supported (supported: %s)", p->path, s, names);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", s);

    /* checked here, kept by the model (model/quant.h) */
    df_quant *q;
    char qf[48];
    snprintf(qf, sizeof qf, "%squantization_config", p->prefix);
    if ((rc = df_quant_parse(&q, df_cfg_field(root, "quantization_config"), p->path, qf, p->err))) return rc;
    if (q) snprintf(c->quant_method, sizeof c->quant_method, "%s", df_quant_describe(q));
    df_quant_free(q);
    if ((rc = df_cfg_str(p, root, "torch_dtype", false, &s))) return rc;
    if (!s && (rc = df_cfg_str(p, root, "dtype", false, &s))) return rc; /* transformers v5 */
    if (s) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", s);

    if ((rc = df_cfg_int(p, root, "vocab_size", true, 1, DF_CFG_MAX_VOCAB, &c->vocab_size, NULL)))
        return rc;
    if ((rc = df_cfg_int(p, root, "hidden_size", true, 1, DF_CFG_MAX_HIDDEN, &c->hidden_size, NULL)))
        return rc;
    if ((rc = df_cfg_int(p, root, "num_hidden_layers", true, 1, DF_MAX_LAYERS, &c->num_hidden_layers,
                         NULL)))
        return rc;
    if ((rc = df_cfg_int(p, root, "max_position_embeddings", false, 1, DF_CFG_MAX_POS,
                         &c->max_position_embeddings, NULL)))
        return rc;
    double eps = c->rms_norm_eps;
    if ((rc = df_cfg_num(p, root, "rms_norm_eps", false, true, &eps, NULL))) return rc;
    if (!(eps < 1))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field 'rms_norm_eps' must be below 1 (got %g)",
                       p->path, eps);
    c->rms_norm_eps = eps;
    if ((rc = df_cfg_num(p, root, "rope_theta", false, true, &c->rope_theta, NULL))) return rc;
    if ((rc = df_cfg_bool(p, root, "tie_word_embeddings", &c->tie_word_embeddings))) return rc;

    return c->arch->parse_config(c, root, p);
}

int df_cfg_layer_list(const df_cfg_ctx *p, json_t *root, const char *key, int n_layers, bool *mark) {
    json_t *mo = df_cfg_field(root, key);
    if (!mo) return DF_OK;
    if (!json_is_array(mo))
        return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a list of integers", p->path,
                       p->prefix, key);
    for (size_t i = 0; i < json_array_size(mo); i++) {
        json_t *x = json_array_get(mo, i);
        if (!json_is_integer(x))
            return df_fail(p->err, DF_ERR_FORMAT, "%s: field '%s%s' must be a list of integers", p->path,
                           p->prefix, key);
        long long l = json_integer_value(x);
        if (l < 0 || l >= n_layers)
            return df_fail(p->err, DF_ERR_FORMAT,
                           "%s: field '%s%s' entry %lld is out of range (num_hidden_layers %d)", p->path,
                           p->prefix, key, l, n_layers);
        mark[l] = true;
    }
    return DF_OK;
}

int df_cfg_rope(df_config *c, json_t *root, const df_cfg_ctx *p) {
    int rc;
    /* RoPE: every scaling type is relative to the trained context length. */
    c->rope_original_max_position_embeddings = c->max_position_embeddings;
    json_t *rs = df_cfg_field(root, "rope_scaling");
    if (rs) return parse_rope(c, rs, "rope_scaling", p);
    if ((rs = df_cfg_field(root, "rope_parameters"))) {
        if ((rc = parse_rope(c, rs, "rope_parameters", p))) return rc;
        df_cfg_ctx pc = {p->path, "rope_parameters.", p->err};
        if ((rc = df_cfg_num(&pc, rs, "rope_theta", false, true, &c->rope_theta, NULL))) return rc;
    }
    return DF_OK;
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
    c->routed_scaling_factor = 1.0;
    c->n_group = c->topk_group = 1;
    c->bos_token_id = -1;
}

int df_config_parse(df_config *out, const char *json, size_t len, const char *path,
                    df_error *err) {
    if (!path) path = "config.json";
    if (!out || (!json && len))
        return df_fail(err, DF_ERR_ARG, "%s: df_config_parse: bad arguments", path);
    int rc;
    json_t *root = df_json_object(json ? json : "", len, path, err, &rc);
    if (!root) return rc;
    df_config *c = df_xmalloc(sizeof *c); /* ~1 KB; not on the caller's stack twice */
    set_defaults(c);
    df_cfg_ctx p = {path, "", err};
    rc = parse_config(c, root, &p);
    json_decref(root);
    if (rc == DF_OK) *out = *c;
    free(c);
    return rc;
}

int df_config_ids(df_config *c, json_t *root, const df_cfg_ctx *p) { return parse_token_ids(c, root, p); }

int df_config_moe_layers(const df_config *c) {
    int n = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n += c->layer_is_moe[i];
    return n;
}

int df_config_load_dir(df_config *c, const char *dir, df_error *err) {
    if (!c || !dir) return df_fail(err, DF_ERR_ARG, "df_config_load_dir: bad arguments");
    char *path = df_path_join(dir, "config.json");
    char *text;
    size_t len;
    int rc = df_read_file(path, &text, &len, err);
    if (rc == DF_OK) {
        rc = df_config_parse(c, text, len, path, err);
        free(text);
    }
    free(path);
    return rc;
}
