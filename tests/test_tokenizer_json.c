/*
 * test_tokenizer_json.c - byte-level BPE tokenizers built here in JSON: merge order and
 * tie-breaking, both merge list formats, ignore_merges, added tokens (longest match,
 * lstrip/rstrip, plain spans), normalizers, pre-tokenizer variants, and bad
 * tokenizer.json inputs, which must give errors naming the field, never a crash.
 * The real tokenizers against llama.cpp's vectors are in test_tokenizer.c.
 */
#include "toktest.h"

#include <jansson.h>

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
    };
    return cmocka_run_group_tests_name("tokenizer-json", tests, NULL, NULL);
}
