/*
 * tokenizer_json.c - loading a Hugging Face tokenizer.json into the tables of
 * tokenizer.c: the model (byte-level BPE: vocab, merges, options), the added
 * tokens, the normalizers and the pre-tokenizer steps, each field checked
 * (errors name the file and the JSON path). tiktoken.c is the other loader.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* HF's ByteLevel regex (use_regex: true), the GPT-2 pattern. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *jtype(const json_t *j) {
    if (!j) return "missing";
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Optional boolean field: absent or null gives def. */
static int get_bool(df_tokenizer *t, json_t *o, const char *key, const char *where, bool def,
                    bool *out, df_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DF_OK;
    }
    if (!json_is_boolean(v))
        return df_fail(err, DF_ERR_FORMAT, "%s: %s.%s: expected a boolean, got %s", t->path,
                       where, key, jtype(v));
    *out = json_is_true(v);
    return DF_OK;
}

typedef int (*parse_step_fn)(df_tokenizer *t, json_t *n, const char *where, int depth,
                             df_error *err);

/* A normalizer or pre-tokenizer object's "type", checked. */
static int step_type(df_tokenizer *t, json_t *n, const char *where, const char **type,
                     df_error *err) {
    if (!json_is_object(n))
        return df_fail(err, DF_ERR_FORMAT, "%s: %s: expected an object, got %s", t->path, where,
                       jtype(n));
    json_t *ty = json_object_get(n, "type");
    if (!json_is_string(ty))
        return df_fail(err, DF_ERR_FORMAT, "%s: %s.type: expected a string, got %s", t->path,
                       where, jtype(ty));
    *type = json_string_value(ty);
    return DF_OK;
}

/* A "Sequence": parses each element of n[key] with fn, one level deeper. */
static int parse_sequence(df_tokenizer *t, json_t *n, const char *key, const char *where,
                          int depth, parse_step_fn fn, df_error *err) {
    json_t *arr = json_object_get(n, key);
    if (!json_is_array(arr))
        return df_fail(err, DF_ERR_FORMAT, "%s: %s.%s: expected an array, got %s", t->path, where,
                       key, jtype(arr));
    if (depth >= MAX_DEPTH)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: %s: Sequence nested too deeply", t->path,
                       where);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        char w[128];
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, i);
        int rc = fn(t, e, w, depth + 1, err);
        if (rc) return rc;
    }
    return DF_OK;
}

static int parse_normalizer(df_tokenizer *t, json_t *n, const char *where, int depth,
                            df_error *err) {
    if (!n || json_is_null(n)) return DF_OK;
    const char *s;
    int rc = step_type(t, n, where, &s, err);
    if (rc) return rc;
    if (strcmp(s, "Sequence") == 0)
        return parse_sequence(t, n, "normalizers", where, depth, parse_normalizer, err);
    int kind;
    if (strcmp(s, "NFC") == 0) kind = NORM_NFC;
    else if (strcmp(s, "NFD") == 0) kind = NORM_NFD;
    else if (strcmp(s, "NFKC") == 0) kind = NORM_NFKC;
    else if (strcmp(s, "NFKD") == 0) kind = NORM_NFKD;
    else
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: %s: normalizer type \"%s\" is not supported",
                       t->path, where, s);
    if (t->n_norms == MAX_NORMS)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: %s: more than %d normalizers", t->path,
                       where, MAX_NORMS);
    t->norms[t->n_norms++] = kind;
    return DF_OK;
}

static int parse_pretok(df_tokenizer *t, json_t *p, const char *where, int depth,
                        df_error *err) {
    const char *s;
    int rc = step_type(t, p, where, &s, err);
    if (rc) return rc;
    if (strcmp(s, "Sequence") == 0)
        return parse_sequence(t, p, "pretokenizers", where, depth, parse_pretok, err);
    if (t->n_steps == MAX_STEPS)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: %s: more than %d pre-tokenizers", t->path,
                       where, MAX_STEPS);
    /* HF's ByteLevel rewrites the text into its alphabet, so any step after it would
     * see different characters: only a final ByteLevel is supported. */
    if (t->n_steps > 0 && t->steps[t->n_steps - 1].bytelevel)
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: %s: pre-tokenizer \"%s\" after ByteLevel is not supported", t->path,
                       where, s);
    pt_step *st = &t->steps[t->n_steps];
    memset(st, 0, sizeof *st);
    char w[160];
    if (strcmp(s, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
        json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
        if (!json_is_string(rx) && !json_is_string(lit))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: %s.pattern: expected {\"Regex\": string} or {\"String\": string}, "
                           "got %s",
                           t->path, where, jtype(pat));
        json_t *beh = json_object_get(p, "behavior");
        if (!json_is_string(beh))
            return df_fail(err, DF_ERR_FORMAT, "%s: %s.behavior: expected a string, got %s",
                           t->path, where, jtype(beh));
        const char *b = json_string_value(beh);
        if (strcmp(b, "Isolated") == 0) st->behavior = BEH_ISOLATED;
        else if (strcmp(b, "Removed") == 0) st->behavior = BEH_REMOVED;
        else
            return df_fail(err, DF_ERR_UNSUPPORTED,
                           "%s: %s.behavior: \"%s\" is not supported (Isolated, Removed)",
                           t->path, where, b);
        bool inv = false;
        int rc = get_bool(t, p, "invert", where, false, &inv, err);
        if (rc) return rc;
        if (inv)
            return df_fail(err, DF_ERR_UNSUPPORTED, "%s: %s.invert: true is not supported",
                           t->path, where);
        json_t *ps = rx ? rx : lit;
        snprintf(w, sizeof w, "%s.pattern", where);
        if (json_string_length(ps) == 0)
            return df_fail(err, DF_ERR_FORMAT, "%s: %s: empty pattern", t->path, w);
        rc = df_tok_compile_regex(t, json_string_value(ps), json_string_length(ps),
                           rx ? 0 : PCRE2_LITERAL, w, &st->re, err);
        if (rc) return rc;
    } else if (strcmp(s, "ByteLevel") == 0) {
        st->bytelevel = true;
        bool use_regex = false;
        int rc = get_bool(t, p, "add_prefix_space", where, true, &st->add_prefix_space, err);
        if (!rc) rc = get_bool(t, p, "use_regex", where, true, &use_regex, err);
        if (rc) return rc;
        if (use_regex) {
            snprintf(w, sizeof w, "%s (ByteLevel regex)", where);
            rc = df_tok_compile_regex(t, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, w, &st->re, err);
            if (rc) return rc;
        }
    } else {
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: %s: pre-tokenizer type \"%s\" is not supported", t->path, where, s);
    }
    t->n_steps++;
    return DF_OK;
}

/* Whether added_tokens holds this very content under this id. */
static bool is_added_token(json_t *added, const char *s, size_t n, int32_t id) {
    size_t i;
    json_t *e;
    json_array_foreach(added, i, e) {
        json_t *c = json_object_get(e, "content");
        if (json_integer_value(json_object_get(e, "id")) == id && json_is_string(c) &&
            json_string_length(c) == n && memcmp(json_string_value(c), s, n) == 0)
            return true;
    }
    return false;
}

/* model.type, dropout, the subword affixes, byte_fallback (all refused unless
 * plain byte-level BPE) and ignore_merges. */
static int model_options(df_tokenizer *t, json_t *m, df_error *err) {
    json_t *ty = json_object_get(m, "type");
    if (ty && !json_is_string(ty))
        return df_fail(err, DF_ERR_FORMAT, "%s: model.type: expected a string, got %s",
                       t->path, jtype(ty));
    if (ty && strcmp(json_string_value(ty), "BPE") != 0)
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: model.type: \"%s\" is not supported (only BPE)", t->path,
                       json_string_value(ty));
    json_t *drop = json_object_get(m, "dropout");
    if (drop && !json_is_null(drop)) {
        if (!json_is_number(drop))
            return df_fail(err, DF_ERR_FORMAT, "%s: model.dropout: expected a number, got %s",
                           t->path, jtype(drop));
        if (json_number_value(drop) != 0.0)
            return df_fail(err, DF_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not "
                           "supported", t->path);
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *a = json_object_get(m, affixes[i]);
        if (!a || json_is_null(a)) continue;
        if (!json_is_string(a))
            return df_fail(err, DF_ERR_FORMAT, "%s: model.%s: expected a string, got %s",
                           t->path, affixes[i], jtype(a));
        if (json_string_length(a) != 0)
            return df_fail(err, DF_ERR_UNSUPPORTED, "%s: model.%s: \"%s\" is not supported",
                           t->path, affixes[i], json_string_value(a));
    }
    bool bf = false;
    int rc = get_bool(t, m, "byte_fallback", "model", false, &bf, err);
    if (!rc) rc = get_bool(t, m, "ignore_merges", "model", false, &t->ignore_merges, err);
    if (rc) return rc;
    if (bf)
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: model.byte_fallback: true is not supported",
                       t->path);
    return DF_OK;
}

/* The largest id in the vocab and the added tokens sizes the decode table;
 * the vocab hash is sized by the vocab. */
static int size_tables(df_tokenizer *t, json_t *vocab, json_t *added, df_error *err) {
    /* Ids first: the decode table is sized by the largest one. */
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: model.vocab[\"%.64s\"]: expected an integer id, got %s", t->path,
                           key, jtype(v));
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= MAX_ID)
            return df_fail(err, DF_ERR_FORMAT, "%s: model.vocab[\"%.64s\"]: id %lld out of range",
                           t->path, key, (long long)id);
        if (id > max_id) max_id = id;
    }
    size_t i;
    json_t *e;
    if (json_is_array(added)) {
        json_array_foreach(added, i, e) {
            json_t *id = json_is_object(e) ? json_object_get(e, "id") : NULL;
            if (!json_is_integer(id))
                return df_fail(err, DF_ERR_FORMAT,
                               "%s: added_tokens[%zu].id: expected an integer, got %s", t->path,
                               i, jtype(id));
            json_int_t x = json_integer_value(id);
            if (x < 0 || x >= MAX_ID)
                return df_fail(err, DF_ERR_FORMAT, "%s: added_tokens[%zu].id: %lld out of range",
                               t->path, i, (long long)x);
            if (x > max_id) max_id = x;
        }
    }
    if (max_id < 0)
        return df_fail(err, DF_ERR_FORMAT, "%s: model.vocab: empty", t->path);
    t->n_ids = (int32_t)max_id + 1;
    t->dec_off = df_xcalloc((size_t)t->n_ids, sizeof *t->dec_off);
    t->dec_len = df_xmalloc((size_t)t->n_ids * sizeof *t->dec_len);
    for (int32_t k = 0; k < t->n_ids; k++) t->dec_len[k] = UINT32_MAX;

    size_t nv = json_object_size(vocab);
    size_t vcap = df_tok_pow2(nv * 2 + 1);
    t->vmap = df_xmalloc(vcap * sizeof *t->vmap);
    for (size_t k = 0; k < vcap; k++) t->vmap[k].id = -1;
    t->vmap_mask = vcap - 1;

    return DF_OK;
}

/* model.vocab: every token as raw bytes into the arena, the decode table and
 * the vocab hash; all 256 single bytes must be there. */
static int load_vocab(df_tokenizer *t, json_t *vocab, json_t *added, df_error *err) {
    const char *key;
    size_t klen;
    json_t *v;
    int rc;
    unsigned char *buf = NULL;
    size_t bufcap = 0;
    json_object_keylen_foreach(vocab, key, klen, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (klen > bufcap) {
            bufcap = klen * 2;
            buf = df_xrealloc(buf, bufcap);
        }
        long n = df_tok_bl_to_raw(t, key, klen, buf);
        /* DeepSeek-V3 lists its BOS/EOS/pad in the vocab as plain text: BPE can
         * never produce them (as in HF), and the added token gives their bytes. */
        if (n < 0 && is_added_token(added, key, klen, id)) continue;
        if (n < 0) {
            free(buf);
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: model.vocab[\"%.64s\"]: not in the byte-level alphabet "
                           "(only byte-level BPE is supported)",
                           t->path, key);
        }
        if (n == 0) {
            free(buf);
            return df_fail(err, DF_ERR_FORMAT, "%s: model.vocab: empty token (id %d)", t->path,
                           (int)id);
        }
        if (t->dec_len[id] != UINT32_MAX) {
            free(buf);
            return df_fail(err, DF_ERR_FORMAT, "%s: model.vocab[\"%.64s\"]: id %d used twice",
                           t->path, key, (int)id);
        }
        uint32_t off = 0;
        rc = df_tok_arena_put(t, buf, (size_t)n, &off, err);
        if (rc) {
            free(buf);
            return rc;
        }
        t->dec_off[id] = off;
        t->dec_len[id] = (uint32_t)n;
        df_tok_vmap_put(t, id, off, (uint32_t)n);
        if (n == 1) t->byte_id[buf[0]] = id;
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0) {
            free(buf);
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: model.vocab: no token for byte 0x%02x (byte-level BPE needs all "
                           "256)",
                           t->path, b);
        }
    free(buf);
    return DF_OK;
}

/* One merge, "a b" or ["a", "b"]: the two tokens' spellings. */
static int merge_parts(df_tokenizer *t, json_t *e, size_t i, const char **a, size_t *al, const char **b,
                       size_t *bl, df_error *err) {
    if (json_is_string(e)) {
        /* "a b": HF requires exactly two parts split on ' '. */
        *a = json_string_value(e);
        size_t sl = json_string_length(e);
        const char *sp = memchr(*a, ' ', sl);
        if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp + 1 - *a)))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: model.merges[%zu]: \"%.64s\" is not two tokens separated by one space", t->path, i,
                           *a);
        *al = (size_t)(sp - *a);
        *b = sp + 1;
        *bl = sl - *al - 1;
        return DF_OK;
    }
    if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
        json_is_string(json_array_get(e, 1))) {
        *a = json_string_value(json_array_get(e, 0));
        *al = json_string_length(json_array_get(e, 0));
        *b = json_string_value(json_array_get(e, 1));
        *bl = json_string_length(json_array_get(e, 1));
        return DF_OK;
    }
    return df_fail(err, DF_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], got %s", t->path,
                   i, jtype(e));
}

/* model.merges, ranked in list order: both tokens and their concatenation
 * must be in the vocab. */
static int load_merges(df_tokenizer *t, json_t *merges, df_error *err) {
    size_t nm = json_array_size(merges);
    size_t mcap = df_tok_pow2(nm * 2 + 1);
    t->mkey = df_xmalloc(mcap * sizeof *t->mkey);
    t->mval = df_xmalloc(mcap * sizeof *t->mval);
    memset(t->mkey, 0xff, mcap * sizeof *t->mkey);
    t->mmask = mcap - 1;
    if (nm >= UINT32_MAX) return df_fail(err, DF_ERR_FORMAT, "%s: model.merges: too many", t->path);
    unsigned char *buf = NULL;
    size_t bufcap = 0, i;
    json_t *e;
    json_array_foreach(merges, i, e) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        int rc = merge_parts(t, e, i, &a, &al, &b, &bl, err);
        if (rc) {
            free(buf);
            return rc;
        }
        if (al + bl > bufcap) {
            bufcap = (al + bl) * 2;
            buf = df_xrealloc(buf, bufcap);
        }
        long na = df_tok_bl_to_raw(t, a, al, buf);
        long nb = na < 0 ? -1 : df_tok_bl_to_raw(t, b, bl, buf + na);
        int32_t ia = na > 0 ? vmap_get(t, buf, (size_t)na) : -1;
        int32_t ib = nb > 0 ? vmap_get(t, buf + na, (size_t)nb) : -1;
        int32_t im = ia >= 0 && ib >= 0 ? vmap_get(t, buf, (size_t)(na + nb)) : -1;
        if (ia < 0 || ib < 0 || im < 0) {
            free(buf);
            const char *which = ia < 0 ? a : ib < 0 ? b : "(their concatenation)";
            int wl = ia < 0 ? (int)al : ib < 0 ? (int)bl : 21;
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", t->path,
                           i, wl > 64 ? 64 : wl, which);
        }
        df_tok_merge_put(t, ia, ib, (uint32_t)i, im);
    }
    free(buf);
    return DF_OK;
}

/* added_tokens: content into the arena (their bytes decode as written) and
 * the matching options. */
static int load_added(df_tokenizer *t, json_t *added, df_error *err) {
    size_t i;
    json_t *e;
    int rc;
    if (json_is_array(added)) {
        t->added = df_xcalloc(json_array_size(added), sizeof *t->added);
        json_array_foreach(added, i, e) {
            json_t *c = json_object_get(e, "content");
            if (!json_is_string(c) || json_string_length(c) == 0)
                return df_fail(err, DF_ERR_FORMAT,
                               "%s: added_tokens[%zu].content: expected a non-empty string, got "
                               "%s",
                               t->path, i, jtype(c));
            added_tok *at = &t->added[t->n_added];
            bool single = false;
            char w[64];
            snprintf(w, sizeof w, "added_tokens[%zu]", i);
            rc = get_bool(t, e, "lstrip", w, false, &at->lstrip, err);
            if (!rc) rc = get_bool(t, e, "rstrip", w, false, &at->rstrip, err);
            if (!rc) rc = get_bool(t, e, "normalized", w, false, &at->normalized, err);
            if (!rc) rc = get_bool(t, e, "single_word", w, false, &single, err);
            if (!rc) rc = get_bool(t, e, "special", w, false, &at->special, err);
            if (rc) return rc;
            if (single)
                return df_fail(err, DF_ERR_UNSUPPORTED,
                               "%s: %s (\"%.64s\"): single_word is not supported", t->path, w,
                               json_string_value(c));
            at->id = (int32_t)json_integer_value(json_object_get(e, "id"));
            rc = df_tok_arena_put(t, json_string_value(c), json_string_length(c), &at->off, err);
            if (rc) return rc;
            at->len = (uint32_t)json_string_length(c);
            t->dec_off[at->id] = at->off;
            t->dec_len[at->id] = at->len;
            t->n_added++;
        }
    }
    return DF_OK;
}

static int parse_model(df_tokenizer *t, json_t *root, df_error *err) {
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m))
        return df_fail(err, DF_ERR_FORMAT, "%s: model: expected an object, got %s", t->path,
                       jtype(m));
    int rc = model_options(t, m, err);
    if (rc) return rc;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab))
        return df_fail(err, DF_ERR_FORMAT, "%s: model.vocab: expected an object, got %s",
                       t->path, jtype(vocab));
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges))
        return df_fail(err, DF_ERR_FORMAT, "%s: model.merges: expected an array, got %s",
                       t->path, jtype(merges));
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return df_fail(err, DF_ERR_FORMAT, "%s: added_tokens: expected an array, got %s",
                       t->path, jtype(added));

    rc = size_tables(t, vocab, added, err);
    if (!rc) rc = load_vocab(t, vocab, added, err);
    if (!rc) rc = load_merges(t, merges, err);
    if (!rc) rc = load_added(t, added, err);
    return rc;
}

static int check_decoder(df_tokenizer *t, json_t *root, df_error *err) {
    json_t *d = json_object_get(root, "decoder");
    if (!d || json_is_null(d)) return DF_OK;
    json_t *ty = json_is_object(d) ? json_object_get(d, "type") : NULL;
    if (!json_is_string(ty))
        return df_fail(err, DF_ERR_FORMAT, "%s: decoder.type: expected a string, got %s",
                       t->path, jtype(ty));
    if (strcmp(json_string_value(ty), "ByteLevel") != 0)
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: decoder: type \"%s\" is not supported (only ByteLevel)", t->path,
                       json_string_value(ty));
    return DF_OK;
}

int df_tokenizer_load_mem(df_tokenizer **out, const char *json, size_t len, const char *path,
                          df_error *err) {
    if (!out || (!json && len))
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_load_mem: NULL argument");
    *out = NULL;
    if (!path) path = "tokenizer.json";
    json_error_t je;
    json_t *root = json_loadb(json ? json : "", len, 0, &je);
    if (!root)
        return df_fail(err, DF_ERR_FORMAT, "%s: malformed JSON at line %d column %d: %s", path,
                       je.line, je.column, je.text);
    df_tokenizer *t = df_tok_new(path);

    int rc;
    if (!json_is_object(root)) {
        rc = df_fail(err, DF_ERR_FORMAT, "%s: top level: expected an object, got %s", path,
                     jtype(root));
        goto done;
    }
    rc = parse_model(t, root, err);
    if (!rc) rc = parse_normalizer(t, json_object_get(root, "normalizer"), "normalizer", 0, err);
    if (rc) goto done;
    json_t *pt = json_object_get(root, "pre_tokenizer");
    if (!pt || json_is_null(pt)) {
        rc = df_fail(err, DF_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer: missing (only byte-level BPE with a ByteLevel "
                     "pre-tokenizer is supported)",
                     path);
        goto done;
    }
    rc = parse_pretok(t, pt, "pre_tokenizer", 0, err);
    if (rc) goto done;
    if (t->n_steps == 0 || !t->steps[t->n_steps - 1].bytelevel) {
        rc = df_fail(err, DF_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)",
                     path);
        goto done;
    }
    rc = check_decoder(t, root, err);
    if (!rc) rc = df_tok_finish(t, err);
done:
    json_decref(root);
    if (rc) {
        df_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DF_OK;
}

int df_tokenizer_load(df_tokenizer **out, const char *path, df_error *err) {
    if (!out || !path) return df_fail(err, DF_ERR_ARG, "df_tokenizer_load: NULL argument");
    *out = NULL;
    char *data;
    size_t len;
    int rc = df_read_file(path, &data, &len, err);
    if (rc) return rc;
    rc = df_tokenizer_load_mem(out, data, len, path, err);
    free(data);
    return rc;
}

