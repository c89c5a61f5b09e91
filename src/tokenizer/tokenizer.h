/*
 * tokenizer.h - byte-level BPE driven entirely by a Hugging Face tokenizer.json
 * (or a tiktoken.model, see df_tokenizer_load_tiktoken):
 * NFC normalizer, split regex (PCRE2, Unicode properties, JIT), byte-level
 * mapping, merges (both list formats), added/special tokens matched before
 * splitting (special ones only outside the caller's plain spans), and decoding
 * back to raw bytes.
 */
#ifndef DF_TOKENIZER_H
#define DF_TOKENIZER_H

#include "util/util.h"

typedef struct df_tokenizer df_tokenizer;

int df_tokenizer_load(df_tokenizer **out, const char *path, df_error *err);
/* Same from memory (path only names the file in errors). */
int df_tokenizer_load_mem(df_tokenizer **out, const char *json, size_t len,
                          const char *path, df_error *err);
void df_tokenizer_free(df_tokenizer *t);
int df_tokenizer_vocab_size(const df_tokenizer *t); /* max id + 1 */
/* Every added token in the text is recognised, control tokens included. *ids
 * malloc'ed. */
int df_tokenizer_encode(const df_tokenizer *t, const char *text, size_t len,
                        int32_t **ids, size_t *n, df_error *err);

/* A byte range [off, off + len) of a text. */
typedef struct df_text_span {
    size_t off, len;
} df_text_span;

/* Same, except that inside the plain spans (sorted, not overlapping; empty ones
 * are ignored) the text of a special added token ("special": true in
 * tokenizer.json: <|im_start|>, <|im_end|>, <|endoftext|>...) is ordinary text,
 * and no special token reaching into a span is matched. Non-special added tokens
 * (a chat model's <think>, <tool_call>...) are matched everywhere, as Hugging Face does
 * with split_special_tokens. The text is still encoded as one string, so the ids
 * equal df_tokenizer_encode's whenever no special-token text lies in a span. */
int df_tokenizer_encode_spans(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, int32_t **ids,
                              size_t *n, df_error *err);
/* Same with flags: DF_TOK_PLAIN_ALL makes every added token plain text inside the
 * spans, special or not (chat templates whose role markers are non-special added
 * tokens, as DeepSeek-V3's <｜User｜>). */
#define DF_TOK_PLAIN_ALL 1u
int df_tokenizer_encode_plain(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, unsigned flags,
                              int32_t **ids, size_t *n, df_error *err);
/* A checkpoint directory's tokenizer: tokenizer.json, or else tiktoken.model
 * (with the specials of tokenizer_config.json and the Kimi pre-tokenizer); and
 * tokenizer_config.json's chat_template, when there is one. */
int df_tokenizer_load_dir(df_tokenizer **out, const char *dir, df_error *err);
/* The chat_template (Jinja text) of the directory's tokenizer_config.json, or
 * NULL: deltafin renders its own templates (chat.h); this only tells variants
 * of a family's template apart (df_chat_template_for). */
const char *df_tokenizer_chat_template(const df_tokenizer *t);
/* A tiktoken.model file ("base64(bytes) rank" per line, ranks 0..N-1): BPE that
 * merges the adjacent pair whose concatenation has the lowest rank, leftmost on
 * ties. config (NULL: none) is a tokenizer_config.json whose added_tokens_decoder
 * names the special ids from N on; the 256 ids N..N+255 not named there are
 * <|reserved_token_ID|>. pattern (NULL: DF_TIKTOKEN_KIMI_PATTERN) is the split
 * regex in PCRE2 syntax. */
int df_tokenizer_load_tiktoken(df_tokenizer **out, const char *path, const char *config,
                               const char *pattern, df_error *err);
/* Same from memory (path and config_path name the files in errors). */
int df_tokenizer_load_tiktoken_mem(df_tokenizer **out, const char *model, size_t model_len,
                                   const char *path, const char *config, size_t config_len,
                                   const char *config_path, const char *pattern, df_error *err);
/* Kimi's pre-tokenizer regex (tokenization_kimi.py) in PCRE2: its class
 * intersections [X&&[^\p{Han}]] are written (?:(?!\p{sc=Han})[X]), and \p{Han} is
 * the Script property as in the Rust regex crate (PCRE2's bare \p{Han} would
 * take Script_Extensions). */
extern const char DF_TIKTOKEN_KIMI_PATTERN[];
/* The Llama 3 pattern (Meta's tokenizer.py), for tiktoken.model files of Llama 3. */
extern const char DF_TIKTOKEN_LLAMA3_PATTERN[];
/* Raw bytes of one token; returns -1 for an unknown id. */
int df_tokenizer_token_bytes(const df_tokenizer *t, int32_t id, const char **bytes,
                             size_t *len);
/* Id of an exact token string (vocab or added token), or -1. */
int32_t df_tokenizer_find(const df_tokenizer *t, const char *token);

#endif
