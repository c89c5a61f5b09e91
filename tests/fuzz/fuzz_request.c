/*
 * fuzz_request.c - libFuzzer target for the server's request parser/validator
 * (src/server/request.c). The first byte picks the endpoint (completions or
 * chat), the rest is the body. Accepted requests must satisfy the invariants
 * the worker relies on; rejected ones must name a reason. An accepted chat request
 * is then rendered through the chat template with its content spans, as the server
 * does before tokenizing (its content may hold any <think> and </think> tags and
 * special-token text): either it renders, every system, user and tool message's
 * content verbatim in a content span of its own (where the tokenizer will see no
 * control token) and the generation prompt last, or it is refused with a message.
 * ASan/UBSan catch the rest (leaks included: every path must free what it parsed).
 */
#include "server/request.h"
#include "tokenizer/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[600];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "\"model\"", "\"prompt\"", "\"messages\"", "\"role\"", "\"content\"", "\"system\"", "\"user\"",
    "\"assistant\"", "\"developer\"", "\"tool\"", "\"type\"", "\"text\"", "\"max_tokens\"",
    "\"max_completion_tokens\"", "\"temperature\"", "\"top_p\"", "\"seed\"", "\"stop\"", "\"stream\"",
    "\"stream_options\"", "\"include_usage\"", "\"n\"", "\"logprobs\"", "\"top_logprobs\"",
    "\"presence_penalty\"", "\"frequency_penalty\"", "\"tools\"", "\"tool_choice\"",
    "\"response_format\"", "\"json_object\"", "\"chat_template_kwargs\"", "\"enable_thinking\"",
    "\"user\"", "\"logit_bias\"", "\"echo\"", "\"suffix\"", "\"best_of\"", "null", "true", "false",
    "[1,2,3]", "[\"a\",\"b\",\"c\",\"d\",\"e\"]", "\"\\u0000\"", "\"\\ud800\"", "\xff", "1e999",
    "<|im_end|>", "<|im_start|>", "<think>", "</think>",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

/* Content spans sorted, non-empty and inside the text; every turn but the
 * assistant's (whose reasoning is split off) verbatim in one, in order. */
static void check_spans(const df_chat_msg *m, int n, const char *text, const df_text_span *sp,
                        size_t nsp) {
    size_t len = strlen(text), end = 0, k = 0;
    for (size_t i = 0; i < nsp; i++) {
        if (sp[i].off < end || sp[i].len == 0 || sp[i].len > len - sp[i].off) abort();
        end = sp[i].off + sp[i].len;
    }
    for (int i = 0; i < n; i++) {
        size_t cl = strlen(m[i].content);
        if (strcmp(m[i].role, "assistant") == 0 || cl == 0) continue;
        while (k < nsp && !(sp[k].len == cl && memcmp(text + sp[k].off, m[i].content, cl) == 0)) k++;
        if (k++ == nsp) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int kind = data[0] & 1 ? SRV_CHAT : SRV_COMPLETIONS;
    srv_request r;
    srv_error e;
    if (srv_parse_request(kind, (const char *)data + 1, size - 1, &r, &e)) {
        if (!e.message[0]) abort();
        /* names and values vary (the field may be the client's own); the message start does not */
        snprintf(outcome, sizeof outcome, "%d %.24s", kind, e.message);
        char *j = srv_error_json(e.message, "invalid_request_error", e.param);
        if (!j) abort();
        free(j);
        srv_request_free(&r);
        return 0;
    }
    if (kind == SRV_CHAT) {
        if (!r.msgs || r.n_msgs < 1) abort();
        for (int i = 0; i < r.n_msgs; i++)
            if (!r.msgs[i].role || !r.msgs[i].content) abort();
        df_chat_msg *m = calloc((size_t)r.n_msgs, sizeof *m);
        if (!m) abort();
        for (int i = 0; i < r.n_msgs; i++) m[i] = (df_chat_msg){r.msgs[i].role, r.msgs[i].content};
        char *text = NULL;
        df_text_span *sp = NULL;
        size_t nsp = 0;
        df_error err = {0};
        int think = r.enable_thinking != 0;
        int rc = df_chat_render_chatml_spans(m, r.n_msgs, 1, think, &text, &sp, &nsp, &err);
        if (rc == DF_OK) {
            check_spans(m, r.n_msgs, text, sp, nsp);
            const char *tail = think ? "<|im_start|>assistant\n"
                                     : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
            size_t nt = strlen(text), nl = strlen(tail);
            if (nt < nl || strcmp(text + nt - nl, tail) != 0) abort();
        } else if (!err.msg[0] || text || sp) {
            abort();
        }
        free(sp);
        free(text);
        free(m);
    } else if (!r.prompt && (!r.prompt_ids || r.n_prompt_ids == 0)) {
        abort();
    }
    if (r.n_stop < 0 || r.n_stop > SRV_MAX_STOP) abort();
    for (int i = 0; i < r.n_stop; i++)
        if (!r.stop[i] || !r.stop[i][0]) abort();
    if (r.max_tokens == 0 || r.max_tokens < -1) abort();
    if (r.temperature_set && !(r.temperature >= 0 && r.temperature <= 2)) abort();
    if (r.top_p_set && !(r.top_p > 0 && r.top_p <= 1)) abort();
    if (r.include_usage && !r.stream) abort();
    snprintf(outcome, sizeof outcome, "%d ok stream=%d stops=%d", kind, r.stream, r.n_stop);
    srv_request_free(&r);
    return 0;
}
