/*
 * request.c - parses and validates OpenAI completion / chat-completion bodies
 * (request.h). No engine here: token-level checks (prompt length against the
 * context, ids against the vocabulary) happen in the server once it has one.
 *
 * Policy: a field is either honoured exactly, ignored because it cannot change
 * the output (IGNORED below), accepted only at the value that means "off"
 * (n = 1, logprobs false/null, tools empty, response_format text, ...), or
 * refused with a 400 naming it. Unknown fields are refused, so a client never
 * gets silently different behaviour from what it asked for.
 */
#include "server/request.h"
#include "util/json_text.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fields with no effect on the generated text or the response shape. */
static const char *const IGNORED[] = {"user", "metadata", "parallel_tool_calls", "service_tier", NULL};

static int fail(srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Truncation (of a field name the client chose) must not leave half a UTF-8
 * character behind: the error would then not be valid JSON text. */
static void utf8_trim(char *s) {
    size_t n = strlen(s), i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && n - i < 3) i--;
    if (i == 0) return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (want > 1 && n - (i - 1) < want) s[i - 1] = 0;
}

static int fail(srv_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    utf8_trim(e->message);
    utf8_trim(e->param);
    return -1;
}

char *srv_error_json(const char *message, const char *type, const char *param) {
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:n}}", "error", "message", message, "type", type, "param",
                          param && *param ? json_string(param) : json_null(), "code");
    if (!o) /* not valid UTF-8 (an engine message quoting a file name, say) */
        o = json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", "invalid request", "type", type, "param",
                      "code");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static bool is_null(const json_t *v) { return !v || json_is_null(v); }

static int get_number(json_t *v, const char *name, double lo, double hi, double *out, srv_error *e) {
    if (!json_is_number(v)) return fail(e, name, "'%s' must be a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return fail(e, name, "'%s' must be between %g and %g", name, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *v, const char *name, bool *out, srv_error *e) {
    if (!json_is_boolean(v)) return fail(e, name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts
 * (concatenated, as OpenAI does for text-only input). */
static int get_content(json_t *v, char **out, srv_error *e) {
    if (json_is_string(v)) {
        *out = strdup(json_string_value(v));
        return *out ? 0 : fail(e, "messages", "out of memory");
    }
    if (!json_is_array(v)) return fail(e, "messages", "message 'content' must be a string or an array of text parts");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(v, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text) || json_object_size(part) != 2)
            return fail(e, "messages", "only text content parts ({\"type\":\"text\",\"text\":...}) are supported");
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s) return fail(e, "messages", "out of memory");
    size_t off = 0;
    json_array_foreach(v, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(s + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    s[off] = 0;
    *out = s;
    return 0;
}

static int parse_messages(json_t *v, srv_request *r, srv_error *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(e, "messages", "'messages' must be a non-empty array");
    if (json_array_size(v) > 4096) return fail(e, "messages", "too many messages (at most 4096)");
    r->msgs = calloc(json_array_size(v), sizeof *r->msgs);
    if (!r->msgs) return fail(e, "messages", "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        if (!json_is_object(m)) return fail(e, "messages", "messages[%zu] must be an object", i);
        const char *key;
        json_t *val;
        json_object_foreach(m, key, val) {
            if (strcmp(key, "role") && strcmp(key, "content"))
                return fail(e, "messages", "messages[%zu]: field '%s' is not supported", i, key);
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) return fail(e, "messages", "messages[%zu].role must be a string", i);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return fail(e, "messages", "messages[%zu]: unknown role '%.64s' (system, developer, user, assistant)", i,
                        json_string_value(role));
        if (is_null(content)) return fail(e, "messages", "messages[%zu].content is required", i);
        srv_msg *dst = &r->msgs[r->n_msgs];
        if (!(dst->role = strdup(rs))) return fail(e, "messages", "out of memory");
        r->n_msgs++;
        if (get_content(content, &dst->content, e)) return -1;
    }
    return 0;
}

static int parse_prompt(json_t *v, srv_request *r, srv_error *e) {
    if (json_is_string(v)) {
        r->prompt = strdup(json_string_value(v));
        return r->prompt ? 0 : fail(e, "prompt", "out of memory");
    }
    if (!json_is_array(v)) return fail(e, "prompt", "'prompt' must be a string, an array of one string or an array of token ids");
    size_t n = json_array_size(v);
    if (n == 0) return fail(e, "prompt", "'prompt' is empty");
    json_t *first = json_array_get(v, 0);
    if (json_is_string(first) || json_is_array(first)) {
        if (n != 1) return fail(e, "prompt", "only one prompt per request is supported");
        if (json_is_string(first)) return parse_prompt(first, r, e);
        v = first;
        n = json_array_size(v);
        if (n == 0) return fail(e, "prompt", "'prompt' is empty");
    }
    r->prompt_ids = malloc(n * sizeof(int32_t));
    if (!r->prompt_ids) return fail(e, "prompt", "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return fail(e, "prompt", "prompt[%zu] is not a token id", i);
        r->prompt_ids[i] = (int32_t)json_integer_value(t);
    }
    r->n_prompt_ids = n;
    return 0;
}

static int parse_stop(json_t *v, srv_request *r, srv_error *e) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return fail(e, "stop", "stop strings must not be empty");
        r->stop[r->n_stop++] = strdup(json_string_value(v));
        return r->stop[0] ? 0 : fail(e, "stop", "out of memory");
    }
    if (!json_is_array(v)) return fail(e, "stop", "'stop' must be a string or an array of strings");
    if (json_array_size(v) > SRV_MAX_STOP) return fail(e, "stop", "at most %d stop strings", SRV_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) == 0)
            return fail(e, "stop", "stop[%zu] must be a non-empty string", i);
        if (json_string_length(s) > 256) return fail(e, "stop", "stop[%zu] is longer than 256 bytes", i);
        if (!(r->stop[r->n_stop] = strdup(json_string_value(s)))) return fail(e, "stop", "out of memory");
        r->n_stop++;
    }
    return 0;
}

/* Fields accepted only at the value that means "off" (see the policy above):
 * 0 accepted, -1 refused (e says why), 1 not such a field. */
static int parse_off_field(const char *key, json_t *v, bool chat, srv_error *e) {
    if (!strcmp(key, "n") || (!chat && !strcmp(key, "best_of"))) {
        if (!is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
            return fail(e, key, "only %s = 1 is supported", key);
    } else if (!strcmp(key, "logprobs")) {
        if (!is_null(v) && !json_is_false(v)) return fail(e, key, "logprobs are not supported");
    } else if (!strcmp(key, "top_logprobs")) {
        if (!is_null(v)) return fail(e, key, "logprobs are not supported");
    } else if (!strcmp(key, "logit_bias")) {
        if (!is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
            return fail(e, key, "logit_bias is not supported");
    } else if (!strcmp(key, "store")) {
        if (!is_null(v) && !json_is_false(v)) return fail(e, key, "store is not supported");
    } else if (!chat && !strcmp(key, "echo")) {
        if (!is_null(v) && !json_is_false(v)) return fail(e, key, "echo is not supported");
    } else if (!chat && !strcmp(key, "suffix")) {
        if (!is_null(v)) return fail(e, key, "suffix is not supported");
    } else if (chat && (!strcmp(key, "tools") || !strcmp(key, "functions"))) {
        if (!is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return fail(e, key, "tool calling is not supported");
    } else if (chat && (!strcmp(key, "tool_choice") || !strcmp(key, "function_call"))) {
        if (!is_null(v) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
            return fail(e, key, "tool calling is not supported");
    } else if (chat && !strcmp(key, "response_format")) {
        json_t *t = json_object_get(v, "type");
        if (!is_null(v) && !(json_is_object(v) && json_object_size(v) == 1 && json_is_string(t) &&
                             !strcmp(json_string_value(t), "text")))
            return fail(e, key, "only response_format {\"type\":\"text\"} is supported");
    } else {
        return 1;
    }
    return 0;
}

static int parse_fields(json_t *root, srv_request *r, srv_error *e) {
    const bool chat = r->kind == SRV_CHAT;
    const char *key;
    json_t *v;
    int off;
    json_object_foreach(root, key, v) {
        bool ignored = false;
        for (int i = 0; IGNORED[i]; i++) ignored |= !strcmp(key, IGNORED[i]);
        if (ignored) continue;
        if (!strcmp(key, "model")) {
            if (!json_is_string(v)) return fail(e, key, "'model' must be a string");
        } else if (!strcmp(key, chat ? "messages" : "prompt")) {
            if (chat ? parse_messages(v, r, e) : parse_prompt(v, r, e)) return -1;
        } else if (!strcmp(key, "max_tokens") || (chat && !strcmp(key, "max_completion_tokens"))) {
            if (is_null(v)) continue;
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24))
                return fail(e, key, "'%s' must be an integer between 1 and %d", key, 1 << 24);
            /* both given (max_tokens is the older name of the same limit): they must agree */
            if (r->max_tokens >= 0 && r->max_tokens != (int)json_integer_value(v))
                return fail(e, key, "'max_tokens' and 'max_completion_tokens' disagree (%d and %d): give one",
                            r->max_tokens, (int)json_integer_value(v));
            r->max_tokens = (int)json_integer_value(v);
        } else if (!strcmp(key, "temperature")) {
            if (is_null(v)) continue;
            if (get_number(v, key, 0, 2, &r->temperature, e)) return -1;
            r->temperature_set = true;
        } else if (!strcmp(key, "top_p")) {
            if (is_null(v)) continue;
            if (get_number(v, key, 0, 1, &r->top_p, e)) return -1;
            if (r->top_p <= 0) return fail(e, key, "'top_p' must be greater than 0");
            r->top_p_set = true;
        } else if (!strcmp(key, "presence_penalty")) {
            if (!is_null(v) && get_number(v, key, -2, 2, &r->presence_penalty, e)) return -1;
        } else if (!strcmp(key, "frequency_penalty")) {
            if (!is_null(v) && get_number(v, key, -2, 2, &r->frequency_penalty, e)) return -1;
        } else if (!strcmp(key, "seed")) {
            if (is_null(v)) continue;
            if (!json_is_integer(v)) return fail(e, key, "'seed' must be an integer");
            r->seed = (uint64_t)json_integer_value(v);
            r->seed_set = true;
        } else if (!strcmp(key, "stop")) {
            if (!is_null(v) && parse_stop(v, r, e)) return -1;
        } else if (!strcmp(key, "stream")) {
            if (!is_null(v) && get_bool(v, key, &r->stream, e)) return -1;
        } else if (!strcmp(key, "stream_options")) {
            if (is_null(v)) continue;
            if (!json_is_object(v)) return fail(e, key, "'stream_options' must be an object");
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                if (strcmp(k2, "include_usage")) return fail(e, key, "stream_options.%s is not supported", k2);
                if (get_bool(v2, "stream_options.include_usage", &r->include_usage, e)) return -1;
            }
        } else if ((off = parse_off_field(key, v, chat, e)) <= 0) {
            if (off < 0) return -1;
        } else if (chat && !strcmp(key, "chat_template_kwargs")) {
            if (is_null(v)) continue;
            if (!json_is_object(v)) return fail(e, key, "'chat_template_kwargs' must be an object");
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                if (strcmp(k2, "enable_thinking"))
                    return fail(e, key, "chat_template_kwargs.%s is not supported (only enable_thinking)", k2);
                bool b = false;
                if (get_bool(v2, "chat_template_kwargs.enable_thinking", &b, e)) return -1;
                r->enable_thinking = b;
            }
        } else {
            return fail(e, key, "unknown or unsupported field '%.100s'", key);
        }
    }
    if (chat ? !r->msgs : (!r->prompt && !r->prompt_ids))
        return fail(e, chat ? "messages" : "prompt", "'%s' is required", chat ? "messages" : "prompt");
    if (r->include_usage && !r->stream)
        return fail(e, "stream_options", "stream_options is only allowed with stream = true");
    return 0;
}

int srv_parse_request(int kind, const char *body, size_t len, srv_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->max_tokens = -1;
    r->enable_thinking = -1;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return fail(e, NULL, "invalid JSON body: %s (at byte %d)", df_json_error_text(&je), je.position);
    int rc = json_is_object(root) ? parse_fields(root, r, e) : fail(e, NULL, "the request body must be a JSON object");
    json_decref(root);
    if (rc) srv_request_free(r);
    return rc;
}

void srv_request_free(srv_request *r) {
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    int kind = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = kind;
}
