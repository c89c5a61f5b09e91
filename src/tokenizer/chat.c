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
    rc = df_tokenizer_encode_spans(t, text, strlen(text), sp, nsp, ids, n_ids, err);
    free(text);
    free(sp);
    return rc;
}
