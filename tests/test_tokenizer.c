/*
 * test_tokenizer.c - the byte-level BPE tokenizer.
 *
 * Real tokenizers (assets/tokenizers/, fetched by scripts/fetch_assets.sh): every
 * case of llama.cpp's reference vectors (tests/data/tokenizer-vectors/) must match
 * exactly, decode(encode(x)) must give x back (NFC(x) for Qwen3, which normalizes),
 * plus special tokens (plain text inside plain spans, chat content) and a few
 * hundred KB of generated text.
 * Synthetic tokenizers built here in JSON: merge order and tie-breaking, both merge
 * list formats, ignore_merges, added tokens (longest match, lstrip/rstrip, plain spans),
 * normalizers, pre-tokenizer variants, and bad tokenizer.json inputs, which must
 * give errors naming the field, never a crash.
 */
#include "testutil.h"

#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */

static char *asset_path(const char *rel) { return df_path_join(df_test_root(), rel); }

static df_tokenizer *load_asset(const char *rel) {
    char *p = asset_path(rel);
    df_tokenizer *t = NULL;
    df_error err = {0};
    int rc = df_tokenizer_load(&t, p, &err);
    if (rc)
        fprintf(stderr, "cannot load %s: %s\n(run scripts/fetch_assets.sh first)\n", p, err.msg);
    free(p);
    return rc ? NULL : t;
}

static char *decode_all(const df_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, o = 0;
    char *s = df_xmalloc(cap);
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        assert_int_equal(df_tokenizer_token_bytes(t, ids[i], &b, &l), 0);
        if (o + l + 1 > cap) {
            cap = (o + l + 1) * 2;
            s = df_xrealloc(s, cap);
        }
        memcpy(s + o, b, l);
        o += l;
    }
    s[o] = 0;
    *len = o;
    return s;
}

static size_t encode(const df_tokenizer *t, const char *s, size_t len, int32_t **ids) {
    size_t n = 99;
    df_error err = {0};
    int rc = df_tokenizer_encode(t, s, len, ids, &n, &err);
    if (rc) fprintf(stderr, "encode failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    return n;
}

/* Encodes a NUL-terminated string and compares with an expected id list. */
static void expect_ids(const df_tokenizer *t, const char *s, const int32_t *exp, size_t n_exp) {
    int32_t *ids;
    size_t n = encode(t, s, strlen(s), &ids);
    if (n != n_exp || memcmp(ids, exp, n * sizeof *ids) != 0) {
        fprintf(stderr, "encode(\"%s\"): got", s);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", expected");
        for (size_t i = 0; i < n_exp; i++) fprintf(stderr, " %d", exp[i]);
        fprintf(stderr, "\n");
        free(ids);
        fail();
    }
    free(ids);
}
#define EXPECT(t, s, ...)                                                                       \
    do {                                                                                        \
        const int32_t e_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, s, e_, sizeof e_ / sizeof e_[0]);                                         \
    } while (0)

/* Same, with special tokens plain inside the spans {off, len}. */
static void expect_plain(const df_tokenizer *t, const char *s, const df_text_span *sp, size_t nsp,
                         const int32_t *exp, size_t n_exp) {
    int32_t *ids;
    size_t n;
    df_error err = {0};
    int rc = df_tokenizer_encode_spans(t, s, strlen(s), sp, nsp, &ids, &n, &err);
    if (rc) fprintf(stderr, "encode failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    if (n != n_exp || memcmp(ids, exp, n * sizeof *ids) != 0) {
        fprintf(stderr, "encode(\"%s\", %zu plain spans): got", s, nsp);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", expected");
        for (size_t i = 0; i < n_exp; i++) fprintf(stderr, " %d", exp[i]);
        fprintf(stderr, "\n");
        free(ids);
        fail();
    }
    free(ids);
}
#define SPANS(...) ((const df_text_span[]){__VA_ARGS__})
#define EXPECT_PLAIN(t, s, sp, nsp, ...)                                                        \
    do {                                                                                        \
        const int32_t e_[] = {__VA_ARGS__};                                                     \
        expect_plain(t, s, sp, nsp, e_, sizeof e_ / sizeof e_[0]);                              \
    } while (0)

/* ------------------------------------------------------------------------ */
/* llama.cpp vectors                                                        */

/* llama.cpp's test-tokenizer-0 convention: NAME.inp holds the cases separated by
 * "\n__ggml_vocab_test__\n" (so the newline before a separator line belongs to the
 * separator and a case may itself start or end with newlines; the file ends with a
 * separator); NAME.out holds one line of space-separated ids per case. */
typedef struct vcase {
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
} vcase;

typedef struct vectors {
    char *inp, *out;
    vcase *c;
    size_t n;
} vectors;

static void vectors_free(vectors *v) {
    for (size_t i = 0; i < v->n; i++) free(v->c[i].ids);
    free(v->c);
    free(v->inp);
    free(v->out);
}

static void load_vectors(vectors *v, const char *name) {
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof SEP - 1;
    char rel[256];
    df_error err = {0};
    size_t ni, no;
    memset(v, 0, sizeof *v);
    snprintf(rel, sizeof rel, "tests/data/tokenizer-vectors/%s.inp", name);
    char *p = asset_path(rel);
    int rc = df_read_file(p, &v->inp, &ni, &err);
    free(p);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    snprintf(rel, sizeof rel, "tests/data/tokenizer-vectors/%s.out", name);
    p = asset_path(rel);
    rc = df_read_file(p, &v->out, &no, &err);
    free(p);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, DF_OK);

    assert_true(ni >= sl && memcmp(v->inp + ni - sl, SEP, sl) == 0);
    size_t cap = 16;
    v->c = df_xcalloc(cap, sizeof *v->c);
    const char *s = v->inp, *end = v->inp + ni - sl; /* the final separator ends the list */
    for (;;) {
        const char *q = memmem(s, (size_t)(end - s), SEP, sl);
        if (!q) q = end;
        if (v->n == cap) {
            cap *= 2;
            v->c = df_xrealloc(v->c, cap * sizeof *v->c);
        }
        v->c[v->n++] = (vcase){s, (size_t)(q - s), NULL, 0};
        if (q == end) break;
        s = q + sl;
    }

    size_t line = 0;
    char *o = v->out, *oend = v->out + no;
    while (o < oend) {
        char *nl = memchr(o, '\n', (size_t)(oend - o));
        if (!nl) nl = oend;
        *nl = 0;
        assert_true(line < v->n);
        vcase *c = &v->c[line++];
        size_t icap = 8;
        c->ids = df_xmalloc(icap * sizeof *c->ids);
        char *q = o;
        for (;;) {
            char *e;
            long x = strtol(q, &e, 10);
            if (e == q) break;
            if (c->n == icap) {
                icap *= 2;
                c->ids = df_xrealloc(c->ids, icap * sizeof *c->ids);
            }
            c->ids[c->n++] = (int32_t)x;
            q = e;
        }
        o = nl + 1;
    }
    if (line != v->n) fprintf(stderr, "%s: %zu inputs but %zu outputs\n", name, v->n, line);
    assert_int_equal(line, v->n);
}

/* If the vectors were made with a BOS (or other prefix) added, the empty input's
 * expected ids are exactly that prefix: strip it from every case, after checking
 * that each case starts with it. */
static void strip_prefix(vectors *v) {
    const vcase *empty = NULL;
    for (size_t i = 0; i < v->n; i++)
        if (v->c[i].len == 0) empty = &v->c[i];
    if (!empty || empty->n == 0) return;
    size_t k = empty->n;
    int32_t pre[8];
    assert_true(k <= 8);
    memcpy(pre, empty->ids, k * sizeof *pre);
    for (size_t i = 0; i < v->n; i++) {
        vcase *c = &v->c[i];
        assert_true(c->n >= k && memcmp(c->ids, pre, k * sizeof *pre) == 0);
        memmove(c->ids, c->ids + k, (c->n - k) * sizeof *c->ids);
        c->n -= k;
    }
    fprintf(stderr, "  (vectors carry a %zu-token prefix, stripped)\n", k);
}

static void run_vectors(const df_tokenizer *t, const char *name, const char *tok_name,
                        bool nfc) {
    vectors v;
    load_vectors(&v, name);
    strip_prefix(&v);
    size_t ok = 0, rt_ok = 0;
    for (size_t i = 0; i < v.n; i++) {
        const vcase *c = &v.c[i];
        int32_t *ids;
        size_t n = encode(t, c->text, c->len, &ids);
        if (n == c->n && memcmp(ids, c->ids, n * sizeof *ids) == 0) {
            ok++;
        } else {
            fprintf(stderr, "%s case %zu \"%.*s\": got", name, i, (int)c->len, c->text);
            for (size_t j = 0; j < n; j++) fprintf(stderr, " %d", ids[j]);
            fprintf(stderr, "\n  expected");
            for (size_t j = 0; j < c->n; j++) fprintf(stderr, " %d", c->ids[j]);
            fprintf(stderr, "\n");
        }
        size_t dl;
        char *d = decode_all(t, ids, n, &dl);
        const char *want = c->text;
        size_t wl = c->len;
        char *norm = NULL;
        if (nfc && wl) {
            char *z = strndup(c->text, c->len);
            norm = (char *)utf8proc_NFC((const utf8proc_uint8_t *)z);
            free(z);
            assert_non_null(norm);
            want = norm;
            wl = strlen(norm);
        }
        if (dl == wl && memcmp(d, want, wl) == 0) rt_ok++;
        else fprintf(stderr, "%s case %zu: decode(encode(x)) != x\n", name, i);
        free(norm);
        free(d);
        free(ids);
    }
    fprintf(stderr, "  %s vectors with %s: %zu/%zu cases match, %zu/%zu round-trip\n", name,
            tok_name, ok, v.n, rt_ok, v.n);
    assert_true(v.n >= 40);
    assert_int_equal(ok, v.n);
    assert_int_equal(rt_ok, v.n);
    vectors_free(&v);
}

/* ------------------------------------------------------------------------ */
/* Qwen3 and Llama 3                                                        */

/* One cmocka group (so the suite's summary counts every test): the real tokenizers
 * are loaded once, on first use, and a missing asset fails only the tests that
 * need it. */
typedef struct assets {
    df_tokenizer *qwen3, *llama3;
    bool tried_qwen3, tried_llama3;
} assets;

static int setup_assets(void **state) {
    *state = df_xcalloc(1, sizeof(assets));
    return 0;
}
static int teardown_assets(void **state) {
    assets *a = *state;
    df_tokenizer_free(a->qwen3);
    df_tokenizer_free(a->llama3);
    free(a);
    return 0;
}
static const df_tokenizer *qwen3(void **state) {
    assets *a = *state;
    if (!a->tried_qwen3) a->qwen3 = load_asset("assets/tokenizers/qwen3/tokenizer.json");
    a->tried_qwen3 = true;
    assert_non_null(a->qwen3);
    return a->qwen3;
}
static const df_tokenizer *llama3(void **state) {
    assets *a = *state;
    if (!a->tried_llama3) a->llama3 = load_asset("assets/tokenizers/llama3/tokenizer.json");
    a->tried_llama3 = true;
    assert_non_null(a->llama3);
    return a->llama3;
}

static void test_qwen2_vectors(void **state) { run_vectors(qwen3(state), "qwen2", "qwen3", true); }
static void test_llama_bpe_vectors(void **state) {
    run_vectors(llama3(state), "llama-bpe", "llama3", false);
}

static void test_qwen3_specials(void **state) {
    const df_tokenizer *t = qwen3(state);
    assert_int_equal(df_tokenizer_vocab_size(t), 151669);
    assert_int_equal(df_tokenizer_find(t, "<|endoftext|>"), 151643);
    assert_int_equal(df_tokenizer_find(t, "<|im_start|>"), 151644);
    assert_int_equal(df_tokenizer_find(t, "<|im_end|>"), 151645);
    assert_int_equal(df_tokenizer_find(t, "<think>"), 151667);
    assert_int_equal(df_tokenizer_find(t, "</think>"), 151668);
    assert_int_equal(df_tokenizer_find(t, "Ġworld"), 1879); /* tokenizer.json spelling */
    assert_int_equal(df_tokenizer_find(t, "<|no_such_token|>"), -1);
    assert_int_equal(df_tokenizer_find(t, ""), -1);

    /* special and non-special added tokens are both matched in text */
    EXPECT(t, "<|im_start|>user\nHello world<|im_end|>\n", 151644, 872, 198, 9707, 1879, 151645,
           198);
    EXPECT(t, "<think>\n\n</think>\n\n", 151667, 271, 151668, 271);
    /* a broken special token is plain text */
    int32_t *ids;
    size_t n = encode(t, "<|im_end|", 9, &ids);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 151645);
    free(ids);

    const char *b;
    size_t l;
    assert_int_equal(df_tokenizer_token_bytes(t, 151645, &b, &l), 0);
    assert_int_equal(l, 10);
    assert_memory_equal(b, "<|im_end|>", 10);
    assert_int_equal(df_tokenizer_token_bytes(t, 1879, &b, &l), 0);
    assert_int_equal(l, 6);
    assert_memory_equal(b, " world", 6);
    assert_int_equal(df_tokenizer_token_bytes(t, -1, &b, &l), -1);
    assert_int_equal(df_tokenizer_token_bytes(t, 151669, &b, &l), -1);
    assert_int_equal(df_tokenizer_token_bytes(t, INT32_MAX, &b, &l), -1);
}

/* In plain spans (chat message content) control tokens are text: "<|im_end|>"
 * gives ordinary ids that decode to it; <think> (special: false) is still
 * matched; text without special-token text gets the ids of plain encoding
 * wherever the spans cut it, mid-word and mid-newline-run included. */
static void test_qwen3_plain_spans(void **state) {
    const df_tokenizer *t = qwen3(state);
    const char *cases[] = {"<|im_end|>", "<|endoftext|>", "x<|im_start|>system\n", "<|im_end|"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t len = strlen(cases[c]), n;
        int32_t *ids;
        df_error err = {0};
        df_text_span all = {0, len};
        assert_int_equal(df_tokenizer_encode_spans(t, cases[c], len, &all, 1, &ids, &n, &err),
                         DF_OK);
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= 151643 && ids[i] <= 151656) {
                fprintf(stderr, "\"%s\" in a plain span gave control token %d\n", cases[c],
                        ids[i]);
                fail();
            }
        size_t dl;
        char *d = decode_all(t, ids, n, &dl);
        assert_int_equal(dl, len);
        assert_memory_equal(d, cases[c], len);
        free(d);
        free(ids);
    }
    EXPECT_PLAIN(t, "<think>\n\n</think>", SPANS({0, 17}), 1, 151667, 271, 151668);
    /* only the span is plain: the template's own tokens stay */
    const char *conv = "<|im_start|>user\n<|im_end|><|im_end|>\n";
    int32_t *a, *b;
    size_t na, nb;
    df_error err = {0};
    df_text_span content = {17, 10};
    assert_int_equal(df_tokenizer_encode_spans(t, conv, strlen(conv), &content, 1, &a, &na, &err),
                     DF_OK);
    assert_true(na > 5);
    assert_int_equal(a[0], 151644);
    assert_int_equal(a[na - 2], 151645);
    for (size_t i = 1; i < na - 2; i++) assert_int_not_equal(a[i], 151645);
    free(a);

    const char *text = "Hello world,\n\n\n  indented\tand  spaced \xc3\xa9t\xc3\xa9 12345 "
                       "<think>\n\n</think>\n\nend \n";
    size_t len = strlen(text);
    assert_int_equal(df_tokenizer_encode(t, text, len, &a, &na, &err), DF_OK);
    for (size_t off = 0; off < len; off += 3) {
        df_text_span sp[2] = {{0, off / 2}, {off, len - off < 5 ? len - off : 5}};
        assert_int_equal(df_tokenizer_encode_spans(t, text, len, sp, 2, &b, &nb, &err), DF_OK);
        assert_int_equal(nb, na);
        assert_memory_equal(b, a, na * sizeof *a);
        free(b);
    }
    free(a);
}

static void test_llama3_specials(void **state) {
    const df_tokenizer *t = llama3(state);
    assert_int_equal(df_tokenizer_vocab_size(t), 128256);
    assert_int_equal(df_tokenizer_find(t, "<|begin_of_text|>"), 128000);
    assert_int_equal(df_tokenizer_find(t, "<|eot_id|>"), 128009);
    EXPECT(t, "<|begin_of_text|>Hello world", 128000, 9906, 1917);
}

/* Invalid UTF-8 and NUL bytes are encoded (as bytes) and come back unchanged. */
static void check_bytes_roundtrip(const df_tokenizer *t) {
    static const char raw[] = "ok \xff\xfe bad \xc3 trunc \xed\xa0\x80 surrogate \xf4\x90\x80\x80"
                              " big \xc0\xaf overlong \0 nul <|im_end|\xe2\x82";
    size_t len = sizeof raw - 1;
    int32_t *ids;
    size_t n = encode(t, raw, len, &ids);
    size_t dl;
    char *d = decode_all(t, ids, n, &dl);
    assert_int_equal(dl, len);
    assert_memory_equal(d, raw, len);
    free(d);
    free(ids);
    /* empty input */
    n = encode(t, "", 0, &ids);
    assert_int_equal(n, 0);
    free(ids);
    n = encode(t, NULL, 0, &ids);
    assert_int_equal(n, 0);
    free(ids);
    df_error err = {0};
    size_t nn;
    assert_int_equal(df_tokenizer_encode(t, NULL, 3, &ids, &nn, &err), DF_ERR_ARG);
}

static void test_qwen3_bytes(void **state) { check_bytes_roundtrip(qwen3(state)); }
static void test_llama3_bytes(void **state) { check_bytes_roundtrip(llama3(state)); }

/* A few hundred KB of generated text (words, numbers, punctuation, code, runs of
 * whitespace, accents, CJK, emoji): exercises the fast path; the time is printed,
 * not asserted. */
static char *gen_text(size_t target, size_t *len) {
    static const char *const words[] = {
        "the", "of", "and", "tokenizer", "engine", "expert", "mixture", "Qwen",
        "inference", "don't", "I'm", "we've", "HELLO", "x86_64", "3.14159", "2024",
        "1234567", "naïve", "café", "Äpfel", "München", "Привет", "мир", "日本語",
        "中文", "한국어", "🦙", "🚀🚀", "=>", "&&", "...", "(x)", "{y: 1}", "<tag>",
        "\t", "\n", "\n\n", "   ", "'s", "'LL", "--", "$100", "e.g.", "co-op"};
    size_t nw = sizeof words / sizeof words[0], cap = target + 64, o = 0;
    char *s = df_xmalloc(cap);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    while (o < target) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const char *w = words[x % nw];
        size_t l = strlen(w);
        if (o + l + 2 > cap) break;
        memcpy(s + o, w, l);
        o += l;
        if ((x >> 20) % 5) s[o++] = ' ';
    }
    s[o] = 0;
    *len = o;
    return s;
}

static void test_qwen3_bulk(void **state) {
    const df_tokenizer *t = qwen3(state);
    size_t len;
    char *text = gen_text(300 * 1000, &len);
    int32_t *ids;
    double t0 = df_now();
    size_t n = encode(t, text, len, &ids);
    double dt = df_now() - t0;
    fprintf(stderr, "  encoded %zu bytes into %zu tokens in %.3f s (sanitizer build)\n", len, n,
            dt);
    assert_true(n > len / 8 && n < len);
    size_t dl;
    char *d = decode_all(t, ids, n, &dl);
    assert_int_equal(dl, len); /* the generated text is already NFC */
    assert_memory_equal(d, text, len);
    free(d);
    free(ids);
    free(text);
}

/* ------------------------------------------------------------------------ */
/* synthetic tokenizers                                                     */

/* GPT-2 bytes_to_unicode, written independently of the library. */
static void byte_char(unsigned b, char out[3]) {
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        unsigned k = 0;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Byte-level spelling of a raw string (malloc'ed). */
static char *bl(const char *raw) {
    size_t n = strlen(raw);
    char *s = df_xmalloc(2 * n + 1), c[3];
    s[0] = 0;
    for (size_t i = 0; i < n; i++) {
        byte_char((unsigned char)raw[i], c);
        strcat(s, c);
    }
    return s;
}

/* Vocab: ids 0..255 are the bytes, then the listed extra tokens from 256 on.
 * Merges are raw-byte pairs, written in string or pair format. */
typedef struct synth {
    const char *extra[16];
    const char *merges[16][2];
    bool pair_format;
} synth;

static json_t *synth_json(const synth *sy) {
    json_t *vocab = json_object();
    char c[3];
    for (unsigned b = 0; b < 256; b++) {
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (int i = 0; i < 16 && sy->extra[i]; i++) {
        char *k = bl(sy->extra[i]);
        json_object_set_new(vocab, k, json_integer(256 + i));
        free(k);
    }
    json_t *merges = json_array();
    for (int i = 0; i < 16 && sy->merges[i][0]; i++) {
        char *a = bl(sy->merges[i][0]), *b = bl(sy->merges[i][1]);
        if (sy->pair_format) {
            json_array_append_new(merges, json_pack("[s, s]", a, b));
        } else {
            char *ab = df_xmalloc(strlen(a) + strlen(b) + 2);
            sprintf(ab, "%s %s", a, b);
            json_array_append_new(merges, json_string(ab));
            free(ab);
        }
        free(a);
        free(b);
    }
    return json_pack(
        "{s:s, s:[], s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, "
        "s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:o, s:o, s:b, s:b}}",
        "version", "1.0", "added_tokens", "normalizer", "pre_tokenizer", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0, "post_processor", "decoder", "type", "ByteLevel",
        "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE",
        "dropout", "vocab", vocab, "merges", merges, "byte_fallback", 0, "ignore_merges", 0);
}

static void add_token(json_t *j, int id, const char *content, bool lstrip, bool rstrip,
                      bool special) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content",
                                    content, "single_word", 0, "lstrip", lstrip, "rstrip", rstrip,
                                    "normalized", 0, "special", special));
}

/* Loads j (consumed); returns the status and fills err. */
static int load_json(json_t *j, df_tokenizer **t, df_error *err) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    assert_non_null(s);
    *t = NULL;
    memset(err, 0, sizeof *err);
    int rc = df_tokenizer_load_mem(t, s, strlen(s), "synth.json", err);
    free(s);
    return rc;
}

static df_tokenizer *load_ok(json_t *j) {
    df_tokenizer *t;
    df_error err;
    int rc = load_json(j, &t, &err);
    if (rc) fprintf(stderr, "load failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    return t;
}

static const synth SY_ORDER_AB = {{"ab", "bc", "abc"}, {{"a", "b"}, {"b", "c"}}, false};
static const synth SY_ORDER_BC = {{"ab", "bc", "abc"}, {{"b", "c"}, {"a", "b"}}, true};

static void test_merge_order(void **state) {
    (void)state;
    df_tokenizer *t = load_ok(synth_json(&SY_ORDER_AB));
    EXPECT(t, "abc", 256, 'c');    /* "a b" ranks first */
    EXPECT(t, "ab", 256);
    EXPECT(t, "xabcab", 'x', 256, 'c', 256);
    assert_int_equal(df_tokenizer_vocab_size(t), 259);
    assert_int_equal(df_tokenizer_find(t, "abc"), 258);
    df_tokenizer_free(t);
    t = load_ok(synth_json(&SY_ORDER_BC));
    EXPECT(t, "abc", 'a', 257); /* "b c" ranks first; pair format */
    df_tokenizer_free(t);

    /* equal ranks: leftmost first, and merges chain through new symbols */
    static const synth chain = {{"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}}, false};
    t = load_ok(synth_json(&chain));
    EXPECT(t, "aaa", 256, 'a');
    EXPECT(t, "aaaaa", 257, 'a');
    EXPECT(t, "aaaaaaa", 257, 256, 'a');
    df_tokenizer_free(t);
}

static void test_both_merge_formats_agree(void **state) {
    (void)state;
    synth a = {{"he", "ll", "hell", " w", "or", " wor", "ld", " world"},
               {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}, {"o", "r"}, {" w", "or"},
                {"l", "d"}, {" wor", "ld"}},
               false};
    synth b = a;
    b.pair_format = true;
    df_tokenizer *ta = load_ok(synth_json(&a)), *tb = load_ok(synth_json(&b));
    const char *text = "hello world, hell world";
    int32_t *ia, *ib;
    size_t na = encode(ta, text, strlen(text), &ia), nb = encode(tb, text, strlen(text), &ib);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    EXPECT(ta, "hello world", 258, 'o', 263);
    free(ia);
    free(ib);
    df_tokenizer_free(ta);
    df_tokenizer_free(tb);
}

static void test_ignore_merges(void **state) {
    (void)state;
    /* "abc" is in the vocab but no merge reaches it */
    static const synth sy = {{"ab", "abc"}, {{"a", "b"}}, false};
    df_tokenizer *t = load_ok(synth_json(&sy));
    EXPECT(t, "abc", 256, 'c');
    df_tokenizer_free(t);
    json_t *j = synth_json(&sy);
    json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_true());
    t = load_ok(j);
    EXPECT(t, "abc", 257);
    EXPECT(t, "abcd", 256, 'c', 'd');
    df_tokenizer_free(t);
}

static void test_added_tokens(void **state) {
    (void)state;
    static const synth sy = {{"ab"}, {{"a", "b"}}, false};
    json_t *j = synth_json(&sy);
    add_token(j, 300, "<x>", false, false, true);
    add_token(j, 301, "<x>y", false, false, false); /* longer: wins where it matches */
    add_token(j, 302, "[L]", true, false, true);
    add_token(j, 303, "[R]", false, true, true);
    add_token(j, 304, "ab", false, false, false); /* an added token shadowing a merge */
    df_tokenizer *t = load_ok(j);
    assert_int_equal(df_tokenizer_vocab_size(t), 305);
    EXPECT(t, "a<x>b", 'a', 300, 'b');
    EXPECT(t, "<x>y<x>", 301, 300);
    EXPECT(t, "<x<x>>", '<', 'x', 300, '>');
    EXPECT(t, "c  [L]  c", 'c', 302, ' ', ' ', 'c');
    EXPECT(t, "c  [R]  c", 'c', ' ', ' ', 303, 'c');
    EXPECT(t, "c\xc2\xa0[L]", 'c', 302); /* U+00A0 is whitespace for lstrip */
    EXPECT(t, "[L][R]", 302, 303);
    EXPECT(t, "abab", 304, 304);
    assert_int_equal(df_tokenizer_find(t, "<x>y"), 301);
    const char *b;
    size_t l;
    assert_int_equal(df_tokenizer_token_bytes(t, 304, &b, &l), 0);
    assert_memory_equal(b, "ab", 2);
    assert_int_equal(df_tokenizer_token_bytes(t, 299, &b, &l), -1); /* a gap in the ids */
    df_tokenizer_free(t);
}

/* Plain spans: special added tokens are text inside them (the longest other
 * token that matches there is taken), non-special ones are matched everywhere,
 * no special token reaches into a span, and bad spans are refused. */
static void test_plain_spans(void **state) {
    (void)state;
    static const synth sy = {{0}, {{0}}, false};
    json_t *j = synth_json(&sy);
    add_token(j, 300, "<s>", false, false, true);
    add_token(j, 301, "<t>", false, false, false);
    add_token(j, 302, "<s", false, false, false);
    add_token(j, 303, "[L]", true, false, true); /* lstrip */
    df_tokenizer *t = load_ok(j);
    EXPECT_PLAIN(t, "a<s>b", NULL, 0, 'a', 300, 'b');
    EXPECT_PLAIN(t, "a<s>b", SPANS({0, 5}), 1, 'a', 302, '>', 'b');
    EXPECT_PLAIN(t, "<t><s>", SPANS({0, 6}), 1, 301, 302, '>');
    EXPECT_PLAIN(t, "<s><s>", SPANS({3, 3}), 1, 300, 302, '>');
    EXPECT_PLAIN(t, "<s><s>", SPANS({0, 1}, {4, 1}), 2, 302, '>', 302, '>');
    EXPECT_PLAIN(t, "<s>", SPANS({2, 1}), 1, 302, '>');    /* would reach into the span */
    EXPECT_PLAIN(t, "<s>", SPANS({1, 0}, {3, 0}), 2, 300); /* empty spans: none */
    EXPECT_PLAIN(t, "[L]", SPANS({0, 3}), 1, '[', 'L', ']');
    /* a template token after plain text still strips the whitespace before it */
    EXPECT_PLAIN(t, "x  [L]", SPANS({0, 3}), 1, 'x', 303);

    int32_t *ids = (int32_t *)1;
    size_t n = 9;
    df_error err = {0};
    assert_int_equal(df_tokenizer_encode_spans(t, "abcdef", 6, SPANS({2, 2}, {3, 1}), 2, &ids,
                                               &n, &err),
                     DF_ERR_ARG);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err.msg, "plain[1]"));
    assert_non_null(strstr(err.msg, "out of order"));
    assert_int_equal(df_tokenizer_encode_spans(t, "abcdef", 6, SPANS({4, 3}), 1, &ids, &n, &err),
                     DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "plain[0]"));
    assert_non_null(strstr(err.msg, "not inside the text"));
    assert_int_equal(df_tokenizer_encode_spans(t, "abcdef", 6, SPANS({7, 0}), 1, &ids, &n, &err),
                     DF_ERR_ARG);
    assert_int_equal(df_tokenizer_encode_spans(t, "abcdef", 6, NULL, 1, &ids, &n, &err),
                     DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "plain"));
    df_tokenizer_free(t);

    /* a normalized special token is matched only in pieces that touch no span
     * (normalizing moves offsets; real tokenizers mark specials normalized: false) */
    j = synth_json(&sy);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 300, "content",
                                    "<n>", "single_word", 0, "lstrip", 0, "rstrip", 0,
                                    "normalized", 1, "special", 1));
    t = load_ok(j);
    EXPECT_PLAIN(t, "a<n>", NULL, 0, 'a', 300);
    EXPECT_PLAIN(t, "a<n>", SPANS({0, 1}), 1, 'a', '<', 'n', '>');
    df_tokenizer_free(t);
}

static void test_normalizers(void **state) {
    (void)state;
    static const synth sy = {{0}, {{0}}, false};
    /* e + U+0301 (combining acute) */
    df_tokenizer *t = load_ok(synth_json(&sy));
    EXPECT(t, "e\xcc\x81", 'e', 0xcc, 0x81);
    df_tokenizer_free(t);
    json_t *j = synth_json(&sy);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    t = load_ok(j);
    EXPECT(t, "e\xcc\x81", 0xc3, 0xa9);
    df_tokenizer_free(t);
    j = synth_json(&sy);
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "normalizers",
                                  "type", "NFKC", "type", "NFD"));
    t = load_ok(j);
    EXPECT(t, "\xef\xac\x81\xc3\xa9", 'f', 'i', 'e', 0xcc, 0x81); /* U+FB01 ligature, é */
    df_tokenizer_free(t);
}

static void test_pretokenizer_variants(void **state) {
    (void)state;
    static const synth sy = {{"a ", "a b"}, {{"a", " "}, {"a ", "b"}}, false};
    /* the Qwen-style split isolates " b" from "a" */
    df_tokenizer *t = load_ok(synth_json(&sy));
    EXPECT(t, "a b", 'a', ' ', 'b');
    df_tokenizer_free(t);
    /* ByteLevel without regex: one pre-token, merges cross the space */
    json_t *j = synth_json(&sy);
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                  "use_regex", 0));
    t = load_ok(j);
    EXPECT(t, "a b", 257);
    df_tokenizer_free(t);
    /* ByteLevel with the GPT-2 regex and a prefix space */
    j = synth_json(&sy);
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                                  "use_regex", 1));
    t = load_ok(j);
    EXPECT(t, "a b", ' ', 'a', ' ', 'b');
    EXPECT(t, " a", ' ', 'a');
    df_tokenizer_free(t);
    /* Split on a literal string, Removed */
    j = synth_json(&sy);
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}", "type",
                                  "Sequence", "pretokenizers", "type", "Split", "pattern",
                                  "String", "-", "behavior", "Removed", "invert", 0, "type",
                                  "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
    t = load_ok(j);
    EXPECT(t, "a b-a b--a", 257, 257, 'a');
    df_tokenizer_free(t);
    /* \s is Unicode White_Space as in Oniguruma (HF): U+3000 is a space, U+180E is
     * not (PCRE2's own \s would take it), outside and inside classes, and \S too */
    static const char *const pats[] = {"\\s+", "[\\s]+", "\\S+"};
    for (int k = 0; k < 3; k++) {
        j = synth_json(&sy);
        json_object_set_new(
            j, "pre_tokenizer",
            json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}", "type",
                      "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", pats[k],
                      "behavior", "Removed", "invert", 0, "type", "ByteLevel",
                      "add_prefix_space", 0, "use_regex", 0));
        t = load_ok(j);
        if (k < 2) {
            EXPECT(t, "a\xe3\x80\x80" "b", 'a', 'b');
            EXPECT(t, "a\xe1\xa0\x8e" "b", 'a', 0xe1, 0xa0, 0x8e, 'b');
        } else {
            EXPECT(t, "a\xe3\x80\x80" "b", 0xe3, 0x80, 0x80);
            EXPECT(t, "a\xe1\xa0\x8e" "b ", ' ');
        }
        df_tokenizer_free(t);
    }
}

/* Each broken file must fail with the expected code and name the field. */
typedef void (*mutator)(json_t *j);

static void m_vocab_missing(json_t *j) { json_object_del(json_object_get(j, "model"), "vocab"); }
static void m_vocab_array(json_t *j) {
    json_object_set_new(json_object_get(j, "model"), "vocab", json_array());
}
static void m_vocab_id_string(json_t *j) {
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz",
                        json_string("7"));
}
static void m_vocab_id_negative(json_t *j) {
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz",
                        json_integer(-3));
}
static void m_vocab_id_huge(json_t *j) {
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz",
                        json_integer(1ll << 40));
}
static void m_vocab_dup_id(json_t *j) {
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz",
                        json_integer(5));
}
static void m_vocab_not_bytelevel(json_t *j) {
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "a b",
                        json_integer(400));
}
static void m_vocab_missing_byte(json_t *j) {
    json_object_del(json_object_get(json_object_get(j, "model"), "vocab"), "A");
}
static void m_merges_missing(json_t *j) {
    json_object_del(json_object_get(j, "model"), "merges");
}
static void m_merge_number(json_t *j) {
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_integer(3));
}
static void m_merge_three(json_t *j) {
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_string("a b c"));
}
static void m_merge_unknown(json_t *j) {
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_string("q r"));
}
static void m_merge_pair_bad(json_t *j) {
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_pack("[s, i]", "a", 1));
}
static void m_model_missing(json_t *j) { json_object_del(j, "model"); }
static void m_model_wordpiece(json_t *j) {
    json_object_set_new(json_object_get(j, "model"), "type", json_string("WordPiece"));
}
static void m_dropout(json_t *j) {
    json_object_set_new(json_object_get(j, "model"), "dropout", json_real(0.1));
}
static void m_ignore_merges_type(json_t *j) {
    json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_string("yes"));
}
static void m_normalizer_unknown(json_t *j) {
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "Lowercase"));
}
static void m_normalizer_seq_unknown(json_t *j) {
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "normalizers",
                                  "type", "NFC", "type", "Strip"));
}
static void m_normalizer_string(json_t *j) {
    json_object_set_new(j, "normalizer", json_string("NFC"));
}
static void m_pretok_missing(json_t *j) { json_object_set_new(j, "pre_tokenizer", json_null()); }
static void m_pretok_unknown(json_t *j) {
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s}", "type", "Whitespace"));
}
static void m_pretok_bad_regex(json_t *j) {
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"),
                                                   "pretokenizers"),
                                   0);
    json_object_set_new(split, "pattern", json_pack("{s:s}", "Regex", "(unclosed"));
}
static void m_pretok_behavior(json_t *j) {
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"),
                                                   "pretokenizers"),
                                   0);
    json_object_set_new(split, "behavior", json_string("Contiguous"));
}
static void m_pretok_pattern_type(json_t *j) {
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"),
                                                   "pretokenizers"),
                                   0);
    json_object_set_new(split, "pattern", json_integer(5));
}
static void m_pretok_no_bytelevel(json_t *j) {
    json_array_remove(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 1);
}
static void m_decoder_unknown(json_t *j) {
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "WordPiece"));
}
static void m_added_not_array(json_t *j) { json_object_set_new(j, "added_tokens", json_true()); }
static void m_added_content(json_t *j) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i, s:i}", "id", 300, "content", 4));
}
static void m_added_id(json_t *j) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:s, s:s}", "id", "x", "content", "<y>"));
}
static void m_added_single_word(json_t *j) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 300, "content", "<y>",
                                    "single_word", 1));
}
static void m_top_array(json_t *j) {
    json_object_clear(j);
}

static void test_bad_json(void **state) {
    (void)state;
    static const struct {
        mutator m;
        int code;
        const char *needle;
    } cases[] = {
        {m_vocab_missing, DF_ERR_FORMAT, "model.vocab"},
        {m_vocab_array, DF_ERR_FORMAT, "model.vocab"},
        {m_vocab_id_string, DF_ERR_FORMAT, "model.vocab[\"zz\"]"},
        {m_vocab_id_negative, DF_ERR_FORMAT, "model.vocab[\"zz\"]"},
        {m_vocab_id_huge, DF_ERR_FORMAT, "out of range"},
        {m_vocab_dup_id, DF_ERR_FORMAT, "used twice"},
        {m_vocab_not_bytelevel, DF_ERR_FORMAT, "byte-level"},
        {m_vocab_missing_byte, DF_ERR_FORMAT, "byte 0x41"},
        {m_merges_missing, DF_ERR_FORMAT, "model.merges"},
        {m_merge_number, DF_ERR_FORMAT, "model.merges[1]"},
        {m_merge_three, DF_ERR_FORMAT, "model.merges[1]"},
        {m_merge_unknown, DF_ERR_FORMAT, "not in model.vocab"},
        {m_merge_pair_bad, DF_ERR_FORMAT, "model.merges[1]"},
        {m_model_missing, DF_ERR_FORMAT, "model"},
        {m_model_wordpiece, DF_ERR_UNSUPPORTED, "WordPiece"},
        {m_dropout, DF_ERR_UNSUPPORTED, "dropout"},
        {m_ignore_merges_type, DF_ERR_FORMAT, "model.ignore_merges"},
        {m_normalizer_unknown, DF_ERR_UNSUPPORTED, "\"Lowercase\""},
        {m_normalizer_seq_unknown, DF_ERR_UNSUPPORTED, "normalizer.normalizers[1]"},
        {m_normalizer_string, DF_ERR_FORMAT, "normalizer"},
        {m_pretok_missing, DF_ERR_UNSUPPORTED, "pre_tokenizer"},
        {m_pretok_unknown, DF_ERR_UNSUPPORTED, "\"Whitespace\""},
        {m_pretok_bad_regex, DF_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern"},
        {m_pretok_behavior, DF_ERR_UNSUPPORTED, "Contiguous"},
        {m_pretok_pattern_type, DF_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].pattern"},
        {m_pretok_no_bytelevel, DF_ERR_UNSUPPORTED, "ByteLevel"},
        {m_decoder_unknown, DF_ERR_UNSUPPORTED, "decoder"},
        {m_added_not_array, DF_ERR_FORMAT, "added_tokens"},
        {m_added_content, DF_ERR_FORMAT, "added_tokens[0].content"},
        {m_added_id, DF_ERR_FORMAT, "added_tokens[0].id"},
        {m_added_single_word, DF_ERR_UNSUPPORTED, "single_word"},
        {m_top_array, DF_ERR_FORMAT, "model"},
    };
    static const synth sy = {{"ab"}, {{"a", "b"}}, false};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = synth_json(&sy);
        cases[i].m(j);
        df_tokenizer *t;
        df_error err;
        int rc = load_json(j, &t, &err);
        if (rc != cases[i].code || !strstr(err.msg, cases[i].needle) ||
            !strstr(err.msg, "synth.json")) {
            fprintf(stderr, "case %zu: rc %d (want %d), message \"%s\" (want \"%s\")\n", i, rc,
                    cases[i].code, err.msg, cases[i].needle);
            df_tokenizer_free(t);
            fail();
        }
        assert_null(t);
    }

    /* not JSON at all, or not an object */
    static const char *const texts[] = {"", "{", "[1,2]", "{\"model\": }", "null", "\"x\"",
                                        "{\"a\":1}\xff", "{\"model\":{\"vocab\":{\"\\u0000\":0}}}"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        df_tokenizer *t = (df_tokenizer *)1;
        df_error err = {0};
        int rc = df_tokenizer_load_mem(&t, texts[i], strlen(texts[i]), "bad.json", &err);
        assert_int_equal(rc, DF_ERR_FORMAT);
        assert_null(t);
        assert_non_null(strstr(err.msg, "bad.json"));
    }
    df_tokenizer *t;
    df_error err = {0};
    assert_int_equal(df_tokenizer_load(&t, "/nonexistent/tokenizer.json", &err), DF_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
}

/* Every truncation of a valid file must fail cleanly (or load, for none). */
static void test_truncated_json(void **state) {
    (void)state;
    static const synth sy = {{"ab"}, {{"a", "b"}}, false};
    json_t *j = synth_json(&sy);
    add_token(j, 300, "<x>", false, false, true);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t n = strlen(s);
    for (size_t k = 0; k < n; k += 7) {
        df_tokenizer *t;
        df_error err;
        int rc = df_tokenizer_load_mem(&t, s, k, "trunc.json", &err);
        assert_int_equal(rc, DF_ERR_FORMAT);
    }
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_both_merge_formats_agree),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_plain_spans),
        cmocka_unit_test(test_normalizers),
        cmocka_unit_test(test_pretokenizer_variants),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_truncated_json),
        cmocka_unit_test(test_qwen2_vectors),
        cmocka_unit_test(test_qwen3_specials),
        cmocka_unit_test(test_qwen3_plain_spans),
        cmocka_unit_test(test_qwen3_bytes),
        cmocka_unit_test(test_qwen3_bulk),
        cmocka_unit_test(test_llama_bpe_vectors),
        cmocka_unit_test(test_llama3_specials),
        cmocka_unit_test(test_llama3_bytes),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, setup_assets, teardown_assets);
}
