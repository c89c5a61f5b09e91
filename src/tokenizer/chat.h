/*
 * chat.h - the Qwen3 chat template (system/user/assistant turns, enable_thinking),
 * rendered to text, or to token ids with message content encoded as plain text.
 */
#ifndef DF_CHAT_H
#define DF_CHAT_H

#include "deltafin.h"
#include "tokenizer/tokenizer.h"

/* Renders messages; *out malloc'ed. Unknown roles are an error naming the role. */
int df_chat_render_qwen3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                         int enable_thinking, char **out, df_error *err);
/* Same, and where message content lies in *out: *content (malloc'ed, NULL when
 * there is none) gets *n_content sorted, non-empty spans; every other byte is
 * the template's. */
int df_chat_render_qwen3_spans(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err);
/* The rendered conversation as token ids (*ids malloc'ed): special tokens come
 * from the template only; in message content their text is ordinary text
 * (df_tokenizer_encode_spans). */
int df_chat_tokenize_qwen3(const df_tokenizer *t, const df_chat_msg *msgs, int n,
                           int add_generation_prompt, int enable_thinking, int32_t **ids,
                           size_t *n_ids, df_error *err);

#endif
