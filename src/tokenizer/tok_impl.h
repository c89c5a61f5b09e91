/*
 * tok_impl.h - the tokenizer's private tables and their look-ups, shared by
 * tokenizer.c (the tables, their life cycle, the pre-tokenizer regexes), the
 * two loaders that fill them (tokenizer_json.c: a Hugging Face tokenizer.json;
 * tiktoken.c: a tiktoken.model file with its tokenizer_config.json specials)
 * and the encoder every tokenizer uses (encode.c). Nothing outside
 * src/tokenizer/ includes this.
 */
#ifndef DF_TOK_IMPL_H
#define DF_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Ids beyond this are treated as hostile: tables are sized by the largest id. */
#define MAX_ID (1 << 24)
#define MAX_STEPS 8
#define MAX_NORMS 8
#define MAX_DEPTH 8

typedef struct pt_step {
    bool bytelevel;
    bool add_prefix_space; /* ByteLevel only */
    int behavior;          /* Split only */
    pcre2_code *re;        /* NULL: ByteLevel with use_regex false (no split) */
} pt_step;

typedef struct added_tok {
    int32_t id;
    uint32_t off, len; /* content in the arena */
    bool lstrip, rstrip, normalized;
    bool special; /* a control token: never matched inside plain spans */
} added_tok;

typedef struct trie_node {
    int32_t child, sibling, tok;
    uint8_t byte;
} trie_node;

/* Added-token contents; node 0 is the root. */
typedef struct trie {
    trie_node *nodes;
    int32_t n, cap;
    uint8_t first[256]; /* bytes that start some token: cheap skip while scanning */
} trie;

typedef struct vent {
    int32_t id; /* -1: empty slot */
    uint32_t off, len;
} vent;

struct df_tokenizer {
    char *path;
    int32_t n_ids;
    uint32_t *dec_off, *dec_len; /* by id; dec_len == UINT32_MAX: no such id */
    char *arena;
    size_t arena_n, arena_cap;
    vent *vmap; /* raw bytes -> model.vocab id */
    size_t vmap_mask;
    uint64_t *mkey; /* (left id << 32 | right id), UINT64_MAX: empty */
    uint64_t *mval; /* (rank << 32 | merged id) */
    size_t mmask;
    int32_t byte_id[256];
    uint32_t b2u[256];
    int16_t u2b[512];
    bool ignore_merges;
    int norms[MAX_NORMS];
    int n_norms;
    pt_step steps[MAX_STEPS];
    int n_steps;
    added_tok *added;
    int n_added;
    trie tr_raw, tr_norm;
    /* tiktoken.model: text is cut like tiktoken's Python wrappers do before the
     * specials and the regex see it (df_tok_tiktoken_cut) */
    bool tiktoken;
    /* tokenizer_config.json's chat_template (Jinja), or NULL (df_tokenizer_load_dir) */
    char *chat_template;
};

enum { BEH_ISOLATED, BEH_REMOVED };
enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD };

/* A tokenizer with no tables yet: the byte-level alphabet set up, no byte ids. */
df_tokenizer *df_tok_new(const char *path);
int df_tok_arena_put(df_tokenizer *t, const void *p, size_t n, uint32_t *off, df_error *err);
/* false when the bytes are already there */
bool df_tok_vmap_put(df_tokenizer *t, int32_t id, uint32_t off, uint32_t len);
void df_tok_merge_put(df_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
size_t df_tok_pow2(size_t n);
/* A pre-tokenizer pattern (Oniguruma/regex-crate \s semantics, see tokenizer.c);
 * extra: PCRE2 options (PCRE2_LITERAL for a Split's String pattern). */
int df_tok_compile_regex(df_tokenizer *t, const char *pat, size_t len, uint32_t extra, const char *where,
                         pcre2_code **out, df_error *err);
/* A token spelled in the byte-level alphabet as raw bytes (out holds n bytes);
 * -1 if a character is outside the alphabet. */
long df_tok_bl_to_raw(const df_tokenizer *t, const char *s, size_t n, unsigned char *out);
/* Added-token matchers, once the added tokens are in. */
int df_tok_finish(df_tokenizer *t, df_error *err);
/* s normalized by the tokenizer's normalizers (encode.c); *out is NULL when
 * the text is unchanged (then *out_n == n). */
int df_tok_normalize(const df_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n,
                     df_error *err);
/* Bytes of the next piece of text as tiktoken's Python wrappers cut it: at most
 * max_chars characters (what is left of the current 400,000-character slice),
 * and no run of more than 25,000 whitespace or non-whitespace characters;
 * *chars says how many characters the piece holds. */
size_t df_tok_tiktoken_cut(const unsigned char *p, size_t n, size_t max_chars, size_t *chars);
#define DF_TIKTOKEN_SLICE 400000
#define DF_TIKTOKEN_RUN 25000

/* ---- helpers shared by the tables (tokenizer.c) and the encoder (encode.c) */

static inline uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 31);
}

/* Length of the valid UTF-8 character at p (strict: no overlongs, surrogates or
 * values past U+10FFFF, the same rules PCRE2 checks), or 0. */
static inline size_t utf8_char(const unsigned char *p, size_t n) {
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

static inline uint32_t utf8_decode(const unsigned char *p, size_t k) {
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
static inline size_t utf8_valid_prefix(const unsigned char *p, size_t n) {
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
static inline bool is_ws(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static inline size_t ws_fwd(const unsigned char *p, size_t n) {
    size_t k = utf8_char(p, n);
    return k && is_ws(utf8_decode(p, k)) ? k : 0;
}

/* Whitespace character ending at p + n (looking back at most to p). */
static inline size_t ws_back(const unsigned char *p, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        const unsigned char *q = p + n - k;
        if ((*q & 0xC0) == 0x80) continue;
        return utf8_char(q, k) == k && is_ws(utf8_decode(q, k)) ? k : 0;
    }
    return 0;
}

/* ---- look-ups in the tables ---------------------------------------------- */

static inline int32_t vmap_get(const df_tokenizer *t, const void *p, size_t n) {
    size_t i = hash_bytes(p, n) & t->vmap_mask;
    for (;;) {
        const vent *e = &t->vmap[i];
        if (e->id < 0) return -1;
        if (e->len == n && memcmp(t->arena + e->off, p, n) == 0) return e->id;
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

static inline int32_t trie_child(const trie *tr, int32_t node, uint8_t b) {
    for (int32_t c = tr->nodes[node].child; c >= 0; c = tr->nodes[c].sibling)
        if (tr->nodes[c].byte == b) return c;
    return -1;
}

/* Longest token that starts at p; returns its index or -1. A special token (with
 * all_special: any token) counts only if it is at most special_max bytes long
 * (0: none, SIZE_MAX: any). */
static inline int32_t trie_longest(const trie *tr, const added_tok *added, bool all_special,
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

#endif
