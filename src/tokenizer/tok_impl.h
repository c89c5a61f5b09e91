/*
 * tok_impl.h - the tokenizer's private tables, shared by its two loaders:
 * tokenizer.c (tokenizer.json, and the encoder every tokenizer uses) and
 * tiktoken.c (a tiktoken.model file with its tokenizer_config.json specials).
 * Nothing outside src/tokenizer/ includes this.
 */
#ifndef DF_TOK_IMPL_H
#define DF_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <stdbool.h>

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
int32_t df_tok_vmap_get(const df_tokenizer *t, const void *p, size_t n);
/* false when the bytes are already there */
bool df_tok_vmap_put(df_tokenizer *t, int32_t id, uint32_t off, uint32_t len);
void df_tok_merge_put(df_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
bool df_tok_merge_get(const df_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id);
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
/* Bytes of the next piece of text as tiktoken's Python wrappers cut it: at most
 * max_chars characters (what is left of the current 400,000-character slice),
 * and no run of more than 25,000 whitespace or non-whitespace characters;
 * *chars says how many characters the piece holds. */
size_t df_tok_tiktoken_cut(const unsigned char *p, size_t n, size_t max_chars, size_t *chars);
#define DF_TIKTOKEN_SLICE 400000
#define DF_TIKTOKEN_RUN 25000

#endif
