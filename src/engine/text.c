/*
 * engine/text.c - tokens and text at the API: tokenizing, token bytes, stop
 * tokens, the chat template (the architecture's, or the variant the
 * checkpoint's tokenizer_config.json shows: engine.c), and the UTF-8 text
 * stream that holds back incomplete characters.
 */
#include "engine/internal.h"

#include <stdlib.h>

/* ---- tokenizer and chat ----------------------------------------------------------- */

int df_tokenize(const df_engine *e, const char *text, size_t len, int32_t **ids, size_t *n,
                df_error *err) {
    return df_tokenizer_encode(e->tok, text, len, ids, n, err);
}

int df_token_bytes(const df_engine *e, int32_t id, const char **bytes, size_t *len) {
    return df_tokenizer_token_bytes(e->tok, id, bytes, len);
}

int df_is_stop_token(const df_engine *e, int32_t id) {
    for (int i = 0; i < e->n_stop; i++)
        if (e->stop_ids[i] == id) return 1;
    return 0;
}

int df_chat_render(const df_engine *e, const df_chat_msg *msgs, int n, int add_gen,
                   int enable_thinking, char **out, df_error *err) {
    if (!e) return df_fail(err, DF_ERR_ARG, "df_chat_render: NULL engine");
    return e->chat(msgs, n, add_gen, enable_thinking, out, NULL, NULL, err);
}

int df_chat_tokenize(const df_engine *e, const df_chat_msg *msgs, int n, int add_gen,
                     int enable_thinking, int32_t **ids, size_t *n_ids, df_error *err) {
    if (!e) return df_fail(err, DF_ERR_ARG, "df_chat_tokenize: NULL engine");
    return df_chat_tokenize_with(e->tok, e->chat, msgs, n, add_gen, enable_thinking, ids, n_ids, err);
}

/* Length of the UTF-8 sequence a lead byte starts, 0 if it cannot start one. */
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

static size_t put(char *out, size_t cap, size_t o, const void *p, size_t n) {
    if (o + n <= cap) memcpy(out + o, p, n);
    return o + n;
}

/* Emits complete sequences from buf[0..n), keeps an incomplete tail. */
static size_t drain(df_text_stream *st, const unsigned char *buf, size_t n, char *out, size_t cap,
                    bool final) {
    static const char repl[] = "\xEF\xBF\xBD";
    size_t i = 0, o = 0;
    while (i < n) {
        int l = utf8_len(buf[i]);
        if (l == 0) {
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        if (i + (size_t)l > n) {
            /* incomplete: keep it if the bytes so far are valid continuations */
            bool ok = true;
            for (size_t j = i + 1; j < n; j++) ok &= (buf[j] & 0xC0) == 0x80;
            if (ok && !final) {
                st->n_pending = (int)(n - i);
                memcpy(st->pending, buf + i, n - i);
                return o;
            }
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        bool ok = true;
        for (int j = 1; j < l; j++) ok &= (buf[i + (size_t)j] & 0xC0) == 0x80;
        if (ok && l == 3 && buf[i] == 0xE0) ok = buf[i + 1] >= 0xA0;
        if (ok && l == 3 && buf[i] == 0xED) ok = buf[i + 1] < 0xA0;
        if (ok && l == 4 && buf[i] == 0xF0) ok = buf[i + 1] >= 0x90;
        if (ok && l == 4 && buf[i] == 0xF4) ok = buf[i + 1] < 0x90;
        if (!ok) {
            o = put(out, cap, o, repl, 3);
            i++;
            continue;
        }
        o = put(out, cap, o, buf + i, (size_t)l);
        i += (size_t)l;
    }
    st->n_pending = 0;
    return o;
}

size_t df_text_stream_push(const df_engine *e, df_text_stream *st, int32_t id, char *out, size_t cap) {
    const char *b;
    size_t n;
    if (df_tokenizer_token_bytes(e->tok, id, &b, &n) != 0) return 0;
    unsigned char *tmp = df_xmalloc((size_t)st->n_pending + n);
    memcpy(tmp, st->pending, (size_t)st->n_pending);
    memcpy(tmp + st->n_pending, b, n);
    size_t r = drain(st, tmp, (size_t)st->n_pending + n, out, cap, false);
    free(tmp);
    return r > cap ? cap : r;
}

size_t df_text_stream_flush(df_text_stream *st, char *out, size_t cap) {
    unsigned char tmp[8];
    size_t n = (size_t)st->n_pending;
    memcpy(tmp, st->pending, n);
    size_t r = drain(st, tmp, n, out, cap, true);
    st->n_pending = 0;
    return r > cap ? cap : r;
}

