/*
 * tokenizer.c - byte-level BPE's tables, filled by tokenizer_json.c (a Hugging
 * Face tokenizer.json) and tiktoken.c (tiktoken.model), and their life cycle;
 * the encoder that reads them is encode.c.
 *
 * Owns: the string arena, the vocab and merge hash tables, the added-token
 * tries, the GPT-2 byte<->unicode alphabet, the pre-tokenizer regexes (PCRE2
 * with Unicode properties and JIT, \s spelled as HF's Oniguruma reads it),
 * id -> raw bytes decoding and token look-up by text.
 * Internally everything is raw bytes: vocab strings are converted out of the
 * byte-level alphabet once at load, so encoding never maps characters.
 *
 * A loaded tokenizer is read-only, so one tokenizer may be used from several
 * threads at once.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_impl.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ------------------------------------------------------------------------ */
/* tables                                                                   */

static int arena_put(df_tokenizer *t, const void *p, size_t n, uint32_t *off, df_error *err) {
    if (t->arena_n + n > UINT32_MAX)
        return df_fail(err, DF_ERR_FORMAT, "%s: token strings exceed 4 GiB", t->path);
    if (t->arena_n + n > t->arena_cap) {
        size_t c = t->arena_cap ? t->arena_cap : 4096;
        while (c < t->arena_n + n) c *= 2;
        t->arena = df_xrealloc(t->arena, c);
        t->arena_cap = c;
    }
    if (n) memcpy(t->arena + t->arena_n, p, n);
    *off = (uint32_t)t->arena_n;
    t->arena_n += n;
    return DF_OK;
}


/* Returns false if the key is already there. */
static bool vmap_put(df_tokenizer *t, int32_t id, uint32_t off, uint32_t len) {
    size_t i = hash_bytes(t->arena + off, len) & t->vmap_mask;
    for (;;) {
        vent *e = &t->vmap[i];
        if (e->id < 0) {
            e->id = id;
            e->off = off;
            e->len = len;
            return true;
        }
        if (e->len == len && memcmp(t->arena + e->off, t->arena + off, len) == 0) return false;
        i = (i + 1) & t->vmap_mask;
    }
}


/* A pair listed twice keeps its last rank, as HF's HashMap collect does. */
static void merge_put(df_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = hash_u64(k) & t->mmask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != k) i = (i + 1) & t->mmask;
    t->mkey[i] = k;
    t->mval[i] = (uint64_t)rank << 32 | (uint32_t)id;
}

static int32_t trie_node_new(trie *tr, uint8_t byte) {
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? tr->cap * 2 : 64;
        tr->nodes = df_xrealloc(tr->nodes, (size_t)tr->cap * sizeof *tr->nodes);
    }
    trie_node *nd = &tr->nodes[tr->n];
    nd->child = nd->sibling = nd->tok = -1;
    nd->byte = byte;
    return tr->n++;
}


/* First token with a given content wins (later duplicates are ignored). */
static void trie_add(trie *tr, const unsigned char *s, size_t n, int32_t tok) {
    if (tr->n == 0) trie_node_new(tr, 0);
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = trie_child(tr, node, s[i]);
        if (c < 0) {
            c = trie_node_new(tr, s[i]);
            tr->nodes[c].sibling = tr->nodes[node].child;
            tr->nodes[node].child = c;
        }
        node = c;
    }
    if (tr->nodes[node].tok < 0) tr->nodes[node].tok = tok;
    tr->first[s[0]] = 1;
}


/* Converts a string in the byte-level alphabet to raw bytes (out has room for n);
 * returns the byte count or -1 if some character is outside the alphabet. */
static long bl_to_raw(const df_tokenizer *t, const char *s, size_t n, unsigned char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= 512 || t->u2b[cp] < 0) return -1;
        out[o++] = (unsigned char)t->u2b[cp];
    }
    return (long)o;
}

/* ------------------------------------------------------------------------ */
/* pre-tokenizer regexes                                                    */

/* HF runs these patterns with Oniguruma, whose \s is Unicode White_Space. PCRE2's
 * \s (with UCP) also takes U+180E, so \s and \S are spelled out as classes. Inside
 * a class only \s can be inlined; a \S there is left to PCRE2. Returns a malloc'ed
 * NUL-terminated pattern. */
#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
               "\\x{202F}\\x{205F}\\x{3000}"
static char *rewrite_ws(const char *pat, size_t len) {
    size_t cap = len * 8 + 64, o = 0;
    char *q = df_xmalloc(cap);
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        size_t need = o + sizeof WS_SET + 8;
        if (need > cap) {
            cap = need * 2;
            q = df_xrealloc(q, cap);
        }
        char ch = pat[i];
        if (ch == '\\' && i + 1 < len) {
            char nx = pat[i + 1];
            i++;
            if (nx == 's' && in_class) {
                memcpy(q + o, WS_SET, sizeof WS_SET - 1);
                o += sizeof WS_SET - 1;
            } else if ((nx == 's' || nx == 'S') && !in_class) {
                o += (size_t)sprintf(q + o, "[%s%s]", nx == 'S' ? "^" : "", WS_SET);
            } else {
                q[o++] = ch;
                q[o++] = nx;
            }
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = true;
            q[o++] = ch;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < len && pat[i + 1] == '^') q[o++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']') q[o++] = pat[++i];
            continue;
        }
        if (in_class && ch == '[' && i + 1 < len && pat[i + 1] == ':') {
            /* POSIX class [:name:] inside a class: copy through its closing ':]' */
            const char *e = NULL;
            for (size_t j = i + 2; j + 1 < len; j++)
                if (pat[j] == ':' && pat[j + 1] == ']') {
                    e = pat + j;
                    break;
                }
            if (e) {
                size_t k = (size_t)(e - (pat + i)) + 2;
                if (o + k + 1 > cap) {
                    cap = (o + k + 1) * 2;
                    q = df_xrealloc(q, cap);
                }
                memcpy(q + o, pat + i, k);
                o += k;
                i += k - 1;
                continue;
            }
        }
        if (in_class && ch == ']') in_class = false;
        q[o++] = ch;
    }
    q[o] = 0;
    return q;
}

static int compile_regex(df_tokenizer *t, const char *pat, size_t len, uint32_t extra,
                         const char *where, pcre2_code **out, df_error *err) {
    int ec;
    PCRE2_SIZE eo;
    char *rw = extra & PCRE2_LITERAL ? NULL : rewrite_ws(pat, len);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(rw ? rw : pat), rw ? PCRE2_ZERO_TERMINATED : len,
                                   /* PCRE2_LITERAL refuses PCRE2_UCP (meaningless there) */
                                   PCRE2_UTF | (rw ? PCRE2_UCP : 0) | extra, &ec, &eo, NULL);
    free(rw);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: %s: PCRE2 cannot compile the pattern at offset %zu: %s", t->path,
                       where, (size_t)eo, (const char *)msg);
    }
    /* Without JIT (unavailable or failed) pcre2_match falls back to the interpreter. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return DF_OK;
}

/* Normalized added tokens are matched against normalized text, so their
 * content is normalized too (as HF does when it builds its matcher). */
static int build_tries(df_tokenizer *t, df_error *err) {
    for (int i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        const unsigned char *s = (const unsigned char *)t->arena + a->off;
        if (!a->normalized || t->n_norms == 0) {
            trie_add(a->normalized ? &t->tr_norm : &t->tr_raw, s, a->len, i);
            continue;
        }
        if (utf8_valid_prefix(s, a->len) != a->len)
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: added_tokens (id %d): normalized content is not valid UTF-8",
                           t->path, (int)a->id);
        char *nrm = NULL;
        size_t nn = 0;
        int rc = df_tok_normalize(t, (const char *)s, a->len, &nrm, &nn, err);
        if (rc) return rc;
        if (nn) trie_add(&t->tr_norm, nrm ? (unsigned char *)nrm : s, nn, i);
        free(nrm);
    }
    return DF_OK;
}

df_tokenizer *df_tok_new(const char *path) {
    df_tokenizer *t = df_xcalloc(1, sizeof *t);
    t->path = df_xstrdup(path);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    /* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest
     * are shifted to U+0100 onwards in byte order. */
    for (int u = 0; u < 512; u++) t->u2b[u] = -1;
    int shift = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t->b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + shift++);
        t->u2b[t->b2u[b]] = (int16_t)b;
    }
    return t;
}

/* The tables for tokenizer_json.c and tiktoken.c (tok_impl.h). */
int df_tok_arena_put(df_tokenizer *t, const void *p, size_t n, uint32_t *off, df_error *err) {
    return arena_put(t, p, n, off, err);
}
bool df_tok_vmap_put(df_tokenizer *t, int32_t id, uint32_t off, uint32_t len) {
    return vmap_put(t, id, off, len);
}
void df_tok_merge_put(df_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    merge_put(t, a, b, rank, id);
}
size_t df_tok_pow2(size_t n) { return pow2_at_least(n); }
int df_tok_compile_regex(df_tokenizer *t, const char *pat, size_t len, uint32_t extra, const char *where,
                         pcre2_code **out, df_error *err) {
    return compile_regex(t, pat, len, extra, where, out, err);
}
long df_tok_bl_to_raw(const df_tokenizer *t, const char *s, size_t n, unsigned char *out) {
    return bl_to_raw(t, s, n, out);
}
int df_tok_finish(df_tokenizer *t, df_error *err) { return build_tries(t, err); }

void df_tokenizer_free(df_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    free(t->path);
    free(t->dec_off);
    free(t->dec_len);
    free(t->arena);
    free(t->vmap);
    free(t->mkey);
    free(t->mval);
    free(t->added);
    free(t->tr_raw.nodes);
    free(t->tr_norm.nodes);
    free(t->chat_template);
    free(t);
}

int df_tokenizer_vocab_size(const df_tokenizer *t) { return t ? t->n_ids : 0; }

const char *df_tokenizer_chat_template(const df_tokenizer *t) { return t ? t->chat_template : NULL; }

int df_tokenizer_token_bytes(const df_tokenizer *t, int32_t id, const char **bytes,
                             size_t *len) {
    if (!t || id < 0 || id >= t->n_ids || t->dec_len[id] == UINT32_MAX) return -1;
    if (bytes) *bytes = t->arena + t->dec_off[id];
    if (len) *len = t->dec_len[id];
    return 0;
}

int32_t df_tokenizer_find(const df_tokenizer *t, const char *token) {
    if (!t || !token || !*token) return -1;
    size_t n = strlen(token);
    const trie *trs[2] = {&t->tr_raw, &t->tr_norm};
    for (int k = 0; k < 2; k++) {
        const trie *tr = trs[k];
        if (tr->n == 0) continue;
        int32_t node = 0;
        for (size_t i = 0; i < n && node >= 0; i++)
            node = trie_child(tr, node, (uint8_t)token[i]);
        if (node >= 0 && tr->nodes[node].tok >= 0) return t->added[tr->nodes[node].tok].id;
    }
    unsigned char *buf = df_xmalloc(n);
    long r = bl_to_raw(t, token, n, buf);
    int32_t id = r > 0 ? vmap_get(t, buf, (size_t)r) : -1;
    free(buf);
    return id;
}
