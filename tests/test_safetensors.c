/*
 * test_safetensors.c - the safetensors reader: valid files built in memory,
 * every hostile header we can think of (each asserting the error code and that
 * the message names the file and the tensor), and checkpoint directories on
 * disk (single file, sharded, truncated, inconsistent index).
 */
#include "testutil.h"

#include "model/safetensors.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

/* Assembles a safetensors file: 8-byte LE header length, header, data_len bytes
 * of data (byte i = i * 7 + 1, so content checks can tell tensors apart).
 * hlen_override != UINT64_MAX writes that length instead of the true one. */
static uint8_t *build_st(const char *header, size_t data_len, uint64_t hlen_override,
                         size_t *out_len) {
    size_t hl = strlen(header);
    size_t n = 8 + hl + data_len;
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    uint64_t w = hlen_override == UINT64_MAX ? hl : hlen_override;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(w >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 7 + 1);
    *out_len = n;
    return b;
}

/* Parses header+data and expects failure with `code`; the message must
 * contain each non-NULL needle. */
static void expect_fail_rc(int rc, const df_error *err, int code, const char *n1, const char *n2) {
    if (rc != code || (n1 && !strstr(err->msg, n1)) || (n2 && !strstr(err->msg, n2)))
        print_error("rc=%d (want %d) msg='%s' want '%s' and '%s'\n", rc, code, err->msg,
                    n1 ? n1 : "", n2 ? n2 : "");
    if (getenv("DF_TEST_VERBOSE")) fprintf(stderr, "    [%d] %s\n", rc, err->msg);
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    if (n1) assert_non_null(strstr(err->msg, n1));
    if (n2) assert_non_null(strstr(err->msg, n2));
}

static void parse_expect(const char *header, size_t data_len, int code, const char *n1,
                         const char *n2) {
    size_t len;
    uint8_t *b = build_st(header, data_len, UINT64_MAX, &len);
    df_tensor *t = (df_tensor *)0x1;
    size_t n = 99;
    df_error err = {0};
    int rc = df_st_parse(b, len, "m.safetensors", &t, &n, &err);
    if (rc == DF_OK) df_st_free_tensors(t, n);
    expect_fail_rc(rc, &err, code, n1, n2);
    assert_non_null(strstr(err.msg, "m.safetensors"));
    assert_null(t);
    assert_int_equal(n, 0);
    free(b);
}

static void write_st(const char *dir, const char *name, const char *header, size_t data_len) {
    size_t len;
    uint8_t *b = build_st(header, data_len, UINT64_MAX, &len);
    df_test_write_file(dir, name, b, len);
    free(b);
}

static char *make_tmpdir(void) {
    char *d = strdup("/tmp/df-test-st-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rm_tmpdir(char *d) {
    df_test_rm_tree(d);
    free(d);
}

/* ---- valid headers ------------------------------------------------------- */

static void test_parse_valid(void **state) {
    (void)state;
    /* Listed out of file order: the parser returns them by offset. */
    const char *h = "{\"b.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]},"
                    "\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}";
    size_t len;
    uint8_t *b = build_st(h, 28, UINT64_MAX, &len);
    df_tensor *t;
    size_t n;
    df_error err = {0};
    assert_int_equal(df_st_parse(b, len, "x", &t, &n, &err), DF_OK);
    assert_int_equal(n, 2);
    size_t data0 = 8 + strlen(h);
    assert_string_equal(t[0].name, "a.weight");
    assert_int_equal(t[0].dtype, DF_DT_BF16);
    assert_int_equal(t[0].ndim, 2);
    assert_int_equal(t[0].shape[0], 2);
    assert_int_equal(t[0].shape[1], 3);
    assert_int_equal(t[0].nbytes, 12);
    assert_int_equal(t[0].file_offset, data0);
    assert_ptr_equal(t[0].data, b + data0);
    assert_string_equal(t[1].name, "b.weight");
    assert_int_equal(t[1].dtype, DF_DT_F32);
    assert_int_equal(t[1].ndim, 1);
    assert_int_equal(t[1].nbytes, 16);
    assert_int_equal(t[1].file_offset, data0 + 12);
    assert_ptr_equal(t[1].data, b + data0 + 12);
    assert_int_equal(t[1].file, 0);
    df_st_free_tensors(t, n);
    free(b);
}

static void test_parse_edge_valid(void **state) {
    (void)state;
    /* scalar (shape [] = one element), zero-sized tensors anywhere, padding
     * spaces after the JSON (HF aligns the data start this way), every dtype. */
    const char *h = "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                    "\"z2\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
                    "\"e\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[8,10]},"
                    "\"u\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[10,12]}}     ";
    size_t len;
    uint8_t *b = build_st(h, 16, UINT64_MAX, &len); /* trailing unused data is fine */
    df_tensor *t;
    size_t n;
    df_error err = {0};
    int rc = df_st_parse(b, len, "x", &t, &n, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    assert_int_equal(n, 5);
    assert_string_equal(t[0].name, "s");
    assert_int_equal(t[0].ndim, 0);
    assert_int_equal(t[0].nbytes, 8);
    int found_e = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, "e") == 0) {
            found_e = 1;
            assert_int_equal(t[i].ndim, 8);
            assert_int_equal(t[i].dtype, DF_DT_F8_E4M3);
        }
    assert_true(found_e);
    df_st_free_tensors(t, n);
    free(b);

    /* empty header: no tensors */
    b = build_st("{}", 0, UINT64_MAX, &len);
    assert_int_equal(df_st_parse(b, len, "x", &t, &n, &err), DF_OK);
    assert_int_equal(n, 0);
    df_st_free_tensors(t, n);
    free(b);
}

/* ---- hostile headers ----------------------------------------------------- */

static void test_short_file(void **state) {
    (void)state;
    uint8_t b[7] = {0};
    df_tensor *t;
    size_t n;
    df_error err = {0};
    expect_fail_rc(df_st_parse(b, sizeof b, "tiny.st", &t, &n, &err), &err, DF_ERR_FORMAT,
                   "tiny.st", "too short");
    expect_fail_rc(df_st_parse(NULL, 0, "empty.st", &t, &n, &err), &err, DF_ERR_FORMAT,
                   "empty.st", "too short");
}

static void test_header_length(void **state) {
    (void)state;
    uint64_t lens[] = {UINT64_MAX - 1, (uint64_t)1 << 63, 100000001ull, 1};
    const char *want[] = {"exceeds the", "exceeds the", "limit", "not valid JSON"};
    for (int i = 0; i < 4; i++) {
        size_t len;
        uint8_t *b = build_st("{}", 0, lens[i], &len);
        df_tensor *t;
        size_t n;
        df_error err = {0};
        expect_fail_rc(df_st_parse(b, len, "h.st", &t, &n, &err), &err, DF_ERR_FORMAT, "h.st",
                       want[i]);
        free(b);
    }
    /* one past the file */
    size_t len;
    uint8_t *b = build_st("{}", 0, 3, &len);
    df_tensor *t;
    size_t n;
    df_error err = {0};
    expect_fail_rc(df_st_parse(b, len, "h.st", &t, &n, &err), &err, DF_ERR_FORMAT, "h.st",
                   "file size");
    free(b);
    /* length just under 100 MB but past the file */
    b = build_st("{}", 0, 100000000ull, &len);
    expect_fail_rc(df_st_parse(b, len, "h.st", &t, &n, &err), &err, DF_ERR_FORMAT, "h.st",
                   "file size");
    free(b);
}

static void test_not_json(void **state) {
    (void)state;
    parse_expect("{\"a\":", 0, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("garbage", 0, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("", 0, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("{} trailing", 0, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("{\"a\\u0000b\":{}}", 0, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("[]", 0, DF_ERR_FORMAT, "not a JSON object", NULL);
    parse_expect("42", 0, DF_ERR_FORMAT, "not a JSON object", NULL);
    parse_expect("\"s\"", 0, DF_ERR_FORMAT, "not a JSON object", NULL);
}

static void test_duplicate_keys(void **state) {
    (void)state;
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 2, DF_ERR_FORMAT, "duplicate", "w");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 2, DF_ERR_FORMAT, "duplicate", "dtype");
}

static void test_offsets(void **state) {
    (void)state;
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3,
                 DF_ERR_FORMAT, "tensor 'w'", "past the end");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[9223372036854775800,"
                 "9223372036854775804]}}",
                 3, DF_ERR_FORMAT, "tensor 'w'", "past the end");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,2]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "before begin");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "negative");
    /* beyond int64: jansson refuses the integer */
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}",
                 8, DF_ERR_FORMAT, "not valid JSON", NULL);
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "data_offsets");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "data_offsets");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.0,1]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "data_offsets");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0,1\"}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "data_offsets");
}

static void test_overlap(void **state) {
    (void)state;
    parse_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, DF_ERR_FORMAT, "overlaps", "'a'");
    /* identical ranges */
    parse_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 12, DF_ERR_FORMAT, "overlaps", NULL);
    /* one inside another, found even with a tensor in between */
    parse_expect("{\"big\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]},"
                 "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[10,11]},"
                 "\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[50,51]}}",
                 100, DF_ERR_FORMAT, "overlaps tensor 'big'", "tensor 'x'");
}

static void test_size_mismatch(void **state) {
    (void)state;
    parse_expect("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 16,
                 DF_ERR_FORMAT, "tensor 'w'", "needs 12");
    parse_expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}", 16,
                 DF_ERR_FORMAT, "tensor 'w'", "needs 4");
}

static void test_dtype(void **state) {
    (void)state;
    parse_expect("{\"layer.w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 8,
                 DF_ERR_FORMAT, "tensor 'layer.w'", "unknown dtype 'F4'");
    parse_expect("{\"w\":{\"dtype\":\"bf16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "'bf16'");
    parse_expect("{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,4]}}", 8, DF_ERR_FORMAT,
                 "tensor 'w'", "dtype");
    parse_expect("{\"w\":{\"shape\":[2],\"data_offsets\":[0,4]}}", 8, DF_ERR_FORMAT,
                 "tensor 'w'", "missing 'dtype'");
}

static void test_shape(void **state) {
    (void)state;
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "negative");
    /* 2^32 * 2^32 overflows the element count */
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                 "\"data_offsets\":[0,0]}}",
                 8, DF_ERR_FORMAT, "tensor 'w'", "overflow");
    /* elements fit, bytes do not */
    parse_expect("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                 "\"data_offsets\":[0,0]}}",
                 8, DF_ERR_FORMAT, "tensor 'w'", "overflow");
    /* a zero dimension makes the huge ones harmless (0 elements); the offsets
     * must then span 0 bytes */
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[0,9223372036854775807,9223372036854775807],"
                 "\"data_offsets\":[0,1]}}",
                 8, DF_ERR_FORMAT, "tensor 'w'", "needs 0");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                 8, DF_ERR_FORMAT, "tensor 'w'", "9 dimensions");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "shape[0]");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,\"2\"],\"data_offsets\":[0,2]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "shape[1]");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "shape");
}

static void test_entry_structure(void **state) {
    (void)state;
    parse_expect("{\"w\":[1,2]}", 8, DF_ERR_FORMAT, "tensor 'w'", "not a JSON object");
    parse_expect("{\"w\":null}", 8, DF_ERR_FORMAT, "tensor 'w'", "not a JSON object");
    parse_expect("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 8,
                 DF_ERR_FORMAT, "tensor 'w'", "unknown key 'x'");
    parse_expect("{\"__metadata__\":{\"format\":1}}", 0, DF_ERR_FORMAT, "__metadata__",
                 "format");
    parse_expect("{\"__metadata__\":[]}", 0, DF_ERR_FORMAT, "__metadata__", NULL);
}

static void test_long_name_message(void **state) {
    (void)state;
    /* a 5000-character name: the message stays bounded and well formed */
    char *h = malloc(6000);
    char *p = h;
    p += sprintf(p, "{\"");
    for (int i = 0; i < 5000; i++) *p++ = 'n';
    sprintf(p, "\":{\"dtype\":\"Q\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    parse_expect(h, 8, DF_ERR_FORMAT, "tensor 'nnnn", NULL);
    free(h);
}

static void test_many_tensors(void **state) {
    (void)state;
    /* the engine looks up tens of thousands of expert tensors */
    enum { N = 20000 };
    size_t cap = (size_t)N * 160 + 16;
    char *h = malloc(cap);
    size_t o = 0;
    o += (size_t)sprintf(h + o, "{");
    for (int i = 0; i < N; i++)
        o += (size_t)sprintf(h + o, "%s\"model.layers.%d.mlp.experts.%d.up_proj.weight\":"
                             "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", i / 128, i % 128, i, i + 1);
    sprintf(h + o, "}");
    char *dir = make_tmpdir();
    write_st(dir, "model.safetensors", h, N);
    free(h);
    df_st *st;
    df_error err = {0};
    int rc = df_st_open_dir(&st, dir, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    assert_int_equal(df_st_count(st), N);
    double t0 = df_now();
    char name[128];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", i / 128,
                 i % 128);
        const df_tensor *t = df_st_find(st, name);
        assert_non_null(t);
        assert_string_equal(t->name, name);
        assert_int_equal(((const uint8_t *)t->data)[0], (uint8_t)(i * 7 + 1));
    }
    assert_null(df_st_find(st, "model.layers.0.mlp.experts.0.up_proj.weigh"));
    assert_null(df_st_find(st, ""));
    assert_true(df_now() - t0 < 2.0);
    df_st_close(st);
    rm_tmpdir(dir);
}

/* ---- directories --------------------------------------------------------- */

static const char *H2 =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}";

static void test_open_single(void **state) {
    (void)state;
    char *dir = make_tmpdir();
    write_st(dir, "model.safetensors", H2, 24);
    df_st *st;
    df_error err = {0};
    assert_int_equal(df_st_open_dir(&st, dir, &err), DF_OK);
    assert_int_equal(df_st_count(st), 2);
    assert_int_equal(df_st_file_count(st), 1);
    assert_non_null(strstr(df_st_file_path(st, 0), "model.safetensors"));
    assert_null(df_st_file_path(st, 1));
    assert_true(df_st_file_fd(st, 0) >= 0);
    assert_int_equal(df_st_file_fd(st, 1), -1);
    const df_tensor *n = df_st_find(st, "model.norm.weight");
    assert_non_null(n);
    assert_int_equal(n->nbytes, 8);
    assert_int_equal(((const uint8_t *)n->data)[0], (uint8_t)(16 * 7 + 1));
    /* the descriptor reads the same bytes the mapping shows */
    uint8_t buf[8];
    assert_int_equal(pread(df_st_file_fd(st, 0), buf, 8, (off_t)n->file_offset), 8);
    assert_memory_equal(buf, n->data, 8);
    assert_ptr_equal(df_st_at(st, 0), df_st_find(st, "model.embed_tokens.weight"));
    assert_null(df_st_at(st, 2));
    assert_null(df_st_find(st, "nope"));
    df_st_close(st);
    rm_tmpdir(dir);
}

static void test_open_missing(void **state) {
    (void)state;
    char *dir = make_tmpdir();
    df_st *st = (df_st *)0x1;
    df_error err = {0};
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_IO, dir, "model.safetensors");
    assert_null(st);
    expect_fail_rc(df_st_open_dir(&st, "/nonexistent/dir", &err), &err, DF_ERR_IO,
                   "/nonexistent/dir/model.safetensors", NULL);
    /* a directory where the file should be */
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_IO, p, NULL);
    rmdir(p);
    /* an empty file */
    df_test_write_file(dir, "model.safetensors", "", 0);
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_FORMAT, p, "too short");
    rm_tmpdir(dir);
}

static void test_open_truncated(void **state) {
    (void)state;
    char *dir = make_tmpdir();
    size_t len;
    uint8_t *b = build_st(H2, 24, UINT64_MAX, &len);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    df_st *st;
    df_error err = {0};
    /* data cut short: names the file and the tensor that no longer fits */
    df_test_write_file(dir, "model.safetensors", b, len - 3);
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_FORMAT, p,
                   "tensor 'model.norm.weight'");
    assert_non_null(strstr(err.msg, "truncated"));
    /* cut inside the header */
    df_test_write_file(dir, "model.safetensors", b, 8 + strlen(H2) / 2);
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_FORMAT, p, "header length");
    free(b);
    rm_tmpdir(dir);
}

/* Shard A: a, b. Shard B: c. */
static const char *SA = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}";
static const char *SB = "{\"c\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
#define SHARD_A "model-00001-of-00002.safetensors"
#define SHARD_B "model-00002-of-00002.safetensors"

static char *sharded_dir(const char *index) {
    char *dir = make_tmpdir();
    write_st(dir, SHARD_A, SA, 3);
    write_st(dir, SHARD_B, SB, 4);
    df_test_write_file(dir, "model.safetensors.index.json", index, strlen(index));
    return dir;
}

static void test_open_sharded(void **state) {
    (void)state;
    char *dir = sharded_dir("{\"metadata\":{\"total_size\":7},\"weight_map\":{"
                            "\"c\":\"" SHARD_B "\",\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_A "\"}}");
    /* a stray model.safetensors is ignored when an index exists */
    write_st(dir, "model.safetensors", "{}", 0);
    df_st *st;
    df_error err = {0};
    int rc = df_st_open_dir(&st, dir, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    assert_int_equal(df_st_count(st), 3);
    assert_int_equal(df_st_file_count(st), 2);
    const df_tensor *a = df_st_find(st, "a"), *c = df_st_find(st, "c");
    assert_non_null(a);
    assert_non_null(c);
    assert_non_null(strstr(df_st_file_path(st, a->file), SHARD_A));
    assert_non_null(strstr(df_st_file_path(st, c->file), SHARD_B));
    assert_int_not_equal(a->file, c->file);
    assert_int_equal(c->dtype, DF_DT_I16);
    assert_int_equal(((const uint8_t *)c->data)[1], 8);
    assert_true(df_st_file_fd(st, 0) >= 0 && df_st_file_fd(st, 1) >= 0);
    df_st_close(st);
    rm_tmpdir(dir);
}

static void sharded_expect(const char *index, int code, const char *n1, const char *n2) {
    char *dir = sharded_dir(index);
    df_st *st = (df_st *)0x1;
    df_error err = {0};
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, code, n1, n2);
    assert_null(st);
    rm_tmpdir(dir);
}

static void test_sharded_bad(void **state) {
    (void)state;
    /* index names a shard that does not exist */
    sharded_expect("{\"weight_map\":{\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_A
                   "\",\"c\":\"model-00003-of-00003.safetensors\"}}",
                   DF_ERR_IO, "model-00003-of-00003.safetensors", "cannot open");
    /* index lists a tensor no shard holds */
    sharded_expect("{\"weight_map\":{\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_A "\",\"c\":\"" SHARD_B
                   "\",\"d\":\"" SHARD_B "\"}}",
                   DF_ERR_FORMAT, "tensor 'd'", SHARD_B);
    /* a shard holds a tensor the index does not list */
    sharded_expect("{\"weight_map\":{\"a\":\"" SHARD_A "\",\"c\":\"" SHARD_B "\"}}",
                   DF_ERR_FORMAT, "tensor 'b'", "not listed");
    /* index puts a tensor in the wrong shard */
    sharded_expect("{\"weight_map\":{\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_B "\",\"c\":\"" SHARD_B
                   "\"}}",
                   DF_ERR_FORMAT, "tensor 'b'", SHARD_B);
    /* path tricks in shard names */
    sharded_expect("{\"weight_map\":{\"a\":\"../" SHARD_A "\"}}", DF_ERR_FORMAT, "tensor 'a'",
                   "not a file name");
    sharded_expect("{\"weight_map\":{\"a\":\"\"}}", DF_ERR_FORMAT, "tensor 'a'", "not a file name");
    /* malformed index */
    sharded_expect("{\"weight_map\":{\"a\":3}}", DF_ERR_FORMAT, "index.json", "tensor 'a'");
    sharded_expect("{\"weight_map\":[]}", DF_ERR_FORMAT, "index.json", "weight_map");
    sharded_expect("{\"metadata\":{}}", DF_ERR_FORMAT, "index.json", "weight_map");
    sharded_expect("{\"weight_map\":{}}", DF_ERR_FORMAT, "index.json", "empty");
    sharded_expect("{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", DF_ERR_FORMAT, "index.json",
                   "duplicate");
    sharded_expect("not json", DF_ERR_FORMAT, "index.json", "not valid JSON");
}

static void test_sharded_duplicate_across(void **state) {
    (void)state;
    /* the same name in two shards: whichever the index does not name is caught */
    char *dir = make_tmpdir();
    write_st(dir, SHARD_A, SA, 3);
    write_st(dir, SHARD_B, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    const char *idx = "{\"weight_map\":{\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_A "\"}}";
    df_test_write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    df_st *st;
    df_error err = {0};
    /* shard B is never opened (not in the index), so this is valid */
    assert_int_equal(df_st_open_dir(&st, dir, &err), DF_OK);
    df_st_close(st);
    const char *idx2 = "{\"weight_map\":{\"a\":\"" SHARD_B "\",\"b\":\"" SHARD_A "\"}}";
    df_test_write_file(dir, "model.safetensors.index.json", idx2, strlen(idx2));
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_FORMAT, "tensor 'a'", SHARD_B);
    rm_tmpdir(dir);
}

static void test_sharded_truncated_shard(void **state) {
    (void)state;
    char *dir = sharded_dir("{\"weight_map\":{\"a\":\"" SHARD_A "\",\"b\":\"" SHARD_A
                            "\",\"c\":\"" SHARD_B "\"}}");
    size_t len;
    uint8_t *b = build_st(SB, 4, UINT64_MAX, &len);
    df_test_write_file(dir, SHARD_B, b, len - 1);
    free(b);
    df_st *st;
    df_error err = {0};
    expect_fail_rc(df_st_open_dir(&st, dir, &err), &err, DF_ERR_FORMAT, SHARD_B, "tensor 'c'");
    rm_tmpdir(dir);
}

/* A df_st over tensors parsed from memory (what the fuzzer binds weights in):
 * names found, the file named as given, no descriptor; a name twice refused. */
static void test_from_tensors(void **state) {
    (void)state;
    const char *h = "{\"b.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]},"
                    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}";
    size_t len, n;
    uint8_t *b = build_st(h, 28, UINT64_MAX, &len);
    df_tensor *t;
    df_error err = {0};
    assert_int_equal(df_st_parse(b, len, "mem", &t, &n, &err), DF_OK);
    df_st *st;
    assert_int_equal(df_st_from_tensors(&st, t, n, "mem", &err), DF_OK);
    assert_int_equal(df_st_count(st), 2);
    const df_tensor *a = df_st_find(st, "a.weight");
    assert_non_null(a);
    assert_int_equal(a->nbytes, 12);
    assert_ptr_equal(a->data, b + 8 + strlen(h));
    assert_non_null(df_st_find(st, "b.weight"));
    assert_null(df_st_find(st, "c.weight"));
    assert_string_equal(df_st_file_path(st, a->file), "mem");
    assert_string_equal(df_st_where(st), "mem");
    assert_int_equal(df_st_file_fd(st, 0), -1);
    df_st_close(st);
    /* the same name twice (a parser never gives that; the view still refuses it) */
    df_tensor *d = calloc(2, sizeof *d);
    assert_non_null(d);
    d[0].name = strdup("x.weight");
    d[1].name = strdup("x.weight");
    assert_int_equal(df_st_from_tensors(&st, d, 2, "mem", &err), DF_ERR_FORMAT);
    assert_null(st);
    assert_non_null(strstr(err.msg, "tensor 'x.weight'"));
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_edge_valid),
        cmocka_unit_test(test_short_file),
        cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_dtype),
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_entry_structure),
        cmocka_unit_test(test_long_name_message),
        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_from_tensors),
        cmocka_unit_test(test_open_single),
        cmocka_unit_test(test_open_missing),
        cmocka_unit_test(test_open_truncated),
        cmocka_unit_test(test_open_sharded),
        cmocka_unit_test(test_sharded_bad),
        cmocka_unit_test(test_sharded_duplicate_across),
        cmocka_unit_test(test_sharded_truncated_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
