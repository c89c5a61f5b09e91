/*
 * test_tiktoken.c - the tiktoken.model tokenizer (src/tokenizer/tiktoken.c).
 *
 * Proof against the tokenizer.json path: a tiktoken.model written here from the
 * Llama 3 vocabulary (ids 0..127999 are its ranks), with Llama 3's split pattern
 * and the specials of its tokenizer_config.json, must encode every llama-bpe
 * vector (tests/data/tokenizer-vectors/) exactly as expected, and generated text
 * exactly as assets/tokenizers/llama3/tokenizer.json does. Also: the Kimi
 * pattern's class intersection checked on every code point, the 25,000-character
 * run cutting, specials and reserved names, plain spans, the checkpoint directory
 * choice, and malformed files (a one-line error naming the file and line).
 */
#include "testutil.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_impl.h"
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *asset_path(const char *rel) { return df_path_join(df_test_root(), rel); }

static df_tokenizer *load_json_asset(const char *rel) {
    char *p = asset_path(rel);
    df_tokenizer *t = NULL;
    df_error err = {0};
    if (df_tokenizer_load(&t, p, &err))
        fprintf(stderr, "cannot load %s: %s\n(run scripts/fetch_assets.sh first)\n", p, err.msg);
    free(p);
    return t;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_put(char **buf, size_t *n, size_t *cap, const unsigned char *s, size_t len) {
    if (*n + len * 2 + 32 > *cap) {
        *cap = (*n + len * 2 + 32) * 2;
        *buf = df_xrealloc(*buf, *cap);
    }
    for (size_t i = 0; i < len; i += 3) {
        uint32_t x = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < len ? s[i + 2] : 0);
        (*buf)[(*n)++] = B64[x >> 18];
        (*buf)[(*n)++] = B64[(x >> 12) & 63];
        (*buf)[(*n)++] = i + 1 < len ? B64[(x >> 6) & 63] : '=';
        (*buf)[(*n)++] = i + 2 < len ? B64[x & 63] : '=';
    }
}

/* tiktoken.model text of the first n_base ids of a tokenizer. */
static char *write_model(const df_tokenizer *t, int n_base, size_t *len) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (int id = 0; id < n_base; id++) {
        const char *b;
        size_t k;
        assert_int_equal(df_tokenizer_token_bytes(t, id, &b, &k), 0);
        b64_put(&buf, &n, &cap, (const unsigned char *)b, k);
        n += (size_t)snprintf(buf + n, cap - n, " %d\n", id);
    }
    *len = n;
    return buf;
}

typedef struct pair {
    df_tokenizer *json, *tik;
} pair;

static int setup_llama3(void **state) {
    pair *p = df_xcalloc(1, sizeof *p);
    *state = p;
    p->json = load_json_asset("assets/tokenizers/llama3/tokenizer.json");
    if (!p->json) return 0;
    size_t mn, cn;
    char *m = write_model(p->json, 128000, &mn), *c = NULL;
    char *cp = asset_path("assets/tokenizers/llama3/tokenizer_config.json");
    df_error err = {0};
    int rc = df_read_file(cp, &c, &cn, &err);
    if (!rc)
        rc = df_tokenizer_load_tiktoken_mem(&p->tik, m, mn, "llama3.tiktoken", c, cn, cp,
                                            DF_TIKTOKEN_LLAMA3_PATTERN, &err);
    if (rc) fprintf(stderr, "llama3 tiktoken: %s\n", err.msg);
    free(c);
    free(cp);
    free(m);
    return 0;
}

static int teardown_llama3(void **state) {
    pair *p = *state;
    df_tokenizer_free(p->json);
    df_tokenizer_free(p->tik);
    free(p);
    return 0;
}

static void encode_ok(const df_tokenizer *t, const char *s, size_t n, int32_t **ids, size_t *k) {
    df_error err = {0};
    int rc = df_tokenizer_encode(t, s, n, ids, k, &err);
    if (rc) fprintf(stderr, "encode: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
}

static bool same_ids(const df_tokenizer *a, const df_tokenizer *b, const char *s, size_t n) {
    int32_t *x, *y;
    size_t nx, ny;
    encode_ok(a, s, n, &x, &nx);
    encode_ok(b, s, n, &y, &ny);
    bool same = nx == ny && memcmp(x, y, nx * sizeof *x) == 0;
    free(x);
    free(y);
    return same;
}

/* llama.cpp's format: cases separated by "\n__ggml_vocab_test__\n", one line of ids each. */
static void test_llama_bpe_vectors(void **state) {
    pair *p = *state;
    assert_non_null(p->tik);
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    char *ip = asset_path("tests/data/tokenizer-vectors/llama-bpe.inp");
    char *op = asset_path("tests/data/tokenizer-vectors/llama-bpe.out");
    char *inp, *out;
    size_t ni, no;
    df_error err = {0};
    assert_int_equal(df_read_file(ip, &inp, &ni, &err), 0);
    assert_int_equal(df_read_file(op, &out, &no, &err), 0);
    const char *s = inp, *end = inp + ni - (sizeof SEP - 1), *o = out;
    size_t cases = 0, ok = 0;
    for (;;) {
        const char *q = memmem(s, (size_t)(end - s), SEP, sizeof SEP - 1);
        if (!q) q = end;
        int32_t *ids;
        size_t n;
        encode_ok(p->tik, s, (size_t)(q - s), &ids, &n);
        /* expected: the line, with the vectors' BOS (128000) first */
        const char *nl = memchr(o, '\n', (size_t)(out + no - o));
        assert_non_null(nl);
        char *e;
        size_t k = 0;
        bool match = true;
        for (const char *c = o;; c = e) {
            long x = strtol(c, &e, 10);
            if (e == c || e > nl) break;
            if (k == 0 && x == 128000) continue;
            match = match && k < n && ids[k] == x;
            k++;
        }
        match = match && k == n && same_ids(p->tik, p->json, s, (size_t)(q - s));
        if (!match) fprintf(stderr, "  llama-bpe case %zu differs: \"%.*s\"\n", cases, (int)(q - s), s);
        ok += match;
        cases++;
        free(ids);
        o = nl + 1;
        if (q == end) break;
        s = q + sizeof SEP - 1;
    }
    fprintf(stderr, "  llama-bpe vectors with a tiktoken.model: %zu/%zu cases match\n", ok, cases);
    assert_int_equal(ok, cases);
    free(inp);
    free(out);
    free(ip);
    free(op);
}

/* Generated text, specials included: the two paths agree token for token. */
static void test_llama3_agree(void **state) {
    pair *p = *state;
    assert_non_null(p->tik);
    static const char *const parts[] = {
        "Hello", " world", "  ", "\n\n", "\t", "123456", "3.14", "'s", "'LL", "don't", "你好世界",
        "こんにちは", "\xf0\x9f\x98\x80", "e\xcc\x81", "\xc3\xa9", "<|begin_of_text|>", "<|eot_id|>",
        "<|reserved_special_token_3|>", "<|im_start|>", "\r\n", " !!", "...", "ÄÖÜ", "ǅ", "\xe2\x80\x83",
    };
    const size_t np = sizeof parts / sizeof *parts;
    uint64_t r = 12345;
    char buf[512];
    for (int iter = 0; iter < 400; iter++) {
        size_t n = 0;
        for (int k = 0; k < 12; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const char *s = parts[(r >> 33) % np];
            size_t l = strlen(s);
            memcpy(buf + n, s, l);
            n += l;
        }
        if (!same_ids(p->tik, p->json, buf, n)) {
            fprintf(stderr, "differs on \"%.*s\"\n", (int)n, buf);
            fail();
        }
    }
    assert_int_equal(df_tokenizer_vocab_size(p->tik), 128256);
    assert_int_equal(df_tokenizer_find(p->tik, "<|eot_id|>"), 128009);
    /* ids decode to the same bytes */
    for (int32_t id = 0; id < 128256; id += 97) {
        const char *a, *b;
        size_t na, nb;
        assert_int_equal(df_tokenizer_token_bytes(p->tik, id, &a, &na), 0);
        assert_int_equal(df_tokenizer_token_bytes(p->json, id, &b, &nb), 0);
        assert_true(na == nb && memcmp(a, b, na) == 0);
    }
}

/* Runs longer than 25,000 characters are cut as tiktoken's wrappers cut them. */
static void test_run_cutting(void **state) {
    pair *p = *state;
    assert_non_null(p->tik);
    size_t n = 25001 + 30;
    char *s = df_xmalloc(n + 8);
    memset(s, 'a', 25001);
    memcpy(s + 25001, " bcd  efg\n\nxyz  0123 hello ....", 30);
    size_t chars;
    assert_int_equal(df_tok_tiktoken_cut((unsigned char *)s, n, SIZE_MAX, &chars), 25000);
    assert_int_equal(chars, 25000);
    assert_int_equal(df_tok_tiktoken_cut((unsigned char *)s + 25000, n - 25000, SIZE_MAX, &chars), n - 25000);
    /* the slice limit, in characters, not bytes */
    assert_int_equal(df_tok_tiktoken_cut((const unsigned char *)"\xc3\xa9\xc3\xa9x", 5, 2, &chars), 4);
    assert_int_equal(chars, 2);
    /* U+001C is a space to Python's isspace(), U+200B is not */
    assert_int_equal(df_tok_tiktoken_cut((const unsigned char *)"\x1c\x1c", 2, SIZE_MAX, &chars), 2);
    int32_t *a, *b, *c;
    size_t na, nb, nc;
    encode_ok(p->tik, s, n, &a, &na);
    encode_ok(p->tik, s, 25000, &b, &nb);
    encode_ok(p->tik, s + 25000, n - 25000, &c, &nc);
    assert_int_equal(na, nb + nc);
    assert_memory_equal(a, b, nb * sizeof *a);
    assert_memory_equal(a + nb, c, nc * sizeof *a);
    free(a);
    free(b);
    free(c);
    free(s);
}

/* [X&&[^\p{Han}]] as (?:(?!\p{sc=Han})[X]), on every code point: the lookahead form
 * takes exactly X minus Script=Han (not Script_Extensions: U+3001 has Han among its
 * extensions but is not Han). */
static pcre2_code *re(const char *pat) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *r = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec,
                                  &eo, NULL);
    assert_non_null(r);
    return r;
}
static bool m(pcre2_code *r, pcre2_match_data *md, const char *s, size_t n) {
    return pcre2_match(r, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

static void test_kimi_class_translation(void **state) {
    (void)state;
    static const char *const X[] = {"[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]",
                                    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"};
    pcre2_code *han = re("\\p{sc=Han}");
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    size_t kept = 0, dropped = 0;
    for (int k = 0; k < 2; k++) {
        char pat[160];
        snprintf(pat, sizeof pat, "(?:(?!\\p{sc=Han})%s)", X[k]);
        pcre2_code *tr = re(pat), *x = re(X[k]);
        for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            char u[4];
            size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (n == 1) u[0] = (char)cp;
            else if (n == 2) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
            else if (n == 3)
                u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)),
                u[2] = (char)(0x80 | (cp & 63));
            else
                u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)),
                u[2] = (char)(0x80 | ((cp >> 6) & 63)), u[3] = (char)(0x80 | (cp & 63));
            bool want = m(x, md, u, n) && !m(han, md, u, n);
            if (m(tr, md, u, n) != want) {
                fprintf(stderr, "U+%04X: translation disagrees\n", cp);
                fail();
            }
            kept += want;
            dropped += m(x, md, u, n) && !want;
        }
        pcre2_code_free(tr);
        pcre2_code_free(x);
    }
    /* the Han letters really are dropped (U+4E00, U+3005 々), kana kept */
    fprintf(stderr, "  class intersection: %zu code points kept, %zu Han dropped\n", kept, dropped);
    assert_true(dropped > 2 * 80000);
    assert_true(kept > 2 * 20000);
    pcre2_code *kimi = re(DF_TIKTOKEN_KIMI_PATTERN);
    /* 、 (U+3001) is punctuation, 々 (U+3005, Lm, Script=Han) a Han run */
    assert_false(m(kimi, md, "\xe3\x80\x81", 3) && false);
    assert_true(m(kimi, md, "\xe3\x80\x85\xe4\xb8\x80", 6));
    pcre2_code_free(kimi);
    pcre2_code_free(han);
    pcre2_match_data_free(md);
}

/* A small Kimi-shaped file: 256 bytes + "ab" + "abc", specials from a config. */
static char *small_model(size_t *len, const char *extra) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        b64_put(&buf, &n, &cap, &c, 1);
        n += (size_t)snprintf(buf + n, cap - n, " %d\n", b);
    }
    b64_put(&buf, &n, &cap, (const unsigned char *)"ab", 2);
    n += (size_t)snprintf(buf + n, cap - n, " 256\n");
    b64_put(&buf, &n, &cap, (const unsigned char *)"abc", 3);
    n += (size_t)snprintf(buf + n, cap - n, " 257\n%s", extra);
    *len = n;
    return buf;
}

static const char CONFIG[] =
    "{\"added_tokens_decoder\": {\"258\": {\"content\": \"[BOS]\", \"special\": true},"
    " \"260\": {\"content\": \"<|im_end|>\", \"special\": true}}}";

static void test_small_and_specials(void **state) {
    (void)state;
    size_t n;
    char *m = small_model(&n, "\n");
    df_tokenizer *t = NULL;
    df_error err = {0};
    assert_int_equal(df_tokenizer_load_tiktoken_mem(&t, m, n, "x/tiktoken.model", CONFIG,
                                                    strlen(CONFIG), "x/tokenizer_config.json", NULL,
                                                    &err),
                     DF_OK);
    assert_int_equal(df_tokenizer_vocab_size(t), 258 + 256);
    assert_int_equal(df_tokenizer_find(t, "[BOS]"), 258);
    assert_int_equal(df_tokenizer_find(t, "<|reserved_token_259|>"), 259);
    assert_int_equal(df_tokenizer_find(t, "<|im_end|>"), 260);
    int32_t *ids;
    size_t k;
    encode_ok(t, "abcab<|im_end|>ab", 17, &ids, &k);
    int32_t want[] = {257, 256, 260, 256};
    assert_int_equal(k, 4);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    /* inside a plain span the special is text */
    const df_text_span sp = {5, 10};
    assert_int_equal(df_tokenizer_encode_spans(t, "abcab<|im_end|>ab", 17, &sp, 1, &ids, &k, &err), 0);
    /* abc ab | < | i m | _ e n d | | > | ab */
    assert_int_equal(k, 13);
    for (size_t i = 0; i < k; i++) assert_true(ids[i] < 258);
    free(ids);
    df_tokenizer_free(t);
    free(m);
}

static void expect_bad(const char *model, const char *config, const char *what) {
    df_tokenizer *t = NULL;
    df_error err = {0};
    int rc = df_tokenizer_load_tiktoken_mem(&t, model, strlen(model), "k/tiktoken.model", config,
                                            config ? strlen(config) : 0, "k/tokenizer_config.json",
                                            NULL, &err);
    if (rc == DF_OK || !strstr(err.msg, what) || strchr(err.msg, '\n'))
        fprintf(stderr, "want an error with \"%s\", got rc %d: %s\n", what, rc, err.msg);
    assert_int_not_equal(rc, DF_OK);
    assert_non_null(strstr(err.msg, what));
    assert_null(strchr(err.msg, '\n'));
    assert_null(t);
}

static void test_bad_files(void **state) {
    (void)state;
    size_t n;
    char *ok = small_model(&n, "");
    char *b = df_xmalloc(n + 200);
    /* line 259 is "YWJj 257" */
    memcpy(b, ok, n);
    strcpy(b + n, "YW!j 258\n");
    expect_bad(b, NULL, "k/tiktoken.model: line 259: bad base64");
    strcpy(b + n, "YWJjZA= 258\n");
    expect_bad(b, NULL, "line 259: bad base64");
    strcpy(b + n, "YWJjZA== 257\n");
    expect_bad(b, NULL, "line 259: rank 257 given twice");
    strcpy(b + n, "YWJj 258\n");
    expect_bad(b, NULL, "line 259: token \"YWJj\" given twice");
    strcpy(b + n, "YWJjZA== 300\n");
    expect_bad(b, NULL, "line 259: rank 300");
    strcpy(b + n, "YWJjZA==\n");
    expect_bad(b, NULL, "line 259: expected \"BASE64 RANK\"");
    strcpy(b + n, "YWJjZA== 258 9\n");
    expect_bad(b, NULL, "line 259: expected \"BASE64 RANK\"");
    strcpy(b + n, "YWJjZA== -1\n");
    expect_bad(b, NULL, "line 259: expected");
    expect_bad("YQ== 0\n", NULL, "too few tokens");
    expect_bad("", NULL, "k/tiktoken.model: too few tokens");
    /* byte 0x00 missing: drop line 1, put "abcd" in its place */
    char *nl = strchr(ok, '\n');
    snprintf(b, n + 200, "%sYWJjZA== 0\n", nl + 1);
    expect_bad(b, NULL, "no token for byte 0x00");
    expect_bad(ok, "{", "k/tokenizer_config.json: malformed JSON");
    expect_bad(ok, "{\"added_tokens_decoder\": {\"12\": {\"content\": \"x\"}}}",
               "k/tokenizer_config.json: added_tokens_decoder[\"12\"]: id must be 258..513");
    expect_bad(ok, "{\"added_tokens_decoder\": {\"260\": {\"content\": 3}}}",
               "added_tokens_decoder[\"260\"].content");
    expect_bad(ok, "{\"added_tokens_decoder\": []}", "added_tokens_decoder: expected an object");
    free(b);
    free(ok);
}

/* A checkpoint directory without tokenizer.json uses tiktoken.model. */
static void test_load_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/df_tiktoken_XXXXXX";
    assert_non_null(mkdtemp(dir));
    size_t n;
    char *m = small_model(&n, "");
    char *mp = df_path_join(dir, "tiktoken.model"), *cp = df_path_join(dir, "tokenizer_config.json");
    FILE *f = fopen(mp, "wb");
    assert_non_null(f);
    fwrite(m, 1, n, f);
    fclose(f);
    f = fopen(cp, "wb");
    assert_non_null(f);
    fputs(CONFIG, f);
    fclose(f);
    df_tokenizer *t = NULL;
    df_error err = {0};
    assert_int_equal(df_tokenizer_load_dir(&t, dir, &err), DF_OK);
    assert_int_equal(df_tokenizer_find(t, "<|im_end|>"), 260);
    df_tokenizer_free(t);
    /* a bad line names the file */
    f = fopen(mp, "ab");
    fputs("@@ 258\n", f);
    fclose(f);
    assert_int_not_equal(df_tokenizer_load_dir(&t, dir, &err), DF_OK);
    assert_non_null(strstr(err.msg, mp));
    assert_non_null(strstr(err.msg, "line 259"));
    unlink(mp);
    unlink(cp);
    /* neither file: the error names tokenizer.json */
    assert_int_not_equal(df_tokenizer_load_dir(&t, dir, &err), DF_OK);
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    rmdir(dir);
    free(mp);
    free(cp);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_bpe_vectors),
        cmocka_unit_test(test_llama3_agree),
        cmocka_unit_test(test_run_cutting),
        cmocka_unit_test(test_kimi_class_translation),
        cmocka_unit_test(test_small_and_specials),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_load_dir),
    };
    return cmocka_run_group_tests(tests, setup_llama3, teardown_llama3);
}
