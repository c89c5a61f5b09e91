/*
 * test_tokenizer.c - the byte-level BPE tokenizer on real tokenizers
 * (assets/tokenizers/, fetched by scripts/fetch_assets.sh): every case of llama.cpp's
 * reference vectors (tests/data/tokenizer-vectors/) must match exactly,
 * decode(encode(x)) must give x back (NFC(x) for Qwen3, which normalizes), plus special
 * tokens (plain text inside plain spans, chat content) and a few hundred KB of
 * generated text. Tokenizers built in JSON (merge order, normalizers, bad inputs) are
 * in test_tokenizer_json.c.
 */
#include "toktest.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
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
