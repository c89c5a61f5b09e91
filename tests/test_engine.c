/*
 * test_engine.c - the engine through its public API on synthetic checkpoints
 * (tests/make_test_models.sh): a row's logits are bit-identical whatever the
 * batch it is evaluated in, the thread count and the kernel path (also for the
 * Kimi-Linear family's recurrent state: a prompt as T rows or T single steps,
 * in passes of any size); truncation replays exactly (a KV cache and a latent
 * cache), and a recurrent state rolls back exactly to the positions it kept,
 * or the nearest earlier one, within the session's keep limit; bad calls and
 * bad directories fail cleanly.
 */
#include "testutil.h"

#include "deltafin.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NTOK 80 /* crosses the engine's 64-row chunk */

static char model_path[9][512];

/* 4..6: the Kimi-Linear family (KDA recurrent state + NoPE MLA): Kimi-Linear's
 * shape, K3's (MXFP4 experts, latent MoE, attention residuals), per-channel A_log */
enum { KIMI_LINEAR = 4, K3 = 5, KDA_CHAN = 6 };

static const char *model(int i) {
    const char *names[] = {"engine-moe",         "engine-dense", "engine-ds",      "engine-ds-v2",
                           "engine-kimi-linear", "engine-k3",    "engine-kda-chan", "engine-fp8-ds",
                           "engine-fp8-ue8m0"};
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

/* Logits of all n rows of tk, fed `step` tokens per call, the engine evaluating
 * at most `chunk` rows per pass (0: its default). */
static float *run_tokens(const char *dir, int threads, const char *isa, int step, int chunk, const int32_t *tk,
                         int n, int *vocab) {
    df_engine_opts o = {.model_dir = dir, .n_threads = threads, .isa = isa, .prefill_chunk = chunk};
    df_engine *e;
    df_error err;
    int rc = df_engine_open(&e, &o, &err);
    if (rc) fail_msg("open %s: %s", dir, err.msg);
    int V = df_engine_info(e)->vocab_size;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, n, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        rc = df_session_eval(s, tk + i, k, lg + (size_t)i * V, 1, &err);
        if (rc) fail_msg("eval: %s", err.msg);
    }
    df_session_free(s);
    df_engine_close(e);
    *vocab = V;
    return lg;
}

static float *run_chunk(const char *dir, int threads, const char *isa, int step, int chunk, int *vocab) {
    return run_tokens(dir, threads, isa, step, chunk, toks, NTOK, vocab);
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
        if (arms[a].isa && !df_test_isa_available(arms[a].isa)) continue; /* CPU lacks it */
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
/* FP8 as shipped: the one-token products read the F16-form maps, and with power-of-two
 * block scales (DeepSeek-V3.1) move them onto the activations; on every path */
static void test_fp8_bit_exact(void **st) { (void)st; check_identical(7); }
static void test_fp8_ue8m0_bit_exact(void **st) { (void)st; check_identical(8); }

/* Kimi Delta Attention runs its recurrence row by row in position order: a
 * prompt prefilled as T rows gives the bits of T single-token steps, in
 * passes of any size, with any thread count and kernel path. */
#define NREC 21
static void check_recurrent_identical(int which) {
    int V;
    float *ref = run_tokens(model(which), 1, "c", 1, 0, toks, NREC, &V); /* T single steps */
    const char *isas[] = {"c", "avx2", "avx512"};
    /* (tokens per call, rows per pass): T rows at once; single steps; passes of 1, 3, 7 rows;
     * calls of 5 rows cut into passes of 3 (a pass ends inside a call and across calls) */
    struct { int step, chunk; } ways[] = {{NREC, 0}, {1, 0}, {NREC, 1}, {NREC, 3}, {NREC, 7}, {5, 3}};
    int checked = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!df_test_isa_available(isas[i])) continue;
        /* every way on the CPU's own path; the others (slow under the
         * sanitizers) with 2 threads in whole and split passes */
        bool all = df_isa_from_name(isas[i]) == (int)df_isa_detect();
        for (int threads = all ? 1 : 2; threads <= 2; threads++)
            for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
                if (!all && w != 0 && w != 5) continue;
                int V2;
                float *got = run_tokens(model(which), threads, isas[i], ways[w].step, ways[w].chunk, toks, NREC, &V2);
                assert_int_equal(V, V2);
                for (int r = 0; r < NREC; r++)
                    if (memcmp(ref + (size_t)r * V, got + (size_t)r * V, sizeof(float) * (size_t)V) != 0)
                        fail_msg("%s (isa %s, threads %d, %d tokens per call, passes of %d): row %d differs",
                                 model(which), isas[i], threads, ways[w].step, ways[w].chunk, r);
                free(got);
                checked++;
            }
    }
    /* the C path and, where the CPU has one, a vector path */
    assert_true(checked >= (df_isa_detect() == DF_ISA_C ? 12 : 14));
    /* the rows differ from each other (the state carries something) and the
     * check notices a one-ulp change */
    assert_int_not_equal(memcmp(ref, ref + V, sizeof(float) * (size_t)V), 0);
    float *again = run_tokens(model(which), 2, NULL, NREC, 0, toks, NREC, &V);
    again[(size_t)(NREC - 1) * V + 7] = nextafterf(again[(size_t)(NREC - 1) * V + 7], INFINITY);
    assert_int_not_equal(memcmp(ref, again, sizeof(float) * (size_t)V * NREC), 0);
    free(again);
    free(ref);
}

static void test_kimi_linear_bit_exact(void **st) { (void)st; check_recurrent_identical(KIMI_LINEAR); }
static void test_k3_bit_exact(void **st) { (void)st; check_recurrent_identical(K3); }
static void test_kda_per_channel_bit_exact(void **st) { (void)st; check_recurrent_identical(KDA_CHAN); }

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

/* ---- a recurrent state rolls back to kept positions only ------------------------- */

#define NROLL 24
typedef struct {
    df_engine *e;
    df_session *s;
    int V;
    float *ref;  /* [NROLL][V]: a fresh session's logits of toks[0..NROLL) */
    float *got;
} roll_ctx;

static void roll_open(roll_ctx *c, int chunk) {
    df_engine_opts o = {.model_dir = model(K3), .n_threads = 2, .prefill_chunk = chunk};
    df_error err;
    if (df_engine_open(&c->e, &o, &err)) fail_msg("open: %s", err.msg);
    c->V = df_engine_info(c->e)->vocab_size;
    c->ref = malloc(sizeof(float) * (size_t)c->V * NROLL);
    c->got = malloc(sizeof(float) * (size_t)c->V * NROLL);
    assert_int_equal(df_session_new(&c->s, c->e, NROLL, &err), DF_OK);
    assert_int_equal(df_session_eval(c->s, toks, NROLL, c->ref, 1, &err), DF_OK);
    df_session_free(c->s);
    assert_int_equal(df_session_new(&c->s, c->e, NROLL, &err), DF_OK);
}

static void roll_close(roll_ctx *c) {
    df_session_free(c->s);
    df_engine_close(c->e);
    free(c->ref);
    free(c->got);
}

/* Rolls back towards `want`, expecting to land at `at`, then evaluates the
 * rest of toks in calls of `step`: every row's logits are a fresh session's. */
static void roll_replay(roll_ctx *c, int want, int at, int step) {
    df_error err;
    int got = df_session_rollback(c->s, want, &err);
    if (got != at) fail_msg("rollback to %d: at %d, want %d (%s)", want, got, at, got < 0 ? err.msg : "");
    assert_int_equal(df_session_pos(c->s), at);
    for (int i = at; i < NROLL; i += step) {
        int k = NROLL - i < step ? NROLL - i : step;
        assert_int_equal(df_session_eval(c->s, toks + i, k, c->got + (size_t)i * c->V, 1, &err), DF_OK);
    }
    for (int r = at; r < NROLL; r++)
        if (memcmp(c->ref + (size_t)r * c->V, c->got + (size_t)r * c->V, sizeof(float) * (size_t)c->V) != 0)
            fail_msg("after a rollback to %d (asked %d): row %d differs from a fresh session's", at, want, r);
}

/* Kept positions inside a pass, at a pass's end and at a call's end; a
 * different continuation evaluated past them, then back, exactly; a position
 * that was not kept gives the nearest earlier kept one, or 0. */
static void test_rollback_recurrent(void **st) {
    (void)st;
    roll_ctx c;
    roll_open(&c, 3); /* passes of 3 rows: position 5 is kept inside one, 9 at a pass's end */
    df_error err;
    int lim = df_session_keep_limit(c.s);
    assert_true(lim >= 3 && lim < 1000); /* a recurrent state keeps a few positions, not all */
    df_session_keep(c.s, 5);
    df_session_keep(c.s, 9);
    df_session_keep(c.s, 14);
    assert_int_equal(df_session_eval(c.s, toks, 14, NULL, 0, &err), DF_OK); /* 14: the call's end */
    int32_t other[6] = {3, 1, 4, 1, 5, 9};
    assert_int_equal(df_session_eval(c.s, other, 6, NULL, 0, &err), DF_OK);
    assert_int_equal(df_session_pos(c.s), 20);
    assert_int_equal(df_session_rollback(c.s, 20, &err), 20); /* where it is: always */
    roll_replay(&c, 14, 14, 1);
    roll_replay(&c, 16, 14, 4); /* not kept: the nearest earlier kept position */
    roll_replay(&c, 13, 9, 2);
    roll_replay(&c, 14, 9, 3);  /* kept positions past a rollback are forgotten with their rows */
    roll_replay(&c, 8, 5, NROLL);
    roll_replay(&c, 4, 0, 7);   /* nothing kept before: the start */
    /* a full session: rolling back makes room */
    assert_int_equal(df_session_eval(c.s, toks, 1, NULL, 0, &err), DF_ERR_CONTEXT);
    roll_replay(&c, 0, 0, 5);
    /* a position the session has passed cannot be kept any more (asking is
     * ignored: nothing was snapshotted there); the current one can */
    df_session_keep(c.s, 10);
    roll_replay(&c, 12, 0, 10);
    assert_int_equal(df_session_rollback(c.s, 0, &err), 0);
    assert_int_equal(df_session_eval(c.s, toks, 11, NULL, 0, &err), DF_OK);
    df_session_keep(c.s, 11);
    df_session_keep(c.s, 6);
    assert_int_equal(df_session_eval(c.s, other, 6, NULL, 0, &err), DF_OK);
    roll_replay(&c, 12, 11, 2);
    roll_replay(&c, 10, 0, NROLL);
    /* out of range: an error, the session unchanged */
    assert_int_equal(df_session_rollback(c.s, NROLL + 1, &err), -1);
    assert_int_equal(err.code, DF_ERR_ARG);
    assert_int_equal(df_session_rollback(c.s, -1, &err), -1);
    assert_int_equal(df_session_pos(c.s), NROLL);
    roll_close(&c);
}

/* Keeping more positions than df_session_keep_limit forgets the oldest
 * requests but not the earliest position (df_seq_keep): a shared prompt
 * prefix outlives later keeps. */
static void test_rollback_keep_limit(void **st) {
    (void)st;
    roll_ctx c;
    roll_open(&c, 0);
    df_error err;
    int lim = df_session_keep_limit(c.s);
    assert_true(lim >= 2 && 2 * (lim + 2) < NROLL);
    /* 2, 4, ..., 2 (lim + 2): the earliest (2) stays; of the rest the last lim - 1 */
    for (int i = 1; i <= lim + 2; i++) df_session_keep(c.s, 2 * i);
    assert_int_equal(df_session_eval(c.s, toks, NROLL, NULL, 0, &err), DF_OK);
    int first_kept = 2 * (lim + 2) - 2 * (lim - 2); /* the oldest of the last lim - 1 */
    for (int p = 2 * (lim + 2); p >= first_kept; p -= 2) roll_replay(&c, p + 1, p, 5);
    /* those between the earliest and the last lim - 1 were forgotten */
    roll_replay(&c, first_kept - 1, 2, 3);
    roll_replay(&c, 1, 0, NROLL);
    roll_close(&c);
}

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
        cmocka_unit_test(test_fp8_bit_exact),   cmocka_unit_test(test_fp8_ue8m0_bit_exact),
        cmocka_unit_test(test_kimi_linear_bit_exact), cmocka_unit_test(test_k3_bit_exact),
        cmocka_unit_test(test_kda_per_channel_bit_exact),
        cmocka_unit_test(test_truncate_replays), cmocka_unit_test(test_truncate_replays_deepseek),
        cmocka_unit_test(test_rollback_recurrent), cmocka_unit_test(test_rollback_keep_limit),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_text_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
