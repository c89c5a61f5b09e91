/*
 * chat.h - chat templates (system/user/assistant turns, enable_thinking),
 * rendered to text, or to token ids with message content encoded as plain text.
 * Which template a model uses is its architecture's (model/arch.h).
 */
#ifndef DF_CHAT_H
#define DF_CHAT_H

#include "deltafin.h"
#include "tokenizer/tokenizer.h"

/* A chat template: renders messages into *out (malloc'ed) and, when content
 * is non-NULL, says where message content lies (*content malloc'ed, NULL when
 * there is none, *n_content sorted non-empty spans; every other byte is the
 * template's). Unknown roles are an error naming the role. */
typedef int (*df_chat_template_fn)(const df_chat_msg *msgs, int n, int add_generation_prompt,
                                   int enable_thinking, char **out, df_text_span **content,
                                   size_t *n_content, df_error *err);

/* ChatML with a think block (df_chat_template_fn), and the same without spans. */
int df_chat_render_chatml(const df_chat_msg *msgs, int n, int add_generation_prompt,
                          int enable_thinking, char **out, df_error *err);
int df_chat_render_chatml_spans(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err);
/* DeepSeek-V3, DeepSeek-R1 (opens the answer with <think>) and Kimi K2 (a default
 * system message when the conversation has none); enable_thinking is ignored.
 * df_chat_tokenize_with keeps every added token's text plain in their content. */
int df_chat_render_deepseek_v3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err);
/* DeepSeek-V2/V2-Lite-Chat: "User: C\n\n", "Assistant: C" EOS (system, user,
 * assistant roles only). */
int df_chat_render_deepseek_v2(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err);
int df_chat_render_deepseek_r1(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err);
/* Kimi K2's, also Kimi-Linear's: the default system message goes first when the
 * first message is no system message. */
int df_chat_render_kimi_k2(const df_chat_msg *msgs, int n, int add_generation_prompt,
                           int enable_thinking, char **out, df_text_span **content,
                           size_t *n_content, df_error *err);
#define DF_CHAT_KIMI_DEFAULT_SYSTEM "You are Kimi, an AI assistant created by Moonshot AI."
/* Kimi K3's XTML: <|open|>message role="user"<|sep|>C<|close|>message<|sep|><|end_of_msg|>.
 * enable_thinking is also the thinking effort (deltafin.h DF_THINK_*: on = max),
 * stated in a system message first; the generation prompt opens the assistant
 * message and its think element (response when thinking is off). Tool messages
 * are refused (they need a tool name). */
int df_chat_render_kimi_k3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                           int enable_thinking, char **out, df_text_span **content,
                           size_t *n_content, df_error *err);
/* An XTML attribute value escaped as K3's encoder does (& and " only), malloc'ed. */
char *df_chat_xtml_escape(const char *value);
/* The template a checkpoint uses: its family's (model/arch.h), or the variant
 * that the checkpoint's own Jinja (tokenizer_config.json's chat_template, NULL
 * if none) shows it to be: DeepSeek-R1's for DeepSeek-V3's when the generation
 * prompt opens <think>\n; DeepSeek-V3's for DeepSeek-V2's when it writes
 * <｜User｜> (DeepSeek-V2.5); Kimi K3's for Kimi K2's when it writes <|open|>. */
df_chat_template_fn df_chat_template_for(df_chat_template_fn family, const char *jinja);
/* The same for a checkpoint's tokenizer: its chat_template, or, when it has
 * none, its specials (Kimi K3's <|open|> and <|end_of_msg|> without Kimi K2's
 * <|im_user|> give Kimi K3's template for Kimi K2's). */
df_chat_template_fn df_chat_template_for_tokenizer(df_chat_template_fn family, const df_tokenizer *t);
/* "DeepSeek-R1" and the like, for `deltafin inspect`. */
const char *df_chat_template_name(df_chat_template_fn t);
/* The conversation rendered by tmpl, as token ids (*ids malloc'ed): special tokens come
 * from the template only; in message content their text is ordinary text
 * (df_tokenizer_encode_spans). */
int df_chat_tokenize_with(const df_tokenizer *t, df_chat_template_fn tmpl, const df_chat_msg *msgs, int n,
                          int add_generation_prompt, int enable_thinking, int32_t **ids, size_t *n_ids,
                          df_error *err);

#endif
