/*
 * fuzz_tiktoken.c - libFuzzer target for the tiktoken.model loader and its
 * encoding (src/tokenizer/tiktoken.c over tokenizer.c's encoder).
 *
 * An input that starts with 'M' is the rest taken as a tiktoken.model, up to a
 * NUL after which comes a tokenizer_config.json: a file a user downloads with a
 * checkpoint, so it must be refused with one line naming the file at fault
 * (k.model or k.json), or load into a tokenizer that encodes a sample to ids that
 * all decode, back to the sample. Any other input is text encoded with a small
 * fixed tokenizer (the 256 bytes, a few merges, Kimi K2's special names, the
 * Kimi split pattern): ids decode back to the text, byte for byte (tiktoken has
 * no normalizer); with its middle third a plain span no special id comes from
 * inside it, and text without '<' or '[' gets the very ids of the plain encoding.
 */
#include "tokenizer/tokenizer.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[160];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "M", "YWI= 256\n", "YWJj 257\n", "AA== 0\n", "\n", " ", "==", "=", "\x00{\"added_tokens_decoder\":{",
    "\"256\":{\"content\":\"<|im_end|>\",\"special\":true}}", "<|im_end|>", "<|im_user|>",
    "<|im_middle|>", "[BOS]", "[EOS]", "<|reserved_token_", "\xe4\xb8\x80", "\xe3\x80\x85",
    "'s", "'LL", "\r\n", "   ", "123456", "\xf0\x9f\x98\x80", "e\xcc\x81", "\xff\xfe",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* All ids decodable; the bytes into *out (malloc'ed). */
static size_t decode_all(const df_tokenizer *t, const int32_t *ids, size_t n, char **out) {
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) abort();
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t k;
        if (ids[i] < 0 || ids[i] >= df_tokenizer_vocab_size(t)) abort();
        if (df_tokenizer_token_bytes(t, ids[i], &b, &k) != 0) abort();
        while (len + k > cap) cap *= 2;
        buf = realloc(buf, cap);
        if (!buf) abort();
        memcpy(buf + len, b, k);
        len += k;
    }
    *out = buf;
    return len;
}

static int n_base; /* of the fixed tokenizer */

static const df_tokenizer *fixed(void) {
    static df_tokenizer *t;
    if (t) return t;
    static const char *const MERGED[] = {"ab", "abc", "  ", "\n\n", "th", "the", " the", "12", "123"};
    static const char CONFIG[] =
        "{\"added_tokens_decoder\": {\"265\": {\"content\": \"[BOS]\"}, \"266\": {\"content\": "
        "\"<|im_end|>\"}, \"267\": {\"content\": \"<|im_user|>\"}, \"268\": {\"content\": "
        "\"<|im_middle|>\"}, \"269\": {\"content\": \"<think>\", \"special\": false}}}";
    char m[8192];
    size_t n = 0;
    for (int b = 0; b < 256; b++)
        n += (size_t)sprintf(m + n, "%c%c== %d\n", B64[b >> 2], B64[(b & 3) << 4], b);
    int id = 256;
    for (size_t i = 0; i < sizeof MERGED / sizeof *MERGED; i++) {
        const unsigned char *s = (const unsigned char *)MERGED[i];
        size_t l = strlen(MERGED[i]);
        for (size_t j = 0; j < l; j += 3) {
            uint32_t x = (uint32_t)s[j] << 16 | (j + 1 < l ? (uint32_t)s[j + 1] << 8 : 0) |
                         (j + 2 < l ? s[j + 2] : 0);
            m[n++] = B64[x >> 18];
            m[n++] = B64[(x >> 12) & 63];
            m[n++] = j + 1 < l ? B64[(x >> 6) & 63] : '=';
            m[n++] = j + 2 < l ? B64[x & 63] : '=';
        }
        n += (size_t)sprintf(m + n, " %d\n", id++);
    }
    n_base = id;
    df_error err = {0};
    if (df_tokenizer_load_tiktoken_mem(&t, m, n, "fixed.model", CONFIG, strlen(CONFIG), "fixed.json",
                                       NULL, &err)) {
        fprintf(stderr, "fuzz_tiktoken: %s\n", err.msg);
        exit(2);
    }
    return t;
}

static void fuzz_encode(const char *text, size_t n) {
    const df_tokenizer *t = fixed();
    int32_t *ids = NULL, *sids = NULL;
    size_t n_ids = 0, n_sids = 0;
    df_error err = {0};
    if (df_tokenizer_encode(t, text, n, &ids, &n_ids, &err)) abort();
    char *back;
    if (decode_all(t, ids, n_ids, &back) != n || memcmp(back, text, n) != 0) abort();
    free(back);
    df_text_span sp = {n / 3, 2 * n / 3 - n / 3};
    if (df_tokenizer_encode_spans(t, text, n, &sp, 1, &sids, &n_sids, &err)) abort();
    if (decode_all(t, sids, n_sids, &back) != n || memcmp(back, text, n) != 0) abort();
    free(back);
    size_t off = 0;
    for (size_t i = 0; i < n_sids; i++) {
        const char *b;
        size_t k;
        df_tokenizer_token_bytes(t, sids[i], &b, &k);
        bool inside = off < sp.off + sp.len && off + k > sp.off;
        /* special ids are n_base..; <think> (special: false) may match anywhere */
        if (inside && sids[i] >= n_base && sids[i] != 269) abort();
        off += k;
    }
    if (!memchr(text, '<', n) && !memchr(text, '[', n) &&
        (n_sids != n_ids || memcmp(sids, ids, n_ids * sizeof *ids) != 0))
        abort();
    int bits = 0;
    while ((n_ids >> bits) > 0 && bits < 12) bits++;
    snprintf(outcome, sizeof outcome, "enc %d", bits);
    free(ids);
    free(sids);
}

static void fuzz_load(const char *data, size_t n) {
    const char *nul = memchr(data, 0, n);
    size_t mn = nul ? (size_t)(nul - data) : n;
    const char *cfg = nul ? nul + 1 : NULL;
    size_t cn = nul ? n - mn - 1 : 0;
    df_tokenizer *t = NULL;
    df_error err = {0};
    int rc = df_tokenizer_load_tiktoken_mem(&t, data, mn, "k.model", cfg, cn, "k.json", NULL, &err);
    if (rc) {
        if (t || err.code != rc || strchr(err.msg, '\n') ||
            (!strstr(err.msg, "k.model") && !strstr(err.msg, "k.json")))
            abort();
        char head[16];
        snprintf(head, sizeof head, "%d ", rc);
        df_fuzz_describe(outcome, sizeof outcome, head, err.msg, strlen(err.msg), '"');
        return;
    }
    static const char SAMPLE[] = "Hello, world! 123 <|im_end|>h\xc3\xa9llo e\xcc\x81 \xff\xfe\r\n  x";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (df_tokenizer_encode(t, SAMPLE, sizeof SAMPLE - 1, &ids, &n_ids, &err)) abort();
    char *back;
    size_t len = decode_all(t, ids, n_ids, &back);
    /* a special named like sample text decodes to that text too */
    if (len != sizeof SAMPLE - 1 || memcmp(back, SAMPLE, len) != 0) abort();
    free(back);
    free(ids);
    snprintf(outcome, sizeof outcome, "ok");
    df_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'M') fuzz_load((const char *)data + 1, size - 1);
    else fuzz_encode((const char *)data, size);
    return 0;
}
