/*
 * tokenizer.c - byte-level BPE: the tables that tokenizer_json.c (a Hugging
 * Face tokenizer.json) and tiktoken.c (tiktoken.model) fill, and the encoder.
 *
 * Owns: normalizers (utf8proc), pre-tokenizer regexes (PCRE2 with Unicode
 * properties and JIT), the GPT-2 byte<->unicode alphabet, the vocab and merge
 * hash tables, added-token matching, the BPE merge loop and id -> raw bytes
 * decoding.
 *
 * The encode pipeline follows HF tokenizers' order so results match it exactly:
 *   1. added tokens with normalized=false are cut out of the raw text
 *      (leftmost-longest, lstrip/rstrip honoured);
 *   2. each remaining piece is normalized, then cut by normalized=true added tokens;
 *   3. the pre-tokenizer steps split each piece (Split regexes, ByteLevel);
 *   4. every pre-token is merged by BPE (ignore_merges: a pre-token that is itself
 *      in the vocab maps straight to its id).
 * Plain spans (df_tokenizer_encode_spans, used for chat message content) switch
 * off special added tokens in steps 1-2 inside them; everything else runs over
 * the whole text as one string, so ids change only where special-token text
 * lies in a span. Encoding spans separately would not do: a pre-tokenizer whose
 * pattern groups runs of newlines joins "\n" + "\n\n" across the edge of
 * "user\n" and content into one token.
 * Internally everything is raw bytes: vocab strings are converted out of the
 * byte-level alphabet once at load, so encoding never maps characters.
 *
 * Text that is not valid UTF-8 cannot be normalized or fed to a UTF-8 regex; such
 * byte runs bypass steps 2-3 and go to BPE as their own pre-tokens, so encoding
 * never fails on it and decoding still gives the bytes back.
 *
 * A loaded tokenizer is read-only: all per-call state lives in enc_ctx, so one
 * tokenizer may be used from several threads at once.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_impl.h"

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------ */
/* small helpers                                                            */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 31);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Length of the valid UTF-8 character at p (strict: no overlongs, surrogates or
 * values past U+10FFFF, the same rules PCRE2 checks), or 0. */
static size_t utf8_char(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;
        if (c == 0xED && p[1] >= 0xA0) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static uint32_t utf8_decode(const unsigned char *p, size_t k) {
    switch (k) {
    case 1: return p[0];
    case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default:
        return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
               (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    }
}

/* Length of the longest valid UTF-8 prefix of p. */
static size_t utf8_valid_prefix(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_char(p + i, n - i);
        if (!k) break;
        i += k;
    }
    return i;
}

/* Unicode White_Space (Rust's char::is_whitespace, used by HF for lstrip/rstrip). */
static bool is_ws(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static size_t ws_fwd(const unsigned char *p, size_t n) {
    size_t k = utf8_char(p, n);
    return k && is_ws(utf8_decode(p, k)) ? k : 0;
}

/* Whitespace character ending at p + n (looking back at most to p). */
static size_t ws_back(const unsigned char *p, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        const unsigned char *q = p + n - k;
        if ((*q & 0xC0) == 0x80) continue;
        return utf8_char(q, k) == k && is_ws(utf8_decode(q, k)) ? k : 0;
    }
    return 0;
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

static int32_t vmap_get(const df_tokenizer *t, const void *p, size_t n) {
    size_t i = hash_bytes(p, n) & t->vmap_mask;
    for (;;) {
        const vent *e = &t->vmap[i];
        if (e->id < 0) return -1;
        if (e->len == n && memcmp(t->arena + e->off, p, n) == 0) return e->id;
        i = (i + 1) & t->vmap_mask;
    }
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

static inline bool merge_get(const df_tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *id) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = hash_u64(k) & t->mmask;
    for (;;) {
        uint64_t kk = t->mkey[i];
        if (kk == k) {
            *rank = (uint32_t)(t->mval[i] >> 32);
            *id = (int32_t)(uint32_t)t->mval[i];
            return true;
        }
        if (kk == UINT64_MAX) return false;
        i = (i + 1) & t->mmask;
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

static int32_t trie_child(const trie *tr, int32_t node, uint8_t b) {
    for (int32_t c = tr->nodes[node].child; c >= 0; c = tr->nodes[c].sibling)
        if (tr->nodes[c].byte == b) return c;
    return -1;
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

/* Longest token that starts at p; returns its index or -1. A special token (with
 * all_special: any token) counts only if it is at most special_max bytes long
 * (0: none, SIZE_MAX: any). */
static int32_t trie_longest(const trie *tr, const added_tok *added, bool all_special,
                            const unsigned char *p, size_t n, size_t special_max, size_t *len) {
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        node = trie_child(tr, node, p[i]);
        if (node < 0) break;
        int32_t tok = tr->nodes[node].tok;
        if (tok >= 0 && (!(all_special || added[tok].special) || i + 1 <= special_max)) {
            best = tok;
            *len = i + 1;
        }
    }
    return best;
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

static int normalize(const df_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n,
                     df_error *err);

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
        int rc = normalize(t, (const char *)s, a->len, &nrm, &nn, err);
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
int32_t df_tok_vmap_get(const df_tokenizer *t, const void *p, size_t n) {
    return vmap_get(t, p, n);
}
bool df_tok_vmap_put(df_tokenizer *t, int32_t id, uint32_t off, uint32_t len) {
    return vmap_put(t, id, off, len);
}
void df_tok_merge_put(df_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    merge_put(t, a, b, rank, id);
}
bool df_tok_merge_get(const df_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    return merge_get(t, a, b, rank, id);
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

/* ------------------------------------------------------------------------ */
/* encoding                                                                 */

typedef struct enc_ctx {
    const df_tokenizer *t;
    df_error *err;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    /* BPE scratch, grown to the longest pre-token seen */
    int32_t *sym, *nxt, *prv;
    uint64_t *heap;
    size_t scap;
    /* Special added tokens are plain text inside these spans of the input (sorted,
     * non-empty); raw pieces are located in the input by their offset from text. */
    const char *text;
    const df_text_span *plain;
    size_t n_plain;
    bool norm_special; /* the piece being normalized may match special tokens */
    bool norm_in_text; /* normalizing left it unchanged: it still lies in text */
    bool all_plain;    /* DF_TOK_PLAIN_ALL: no added token at all inside plain spans */
} enc_ctx;

/* Index of the first plain span ending after offset off (n_plain: none). */
static size_t plain_after(const enc_ctx *c, size_t off) {
    size_t lo = 0, hi = c->n_plain;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->plain[mid].off + c->plain[mid].len > off) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Longest special token that may start at input offset off: none inside a plain
 * span, and none reaching into the next one. */
static size_t special_room(const enc_ctx *c, size_t off) {
    if (c->n_plain == 0) return SIZE_MAX;
    size_t k = plain_after(c, off);
    if (k == c->n_plain) return SIZE_MAX;
    return c->plain[k].off <= off ? 0 : c->plain[k].off - off;
}

static bool overlaps_plain(const enc_ctx *c, size_t off, size_t n) {
    size_t k = plain_after(c, off);
    return k < c->n_plain && c->plain[k].off < off + n;
}

static void emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 256;
        c->ids = df_xrealloc(c->ids, c->cap * sizeof *c->ids);
    }
    c->ids[c->n++] = id;
}

/* Min-heap of (rank << 32 | position): lowest rank first, leftmost on ties, the
 * order HF's Word::merge_all uses. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        if (l + 1 < m && h[l + 1] < h[l]) l++;
        if (h[l] >= v) break;
        h[i] = h[l];
        i = l;
    }
    if (m) h[i] = v;
    return top;
}

static void push_pair(enc_ctx *c, size_t *hn, int32_t pos) {
    int32_t r = c->nxt[pos];
    uint32_t rank;
    int32_t id;
    if (r >= 0 && merge_get(c->t, c->sym[pos], c->sym[r], &rank, &id))
        heap_push(c->heap, hn, (uint64_t)rank << 32 | (uint32_t)pos);
}

static int bpe_word(enc_ctx *c, const unsigned char *p, size_t n) {
    const df_tokenizer *t = c->t;
    if (n == 0) return DF_OK;
    if (n == 1) {
        emit(c, t->byte_id[p[0]]);
        return DF_OK;
    }
    if (t->ignore_merges) {
        int32_t id = vmap_get(t, p, n);
        if (id >= 0) {
            emit(c, id);
            return DF_OK;
        }
    }
    if (n > INT32_MAX)
        return df_fail(c->err, DF_ERR_ARG, "%s: pre-token of %zu bytes is too long", t->path, n);
    if (n > c->scap) {
        size_t cap = n < 64 ? 64 : n;
        c->sym = df_xrealloc(c->sym, cap * sizeof *c->sym);
        c->nxt = df_xrealloc(c->nxt, cap * sizeof *c->nxt);
        c->prv = df_xrealloc(c->prv, cap * sizeof *c->prv);
        /* Each merge pushes at most two entries: n initial + 2 per merge. */
        c->heap = df_xrealloc(c->heap, 3 * cap * sizeof *c->heap);
        c->scap = cap;
    }
    int32_t *sym = c->sym, *nxt = c->nxt, *prv = c->prv;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[p[i]];
        nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prv[i] = (int32_t)i - 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(c, &hn, (int32_t)i);
    while (hn) {
        uint64_t top = heap_pop(c->heap, &hn);
        int32_t pos = (int32_t)(uint32_t)top, r = nxt[pos];
        uint32_t rank;
        int32_t id;
        /* Stale entries: the left symbol died or either side changed. Ranks are
         * unique per pair, so an equal rank means the very same pair. */
        if (sym[pos] < 0 || r < 0 || !merge_get(t, sym[pos], sym[r], &rank, &id) ||
            rank != (uint32_t)(top >> 32))
            continue;
        sym[pos] = id;
        sym[r] = -1;
        nxt[pos] = nxt[r];
        if (nxt[r] >= 0) prv[nxt[r]] = pos;
        if (prv[pos] >= 0) push_pair(c, &hn, prv[pos]);
        push_pair(c, &hn, pos);
    }
    for (int32_t i = 0; i >= 0; i = nxt[i]) emit(c, sym[i]);
    return DF_OK;
}

static int pretok(enc_ctx *c, const char *p, size_t n, int k);

static int regex_split(enc_ctx *c, const pt_step *st, const char *p, size_t n, int k) {
    size_t pos = 0, prev = 0;
    while (pos < n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             c->md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return df_fail(c->err, DF_ERR_UNSUPPORTED, "%s: pre-tokenizer regex failed: %s",
                           c->t->path, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* empty match: step one character, like find_iter */
            if (s >= n) break;
            size_t adv = utf8_char((const unsigned char *)p + s, n - s);
            pos = s + (adv ? adv : 1);
            continue;
        }
        int r = DF_OK;
        if (s > prev) r = pretok(c, p + prev, s - prev, k + 1);
        if (!r && st->behavior == BEH_ISOLATED) r = pretok(c, p + s, e - s, k + 1);
        if (r) return r;
        prev = pos = e;
    }
    return prev < n ? pretok(c, p + prev, n - prev, k + 1) : DF_OK;
}

static int pretok(enc_ctx *c, const char *p, size_t n, int k) {
    const df_tokenizer *t = c->t;
    if (n == 0) return DF_OK;
    if (k == t->n_steps) return bpe_word(c, (const unsigned char *)p, n);
    const pt_step *st = &t->steps[k];
    if (st->bytelevel && st->add_prefix_space && p[0] != ' ') {
        char *q = df_xmalloc(n + 1);
        q[0] = ' ';
        memcpy(q + 1, p, n);
        int rc = st->re ? regex_split(c, st, q, n + 1, k) : pretok(c, q, n + 1, k + 1);
        free(q);
        return rc;
    }
    return st->re ? regex_split(c, st, p, n, k) : pretok(c, p, n, k + 1);
}

/* Normalizes valid UTF-8; *out is NULL when the text is unchanged. */
static int normalize(const df_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n,
                     df_error *err) {
    *out = NULL;
    *out_n = n;
    char *cur = NULL;
    for (int i = 0; i < t->n_norms && n > 0; i++) {
        const unsigned char *src = cur ? (unsigned char *)cur : (const unsigned char *)s;
        /* Fast paths: ASCII is invariant under every normal form; every code point
         * below U+0300 is NFC_Quick_Check=Yes and none combines with what precedes it
         * (UTF-8 lead bytes >= 0xCC start U+0300 and up). */
        unsigned char lim = t->norms[i] == NORM_NFC ? 0xCC : 0x80;
        size_t j = 0;
        while (j < n && src[j] < lim) j++;
        if (j == n) continue;
        utf8proc_option_t opt = UTF8PROC_STABLE;
        switch (t->norms[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map(src, (utf8proc_ssize_t)n, &dst, opt);
        if (r < 0) {
            free(cur);
            return df_fail(err, r == UTF8PROC_ERROR_NOMEM ? DF_ERR_NOMEM : DF_ERR_ARG,
                           "%s: normalizer: %s", t->path, utf8proc_errmsg(r));
        }
        free(cur);
        cur = (char *)dst;
        n = (size_t)r;
    }
    *out = cur;
    *out_n = n;
    return DF_OK;
}

typedef int (*seg_fn)(enc_ctx *c, const char *p, size_t n);

/* Cuts added tokens out of p (leftmost-longest) and hands the rest to fn. A
 * special token is cut only where plain spans allow it (see enc_ctx); where they
 * do not, the longest other token that matches there is taken, or none. */
static int split_added(enc_ctx *c, const trie *tr, const char *p, size_t n, seg_fn fn) {
    if (tr->n == 0) return fn(c, p, n);
    const unsigned char *u = (const unsigned char *)p;
    /* p lies in the input (not normalized, or unchanged by it) */
    bool raw = tr == &c->t->tr_raw || c->norm_in_text;
    size_t cur = 0, i = 0;
    while (i < n) {
        if (!tr->first[u[i]]) {
            i++;
            continue;
        }
        size_t mlen = 0;
        size_t room = raw ? special_room(c, (size_t)(p - c->text) + i)
                          : c->norm_special ? SIZE_MAX : 0;
        int32_t tok = trie_longest(tr, c->t->added, c->all_plain, u + i, n - i, room, &mlen);
        if (tok < 0) {
            i++;
            continue;
        }
        const added_tok *a = &c->t->added[tok];
        size_t s = i, e = i + mlen, w;
        if (a->lstrip)
            while (s > cur && (w = ws_back(u + cur, s - cur))) s -= w;
        if (a->rstrip)
            while (e < n && (w = ws_fwd(u + e, n - e))) e += w;
        if (s > cur) {
            int rc = fn(c, p + cur, s - cur);
            if (rc) return rc;
        }
        emit(c, a->id);
        cur = i = e;
    }
    return cur < n ? fn(c, p + cur, n - cur) : DF_OK;
}

static int seg_pretok(enc_ctx *c, const char *p, size_t n) { return pretok(c, p, n, 0); }

static int seg_valid(enc_ctx *c, const char *p, size_t n) {
    /* Normalizing moves offsets, so a piece that touches a plain span matches no
     * normalized special token anywhere (tokenizers mark them normalized: false). */
    c->norm_special = !overlaps_plain(c, (size_t)(p - c->text), n);
    char *nrm;
    size_t nn;
    int rc = normalize(c->t, p, n, &nrm, &nn, c->err);
    if (rc) return rc;
    /* Unchanged text keeps its offsets, so spans can be honoured token by token.
     * Only for DF_TOK_PLAIN_ALL, whose templates' role markers may be normalized
     * added tokens (DeepSeek-V3); the default keeps its whole-piece rule. */
    c->norm_in_text = nrm == NULL && c->all_plain;
    rc = split_added(c, &c->t->tr_norm, nrm ? nrm : p, nn, seg_pretok);
    c->norm_in_text = false;
    free(nrm);
    return rc;
}

static int seg_raw(enc_ctx *c, const char *p, size_t n) {
    const unsigned char *u = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        size_t v = utf8_valid_prefix(u + i, n - i);
        if (v) {
            int rc = seg_valid(c, p + i, v);
            if (rc) return rc;
            i += v;
        }
        size_t j = i;
        while (j < n && !utf8_char(u + j, n - j)) j++;
        if (j > i) {
            int rc = bpe_word(c, u + i, j - i);
            if (rc) return rc;
            i = j;
        }
    }
    return DF_OK;
}

/* Plain spans must be sorted, apart and inside the text; the non-empty ones are
 * copied to *out (malloc'ed, NULL when there are none). */
static int check_spans(const df_text_span *sp, size_t n_sp, size_t len, df_text_span **out,
                       size_t *n_out, df_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!sp && n_sp)
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_encode_spans: plain: NULL with %zu spans",
                       n_sp);
    size_t end = 0;
    for (size_t i = 0; i < n_sp; i++) {
        if (sp[i].off < end || sp[i].off > len || sp[i].len > len - sp[i].off) {
            free(*out);
            *out = NULL;
            *n_out = 0;
            return df_fail(err, DF_ERR_ARG,
                           "df_tokenizer_encode_spans: plain[%zu] (offset %zu, %zu bytes) is %s",
                           i, sp[i].off, sp[i].len,
                           sp[i].off < end ? "out of order or overlaps the one before"
                                           : "not inside the text");
        }
        end = sp[i].off + sp[i].len;
        if (sp[i].len == 0) continue;
        if (!*out) *out = df_xmalloc(n_sp * sizeof **out);
        (*out)[(*n_out)++] = sp[i];
    }
    return DF_OK;
}

int df_tokenizer_encode(const df_tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *n, df_error *err) {
    return df_tokenizer_encode_plain(t, text, len, NULL, 0, 0, ids, n, err);
}

int df_tokenizer_encode_spans(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, int32_t **ids,
                              size_t *n, df_error *err) {
    return df_tokenizer_encode_plain(t, text, len, plain, n_plain, 0, ids, n, err);
}

/* tiktoken's Python wrappers (Llama 3's and Kimi's tokenizer classes) cut the
 * text into slices and runs before tiktoken sees it, specials included: a token
 * never spans a cut. */
static int encode_tiktoken(enc_ctx *c, const char *text, size_t len) {
    size_t off = 0, left = DF_TIKTOKEN_SLICE;
    while (off < len) {
        if (left == 0) left = DF_TIKTOKEN_SLICE;
        size_t chars;
        size_t k = df_tok_tiktoken_cut((const unsigned char *)text + off, len - off, left, &chars);
        left -= chars;
        int rc = split_added(c, &c->t->tr_raw, text + off, k, seg_raw);
        if (rc) return rc;
        off += k;
    }
    return DF_OK;
}

int df_tokenizer_encode_plain(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, unsigned flags,
                              int32_t **ids, size_t *n, df_error *err) {
    if (!t || !ids || !n || (!text && len))
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    enc_ctx c = {.t = t, .err = err, .text = text, .all_plain = flags & DF_TOK_PLAIN_ALL};
    df_text_span *sp;
    int rc = check_spans(plain, n_plain, len, &sp, &c.n_plain, err);
    if (rc) return rc;
    c.plain = sp;
    if (len) {
        c.md = pcre2_match_data_create(1, NULL);
        c.mctx = pcre2_match_context_create(NULL);
        c.js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!c.md || !c.mctx) {
            rc = df_fail(err, DF_ERR_NOMEM, "%s: out of memory for regex matching", t->path);
            goto out;
        }
        if (c.js) pcre2_jit_stack_assign(c.mctx, NULL, c.js);
        rc = t->tiktoken ? encode_tiktoken(&c, text, len)
                         : split_added(&c, &t->tr_raw, text, len, seg_raw);
    }
out:
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.js);
    free(c.sym);
    free(c.nxt);
    free(c.prv);
    free(c.heap);
    free(sp);
    if (rc) {
        free(c.ids);
        return rc;
    }
    *ids = c.ids ? c.ids : df_xmalloc(sizeof(int32_t));
    *n = c.n;
    return DF_OK;
}
