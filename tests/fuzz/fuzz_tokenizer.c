/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer (src/tokenizer/tokenizer.c).
 *
 * An input that starts with 'J' is the rest parsed as a tokenizer.json: a file a
 * user downloads with a checkpoint, so hostile vocabularies, merges, regexes and
 * added tokens must be refused with a message naming the file, or load into a
 * tokenizer whose every emitted id decodes. Any other input is text encoded with
 * the trained demo model's tokenizer ($DF_FUZZ_TOKENIZER, default
 * models/demo-moe/tokenizer.json): every id must be in range and decode, and
 * since byte-level BPE loses nothing, decoding must give the text back whenever
 * its NFC normalizer leaves it unchanged (valid UTF-8 already in NFC, or no
 * UTF-8 lead byte at all, whose invalid bytes bypass normalization). The text is
 * encoded again with its middle third as a plain span (chat message content):
 * no control token may then come from inside it, and text without a '<' (which
 * every added token of the demo and Qwen3 tokenizers starts with) must get the
 * very ids of the plain encoding, wherever the span cuts it.
 */
#include "tokenizer/tokenizer.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static char outcome[160];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "J{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "\"added_tokens\"",
    "\"normalizer\"", "\"pre_tokenizer\"", "\"pretokenizers\"", "\"Sequence\"", "\"Split\"",
    "\"ByteLevel\"", "\"NFC\"", "\"NFKC\"", "\"NFD\"", "\"NFKD\"", "\"Regex\"", "\"String\"",
    "\"behavior\"", "\"Isolated\"", "\"Removed\"", "\"invert\"", "\"use_regex\"",
    "\"add_prefix_space\"", "\"ignore_merges\"", "\"byte_fallback\"", "\"vocab\"", "\"merges\"",
    "\"content\"", "\"lstrip\"", "\"rstrip\"", "\"normalized\"", "\"special\"",
    "\"single_word\"", "\"id\"", "\"(a+)+$\"", "\"\\\\p{L}+\"", "\"[\"", "\"\\\\\"",
    "<|im_start|>", "<|im_end|>", "<think>", "\xc3\xa9", "e\xcc\x81", "\xed\xa0\x80", "\xf0\x9f\x98\x80",
    "\r\n", "   ", "123456", "\xff\xfe",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

/* Every id in range and decodable; the decoded bytes into *out (malloc'ed). */
static size_t decode_all(const df_tokenizer *t, const int32_t *ids, size_t n, char **out) {
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) abort();
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t k;
        if (ids[i] < 0 || ids[i] >= df_tokenizer_vocab_size(t)) abort();
        if (df_tokenizer_token_bytes(t, ids[i], &b, &k) != 0) abort();
        if (len + k > cap) {
            while (len + k > cap) cap *= 2;
            buf = realloc(buf, cap);
            if (!buf) abort();
        }
        memcpy(buf + len, b, k);
        len += k;
    }
    *out = buf;
    return len;
}

/* Whether NFC leaves the text as it is, as far as the tokenizer can see it. */
static int nfc_stable(const unsigned char *s, size_t n) {
    int lead = 0;
    for (size_t i = 0; i < n; i++) lead |= s[i] >= 0xC0 && s[i] <= 0xF7;
    if (!lead) return 1; /* ASCII (NFC's identity) and stray bytes (never normalized) */
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return 0; /* mixed: valid runs are normalized piece by piece */
        i += (size_t)k;
    }
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, &d, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    int same = r == (utf8proc_ssize_t)n && memcmp(d, s, n) == 0;
    free(d);
    return same;
}

static const df_tokenizer *demo_tokenizer(void) {
    static df_tokenizer *t;
    if (t) return t;
    const char *path = getenv("DF_FUZZ_TOKENIZER");
    if (!path) path = "models/demo-moe/tokenizer.json";
    df_error err = {0};
    if (df_tokenizer_load(&t, path, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
        exit(2);
    }
    return t;
}

/* Encodes with [n/3, 2n/3) plain and checks it against the plain encoding. */
static void fuzz_plain_span(const df_tokenizer *t, const char *text, size_t n, const int32_t *ref,
                            size_t n_ref, int stable) {
    df_text_span sp = {n / 3, 2 * n / 3 - n / 3};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    df_error err = {0};
    if (df_tokenizer_encode_spans(t, text, n, &sp, 1, &ids, &n_ids, &err)) abort();
    if (!memchr(text, '<', n) && (n_ids != n_ref || memcmp(ids, ref, n_ids * sizeof *ids) != 0))
        abort();
    int32_t ctl[3] = {df_tokenizer_find(t, "<|im_start|>"), df_tokenizer_find(t, "<|im_end|>"),
                      df_tokenizer_find(t, "<|endoftext|>")};
    size_t off = 0;
    for (size_t i = 0; i < n_ids && stable; i++) {
        const char *b;
        size_t k;
        if (df_tokenizer_token_bytes(t, ids[i], &b, &k) != 0) abort();
        bool inside = off < sp.off + sp.len && off + k > sp.off;
        if (inside && (ids[i] == ctl[0] || ids[i] == ctl[1] || ids[i] == ctl[2])) abort();
        off += k;
    }
    char *back;
    size_t len = decode_all(t, ids, n_ids, &back);
    if (stable && (len != n || memcmp(back, text, n) != 0)) abort();
    free(back);
    free(ids);
}

static void fuzz_encode(const char *text, size_t n) {
    const df_tokenizer *t = demo_tokenizer();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    df_error err = {0};
    if (df_tokenizer_encode(t, text, n, &ids, &n_ids, &err)) abort(); /* never fails on text */
    char *back;
    size_t len = decode_all(t, ids, n_ids, &back);
    int stable = nfc_stable((const unsigned char *)text, n);
    if (stable && (len != n || memcmp(back, text, n) != 0)) abort();
    fuzz_plain_span(t, text, n, ids, n_ids, stable);
    int bits = 0;
    while ((n_ids >> bits) > 0 && bits < 12) bits++;
    snprintf(outcome, sizeof outcome, "enc %d %d", bits, stable);
    free(back);
    free(ids);
}

static void fuzz_load(const char *json, size_t n) {
    df_tokenizer *t = NULL;
    df_error err = {0};
    int rc = df_tokenizer_load_mem(&t, json, n, "tok.json", &err);
    if (rc) {
        if (t || err.code != rc || !strstr(err.msg, "tok.json")) abort();
        /* names and values vary (quoted keys, ids); the kind of complaint does not;
         * "no token for byte xNN" is one outcome */
        const char *b = strstr(err.msg, "byte x");
        char head[16];
        snprintf(head, sizeof head, "%d ", rc);
        df_fuzz_describe(outcome, sizeof outcome, head, err.msg,
                         b ? (size_t)(b - err.msg) + 6 : strlen(err.msg), '"');
        return;
    }
    if (df_tokenizer_vocab_size(t) <= 0) abort();
    static const char SAMPLE[] = "Hello, world! 123 <|im_start|>h\xc3\xa9llo e\xcc\x81 \xff\xfe\r\n  x";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rc = df_tokenizer_encode(t, SAMPLE, sizeof SAMPLE - 1, &ids, &n_ids, &err);
    if (rc == DF_OK) {
        char *back;
        decode_all(t, ids, n_ids, &back);
        free(back);
        free(ids);
    } else if (!err.msg[0]) {
        abort();
    }
    snprintf(outcome, sizeof outcome, "ok %d", rc);
    df_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'J') fuzz_load((const char *)data + 1, size - 1);
    else fuzz_encode((const char *)data, size);
    return 0;
}
