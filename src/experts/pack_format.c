/*
 * pack_format.c - the pack's format (docs/pack-format.md): the model
 * fingerprint, the record plan, the manifest's text and its parsing, and the
 * small helpers the other pack files share.
 *
 * Everything here works from a checkpoint's config, safetensors and expert
 * inventory (df_pack_ckpt), never from a loaded model: a record is the
 * expert's parts as the architecture's layout names them, so a family whose
 * experts have scale tensors (or more matrices) packs without a change here.
 * The manifest is untrusted input: every field, offset and range is checked.
 */
#include "experts/pack_internal.h"
#include "model/model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- small helpers -------------------------------------------------------------------- */

bool pk_exists(const char *dir, const char *name) {
    char *p = df_path_join(dir, name);
    struct stat sb;
    bool r = stat(p, &sb) == 0;
    free(p);
    return r;
}

void pk_unlink_in(const char *dir, const char *name) {
    char *p = df_path_join(dir, name);
    unlink(p);
    free(p);
}

void pk_hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

bool pk_parse_hex64(const char *s, uint64_t *v) {
    if (!s || strlen(s) != 16) return false;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return true;
}

bool pk_is_hex(const char *s, size_t n) {
    if (!s || strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

bool pk_is_uuid(const char *s) {
    if (!s || strlen(s) != 36) return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    }
    return true;
}

bool pk_jint(json_t *o, const char *key, long long lo, long long hi, long long *v) {
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j)) return false;
    long long x = json_integer_value(j);
    if (x < lo || x > hi) return false;
    *v = x;
    return true;
}

const char *pk_jstr(json_t *o, const char *key) {
    json_t *j = json_object_get(o, key);
    return json_is_string(j) ? json_string_value(j) : NULL;
}

int pk_fail_more(df_error *err, int code, const char *more) {
    if (!err) return code;
    char was[sizeof err->msg];
    snprintf(was, sizeof was, "%s", err->msg);
    return df_fail(err, code, "%s%s", was, more);
}

/* ---- the checkpoint ------------------------------------------------------------------------ */

int pk_source_open(pk_source *s, const char *dir, df_error *err) {
    memset(s, 0, sizeof *s);
    int rc = df_config_load_dir(&s->cfg, dir, err);
    if (!rc) rc = df_st_open_dir(&s->st, dir, err);
    if (!rc) rc = df_quant_load_dir(&s->quant, dir, err);
    if (!rc) rc = df_expert_inventory_build(&s->inv, &s->cfg, s->st, s->quant, err);
    if (rc) {
        pk_source_close(s);
        return rc;
    }
    s->ck = (df_pack_ckpt){dir, &s->cfg, s->st, &s->inv};
    return DF_OK;
}

void pk_source_close(pk_source *s) {
    df_expert_inventory_free(&s->inv);
    if (s->st) df_st_close(s->st);
    df_quant_free(s->quant);
    memset(s, 0, sizeof *s);
}

bool pk_has_experts(const df_pack_ckpt *ck) {
    return ck->cfg->num_experts > 0 && ck->inv->layout && ck->inv->xt &&
           df_config_moe_layers(ck->cfg) > 0;
}

/* ---- the record plan ------------------------------------------------------------------------ */

void pk_plan_free(pk_plan *p) {
    free(p->rec);
    free(p->parts);
    free(p->src);
    memset(p, 0, sizeof *p);
}

/* Part k of a record from its tensor; the error names a tensor a manifest
 * could not describe. */
static int plan_part(df_pack_part *pt, const df_tensor *t, const char *name, uint64_t off,
                     const df_st *st, df_error *err) {
    if (t->ndim < 1 || t->ndim > DF_PACK_MAX_DIMS || t->nbytes == 0)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: tensor '%s': a pack part has 1 to %d "
                       "dimensions and at least one byte", df_st_file_path(st, t->file), t->name,
                       DF_PACK_MAX_DIMS);
    pt->name = name;
    pt->offset = off;
    pt->nbytes = t->nbytes;
    pt->dtype = t->dtype;
    pt->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) pt->shape[d] = t->shape[d];
    return DF_OK;
}

int pk_plan_build(pk_plan *p, const df_pack_ckpt *ck, int S, df_error *err) {
    memset(p, 0, sizeof *p);
    const df_config *c = ck->cfg;
    const df_expert_layout *xl = ck->inv->layout;
    int np = xl->n_parts, n = 0;
    for (int li = 0; li < c->num_hidden_layers; li++)
        if (c->layer_is_moe[li]) n += c->num_experts;
    p->S = S;
    p->n = n;
    p->rec = df_xcalloc((size_t)n, sizeof *p->rec);
    p->parts = df_xcalloc((size_t)n * (size_t)np, sizeof *p->parts);
    p->src = df_xcalloc((size_t)n * (size_t)np, sizeof *p->src);
    uint64_t off = 0;
    int i = 0;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        for (int e = 0; e < c->num_experts; e++, i++) {
            df_pack_record *r = &p->rec[i];
            df_pack_part *parts = &p->parts[(size_t)i * (size_t)np];
            r->layer = li;
            r->expert = e;
            r->n_parts = np;
            r->part = parts;
            uint64_t po = 0;
            for (int k = 0; k < np; k++) {
                const df_tensor *t = df_expert_part(ck->inv, li, e, k);
                int rc = plan_part(&parts[k], t, xl->part[k], po, ck->st, err);
                if (rc) {
                    pk_plan_free(p);
                    return rc;
                }
                p->src[(size_t)i * (size_t)np + (size_t)k] = t;
                po += t->nbytes;
            }
            r->length = po;
            r->padded = pk_round_up(po, (uint64_t)DF_PACK_ALIGN * (uint64_t)S);
            r->offset = off;
            off += r->padded / (uint64_t)S;
            p->total_padded += r->padded;
            if (r->padded > p->max_padded) p->max_padded = (size_t)r->padded;
        }
    }
    p->stripe_file_bytes = off;
    return DF_OK;
}

/* ---- fingerprint -------------------------------------------------------------------- */

static char *dir_of(const df_st *st) {
    const char *f = df_st_file_path(st, 0);
    if (!f) return df_xstrdup(".");
    char *d = df_xstrdup(f);
    char *slash = strrchr(d, '/');
    if (!slash) {
        free(d);
        return df_xstrdup(".");
    }
    if (slash == d) slash[1] = 0;
    else *slash = 0;
    return d;
}

/* Data samples: two checkpoints with the same config and shapes (a fine-tune)
 * differ here, at the cost of a few small reads instead of hashing every byte.
 * Read with pread(), not through a mapping: a touched page of the mapping
 * (and the fault-around pages next to it) would stay in the RSS, which a
 * streaming budget does not count (docs/pack-format.md). */
static int fp_samples(XXH3_state_t *st, const df_pack_ckpt *ck, df_error *err) {
    const df_config *c = ck->cfg;
    int np = ck->inv->layout->n_parts;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        int ex[3] = {0, c->num_experts / 2, c->num_experts - 1};
        for (int j = 0; j < 3; j++) {
            if ((j == 1 && ex[1] == ex[0]) || (j == 2 && (ex[2] == ex[1] || ex[2] == ex[0])))
                continue;
            for (int k = 0; k < np; k++) {
                int rc = df_fp_tensor_samples(st, ck->st, df_expert_part(ck->inv, li, ex[j], k), err);
                if (rc) return rc;
            }
        }
    }
    return DF_OK;
}

/* Every expert tensor's name, dtype and shape, in record order. */
static void fp_tensors(XXH3_state_t *st, const df_pack_ckpt *ck) {
    const df_config *c = ck->cfg;
    int np = ck->inv->layout->n_parts;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        for (int e = 0; e < c->num_experts; e++)
            for (int k = 0; k < np; k++) {
                const df_tensor *t = df_expert_part(ck->inv, li, e, k);
                XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
                const char *dn = df_dtype_name(t->dtype);
                XXH3_128bits_update(st, dn, strlen(dn) + 1);
                df_fp_u64(st, (uint64_t)t->ndim);
                for (int d = 0; d < t->ndim; d++) df_fp_u64(st, (uint64_t)t->shape[d]);
            }
    }
}

int df_pack_fingerprint(const df_pack_ckpt *ck, char out[DF_PACK_FP_HEX + 1], df_error *err) {
    if (!ck || !ck->cfg || !ck->st || !ck->inv || !out)
        return df_fail(err, DF_ERR_ARG, "df_pack_fingerprint: bad arguments");
    if (!pk_has_experts(ck))
        return df_fail(err, DF_ERR_UNSUPPORTED, "model has no routed experts (architecture %s)",
                       ck->cfg->model_type);
    char *dir = ck->dir ? df_xstrdup(ck->dir) : dir_of(ck->st);
    char *cpath = df_path_join(dir, "config.json");
    free(dir);
    char *cfg;
    size_t clen;
    int rc = df_read_file(cpath, &cfg, &clen, err);
    free(cpath);
    if (rc) return rc;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        free(cfg);
        return df_fail(err, DF_ERR_NOMEM, "out of memory");
    }
    XXH3_128bits_reset(st);
    static const char magic[] = "deltafin-pack-fingerprint v1\n";
    XXH3_128bits_update(st, magic, sizeof magic - 1);
    df_fp_u64(st, clen);
    XXH3_128bits_update(st, cfg, clen);
    free(cfg);
    df_fp_u64(st, (uint64_t)ck->cfg->num_hidden_layers);
    df_fp_u64(st, (uint64_t)ck->cfg->num_experts);
    fp_tensors(st, ck);
    rc = fp_samples(st, ck, err);
    if (rc) {
        XXH3_freeState(st);
        return rc;
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    snprintf(out, DF_PACK_FP_HEX + 1, "%016" PRIx64 "%016" PRIx64, h.high64, h.low64);
    return DF_OK;
}

/* ---- manifest text ---------------------------------------------------------------------- */

static char *json_quote(const char *s) {
    json_t *j = json_string(s ? s : "");
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return q ? q : df_xstrdup("\"\"");
}

/* Quoted part names, each distinct name (pointer) quoted once. */
typedef struct quoted {
    const char *name[PK_MAX_NAMES];
    char *q[PK_MAX_NAMES];
    int n;
} quoted;

static const char *quote_name(quoted *qn, const char *name) {
    for (int i = 0; i < qn->n; i++)
        if (qn->name[i] == name) return qn->q[i];
    char *q = json_quote(name);
    if (qn->n == PK_MAX_NAMES) { /* cannot happen: names come from one layout */
        free(qn->q[PK_MAX_NAMES - 1]);
        qn->n--;
    }
    qn->name[qn->n] = name;
    qn->q[qn->n++] = q;
    return q;
}

static void put_record(df_sbuf *b, quoted *qn, const df_pack_record *r, uint64_t xxh3,
                       uint64_t sxxh3, bool last) {
    char h[17], sh[17];
    pk_hex64(xxh3, h);
    pk_hex64(sxxh3, sh);
    df_sb_printf(b, "    [%d, %d, %" PRIu64 ", %" PRIu64 ", \"%s\", \"%s\", [", r->layer, r->expert,
                 r->offset, r->length, h, sh);
    for (int k = 0; k < r->n_parts; k++) {
        const df_pack_part *pt = &r->part[k];
        df_sb_printf(b, "%s[%s, \"%s\", [", k ? ", " : "", quote_name(qn, pt->name),
                     df_dtype_name(pt->dtype));
        for (int d = 0; d < pt->ndim; d++) df_sb_printf(b, "%s%" PRId64, d ? ", " : "", pt->shape[d]);
        df_sb_printf(b, "], %" PRIu64 "]", pt->nbytes);
    }
    df_sb_printf(b, "]]%s\n", last ? "" : ",");
}

char *pk_manifest_text(const pk_plan *p, const df_config *c, const df_expert_layout *xl, const char *uuid, const char *fp,
                       int stripe, const uint64_t *rec_xxh3, const uint64_t *stripe_xxh3) {
    df_sbuf b = {0};
    char *arch = json_quote(c->model_type);
    /* for information (the parts' names and dtypes are what readers check):
     * the experts' matrices as shipped, "stored" when the dtype says it */
    char formats[256];
    static const char *const mat[] = {"gate", "up", "down"};
    size_t o = (size_t)snprintf(formats, sizeof formats, "{");
    for (int k = 0; k < DF_EXPERT_MATS && o < sizeof formats; k++)
        o += (size_t)snprintf(formats + o, sizeof formats - o, "%s\"%s\": \"%s\"", k ? ", " : "", mat[k],
                              xl->mat[k].scale >= 0 ? df_wfmt_name(xl->fmt[k]) : "as the part's dtype");
    if (o < sizeof formats) snprintf(formats + o, sizeof formats - o, "}");
    df_sb_printf(&b,
                 "{\n"
                 "  \"format\": \"" FORMAT_NAME "\",\n"
                 "  \"version\": %d,\n"
                 "  \"uuid\": \"%s\",\n"
                 "  \"stripe\": %d,\n"
                 "  \"stripes\": %d,\n"
                 "  \"align\": %d,\n"
                 "  \"fingerprint\": \"%s\",\n"
                 "  \"model\": {\"architecture\": %s, \"num_hidden_layers\": %d, "
                 "\"num_experts\": %d, \"hidden_size\": %d, \"moe_intermediate_size\": %d},\n"
                 "  \"weight_formats\": %s,\n"
                 "  \"data_file\": \"" DATA_NAME "\",\n"
                 "  \"data_bytes\": %" PRIu64 ",\n"
                 "  \"record_fields\": [\"layer\", \"expert\", \"offset\", \"length\", \"xxh3\", "
                 "\"stripe_xxh3\", \"parts\"],\n"
                 "  \"part_fields\": [\"name\", \"dtype\", \"shape\", \"nbytes\"],\n"
                 "  \"records\": [\n",
                 DF_PACK_VERSION, uuid, stripe, p->S, DF_PACK_ALIGN, fp, arch, c->num_hidden_layers,
                 c->num_experts, c->hidden_size, c->moe_intermediate_size, formats, p->stripe_file_bytes);
    free(arch);
    quoted qn = {0};
    for (int i = 0; i < p->n; i++)
        put_record(&b, &qn, &p->rec[i], rec_xxh3[i], stripe_xxh3[i], i + 1 == p->n);
    for (int i = 0; i < qn.n; i++) free(qn.q[i]);
    df_sb_printf(&b, "  ]\n}\n");
    return b.s;
}

/* ---- manifest parsing ------------------------------------------------------------------- */

void pk_manifest_free(pk_manifest *mf) {
    free(mf->rec);
    free(mf->parts);
    for (int i = 0; i < mf->n_names; i++) free(mf->names[i]);
    free(mf->names);
    free(mf->sxxh3);
    memset(mf, 0, sizeof *mf);
}

/* The manifest's copy of name, NULL when it is not a name a part can have or
 * there are too many. */
static const char *intern(pk_manifest *mf, const char *name) {
    if (!name || !*name || strlen(name) > PK_MAX_NAME) return NULL;
    for (int i = 0; i < mf->n_names; i++)
        if (!strcmp(mf->names[i], name)) return mf->names[i];
    if (mf->n_names == PK_MAX_NAMES) return NULL;
    if (!mf->names) mf->names = df_xcalloc(PK_MAX_NAMES, sizeof *mf->names);
    mf->names[mf->n_names] = df_xstrdup(name);
    return mf->names[mf->n_names++];
}

/* Why a record is malformed: a short phrase into a buffer of WHY bytes. */
#define WHY 160
#define PART_WHY 80 /* a part's, which its record's prefixes */
#define MALFORMED(...) (snprintf(why, WHY, __VA_ARGS__), false)
#define MALFORMED_PART(...) (snprintf(why, PART_WHY, __VA_ARGS__), false)

/* dtype, shape and nbytes of a part: nbytes must be the shape's bytes. */
static bool parse_part_body(json_t *dt, json_t *sh, json_t *nb, df_pack_part *pt, char *why) {
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_integer(nb))
        return MALFORMED_PART("not [dtype, shape, nbytes]");
    size_t nd = json_array_size(sh);
    int d = df_dtype_from_name(json_string_value(dt));
    if (d < 0) return MALFORMED_PART("unknown dtype '%.20s'", json_string_value(dt));
    if (nd < 1 || nd > DF_PACK_MAX_DIMS)
        return MALFORMED_PART("its shape has %zu dimensions (1..%d)", nd, DF_PACK_MAX_DIMS);
    long long n = json_integer_value(nb);
    /* every dimension < 2^31, at most 4 of them, dtype size <= 8: fits 2^127 */
    unsigned __int128 want = df_dtype_size((df_dtype)d);
    for (size_t k = 0; k < nd; k++) {
        json_t *x = json_array_get(sh, k);
        long long v = json_is_integer(x) ? json_integer_value(x) : 0;
        if (v < 1 || v > INT32_MAX)
            return MALFORMED_PART("shape[%zu] is not an integer in 1..%d", k, INT32_MAX);
        pt->shape[k] = v;
        want *= (unsigned __int128)v;
    }
    if (n <= 0 || n > ((long long)1 << 50)) return MALFORMED_PART("nbytes %lld is outside 1..2^50", n);
    if (want != (unsigned __int128)n)
        return MALFORMED_PART("nbytes %lld is not what its %.12s shape holds", n, json_string_value(dt));
    pt->nbytes = (uint64_t)n;
    pt->dtype = (df_dtype)d;
    pt->ndim = (int)nd;
    return true;
}

/* Version 1: the three parts [dtype, [rows, cols], nbytes] of columns 7-9,
 * which were always an expert's gate, up and down matrices (the only layout
 * version 1 knew). */
static bool parse_parts_v1(pk_manifest *mf, json_t *const *f, df_pack_part *parts, char *why) {
    static const char *const v1_names[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    for (int k = 0; k < 3; k++) {
        json_t *a = f[6 + k];
        if (!json_is_array(a) || json_array_size(a) != 3 || !json_is_array(json_array_get(a, 1)) ||
            json_array_size(json_array_get(a, 1)) != 2)
            return MALFORMED("column %d is not [dtype, [rows, cols], nbytes]", 7 + k);
        char sub[PART_WHY];
        if (!parse_part_body(json_array_get(a, 0), json_array_get(a, 1), json_array_get(a, 2), &parts[k], sub))
            return MALFORMED("column %d: %s", 7 + k, sub);
        if (!(parts[k].name = intern(mf, v1_names[k]))) return MALFORMED("too many part names");
    }
    return true;
}

/* Version 2: column 7 is [[name, dtype, shape, nbytes], ...]. */
static bool parse_parts_v2(pk_manifest *mf, json_t *a, df_pack_part *parts, char *why) {
    size_t np = json_array_size(a);
    for (size_t k = 0; k < np; k++) {
        json_t *p = json_array_get(a, k);
        if (!json_is_array(p) || json_array_size(p) != 4)
            return MALFORMED("part %zu is not [name, dtype, shape, nbytes]", k);
        json_t *nm = json_array_get(p, 0);
        if (!json_is_string(nm) || !(parts[k].name = intern(mf, json_string_value(nm))))
            return MALFORMED("part %zu: its name is not a string of 1..%d bytes (or there are more than %d names)",
                             k, PK_MAX_NAME, PK_MAX_NAMES);
        char sub[PART_WHY];
        if (!parse_part_body(json_array_get(p, 1), json_array_get(p, 2), json_array_get(p, 3), &parts[k], sub))
            return MALFORMED("part %zu ('%.40s'): %s", k, parts[k].name, sub);
    }
    return true;
}

/* Parts of record a (0 if it is not an array of the version's width). */
static size_t record_parts(const pk_manifest *mf, json_t *a) {
    if (!json_is_array(a)) return 0;
    if (mf->version == 1) return json_array_size(a) == 9 ? 3 : 0;
    json_t *p = json_array_size(a) == 7 ? json_array_get(a, 6) : NULL;
    size_t n = json_is_array(p) ? json_array_size(p) : 0;
    return n <= DF_EXPERT_MAX_PARTS ? n : 0;
}

/* The columns of record i, without checks against its neighbours; false
 * with why set when they are malformed. */
static bool parse_record(pk_manifest *mf, json_t *a, size_t i, df_pack_part *parts, size_t np, char *why) {
    df_pack_record *r = &mf->rec[i];
    json_t *f[9];
    size_t nf = json_array_size(a);
    for (size_t k = 0; k < nf; k++) f[k] = json_array_get(a, k);
    if (!json_is_integer(f[0]) || !json_is_integer(f[1]) || !json_is_integer(f[2]) ||
        !json_is_integer(f[3]) || !json_is_string(f[4]) || !json_is_string(f[5]))
        return MALFORMED("columns 1-4 must be integers (layer, expert, offset, length), 5-6 strings (checksums)");
    long long layer = json_integer_value(f[0]), ex = json_integer_value(f[1]);
    long long off = json_integer_value(f[2]), ln = json_integer_value(f[3]);
    if (layer < 0 || layer >= mf->n_layers)
        return MALFORMED("layer %lld is outside 0..%d", layer, mf->n_layers - 1);
    if (ex < 0 || ex >= mf->n_experts) return MALFORMED("expert %lld is outside 0..%d", ex, mf->n_experts - 1);
    if (off < 0) return MALFORMED("offset %lld is negative", off);
    if (ln <= 0 || ln >= ((long long)1 << 52)) return MALFORMED("length %lld is outside 1..2^52", ln);
    if (!pk_parse_hex64(json_string_value(f[4]), &r->xxh3) || !pk_parse_hex64(json_string_value(f[5]), &mf->sxxh3[i]))
        return MALFORMED("a checksum is not 16 hex digits");
    if (!(mf->version == 1 ? parse_parts_v1(mf, f, parts, why) : parse_parts_v2(mf, f[6], parts, why))) return false;
    uint64_t po = 0;
    for (size_t k = 0; k < np; k++) {
        parts[k].offset = po;
        po += parts[k].nbytes;
    }
    r->layer = (int)layer;
    r->expert = (int)ex;
    r->offset = (uint64_t)off;
    r->length = (uint64_t)ln;
    r->padded = pk_round_up(r->length, (uint64_t)DF_PACK_ALIGN * (uint64_t)mf->stripes);
    r->n_parts = (int)np;
    r->part = parts;
    return true;
}
#undef MALFORMED
#undef MALFORMED_PART

/* Why record r cannot follow a record ending at prev_end, or NULL. */
static const char *record_misplaced(const pk_manifest *mf, const df_pack_record *r, uint64_t prev_end,
                                    uint8_t *seen) {
    uint64_t po = 0;
    for (int k = 0; k < r->n_parts; k++) po += r->part[k].nbytes;
    if (po != r->length) return "its parts do not add up to its length";
    if (r->offset % DF_PACK_ALIGN) return "its offset is not a multiple of 4096";
    if (r->offset < prev_end) return "it overlaps the record before it";
    if (r->offset + r->padded / (uint64_t)mf->stripes > mf->data_bytes) return "it extends past data_bytes";
    if (seen[(size_t)r->layer * (size_t)mf->n_experts + (size_t)r->expert]++)
        return "its layer and expert appear twice";
    return NULL;
}

/* The records array: in file order, not overlapping, every (layer, expert) once. */
static int parse_records(pk_manifest *mf, json_t *recs, const char *dir, df_error *err) {
    size_t n = json_is_array(recs) ? json_array_size(recs) : 0;
    if (n == 0 || n > (size_t)mf->n_layers * (size_t)mf->n_experts)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": field 'records' must be an "
                       "array of 1..%lld records", dir, (long long)mf->n_layers * mf->n_experts);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += record_parts(mf, json_array_get(recs, i));
    mf->n = (int)n;
    mf->rec = df_xcalloc(n, sizeof *mf->rec);
    mf->sxxh3 = df_xcalloc(n, sizeof *mf->sxxh3);
    mf->parts = df_xcalloc(total ? total : 1, sizeof *mf->parts);
    uint8_t *seen = df_xcalloc((size_t)mf->n_layers * (size_t)mf->n_experts, 1);
    uint64_t prev_end = 0;
    size_t used = 0;
    int rc = DF_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *a = json_array_get(recs, i);
        size_t np = record_parts(mf, a);
        char bad[WHY];
        if (np == 0 && mf->version == 1) snprintf(bad, sizeof bad, "it is not an array of 9 columns");
        else if (np == 0)
            snprintf(bad, sizeof bad, "it is not an array of 7 columns, the last a list of 1..%d parts",
                     DF_EXPERT_MAX_PARTS);
        if (np == 0 || !parse_record(mf, a, i, mf->parts + used, np, bad)) {
            rc = df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": record %zu is malformed: %s", dir, i, bad);
            break;
        }
        used += np;
        const df_pack_record *r = &mf->rec[i];
        const char *why = record_misplaced(mf, r, prev_end, seen);
        if (why)
            rc = df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": record %zu (layer %d expert %d): %s",
                         dir, i, r->layer, r->expert, why);
        prev_end = r->offset + r->padded / (uint64_t)mf->stripes;
    }
    free(seen);
    return rc;
}

#define BAD(...) return df_fail(err, DF_ERR_FORMAT, __VA_ARGS__)

/* The identity fields: format, version, uuid, fingerprint, stripes. */
static int parse_identity(pk_manifest *mf, json_t *root, const char *dir, df_error *err) {
    long long v;
    const char *fmt = pk_jstr(root, "format");
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0)
        BAD("pack %s: " MANIFEST_NAME ": not a deltafin pack manifest (field 'format' is not "
            "\"" FORMAT_NAME "\")", dir);
    if (!pk_jint(root, "version", 0, INT32_MAX, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'version' missing or not an integer", dir);
    if (v < 1 || v > DF_PACK_VERSION)
        return df_fail(err, DF_ERR_UNSUPPORTED, "pack %s: format version %lld, this deltafin reads "
                       "versions 1 to %d (repack with this version)", dir, v, DF_PACK_VERSION);
    mf->version = (int)v;
    const char *uuid = pk_jstr(root, "uuid"), *fp = pk_jstr(root, "fingerprint");
    if (!pk_is_uuid(uuid)) BAD("pack %s: " MANIFEST_NAME ": field 'uuid' is not a uuid", dir);
    if (!pk_is_hex(fp, DF_PACK_FP_HEX))
        BAD("pack %s: " MANIFEST_NAME ": field 'fingerprint' is not %d hex digits", dir, DF_PACK_FP_HEX);
    snprintf(mf->uuid, sizeof mf->uuid, "%s", uuid);
    snprintf(mf->fp, sizeof mf->fp, "%s", fp);
    if (!pk_jint(root, "stripes", 1, DF_PACK_MAX_STRIPES, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'stripes' must be an integer in 1..%d", dir,
            DF_PACK_MAX_STRIPES);
    mf->stripes = (int)v;
    if (!pk_jint(root, "stripe", 0, mf->stripes - 1, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'stripe' must be an integer in 0..%d", dir, mf->stripes - 1);
    mf->stripe = (int)v;
    if (!pk_jint(root, "align", DF_PACK_ALIGN, DF_PACK_ALIGN, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'align' must be %d", dir, DF_PACK_ALIGN);
    return DF_OK;
}

/* The model's bounds and the data file. */
static int parse_model(pk_manifest *mf, json_t *root, const char *dir, df_error *err) {
    long long v;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) BAD("pack %s: " MANIFEST_NAME ": field 'model' missing", dir);
    if (!pk_jint(model, "num_hidden_layers", 1, DF_MAX_LAYERS, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'model.num_hidden_layers' must be in 1..%d", dir,
            DF_MAX_LAYERS);
    mf->n_layers = (int)v;
    if (!pk_jint(model, "num_experts", 1, 65536, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'model.num_experts' must be in 1..65536", dir);
    mf->n_experts = (int)v;
    const char *arch = pk_jstr(model, "architecture");
    snprintf(mf->arch, sizeof mf->arch, "%s", arch ? arch : "?");
    const char *df = pk_jstr(root, "data_file");
    if (!df || strcmp(df, DATA_NAME) != 0)
        BAD("pack %s: " MANIFEST_NAME ": field 'data_file' must be \"" DATA_NAME "\"", dir);
    if (!pk_jint(root, "data_bytes", 0, INT64_MAX, &v) || v % DF_PACK_ALIGN)
        BAD("pack %s: " MANIFEST_NAME ": field 'data_bytes' must be a multiple of %d", dir, DF_PACK_ALIGN);
    mf->data_bytes = (uint64_t)v;
    return DF_OK;
}

#undef BAD

/* Parses and validates a manifest (untrusted: every offset, length and range is
 * checked, records are in file order and do not overlap). `dir` names errors. */
static int manifest_parse(pk_manifest *mf, const char *dir, const char *text, size_t len, df_error *err) {
    memset(mf, 0, sizeof *mf);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": not valid JSON: %s (line %d)",
                       dir, je.text, je.line);
    int rc = parse_identity(mf, root, dir, err);
    if (!rc) rc = parse_model(mf, root, dir, err);
    if (!rc) rc = parse_records(mf, json_object_get(root, "records"), dir, err);
    json_decref(root);
    if (rc) pk_manifest_free(mf);
    return rc;
}

int pk_manifest_load(pk_manifest *mf, const char *dir, df_error *err) {
    memset(mf, 0, sizeof *mf);
    char *path = df_path_join(dir, MANIFEST_NAME);
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) {
        rc = df_fail(err, DF_ERR_IO, "pack %s: " MANIFEST_NAME ": cannot open: %s", dir, strerror(errno));
    } else if (!S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_MANIFEST_BYTES) {
        rc = df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": not a regular file of at "
                     "most 1 GiB", dir);
    } else {
        char *text;
        size_t len;
        df_error e2;
        rc = df_read_file(path, &text, &len, &e2);
        if (rc) rc = df_fail(err, rc, "pack %s: %s", dir, e2.msg);
        else {
            rc = manifest_parse(mf, dir, text, len, err);
            free(text);
        }
    }
    free(path);
    return rc;
}

bool pk_record_equal(const df_pack_record *a, const df_pack_record *b) {
    if (a->layer != b->layer || a->expert != b->expert || a->offset != b->offset ||
        a->length != b->length || a->padded != b->padded || a->xxh3 != b->xxh3 ||
        a->n_parts != b->n_parts)
        return false;
    for (int k = 0; k < a->n_parts; k++) {
        const df_pack_part *x = &a->part[k], *y = &b->part[k];
        if (strcmp(x->name, y->name) || x->offset != y->offset || x->nbytes != y->nbytes ||
            x->dtype != y->dtype || x->ndim != y->ndim)
            return false;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d]) return false;
    }
    return true;
}
