/*
 * quant.c - quantization_config (fp8 and compressed-tensors) parsed and
 * validated; module -> format matching; a weight's companion tensors found and
 * checked. The formats and their tensors: quant.h.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/quant.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a module pattern: a plain name, "Linear", or a compiled "re:" regex */
typedef struct qpat {
    char *s;
    pcre2_code *re;
} qpat;

typedef struct qgroup {
    char *name;
    df_qkind kind;
    qpat *targets;
    int n_targets;
} qgroup;

struct df_quant {
    bool fp8;
    bool ue8m0;
    qpat *skip; /* fp8: modules_to_not_convert; compressed-tensors: ignore */
    int n_skip;
    qgroup *groups;
    int n_groups;
    char desc[160];
};

const char *df_qkind_name(df_qkind k) {
    static const char *const n[] = {"bf16", "fp8", "int4", "mxfp4"};
    return (unsigned)k < 4 ? n[k] : "?";
}

void df_quant_free(df_quant *q) {
    if (!q) return;
    for (int i = 0; i < q->n_skip; i++) free(q->skip[i].s), pcre2_code_free(q->skip[i].re);
    free(q->skip);
    for (int g = 0; g < q->n_groups; g++) {
        for (int i = 0; i < q->groups[g].n_targets; i++)
            free(q->groups[g].targets[i].s), pcre2_code_free(q->groups[g].targets[i].re);
        free(q->groups[g].targets);
        free(q->groups[g].name);
    }
    free(q->groups);
    free(q);
}

const char *df_quant_describe(const df_quant *q) { return q ? q->desc : ""; }

/* ---- parsing ------------------------------------------------------------------------ */

typedef struct qctx {
    const char *path, *field;
    df_error *err;
} qctx;

static int bad(const qctx *c, const char *sub, const char *why) {
    return df_fail(c->err, DF_ERR_UNSUPPORTED, "%s: field '%s.%s' %s", c->path, c->field, sub, why);
}

/* A list of module patterns (strings; "re:" ones compiled). */
static int parse_pats(const qctx *c, json_t *list, const char *sub, bool regex, qpat **out, int *n) {
    *out = NULL, *n = 0;
    if (!list || json_is_null(list)) return DF_OK;
    if (!json_is_array(list)) return bad(c, sub, "must be a list of strings");
    size_t k = json_array_size(list);
    *out = df_xcalloc(k ? k : 1, sizeof(qpat));
    for (size_t i = 0; i < k; i++) {
        json_t *s = json_array_get(list, i);
        char where[96];
        snprintf(where, sizeof where, "%s[%zu]", sub, i);
        if (!json_is_string(s)) return bad(c, where, "must be a string");
        qpat *p = &(*out)[(*n)++];
        p->s = df_xstrdup(json_string_value(s));
        if (regex && strncmp(p->s, "re:", 3) == 0) {
            int ec;
            PCRE2_SIZE eo;
            p->re = pcre2_compile((PCRE2_SPTR)(p->s + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &ec, &eo, NULL);
            if (!p->re) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(ec, msg, sizeof msg);
                char why[256];
                snprintf(why, sizeof why, "is not a valid regular expression (%s at offset %zu)", (char *)msg,
                         (size_t)eo);
                return df_fail(c->err, DF_ERR_FORMAT, "%s: field '%s.%s' %s", c->path, c->field, where, why);
            }
        }
    }
    return DF_OK;
}

static bool str_is(json_t *o, const char *key, const char *want) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) && strcmp(json_string_value(v), want) == 0;
}
static bool absent(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return !v || json_is_null(v);
}

static int parse_fp8(df_quant *q, json_t *qc, const qctx *c) {
    q->fp8 = true;
    if (!absent(qc, "fmt") && !str_is(qc, "fmt", "e4m3")) return bad(c, "fmt", "must be \"e4m3\"");
    if (!absent(qc, "activation_scheme") && !str_is(qc, "activation_scheme", "dynamic"))
        return bad(c, "activation_scheme", "must be \"dynamic\" (static activation scales are not supported)");
    json_t *b = json_object_get(qc, "weight_block_size");
    if (!json_is_array(b) || json_array_size(b) != 2 || json_integer_value(json_array_get(b, 0)) != 128 ||
        json_integer_value(json_array_get(b, 1)) != 128 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)))
        return bad(c, "weight_block_size", "must be [128, 128] (per-tensor or other blocks are not supported)");
    if (!absent(qc, "scale_fmt")) {
        if (str_is(qc, "scale_fmt", "ue8m0")) q->ue8m0 = true;
        else if (!str_is(qc, "scale_fmt", "float")) return bad(c, "scale_fmt", "must be \"ue8m0\" or \"float\"");
    }
    const char *key = absent(qc, "modules_to_not_convert") ? "ignored_layers" : "modules_to_not_convert";
    int rc = parse_pats(c, json_object_get(qc, key), key, false, &q->skip, &q->n_skip);
    if (rc) return rc;
    snprintf(q->desc, sizeof q->desc, "fp8 (e4m3, F32 scales per 128x128 block%s)%s",
             q->ue8m0 ? ", ue8m0" : "", q->n_skip ? ", some modules BF16" : "");
    return DF_OK;
}

/* One config group's weights scheme, in format fmt: INT4 or MXFP4, as shipped. */
static int parse_scheme(json_t *w, const char *fmt, const char *gsub, const qctx *c, df_qkind *kind) {
    char sub[256];
#define SUB(k) (snprintf(sub, sizeof sub, "%.100s.weights.%s", gsub, k), sub)
    if (!json_is_object(w)) return bad(c, (snprintf(sub, sizeof sub, "%.100s.weights", gsub), sub), "must be an object");
    json_t *nb = json_object_get(w, "num_bits");
    if (!json_is_integer(nb) || json_integer_value(nb) != 4) return bad(c, SUB("num_bits"), "must be 4");
    bool is_int = str_is(w, "type", "int"), is_float = str_is(w, "type", "float");
    if (!is_int && !is_float) return bad(c, SUB("type"), "must be \"int\" or \"float\"");
    if (!str_is(w, "strategy", "group")) return bad(c, SUB("strategy"), "must be \"group\"");
    json_t *gs = json_object_get(w, "group_size");
    if (!json_is_integer(gs) || json_integer_value(gs) != 32) return bad(c, SUB("group_size"), "must be 32");
    if (!json_is_true(json_object_get(w, "symmetric")))
        return bad(c, SUB("symmetric"), "must be true (zero points are not supported)");
    json_t *dyn = json_object_get(w, "dynamic");
    if (dyn && !json_is_false(dyn) && !json_is_null(dyn)) return bad(c, SUB("dynamic"), "must be false");
    if (!absent(w, "actorder")) return bad(c, SUB("actorder"), "must be null (activation reordering is not supported)");
    if (!absent(w, "block_structure")) return bad(c, SUB("block_structure"), "must be null");
    if (!absent(w, "zp_dtype")) return bad(c, SUB("zp_dtype"), "must be null (zero points are not supported)");
    if (is_int && strcmp(fmt, "pack-quantized") == 0) *kind = DF_Q_INT4;
    else if (is_float && strcmp(fmt, "mxfp4-pack-quantized") == 0) *kind = DF_Q_MXFP4;
    else {
        snprintf(sub, sizeof sub, "%.100s.format", gsub);
        char why[160];
        snprintf(why, sizeof why, "is \"%.40s\", which does not hold 4-bit %s weights (want %s)", fmt,
                 is_int ? "int" : "float", is_int ? "pack-quantized" : "mxfp4-pack-quantized");
        return bad(c, sub, why);
    }
    if (*kind == DF_Q_MXFP4 && !absent(w, "scale_dtype") && !str_is(w, "scale_dtype", "torch.uint8"))
        return bad(c, SUB("scale_dtype"), "must be \"torch.uint8\" (E8M0)");
#undef SUB
    return DF_OK;
}

static int parse_group(qgroup *g, const char *name, json_t *gj, const char *top_fmt, const qctx *c) {
    char sub[128];
    snprintf(sub, sizeof sub, "config_groups.%.60s", name);
    g->name = df_xstrdup(name);
    if (!json_is_object(gj)) return bad(c, sub, "must be an object");
    const char *fmt = top_fmt;
    json_t *f = json_object_get(gj, "format");
    if (f && !json_is_null(f)) {
        char fs[160];
        snprintf(fs, sizeof fs, "%.120s.format", sub);
        if (!json_is_string(f)) return bad(c, fs, "must be a string");
        fmt = json_string_value(f);
    }
    if (strcmp(fmt, "mixed-precision") == 0) {
        char fs[160];
        snprintf(fs, sizeof fs, "%.120s.format", sub);
        return bad(c, fs, "is missing (a mixed-precision config names each group's format)");
    }
    const char *acts[] = {"input_activations", "output_activations"};
    for (int i = 0; i < 2; i++)
        if (!absent(gj, acts[i])) {
            char as[160];
            snprintf(as, sizeof as, "%.120s.%s", sub, acts[i]);
            return bad(c, as, "must be null (quantized activations are not supported; deltafin computes them in f32)");
        }
    int rc = parse_scheme(json_object_get(gj, "weights"), fmt, sub, c, &g->kind);
    if (rc) return rc;
    char ts[160];
    snprintf(ts, sizeof ts, "%.120s.targets", sub);
    if ((rc = parse_pats(c, json_object_get(gj, "targets"), ts, true, &g->targets, &g->n_targets))) return rc;
    if (!g->n_targets) return bad(c, ts, "must list at least one target");
    return DF_OK;
}

static int parse_ct(df_quant *q, json_t *qc, const qctx *c) {
    json_t *f = json_object_get(qc, "format");
    if (!json_is_string(f)) return bad(c, "format", "must be a string");
    const char *fmt = json_string_value(f);
    if (strcmp(fmt, "pack-quantized") && strcmp(fmt, "mxfp4-pack-quantized") && strcmp(fmt, "mixed-precision")) {
        char why[160];
        snprintf(why, sizeof why, "is \"%.40s\" (supported: pack-quantized, mxfp4-pack-quantized, mixed-precision)", fmt);
        return bad(c, "format", why);
    }
    if (!absent(qc, "quantization_status") && !str_is(qc, "quantization_status", "compressed"))
        return bad(c, "quantization_status", "must be \"compressed\" (weights stored packed)");
    if (!absent(qc, "kv_cache_scheme")) return bad(c, "kv_cache_scheme", "must be null (a quantized KV cache is not supported)");
    json_t *gs = json_object_get(qc, "config_groups");
    if (!json_is_object(gs) || json_object_size(gs) == 0) return bad(c, "config_groups", "must be a non-empty object");
    q->groups = df_xcalloc(json_object_size(gs), sizeof(qgroup));
    const char *name;
    json_t *gj;
    int rc;
    json_object_foreach(gs, name, gj) {
        if ((rc = parse_group(&q->groups[q->n_groups++], name, gj, fmt, c))) return rc;
    }
    if ((rc = parse_pats(c, json_object_get(qc, "ignore"), "ignore", true, &q->skip, &q->n_skip))) return rc;
    size_t o = (size_t)snprintf(q->desc, sizeof q->desc, "compressed-tensors %s:", fmt);
    for (int g = 0; g < q->n_groups && o < sizeof q->desc; g++)
        o += (size_t)snprintf(q->desc + o, sizeof q->desc - o, "%s %s", g ? "," : "",
                              q->groups[g].kind == DF_Q_INT4 ? "int4 (BF16 scale per 32)" : "mxfp4 (E8M0 scale per 32)");
    return DF_OK;
}

int df_quant_parse(df_quant **out, json_t *qc, const char *path, const char *field, df_error *err) {
    *out = NULL;
    if (!qc || json_is_null(qc)) return DF_OK;
    qctx c = {path, field, err};
    if (!json_is_object(qc))
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: field '%s' must be an object", path, field);
    json_t *m = json_object_get(qc, "quant_method");
    const char *method = json_is_string(m) ? json_string_value(m) : "?";
    df_quant *q = df_xcalloc(1, sizeof *q);
    int rc;
    if (strcmp(method, "fp8") == 0) rc = parse_fp8(q, qc, &c);
    else if (strcmp(method, "compressed-tensors") == 0) rc = parse_ct(q, qc, &c);
    else
        rc = df_fail(err, DF_ERR_UNSUPPORTED,
                     "%s: field '%s.quant_method' is '%.32s' (supported: fp8 with 128x128 block scales, "
                     "compressed-tensors pack-quantized INT4 and mxfp4-pack-quantized MXFP4)",
                     path, field, method);
    if (rc) {
        df_quant_free(q);
        return rc;
    }
    *out = q;
    return DF_OK;
}

int df_quant_load_dir(df_quant **out, const char *dir, df_error *err) {
    *out = NULL;
    char *path = df_path_join(dir, "config.json");
    char *text;
    size_t len;
    int rc = df_read_file(path, &text, &len, err);
    if (!rc) {
        json_error_t je;
        json_t *root = json_loadb(text, len, 0, &je);
        free(text);
        if (!root) rc = df_fail(err, DF_ERR_FORMAT, "%s: not valid JSON: %s", path, je.text);
        else {
            json_t *tc = json_object_get(root, "text_config");
            json_t *qt = json_is_object(tc) ? json_object_get(tc, "quantization_config") : NULL;
            if (qt) rc = df_quant_parse(out, qt, path, "text_config.quantization_config", err);
            else rc = df_quant_parse(out, json_object_get(root, "quantization_config"), path, "quantization_config", err);
            json_decref(root);
        }
    }
    free(path);
    return rc;
}

/* ---- matching ----------------------------------------------------------------------- */

/* fp8's modules_to_not_convert: the entry's dot-separated parts appear in the
 * module's name as consecutive parts ("model.layers.3.mlp" and
 * "lm_head" alike). */
static bool parts_match(const char *entry, const char *mod) {
    size_t n = strlen(entry);
    for (const char *p = mod; (p = strstr(p, entry)); p++) {
        bool start = p == mod || p[-1] == '.';
        bool end = p[n] == 0 || p[n] == '.';
        if (start && end) return true;
    }
    return false;
}

static bool ct_hit(const qpat *p, const char *mod, bool linear) {
    if (p->re) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
        int rc = pcre2_match(p->re, (PCRE2_SPTR)mod, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        return rc >= 0;
    }
    if (strcmp(p->s, "Linear") == 0) return linear;
    return strcmp(p->s, mod) == 0;
}

int df_quant_kind(const df_quant *q, const char *mod, bool linear, df_qkind *out, df_error *err) {
    *out = DF_Q_NONE;
    if (!q || !linear) return DF_OK;
    if (q->fp8) {
        const char *last = strrchr(mod, '.');
        if (strcmp(last ? last + 1 : mod, "lm_head") == 0) return DF_OK;
        for (int i = 0; i < q->n_skip; i++)
            if (parts_match(q->skip[i].s, mod)) return DF_OK;
        *out = DF_Q_FP8;
        return DF_OK;
    }
    for (int i = 0; i < q->n_skip; i++)
        if (ct_hit(&q->skip[i], mod, linear)) return DF_OK;
    const qgroup *hit = NULL;
    for (int g = 0; g < q->n_groups; g++)
        for (int i = 0; i < q->groups[g].n_targets; i++) {
            if (!ct_hit(&q->groups[g].targets[i], mod, linear)) continue;
            if (hit && hit != &q->groups[g])
                return df_fail(err, DF_ERR_UNSUPPORTED, "quantization_config: module '%s' is targeted by "
                               "config groups '%s' and '%s'", mod, hit->name, q->groups[g].name);
            hit = &q->groups[g];
        }
    if (hit) *out = hit->kind;
    return DF_OK;
}

/* ---- a weight's tensors ------------------------------------------------------------- */

static void shape_of(const df_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Tensor module+suffix, which must be there with dtype dt (-1: any) and shape
 * [r][c]; `what` says what it is, `implied` what implies the shape. */
static int need(const df_st *st, const char *mod, const char *suffix, int dt, int64_t r, int64_t c,
                const char *what, const char *implied, const df_tensor **out, df_error *err) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", mod, suffix);
    const df_tensor *t = df_st_find(st, name);
    if (!t)
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint (%s)",
                       df_st_where(st), name, what);
    if (dt >= 0 && t->dtype != (df_dtype)dt)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, want %s (%s)",
                       df_st_file_path(st, t->file), name, df_dtype_name(t->dtype), df_dtype_name((df_dtype)dt),
                       what);
    if (t->ndim != 2 || t->shape[0] != r || t->shape[1] != c) {
        char got[96];
        shape_of(t, got, sizeof got);
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' has shape %s but %s [%lld,%lld]",
                       df_st_file_path(st, t->file), name, got, implied, (long long)r, (long long)c);
    }
    *out = t;
    return DF_OK;
}

/* Companions of another format next to a weight the config gives format `kind`. */
static int stray(const df_st *st, const char *mod, df_qkind kind, df_error *err) {
    static const char *const sfx[] = {".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape"};
    for (int i = 0; i < 4; i++) {
        if (kind == DF_Q_FP8 && i == 0) continue;
        if ((kind == DF_Q_INT4 || kind == DF_Q_MXFP4) && i > 0) continue;
        char name[320];
        snprintf(name, sizeof name, "%s%s", mod, sfx[i]);
        const df_tensor *t = df_st_find(st, name);
        if (t)
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '%s' is there but quantization_config gives module "
                           "'%s' the format %s, which has no such tensor",
                           df_st_file_path(st, t->file), name, mod, df_qkind_name(kind));
    }
    return DF_OK;
}

/* weight_shape: [2] integers that must be [rows, cols]. */
static int check_shape(const df_st *st, const df_tensor *t, int rows, int cols, df_error *err) {
    bool ok = t->ndim == 1 && t->shape[0] == 2 && (t->dtype == DF_DT_I32 || t->dtype == DF_DT_I64);
    int64_t v[2] = {0, 0};
    if (ok) {
        for (int i = 0; i < 2; i++) {
            if (t->dtype == DF_DT_I32) {
                int32_t x;
                memcpy(&x, (const char *)t->data + 4 * i, 4);
                v[i] = x;
            } else memcpy(&v[i], (const char *)t->data + 8 * i, 8);
        }
        if (v[0] == rows && v[1] == cols) return DF_OK;
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' holds [%lld,%lld] but the weight is [%d,%d]",
                       df_st_file_path(st, t->file), t->name, (long long)v[0], (long long)v[1], rows, cols);
    }
    char got[96];
    shape_of(t, got, sizeof got);
    return df_fail(err, DF_ERR_FORMAT, "%s: tensor '%s' is %s %s, want I32 or I64 [2]",
                   df_st_file_path(st, t->file), t->name, df_dtype_name(t->dtype), got);
}

static int bind_plain(const df_st *st, const char *mod, int rows, int cols, df_qweight *out, df_error *err) {
    char name[320];
    snprintf(name, sizeof name, "%s.weight", mod);
    const df_tensor *t = df_st_find(st, name);
    if (!t) {
        char packed[320];
        snprintf(packed, sizeof packed, "%s.weight_packed", mod);
        const df_tensor *p = df_st_find(st, packed);
        if (p)
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '%s' is packed but the checkpoint's "
                           "quantization_config gives module '%s' no packed format",
                           df_st_file_path(st, p->file), packed, mod);
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint", df_st_where(st), name);
    }
    if (t->dtype == DF_DT_F8_E4M3)
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '%s' is F8_E4M3 but the checkpoint's "
                       "quantization_config does not give module '%s' the fp8 format",
                       df_st_file_path(st, t->file), name, mod);
    df_wfmt f;
    if (!df_wfmt_of_dtype(t->dtype, &f) || !df_wfmt_computable(f) || f.scale != DF_SC_NONE)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: BF16, F16, F32, "
                       "and the quantized formats of quantization_config)",
                       df_st_file_path(st, t->file), name, df_dtype_name(t->dtype));
    int rc = need(st, mod, ".weight", -1, rows, cols, "a weight", "config.json implies", &t, err);
    if (rc || (rc = stray(st, mod, DF_Q_NONE, err))) return rc;
    out->fmt = f;
    out->values = t;
    return DF_OK;
}

int df_quant_bind(const df_st *st, const df_quant *q, const char *mod, int rows, int cols, bool linear,
                  df_qweight *out, df_error *err) {
    memset(out, 0, sizeof *out);
    int rc = df_quant_kind(q, mod, linear, &out->kind, err);
    if (rc) return rc;
    if (out->kind == DF_Q_NONE) return bind_plain(st, mod, rows, cols, out, err);
    if ((rc = stray(st, mod, out->kind, err))) return rc;
    if (out->kind == DF_Q_FP8) {
        out->fmt = df_wfmt_fp8_block();
        if ((rc = need(st, mod, ".weight", DF_DT_F8_E4M3, rows, cols, "an fp8 weight", "config.json implies",
                       &out->values, err)))
            return rc;
        return need(st, mod, ".weight_scale_inv", DF_DT_F32, (rows + 127) / 128, (cols + 127) / 128,
                    "the fp8 weight's scales", "one scale per 128x128 block of the weight's shape gives",
                    &out->scale, err);
    }
    bool i4 = out->kind == DF_Q_INT4;
    out->fmt = i4 ? df_wfmt_int4_group() : df_wfmt_mxfp4();
    if (cols % 32) {
        char name[320];
        snprintf(name, sizeof name, "%s.weight_packed", mod);
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s': %d input columns are not a whole number of "
                       "groups of 32", df_st_where(st), name, cols);
    }
    char sh[320];
    snprintf(sh, sizeof sh, "%s.weight_shape", mod);
    out->shape = df_st_find(st, sh);
    if (i4 && !out->shape)
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint (pack-quantized "
                       "weights carry their shape)", df_st_where(st), sh);
    if (out->shape && (rc = check_shape(st, out->shape, rows, cols, err))) return rc;
    if ((rc = need(st, mod, ".weight_packed", i4 ? DF_DT_I32 : DF_DT_U8, rows, i4 ? cols / 8 : cols / 2,
                   i4 ? "INT4 values, eight per I32 word" : "MXFP4 values, two per byte",
                   i4 ? "eight values per word of the weight's shape gives" : "two values per byte of the weight's shape gives",
                   &out->values, err)))
        return rc;
    return need(st, mod, ".weight_scale", i4 ? DF_DT_BF16 : DF_DT_U8, rows, cols / 32,
                i4 ? "BF16 scales, one per group of 32" : "E8M0 scales, one per group of 32",
                "one scale per 32 values of the weight's shape gives", &out->scale, err);
}

int df_quant_check_scales(const df_st *st, const df_tensor *t, df_wfmt fmt, const void *data, df_error *err) {
    size_t n = (size_t)t->nbytes / (fmt.scale == DF_SC_F32 ? 4 : fmt.scale == DF_SC_BF16 ? 2 : 1);
    const uint8_t *b = data;
    for (size_t i = 0; i < n; i++) {
        bool badv;
        if (fmt.scale == DF_SC_F32) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            badv = !isfinite(f);
        } else if (fmt.scale == DF_SC_BF16) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            badv = (h & 0x7f80) == 0x7f80;
        } else badv = b[i] == 0xff;
        if (badv)
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '%s': scale %zu is %s", df_st_file_path(st, t->file),
                           t->name, i, fmt.scale == DF_SC_E8M0 ? "the E8M0 NaN code 0xFF" : "not finite");
    }
    return DF_OK;
}

uint64_t df_quant_matrix_bytes(df_qkind kind, int rows, int cols) {
    uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
    switch (kind) {
    case DF_Q_FP8: return r * c + ((r + 127) / 128) * ((c + 127) / 128) * 4;
    case DF_Q_INT4: return r * c / 2 + r * ((c + 31) / 32) * 2 + 8; /* BF16 scales, I32 [2] shape */
    case DF_Q_MXFP4: return r * c / 2 + r * ((c + 31) / 32);
    default: return r * c * 2;
    }
}
