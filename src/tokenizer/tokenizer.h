/*
 * tokenizer.h - byte-level BPE driven entirely by a Hugging Face tokenizer.json:
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
/* Raw bytes of one token; returns -1 for an unknown id. */
int df_tokenizer_token_bytes(const df_tokenizer *t, int32_t id, const char **bytes,
                             size_t *len);
/* Id of an exact token string (vocab or added token), or -1. */
int32_t df_tokenizer_find(const df_tokenizer *t, const char *token);

#endif
