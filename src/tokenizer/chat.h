/*
 * chat.h - the Qwen3 chat template (system/user/assistant turns, enable_thinking).
 */
#ifndef DF_CHAT_H
#define DF_CHAT_H

#include "deltafin.h"

/* Renders messages; *out malloc'ed. Unknown roles are an error naming the role. */
int df_chat_render_qwen3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                         int enable_thinking, char **out, df_error *err);

#endif
