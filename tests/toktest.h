/*
 * toktest.h - what the tokenizer tests (test_tokenizer.c: the real tokenizers;
 * test_tokenizer_json.c: tokenizers built here in JSON) share: encoding with a check
 * on the result, decoding back, and the EXPECT / EXPECT_PLAIN comparisons of ids.
 */
#ifndef DF_TESTS_TOKTEST_H
#define DF_TESTS_TOKTEST_H

#include "testutil.h"

#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>

static inline char *decode_all(const df_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
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

static inline size_t encode(const df_tokenizer *t, const char *s, size_t len, int32_t **ids) {
    size_t n = 99;
    df_error err = {0};
    int rc = df_tokenizer_encode(t, s, len, ids, &n, &err);
    if (rc) fprintf(stderr, "encode failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    return n;
}

/* ids[0..n) against the expected list; on a difference prints both after
 * `what` (the input described) and fails the test. Frees ids. */
static inline void expect_same_ids(const char *what, int32_t *ids, size_t n, const int32_t *exp, size_t n_exp) {
    if (n != n_exp || memcmp(ids, exp, n * sizeof *ids) != 0) {
        fprintf(stderr, "%s: got", what);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", expected");
        for (size_t i = 0; i < n_exp; i++) fprintf(stderr, " %d", exp[i]);
        fprintf(stderr, "\n");
        free(ids);
        fail();
    }
    free(ids);
}

/* Encodes a NUL-terminated string and compares with an expected id list. */
static inline void expect_ids(const df_tokenizer *t, const char *s, const int32_t *exp, size_t n_exp) {
    int32_t *ids;
    size_t n = encode(t, s, strlen(s), &ids);
    char what[512];
    snprintf(what, sizeof what, "encode(\"%s\")", s);
    expect_same_ids(what, ids, n, exp, n_exp);
}
#define EXPECT(t, s, ...)                                                                       \
    do {                                                                                        \
        const int32_t e_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, s, e_, sizeof e_ / sizeof e_[0]);                                         \
    } while (0)

/* Same, with special tokens plain inside the spans {off, len}. */
static inline void expect_plain(const df_tokenizer *t, const char *s, const df_text_span *sp, size_t nsp,
                                const int32_t *exp, size_t n_exp) {
    int32_t *ids;
    size_t n;
    df_error err = {0};
    int rc = df_tokenizer_encode_spans(t, s, strlen(s), sp, nsp, &ids, &n, &err);
    if (rc) fprintf(stderr, "encode failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    char what[512];
    snprintf(what, sizeof what, "encode(\"%s\", %zu plain spans)", s, nsp);
    expect_same_ids(what, ids, n, exp, n_exp);
}
#define SPANS(...) ((const df_text_span[]){__VA_ARGS__})
#define EXPECT_PLAIN(t, s, sp, nsp, ...)                                                        \
    do {                                                                                        \
        const int32_t e_[] = {__VA_ARGS__};                                                     \
        expect_plain(t, s, sp, nsp, e_, sizeof e_ / sizeof e_[0]);                              \
    } while (0)

#endif
