/*
 * test_batchgen_pcache.c - df_batchgen with the engine's prompt cache (what
 * `serve --parallel` runs on): requests in a batch store their prompts (the
 * interval's multiples, the prompt less its last token, the end of the
 * generation) and restore them at join, as df_generate does, on a Qwen3-MoE
 * (KV cache) and a Kimi K3 (recurrent state: chunks end at the multiples);
 * every request's tokens equal df_generate's without a cache, and a state a
 * batch stored is one df_generate restores.
 */
#include "testutil.h"

#include "deltafin.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CTX 256
#define NP 180    /* prompt P's length: past two intervals of either model */
#define SHARED 90 /* Q starts with P's first SHARED tokens */
#define NR 25
#define MAX_NEW 6
#define EVERY 8

static char tmp[256];
static int32_t P[NP], Q[NP], R[NR];

typedef struct out {
    int32_t toks[MAX_NEW];
    int n, done, status;
    df_generate_result res;
} out;

static int on_token(void *u, int32_t t) {
    out *o = u;
    o->toks[o->n++] = t;
    return 0;
}

static void on_done(void *u, const df_generate_result *r, int status, const df_error *err) {
    out *o = u;
    (void)err;
    o->res = *r;
    o->status = status;
    o->done++;
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/deltafin-test-bgpc-%d", (int)getpid());
    mkdir(tmp, 0755);
    uint32_t x = 777;
    for (int i = 0; i < NP; i++) x = x * 1664525u + 1013904223u, P[i] = (int32_t)((x >> 8) % 1000);
    memcpy(Q, P, sizeof(int32_t) * SHARED);
    for (int i = SHARED; i < NP; i++) x = x * 1664525u + 1013904223u, Q[i] = (int32_t)((x >> 8) % 1000);
    for (int i = 0; i < NR; i++) x = x * 1664525u + 1013904223u, R[i] = (int32_t)((x >> 8) % 1000);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static df_engine *open_model(const char *name, const char *cache) {
    char dir[512];
    const char *d = getenv("DF_TEST_MODELS");
    snprintf(dir, sizeof dir, "%s/%s", d ? d : "build/test-models", name);
    df_engine_opts o = {.model_dir = dir, .n_threads = 2, .prompt_cache = cache, .prompt_cache_every = EVERY};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", dir, err.msg);
    return e;
}

static df_generate_opts opts(df_sampler *smp, out *o) {
    *o = (out){0};
    return (df_generate_opts){.sampler = smp, .max_new = MAX_NEW, .prefill_chunk = 7, .reuse_prefix = 1,
                              .on_token = on_token, .user = o};
}

/* prompt alone on a fresh session: df_generate */
static void alone(df_engine *e, df_sampler *smp, const int32_t *p, int n, out *o) {
    df_session *s;
    df_error err;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    df_generate_opts go = opts(smp, o);
    if (df_generate(s, p, n, &go, &o->res, &err)) fail_msg("generate: %s", err.msg);
    df_session_free(s);
}

/* the prompts together in one batch, each on a fresh session */
static void together(df_engine *e, df_sampler *smp, const int32_t *const *p, const int *n, int k, out *o) {
    df_batchgen *g;
    df_session *s[4];
    df_error err;
    assert_int_equal(df_batchgen_new(&g, e, 16, CTX, &err), DF_OK);
    for (int i = 0; i < k; i++) {
        assert_int_equal(df_session_new(&s[i], e, CTX, &err), DF_OK);
        df_generate_opts go = opts(smp, &o[i]);
        if (df_batchgen_add(g, s[i], p[i], n[i], &go, on_done, &err)) fail_msg("add: %s", err.msg);
    }
    while (df_batchgen_active(g))
        if (df_batchgen_step(g, &err)) fail_msg("step: %s", err.msg);
    df_batchgen_free(g);
    for (int i = 0; i < k; i++) {
        assert_int_equal(o[i].done, 1);
        assert_int_equal(o[i].status, DF_OK);
        df_session_free(s[i]);
    }
}

static void same(const out *a, const out *b, const char *what) {
    if (a->n != b->n || memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n))
        fail_msg("%s: %d tokens against %d, or other ones", what, a->n, b->n);
}

static void run_model(const char *name) {
    df_sampler_params sp;
    df_sampler_params_default(&sp);
    sp.temperature = 0;
    df_sampler *smp;
    df_error err;
    assert_int_equal(df_sampler_new(&smp, &sp, &err), DF_OK);
    out refP, refQ, refR, refPX;
    int32_t PX[NP + MAX_NEW + 3]; /* P, its answer, then more: the next turn */
    df_engine *e = open_model(name, NULL);
    alone(e, smp, P, NP, &refP);
    alone(e, smp, Q, NP, &refQ);
    alone(e, smp, R, NR, &refR);
    memcpy(PX, P, sizeof P);
    memcpy(PX + NP, refP.toks, sizeof(int32_t) * MAX_NEW);
    for (int i = 0; i < 3; i++) PX[NP + MAX_NEW + i] = 11 + i;
    int npx = NP + MAX_NEW + 3;
    alone(e, smp, PX, npx, &refPX);
    df_engine_close(e);

    char cache[400];
    snprintf(cache, sizeof cache, "%s/%s", tmp, name);
    e = open_model(name, cache);
    df_session *probe;
    assert_int_equal(df_session_new(&probe, e, CTX, &err), DF_OK);
    int every = df_session_cache_interval(probe);
    df_session_free(probe);
    assert_true(every >= EVERY);
    assert_true(2 * every < NP); /* Kimi K3's recurrent state: 80 positions */
    out o[2];
    /* P and R in a batch, nothing cached yet: they store */
    const int32_t *p1[] = {P, R};
    int n1[] = {NP, NR};
    together(e, smp, p1, n1, 2, o);
    same(&o[0], &refP, "P in a batch");
    same(&o[1], &refR, "R in a batch");
    assert_int_equal(o[0].res.prompt_cached, 0);
    /* P again and Q in a batch: P restores all but its last token, Q the
     * longest multiple of the interval within the part it shares with P */
    const int32_t *p2[] = {P, Q};
    int n2[] = {NP, NP};
    together(e, smp, p2, n2, 2, o);
    same(&o[0], &refP, "P restored in a batch");
    same(&o[1], &refQ, "Q restored in a batch");
    assert_int_equal(o[0].res.prompt_cached, NP - 1);
    assert_int_equal(o[0].res.prompt_reused, NP - 1);
    assert_int_equal(o[1].res.prompt_cached, SHARED / every * every);
    /* the next turn, alone: from the state the batch stored at the end of P's answer */
    out x;
    alone(e, smp, PX, npx, &x);
    same(&x, &refPX, "the next turn");
    assert_int_equal(x.res.prompt_cached, NP + MAX_NEW - 1);
    df_engine_close(e);
    df_sampler_free(smp);
}

static void test_qwen3_moe(void **state) {
    (void)state;
    run_model("engine-moe");
}

static void test_kimi_k3(void **state) {
    (void)state;
    run_model("engine-k3-stream");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_kimi_k3)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
