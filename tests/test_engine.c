/*
 * test_engine.c - the engine through its public API on synthetic checkpoints
 * (tests/make_test_models.sh): a row's logits are bit-identical whatever the
 * batch it is evaluated in, the thread count and the kernel path; truncation
 * replays exactly (a KV cache and a latent cache); bad calls and bad directories fail cleanly.
 */
#include "testutil.h"

#include "deltafin.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NTOK 80 /* crosses the engine's 64-row chunk */

static char model_path[4][512];

static const char *model(int i) {
    const char *names[] = {"engine-moe", "engine-dense", "engine-ds", "engine-ds-v2"};
    const char *d = getenv("DF_TEST_MODELS");
    snprintf(model_path[i], sizeof model_path[i], "%s/%s", d ? d : "build/test-models", names[i]);
    return model_path[i];
}

static int32_t toks[NTOK];

static void init_tokens(void) {
    uint32_t s = 12345;
    for (int i = 0; i < NTOK; i++) {
        s = s * 1664525u + 1013904223u;
        toks[i] = (int32_t)((s >> 8) % 1000);
    }
}

/* Logits of all NTOK rows, fed `step` tokens per call. */
static float *run_chunk(const char *dir, int threads, const char *isa, int step, int chunk,
                        int *vocab) {
    df_engine_opts o = {.model_dir = dir, .n_threads = threads, .isa = isa, .prefill_chunk = chunk};
    df_engine *e;
    df_error err;
    int rc = df_engine_open(&e, &o, &err);
    if (rc) fail_msg("open %s: %s", dir, err.msg);
    int V = df_engine_info(e)->vocab_size;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)V * NTOK);
    for (int i = 0; i < NTOK; i += step) {
        int k = NTOK - i < step ? NTOK - i : step;
        rc = df_session_eval(s, toks + i, k, lg + (size_t)i * V, 1, &err);
        if (rc) fail_msg("eval: %s", err.msg);
    }
    df_session_free(s);
    df_engine_close(e);
    *vocab = V;
    return lg;
}

static float *run(const char *dir, int threads, const char *isa, int step, int *vocab) {
    return run_chunk(dir, threads, isa, step, 0, vocab);
}

static void check_identical(int which) {
    int V;
    float *ref = run(model(which), 1, "c", 1, &V);
    struct { int threads; const char *isa; int step, chunk; } arms[] = {
        {1, "c", NTOK, 0}, {2, "c", 7, 0}, {2, NULL, NTOK, 0}, {1, NULL, 1, 0}, {3, NULL, 13, 0},
        {2, "avx2", NTOK, 0}, {2, "avx512", 5, 0}, {2, NULL, NTOK, 7}, {1, NULL, NTOK, 64},
        /* one row per call (the decode step's own job layout) split over threads */
        {2, NULL, 1, 0}, {3, "avx2", 1, 0}, {2, "c", 1, 0},
    };
    int checked = 0;
    for (size_t a = 0; a < sizeof arms / sizeof arms[0]; a++) {
        if (arms[a].isa && strcmp(arms[a].isa, "c") != 0) {
            int want = df_isa_from_name(arms[a].isa);
            if (want < 0 || (int)df_isa_detect() < want) continue; /* CPU lacks it */
        }
        int V2;
        float *got = run_chunk(model(which), arms[a].threads, arms[a].isa, arms[a].step,
                               arms[a].chunk, &V2);
        assert_int_equal(V, V2);
        for (int r = 0; r < NTOK; r++)
            if (memcmp(ref + (size_t)r * V, got + (size_t)r * V, sizeof(float) * (size_t)V) != 0)
                fail_msg("arm %zu (threads %d, isa %s, step %d, chunk %d): row %d differs", a,
                         arms[a].threads, arms[a].isa ? arms[a].isa : "auto", arms[a].step,
                         arms[a].chunk, r);
        free(got);
        checked++;
    }
    assert_true(checked >= 9);
    /* the check itself can fail: a perturbed row is noticed */
    float *again = run(model(which), 2, NULL, NTOK, &V);
    again[(size_t)3 * V + 5] = nextafterf(again[(size_t)3 * V + 5], INFINITY);
    assert_int_not_equal(memcmp(ref, again, sizeof(float) * (size_t)V * NTOK), 0);
    free(again);
    free(ref);
}

static void test_moe_bit_exact(void **st) { (void)st; check_identical(0); }
/* the DeepSeek-V3 family: MLA in one (absorbed) form for prefill and decode */
static void test_deepseek_v3_bit_exact(void **st) { (void)st; check_identical(2); }
static void test_deepseek_v2_bit_exact(void **st) { (void)st; check_identical(3); }
static void test_dense_bit_exact(void **st) { (void)st; check_identical(1); }

static void check_truncate(int which) {
    df_engine_opts o = {.model_dir = model(which), .n_threads = 2};
    df_engine *e;
    df_error err;
    assert_int_equal(df_engine_open(&e, &o, &err), DF_OK);
    int V = df_engine_info(e)->vocab_size;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, 32, &err), DF_OK);
    float *a = malloc(sizeof(float) * (size_t)V * 10), *b = malloc(sizeof(float) * (size_t)V * 5);
    assert_int_equal(df_session_eval(s, toks, 10, a, 1, &err), DF_OK);
    assert_int_equal(df_session_pos(s), 10);
    assert_int_equal(df_session_rollback(s, 5, &err), 5);
    /* a different continuation, then back */
    assert_int_equal(df_session_eval(s, toks + 20, 3, NULL, 0, &err), DF_OK);
    assert_int_equal(df_session_rollback(s, 5, &err), 5);
    assert_int_equal(df_session_eval(s, toks + 5, 5, b, 1, &err), DF_OK);
    assert_memory_equal(a + (size_t)5 * V, b, sizeof(float) * (size_t)V * 5);
    /* errors: context full, bad token, bad truncate */
    int32_t many[40] = {0};
    assert_int_equal(df_session_eval(s, many, 40, NULL, 0, &err), DF_ERR_CONTEXT);
    assert_non_null(strstr(err.msg, "context"));
    int32_t bad = V + 3;
    assert_int_equal(df_session_eval(s, &bad, 1, NULL, 0, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "vocabulary"));
    assert_int_equal(df_session_rollback(s, 99, &err), -1);
    assert_int_equal(err.code, DF_ERR_ARG);
    assert_int_equal(df_session_rollback(s, -1, &err), -1);
    free(a);
    free(b);
    df_session_free(s);
    df_engine_close(e);
}

static void test_truncate_replays(void **st) { (void)st; check_truncate(0); }
/* the latent cache: rows past the rollback point are left and overwritten */
static void test_truncate_replays_deepseek(void **st) { (void)st; check_truncate(2); }

static void test_open_errors(void **st) {
    (void)st;
    df_engine *e;
    df_error err;
    df_engine_opts o = {.model_dir = "/nonexistent/deltafin-model"};
    assert_int_equal(df_engine_open(&e, &o, &err), DF_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/deltafin-model"));
    o.model_dir = model(0);
    o.isa = "sse9";
    assert_int_equal(df_engine_open(&e, &o, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "sse9"));
}

static void test_text_stream(void **st) {
    (void)st;
    df_engine_opts o = {.model_dir = model(0), .n_threads = 1};
    df_engine *e;
    df_error err;
    assert_int_equal(df_engine_open(&e, &o, &err), DF_OK);
    /* "é€😀" split into tokens whose bytes cut characters: the stream must only
     * emit whole characters and end with the exact text. */
    const char *text = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80!";
    int32_t *ids;
    size_t n;
    assert_int_equal(df_tokenize(e, text, strlen(text), &ids, &n, &err), DF_OK);
    df_text_stream ts = {0};
    char out[256], buf[64];
    size_t o2 = 0;
    for (size_t i = 0; i < n; i++) {
        size_t w = df_text_stream_push(e, &ts, ids[i], buf, sizeof buf);
        /* every chunk is complete UTF-8 on its own */
        for (size_t j = 0; j < w;) {
            unsigned char c = (unsigned char)buf[j];
            size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            assert_true(j + l <= w);
            j += l;
        }
        memcpy(out + o2, buf, w);
        o2 += w;
    }
    o2 += df_text_stream_flush(&ts, out + o2, sizeof out - o2);
    assert_int_equal(o2, strlen(text));
    assert_memory_equal(out, text, o2);
    free(ids);
    df_engine_close(e);
}

int main(void) {
    init_tokens();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_bit_exact),   cmocka_unit_test(test_dense_bit_exact),
        cmocka_unit_test(test_deepseek_v3_bit_exact), cmocka_unit_test(test_deepseek_v2_bit_exact),
        cmocka_unit_test(test_truncate_replays), cmocka_unit_test(test_truncate_replays_deepseek),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_text_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
