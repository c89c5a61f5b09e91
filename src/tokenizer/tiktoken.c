/*
 * tiktoken.c - the tiktoken.model tokenizer format (Kimi K2, Moonlight, Meta's
 * original Llama 3 files) loaded into the same tables tokenizer.json fills, so
 * that one encoder (encode.c) serves both.
 *
 * Owns: parsing "base64(token bytes) rank" lines, turning ranks into the merge
 * table, the specials from tokenizer_config.json's added_tokens_decoder (and the
 * <|reserved_token_ID|> names of the rest), the Kimi and Llama 3 split patterns,
 * the text cutting of tiktoken's Python wrappers, and the checkpoint directory's
 * choice between tokenizer.json and tiktoken.model.
 *
 * tiktoken merges the adjacent pair whose concatenation has the lowest rank. The
 * merge table says the same: every split of every token into two tokens is a
 * merge with the rank of the whole. From a fixed left symbol, pairs that produce
 * the same token cover the same bytes, so "equal rank means the same pair" still
 * holds in the encoder's heap. A piece that is itself a token maps straight to it
 * (tiktoken looks pieces up before merging): ignore_merges.
 */
#include "tokenizer/tok_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_RESERVED 256

/* Alternatives in tokenization_kimi.py's order; see tokenizer.h for the
 * translation of [X&&[^\p{Han}]]. */
#define KIMI_UPPER "(?:(?!\\p{sc=Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_LOWER "(?:(?!\\p{sc=Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
const char DF_TIKTOKEN_KIMI_PATTERN[] =
    "[\\p{sc=Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "*" KIMI_LOWER "+" KIMI_CONTR
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "+" KIMI_LOWER "*" KIMI_CONTR
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char DF_TIKTOKEN_LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------------------ */
/* cutting text as the Python wrappers do                                   */

/* Python's str.isspace(): Unicode White_Space plus U+001C..U+001F (bidi B/S). */
static bool py_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* One character at p: its length (an invalid byte counts as a one-byte
 * character, never a space) and whether it is a space. */
static size_t next_char(const unsigned char *p, size_t n, bool *space) {
    unsigned c = p[0];
    size_t k = c < 0x80                ? 1
               : c >= 0xC2 && c < 0xE0 ? 2
               : c >= 0xE0 && c < 0xF0 ? 3
               : c >= 0xF0 && c < 0xF5 ? 4
                                       : 0;
    if (k == 0 || k > n) k = 0;
    for (size_t i = 1; i < k; i++)
        if ((p[i] & 0xC0) != 0x80) k = 0;
    if (k <= 1) {
        *space = c < 0x80 && py_space(c);
        return 1;
    }
    uint32_t cp = k == 2 ? (uint32_t)(c & 0x1F) << 6 | (p[1] & 0x3F)
                : k == 3 ? (uint32_t)(c & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F)
                         : (uint32_t)(c & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
                               (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    *space = py_space(cp);
    return k;
}

/* _split_whitespaces_or_nonwhitespaces: a run longer than DF_TIKTOKEN_RUN is
 * cut before the character that would make it too long. */
size_t df_tok_tiktoken_cut(const unsigned char *p, size_t n, size_t max_chars, size_t *chars) {
    size_t i = 0, nch = 0, run = 0;
    bool run_space = false;
    while (i < n && nch < max_chars) {
        bool sp;
        size_t k = next_char(p + i, n - i, &sp);
        if (nch == 0 || sp != run_space) {
            run_space = sp;
            run = 1;
        } else if (++run > DF_TIKTOKEN_RUN) {
            break;
        }
        i += k;
        nch++;
    }
    *chars = nch;
    return i;
}

/* ------------------------------------------------------------------------ */
/* loading                                                                  */

static int b64val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 with padding; returns the byte count or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
            } else if (pad || (v[j] = b64val((unsigned char)s[i + j])) < 0) {
                return -1;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        /* bits the padding drops must be zero (canonical encoding) */
        if ((pad == 2 && (x & 0xFFFF)) || (pad == 1 && (x & 0xFF))) return -1;
        out[o++] = (unsigned char)(x >> 16);
        if (pad < 2) out[o++] = (unsigned char)(x >> 8);
        if (pad < 1) out[o++] = (unsigned char)x;
    }
    return (long)o;
}

typedef struct line {
    const char *tok;
    size_t tok_n;
    long long rank;
} line;

/* Splits one non-empty line into its two fields; false on a bad line. */
static bool parse_line(const char *s, size_t n, line *l) {
    size_t i = 0;
    while (i < n && s[i] != ' ' && s[i] != '\t') i++;
    l->tok = s;
    l->tok_n = i;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    size_t d = i;
    long long r = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && r < MAX_ID) r = r * 10 + (s[i++] - '0');
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
    l->rank = r;
    return l->tok_n > 0 && i > d && s[d] >= '0' && s[d] <= '9' && i == n;
}

/* The next line of [p, end): its length, *next past its '\n'. */
static size_t line_len(const char *p, const char *end, const char **next) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    *next = nl ? nl + 1 : end;
    return (size_t)((nl ? nl : end) - p);
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* The ranks: ids 0..N-1, each once, every single byte among them. */
static int load_ranks(df_tokenizer *t, const char *m, size_t mn, int32_t n_base, df_error *err) {
    unsigned char *buf = df_xmalloc(mn + 4);
    const char *p = m, *end = m + mn, *nx;
    size_t lineno = 0;
    int rc = DF_OK;
    for (; p < end && !rc; p = nx) {
        size_t ln = line_len(p, end, &nx);
        lineno++;
        if (blank(p, ln)) continue;
        line l;
        long bn;
        uint32_t off;
        if (!parse_line(p, ln, &l))
            rc = df_fail(err, DF_ERR_FORMAT, "%s: line %zu: expected \"BASE64 RANK\"", t->path,
                         lineno);
        else if ((bn = b64_decode(l.tok, l.tok_n, buf)) <= 0)
            rc = df_fail(err, DF_ERR_FORMAT, "%s: line %zu: bad base64 \"%.*s\"", t->path, lineno,
                         l.tok_n > 64 ? 64 : (int)l.tok_n, l.tok);
        else if (l.rank >= n_base)
            rc = df_fail(err, DF_ERR_FORMAT,
                         "%s: line %zu: rank %lld, but ranks must be 0..%d (one per line): "
                         "some rank is missing",
                         t->path, lineno, l.rank, (int)n_base - 1);
        else if (t->dec_len[l.rank] != UINT32_MAX)
            rc = df_fail(err, DF_ERR_FORMAT, "%s: line %zu: rank %lld given twice", t->path, lineno,
                         l.rank);
        else if (!(rc = df_tok_arena_put(t, buf, (size_t)bn, &off, err))) {
            if (!df_tok_vmap_put(t, (int32_t)l.rank, off, (uint32_t)bn))
                rc = df_fail(err, DF_ERR_FORMAT, "%s: line %zu: token \"%.*s\" given twice",
                             t->path, lineno, l.tok_n > 64 ? 64 : (int)l.tok_n, l.tok);
            t->dec_off[l.rank] = off;
            t->dec_len[l.rank] = (uint32_t)bn;
            if (bn == 1) t->byte_id[buf[0]] = (int32_t)l.rank;
        }
    }
    free(buf);
    for (int b = 0; b < 256 && !rc; b++)
        if (t->byte_id[b] < 0)
            rc = df_fail(err, DF_ERR_FORMAT, "%s: no token for byte 0x%02x (BPE needs all 256)",
                         t->path, b);
    return rc;
}

/* Every split of a token into two tokens merges with the token's rank. */
static void build_merges(df_tokenizer *t, int32_t n_base) {
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            size_t cap = df_tok_pow2(n * 2 + 1);
            t->mkey = df_xmalloc(cap * sizeof *t->mkey);
            t->mval = df_xmalloc(cap * sizeof *t->mval);
            memset(t->mkey, 0xff, cap * sizeof *t->mkey);
            t->mmask = cap - 1;
        }
        for (int32_t id = 0; id < n_base; id++) {
            const char *s = t->arena + t->dec_off[id];
            uint32_t len = t->dec_len[id];
            for (uint32_t k = 1; k < len; k++) {
                int32_t a = vmap_get(t, s, k);
                int32_t b = a < 0 ? -1 : vmap_get(t, s + k, len - k);
                if (b < 0) continue;
                if (pass == 0) n++;
                else df_tok_merge_put(t, a, b, (uint32_t)id, id);
            }
        }
    }
}

/* added_tokens_decoder: {"ID": {"content": ..., "special": ...}, ...}. */
static int load_specials(df_tokenizer *t, json_t *dec, const char *cpath, int32_t n_base,
                         df_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach(dec, key, v) {
        char *e;
        long id = strtol(key, &e, 10);
        json_t *c = json_is_object(v) ? json_object_get(v, "content") : NULL;
        json_t *sp = json_is_object(v) ? json_object_get(v, "special") : NULL;
        if (*key == 0 || *e || id < n_base || id >= n_base + N_RESERVED)
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: added_tokens_decoder[\"%.32s\"]: id must be %d..%d (after the %d "
                           "ranks of %s)",
                           cpath, key, (int)n_base, (int)n_base + N_RESERVED - 1, (int)n_base,
                           t->path);
        if (!json_is_string(c) || json_string_length(c) == 0)
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: added_tokens_decoder[\"%s\"].content: expected a non-empty string",
                           cpath, key);
        if (sp && !json_is_boolean(sp))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: added_tokens_decoder[\"%s\"].special: expected a boolean", cpath,
                           key);
        added_tok *a = &t->added[id - n_base];
        if (t->dec_len[id] != UINT32_MAX)
            return df_fail(err, DF_ERR_FORMAT, "%s: added_tokens_decoder[\"%s\"]: id given twice",
                           cpath, key);
        int rc = df_tok_arena_put(t, json_string_value(c), json_string_length(c), &a->off, err);
        if (rc) return rc;
        a->len = (uint32_t)json_string_length(c);
        a->special = !sp || json_is_true(sp);
        t->dec_off[id] = a->off;
        t->dec_len[id] = a->len;
    }
    return DF_OK;
}

/* The 256 specials after the ranks: named ones, then reserved names. */
static int build_specials(df_tokenizer *t, const char *config, size_t config_len,
                          const char *cpath, int32_t n_base, df_error *err) {
    t->added = df_xcalloc(N_RESERVED, sizeof *t->added);
    t->n_added = N_RESERVED;
    for (int i = 0; i < N_RESERVED; i++) t->added[i].id = n_base + i;
    if (config) {
        json_error_t je;
        /* reals: model_max_length may be 1e30 written as an integer */
        json_t *root = json_loadb(config, config_len, JSON_DECODE_INT_AS_REAL, &je);
        if (!root)
            return df_fail(err, DF_ERR_FORMAT, "%s: malformed JSON at line %d column %d: %s", cpath,
                           je.line, je.column, je.text);
        json_t *dec = json_is_object(root) ? json_object_get(root, "added_tokens_decoder") : NULL;
        int rc = DF_OK;
        if (dec && !json_is_object(dec))
            rc = df_fail(err, DF_ERR_FORMAT, "%s: added_tokens_decoder: expected an object", cpath);
        else if (dec)
            rc = load_specials(t, dec, cpath, n_base, err);
        json_decref(root);
        if (rc) return rc;
    }
    for (int i = 0; i < N_RESERVED; i++) {
        int32_t id = n_base + i;
        if (t->dec_len[id] != UINT32_MAX) continue;
        char name[48];
        int k = snprintf(name, sizeof name, "<|reserved_token_%d|>", (int)id);
        int rc = df_tok_arena_put(t, name, (size_t)k, &t->added[i].off, err);
        if (rc) return rc;
        t->added[i].len = (uint32_t)k;
        t->added[i].special = true;
        t->dec_off[id] = t->added[i].off;
        t->dec_len[id] = (uint32_t)k;
    }
    return DF_OK;
}

static int32_t count_lines(const char *m, size_t mn) {
    int64_t n = 0;
    const char *nx;
    for (const char *p = m, *end = m + mn; p < end; p = nx) {
        size_t ln = line_len(p, end, &nx);
        if (!blank(p, ln)) n++;
    }
    return n > MAX_ID - N_RESERVED ? -1 : (int32_t)n;
}

int df_tokenizer_load_tiktoken_mem(df_tokenizer **out, const char *model, size_t model_len,
                                   const char *path, const char *config, size_t config_len,
                                   const char *config_path, const char *pattern, df_error *err) {
    if (!out || (!model && model_len))
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_load_tiktoken_mem: NULL argument");
    *out = NULL;
    if (!path) path = "tiktoken.model";
    if (!config_path) config_path = "tokenizer_config.json";
    if (!pattern) pattern = DF_TIKTOKEN_KIMI_PATTERN;
    int32_t n_base = count_lines(model ? model : "", model_len);
    if (n_base < 256)
        return df_fail(err, DF_ERR_FORMAT, "%s: %s (a tiktoken.model needs at least the 256 bytes)",
                       path, n_base < 0 ? "too many lines" : "too few tokens");
    df_tokenizer *t = df_tok_new(path);
    t->tiktoken = true;
    t->ignore_merges = true;
    t->n_ids = n_base + N_RESERVED;
    t->dec_off = df_xcalloc((size_t)t->n_ids, sizeof *t->dec_off);
    t->dec_len = df_xmalloc((size_t)t->n_ids * sizeof *t->dec_len);
    for (int32_t k = 0; k < t->n_ids; k++) t->dec_len[k] = UINT32_MAX;
    size_t vcap = df_tok_pow2((size_t)n_base * 2 + 1);
    t->vmap = df_xmalloc(vcap * sizeof *t->vmap);
    for (size_t k = 0; k < vcap; k++) t->vmap[k].id = -1;
    t->vmap_mask = vcap - 1;
    int rc = load_ranks(t, model, model_len, n_base, err);
    if (!rc) {
        build_merges(t, n_base);
        rc = build_specials(t, config, config_len, config_path, n_base, err);
    }
    if (!rc) {
        t->steps[0].behavior = BEH_ISOLATED;
        rc = df_tok_compile_regex(t, pattern, strlen(pattern), 0, "split pattern", &t->steps[0].re,
                                  err);
        if (!rc) t->n_steps = 1;
    }
    if (!rc) rc = df_tok_finish(t, err);
    if (rc) {
        df_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DF_OK;
}

int df_tokenizer_load_tiktoken(df_tokenizer **out, const char *path, const char *config,
                               const char *pattern, df_error *err) {
    if (!out || !path) return df_fail(err, DF_ERR_ARG, "df_tokenizer_load_tiktoken: NULL argument");
    *out = NULL;
    char *m = NULL, *c = NULL;
    size_t mn = 0, cn = 0;
    int rc = df_read_file(path, &m, &mn, err);
    if (!rc && config) rc = df_read_file(config, &c, &cn, err);
    if (!rc) rc = df_tokenizer_load_tiktoken_mem(out, m, mn, path, c, cn, config, pattern, err);
    free(m);
    free(c);
    return rc;
}

static bool exists(const char *p) {
    return access(p, F_OK) == 0; /* opening a FIFO here would wait for a writer */
}

/* tokenizer_config.json's chat_template into *out (NULL if none): a string, or
 * a list of {"name", "template"} whose "default" entry is the chat template. */
static int read_chat_template(char **out, const char *path, df_error *err) {
    *out = NULL;
    char *text;
    size_t n;
    int rc = df_read_file(path, &text, &n, err);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, n, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!root)
        return df_fail(err, DF_ERR_FORMAT, "%s: malformed JSON at line %d column %d: %s", path, je.line,
                       je.column, je.text);
    json_t *ct = json_is_object(root) ? json_object_get(root, "chat_template") : NULL;
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        json_t *e = json_array_get(ct, i), *name = json_object_get(e, "name");
        if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0) {
            ct = json_object_get(e, "template");
            break;
        }
    }
    if (json_is_string(ct)) *out = df_xstrdup(json_string_value(ct));
    else if (ct && !json_is_null(ct) && !json_is_array(ct))
        rc = df_fail(err, DF_ERR_FORMAT,
                     "%s: field 'chat_template' must be a string or a list of {\"name\", \"template\"}", path);
    json_decref(root);
    return rc;
}

int df_tokenizer_load_dir(df_tokenizer **out, const char *dir, df_error *err) {
    if (!out || !dir) return df_fail(err, DF_ERR_ARG, "df_tokenizer_load_dir: NULL argument");
    char *tj = df_path_join(dir, "tokenizer.json");
    char *tm = df_path_join(dir, "tiktoken.model");
    char *tc = df_path_join(dir, "tokenizer_config.json");
    char *tmpl = NULL;
    /* the small file first: its errors come before a large tokenizer's load */
    int rc = exists(tc) ? read_chat_template(&tmpl, tc, err) : DF_OK;
    /* without either file, the error names tokenizer.json, the usual one */
    if (rc == DF_OK && !exists(tj) && exists(tm))
        rc = df_tokenizer_load_tiktoken(out, tm, exists(tc) ? tc : NULL, NULL, err);
    else if (rc == DF_OK)
        rc = df_tokenizer_load(out, tj, err);
    if (rc == DF_OK) (*out)->chat_template = tmpl;
    else free(tmpl);
    free(tj);
    free(tm);
    free(tc);
    return rc;
}
