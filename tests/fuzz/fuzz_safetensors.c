/*
 * fuzz_safetensors.c - libFuzzer target for df_st_parse (the untrusted
 * safetensors header). Each input is parsed as is and, when it can be, once
 * more with the 8-byte header length recomputed to end at the last '}' so
 * that mutations inside the JSON are not all stopped by a stale length.
 * Whatever parses must satisfy the documented invariants; a violation aborts.
 * What parses then goes through the companion checks of weights as shipped
 * (df_quant_bind, df_quant_check_scales) under a fixed quantization_config of
 * each format: every weight-like tensor's module is bound, at the shape its
 * stored tensor implies, at the one its weight_shape holds and at a fixed one; a bound weight must be what the
 * config says (dtypes, grids, packed widths), its scales are scanned in place.
 */
#include "model/quant.h"
#include "model/safetensors.h"
#include "fuzz.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[2208];

const char *df_fuzz_outcome(void) { return outcome; }

/* Outcome lines are newline-separated: names must not break them. */
static void flatten(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20) *s = '?';
}


static const char *const DICT[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"format\"", "\"pt\"",
    "\"F32\"", "\"F16\"", "\"BF16\"", "\"F64\"", "\"I64\"", "\"I32\"", "\"I16\"", "\"I8\"",
    "\"U8\"", "\"BOOL\"", "\"F8_E4M3\"", "\"F8_E5M2\"", "\"F4\"", "\"U16\"",
    "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}",
    "\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}", "[0,0]", "[1,1,1,1,1,1,1,1,1]",
    /* weights as shipped: companion tensors */
    ".weight\"", ".weight_scale_inv\"", ".weight_packed\"", ".weight_scale\"", ".weight_shape\"",
    "\"skip.weight\"", "\"skip.weight_packed\"", "\"both.weight_packed\"", "[2]", "[128,128]", "[1,2]",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static void check(const uint8_t *data, size_t size, const df_tensor *t, size_t n) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    uint64_t prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t elems = 1;
        if (t[i].ndim < 0 || t[i].ndim > DF_MAX_DIMS || !t[i].name || t[i].file != 0) abort();
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) abort();
            elems *= (uint64_t)t[i].shape[d];
        }
        if (elems * df_dtype_size(t[i].dtype) != t[i].nbytes) abort();
        if (t[i].file_offset < 8 + hlen || t[i].file_offset > size ||
            t[i].nbytes > size - t[i].file_offset)
            abort();
        if ((const uint8_t *)t[i].data != data + t[i].file_offset) abort();
        /* sorted by offset and disjoint */
        if (t[i].nbytes) {
            if (t[i].file_offset < prev_end) abort();
            prev_end = t[i].file_offset + t[i].nbytes;
            /* touch both ends: ASan flags any byte outside the input */
            volatile uint8_t x = ((const uint8_t *)t[i].data)[0];
            x = ((const uint8_t *)t[i].data)[t[i].nbytes - 1];
            (void)x;
        }
    }
}

/* Tensor names come from the input and may hold anything, quotes included, so
 * a message about a tensor is reduced to the kind of complaint: the text after
 * "'NAME': " begins with one of the parser's fixed phrasings. */
static const char *const KINDS[] = {
    "entry is not", "unknown key", "missing 'dtype'", "missing 'shape'",
    "missing 'data_offsets'", "dtype is not", "unknown dtype", "shape is not", "shape has",
    "shape[", "element count", "byte size", "data_offsets is not", "negative data_offsets",
    "data_offsets end", "data_offsets span", "data [",
};

static void describe(char *res, size_t cap, int rc, const char *msg) {
    if (strncmp(msg, "f: tensor '", 11) == 0) {
        for (const char *p = strstr(msg + 11, "': "); p; p = strstr(p + 1, "': ")) {
            for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
                if (strncmp(p + 3, KINDS[k], strlen(KINDS[k])) == 0) {
                    snprintf(res, cap, "%d tensor: %s", rc, KINDS[k]);
                    return;
                }
            }
        }
    }
    snprintf(res, cap, "%d %s", rc, msg);
    flatten(res);
}

/* ---- companion tensors ------------------------------------------------------------- */

/* One config of each format; the mixed one has two groups that both target
 * module "both" (refused by name). */
static const char *const QCFG[] = {
    "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
    "\"weight_block_size\":[128,128],\"modules_to_not_convert\":[\"skip\"]}",
    "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"ignore\":[\"re:.*skip\"],"
    "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\","
    "\"strategy\":\"group\",\"group_size\":32,\"symmetric\":true}}}}",
    "{\"quant_method\":\"compressed-tensors\",\"format\":\"mixed-precision\",\"ignore\":[\"skip\"],"
    "\"config_groups\":{\"m\":{\"format\":\"mxfp4-pack-quantized\",\"targets\":[\"re:[^i]*$\"],"
    "\"weights\":{\"num_bits\":4,\"type\":\"float\",\"strategy\":\"group\",\"group_size\":32,"
    "\"symmetric\":true}},\"i\":{\"format\":\"pack-quantized\",\"targets\":[\"re:.*i\",\"both\"],"
    "\"weights\":{\"num_bits\":4,\"type\":\"int\",\"strategy\":\"group\",\"group_size\":32,"
    "\"symmetric\":true}}}}",
};
#define NQ (sizeof QCFG / sizeof *QCFG)

static df_quant *quant_config(size_t i) {
    static df_quant *q[NQ];
    if (!q[i]) {
        json_t *j = json_loads(QCFG[i], 0, NULL);
        df_error err = {0};
        if (!j || df_quant_parse(&q[i], j, "cfg", "quantization_config", &err) || !q[i]) abort();
        json_decref(j);
    }
    return q[i];
}

static bool is_2d(const df_tensor *t, int64_t r, int64_t c) {
    return t && t->ndim == 2 && t->shape[0] == r && t->shape[1] == c;
}

/* What a bound weight must be: the config's format, its tensors of the right
 * dtypes and shapes; its scales are then read (ASan: in bounds). */
static void check_bound(const df_st *st, const df_qweight *w, int rows, int cols) {
    if (!w->values) abort();
    switch (w->kind) {
    case DF_Q_NONE:
        if (w->scale || w->shape || !is_2d(w->values, rows, cols) || w->values->dtype == DF_DT_F8_E4M3) abort();
        return;
    case DF_Q_FP8:
        if (w->values->dtype != DF_DT_F8_E4M3 || !is_2d(w->values, rows, cols) || !w->scale ||
            w->scale->dtype != DF_DT_F32 || !is_2d(w->scale, (rows + 127) / 128, (cols + 127) / 128))
            abort();
        break;
    case DF_Q_INT4:
    case DF_Q_MXFP4: {
        bool i4 = w->kind == DF_Q_INT4;
        if (cols % 32 || w->values->dtype != (i4 ? DF_DT_I32 : DF_DT_U8) ||
            !is_2d(w->values, rows, i4 ? cols / 8 : cols / 2) || !w->scale ||
            w->scale->dtype != (i4 ? DF_DT_BF16 : DF_DT_U8) || !is_2d(w->scale, rows, cols / 32) ||
            (i4 && !w->shape) || (w->shape && (w->shape->ndim != 1 || w->shape->shape[0] != 2)))
            abort();
        break;
    }
    }
    df_error err = {0};
    int rc = df_quant_check_scales(st, w->scale, w->fmt, w->scale->data, &err);
    if (rc && (rc != err.code || strncmp(err.msg, "f: tensor '", 11) != 0 || !strstr(err.msg, "': scale ")))
        abort();
}

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static const char *const SUFFIX[] = {".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape", ".weight"};

/* Binds module `mod` at [rows][cols] under config qi (NQ: none); the first
 * refusal's message goes to res (once). */
static void bind_one(const df_st *st, size_t qi, const char *mod, int rows, int cols, char *res, size_t cap,
                     int *n_ok) {
    df_qweight w;
    df_error err = {0};
    int rc = df_quant_bind(st, qi < NQ ? quant_config(qi) : NULL, mod, rows, cols, true, &w, &err);
    if (rc == DF_OK) {
        check_bound(st, &w, rows, cols);
        ++*n_ok;
        return;
    }
    if (rc != err.code || !err.msg[0] ||
        (!starts(err.msg, "f: ") && !starts(err.msg, "quantization_config: module '")))
        abort();
    if (!res[0]) df_fuzz_describe(res, cap, "", err.msg, strlen(err.msg), '\'');
}

/* Every weight-like tensor's module under every config; one outcome line. */
static void run_quant(const uint8_t *data, size_t size, char *res, size_t cap) {
    df_tensor *t = NULL;
    size_t n = 0;
    df_error err = {0};
    if (df_st_parse(data, size, "f", &t, &n, &err) != DF_OK) return;
    df_st *st;
    if (df_st_from_tensors(&st, t, n, "f", &err) != DF_OK) return; /* a name twice */
    char first[NQ + 1][80] = {{0}};
    int n_ok = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        const df_tensor *x = df_st_at(st, i);
        size_t len = strlen(x->name), k = 0, sl = 0;
        for (; k < sizeof SUFFIX / sizeof *SUFFIX; k++) {
            sl = strlen(SUFFIX[k]);
            if (len >= sl && strcmp(x->name + len - sl, SUFFIX[k]) == 0) break;
        }
        if (k == sizeof SUFFIX / sizeof *SUFFIX || len - sl > 200) continue;
        char mod[256];
        snprintf(mod, sizeof mod, "%.*s", (int)(len - sl), x->name);
        /* the shape the stored tensor implies, and a fixed one */
        int64_t r = x->ndim == 2 ? x->shape[0] : 64, c = x->ndim == 2 ? x->shape[1] : 64;
        c *= x->dtype == DF_DT_I32 ? 8 : k == 1 ? 2 : 1;
        if (r < 1 || c < 1 || r > (1 << 20) || c > (1 << 20)) r = c = 64;
        /* and the one weight_shape holds (its values are data: easily mutated) */
        char sn[280];
        snprintf(sn, sizeof sn, "%s.weight_shape", mod);
        const df_tensor *ws = df_st_find(st, sn);
        int64_t wr = 0, wc = 0;
        if (ws && ws->ndim == 1 && ws->shape[0] == 2 && (ws->dtype == DF_DT_I32 || ws->dtype == DF_DT_I64)) {
            int32_t v[2];
            if (ws->dtype == DF_DT_I32) memcpy(v, ws->data, 8), wr = v[0], wc = v[1];
            else memcpy(&wr, ws->data, 8), memcpy(&wc, (const char *)ws->data + 8, 8);
        }
        for (size_t qi = 0; qi <= NQ; qi++) {
            bind_one(st, qi, mod, (int)r, (int)c, first[qi], sizeof first[qi], &n_ok);
            bind_one(st, qi, mod, 64, 64, first[qi], sizeof first[qi], &n_ok);
            if (wr >= 1 && wc >= 1 && wr <= (1 << 20) && wc <= (1 << 20))
                bind_one(st, qi, mod, (int)wr, (int)wc, first[qi], sizeof first[qi], &n_ok);
        }
    }
    df_st_close(st);
    snprintf(res, cap, "q %s|%s|%s|%s ok %c", first[0], first[1], first[2], first[3], n_ok ? 's' : 'n');
    flatten(res);
}

/* Parses one buffer; describes the result in res (for the driver's guidance). */
static void run(const uint8_t *data, size_t size, char *res, size_t cap) {
    df_tensor *t = NULL;
    size_t n = 0;
    df_error err = {0};
    int rc = df_st_parse(data, size, "f", &t, &n, &err);
    if (rc == DF_OK) {
        check(data, size, t, n);
        snprintf(res, cap, "ok %s", n ? "some" : "none");
        df_st_free_tensors(t, n);
    } else {
        if (t || n || err.code != rc || strncmp(err.msg, "f: ", 3) != 0) abort();
        describe(res, cap, rc, err.msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char raw[700], fixed[700], quant[400];
    run(data, size, raw, sizeof raw);
    quant[0] = 0;
    run_quant(data, size, quant, sizeof quant);
    fixed[0] = 0;
    const uint8_t *end = size >= 10 ? memrchr(data + 8, '}', size - 8) : NULL;
    if (end) {
        uint8_t *copy = malloc(size);
        if (!copy) abort();
        memcpy(copy, data, size);
        uint64_t hlen = (uint64_t)(end - data) - 7;
        for (int i = 0; i < 8; i++) copy[i] = (uint8_t)(hlen >> (8 * i));
        run(copy, size, fixed, sizeof fixed);
        free(copy);
    }
    snprintf(outcome, sizeof outcome, "%s\n%s\n%s", raw, fixed, quant);
    return 0;
}
