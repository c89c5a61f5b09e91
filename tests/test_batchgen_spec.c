/*
 * test_batchgen_spec.c - speculative decoding in a batch (df_batchgen with a
 * df_spec per request): every request's tokens are those of df_generate alone
 * with the same drafter and seed, and those of plain decoding, greedy (with
 * and without a logits hook) and seeded sampling, with drafting requests
 * (prompt lookup under the gate and at a fixed depth, an oracle that is right
 * up to a random position, the model as its own draft model: a draft session
 * per request, every draft accepted) and a plain one in the same steps, on a Qwen3-MoE
 * with experts streamed from a pack, and on a Kimi K3 (recurrent state: few
 * kept positions, so a rejected draft is rolled back to a snapshot and the
 * accepted rows recomputed). The paths were taken: verify passes in the
 * batch, drafts accepted (lookup on the MoE; the oracle partly on both).
 * Refusals: a drafter shared by two requests, a drafter with teacher forcing.
 */
#include "testutil.h"

#include "decode/speculative.h"
#include "deltafin.h"
#include "engine/dev.h"
#include "experts/pack.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NREQ 6
#define CTX 96
#define MAXTOK 64

typedef struct model {
    const char *name;
    char dir[512], pack[300];
    bool streamed;
} model;
static model MODELS[] = {{.name = "engine-moe", .streamed = true}, {.name = "engine-k3-stream"}};
static char tmp[256];
static int V;

/* Request r: its sampler, drafter ("lookup", "oracle", "self": the model as
 * its own draft model, or none) at a fixed
 * depth (0: the gate), tokens wanted, and a logits hook. */
typedef struct rq {
    float temp;
    int top_k;
    uint64_t seed;
    const char *draft;
    int fixed, max_new;
    bool hook;
} rq;
static const rq RQ[NREQ] = {
    {0.0f, 0, 1, "lookup", 0, 28, false}, {0.5f, 2, 3, "lookup", 3, 24, false},
    {0.0f, 0, 1, "oracle", 4, 30, true},  {0.8f, 0, 9, "oracle", 5, 26, false},
    {0.0f, 0, 1, NULL, 0, 20, false},     {0.7f, 0, 4, "self", 3, 22, false},
};

/* A phrase said three times after a random start, so lookup has something to find. */
static int make_prompt(int r, int32_t *p) {
    uint32_t x = 99u + 31u * (uint32_t)r;
    int n = 3 + 2 * r;
    for (int j = 0; j < n; j++) {
        x = x * 1664525u + 1013904223u;
        p[j] = (int32_t)((x >> 8) % 1000);
    }
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < 6; j++) p[n++] = p[j];
    return n;
}

/* Knows the plain output; proposes it, wrong from a pseudo-random offset on. */
typedef struct oracle {
    const int32_t *ref;
    int n_prompt, n_ref;
    uint32_t rng;
} oracle;

static int oracle_draft(void *user, const int32_t *ctx, int n_ctx, int32_t *out, int k) {
    oracle *o = user;
    (void)ctx;
    int at = n_ctx - o->n_prompt;
    o->rng = o->rng * 1664525u + 1013904223u;
    int bad = (int)((o->rng >> 8) % (uint32_t)(k + 2)); /* k, k+1: all right */
    int m = 0;
    for (; m < k && at + m < o->n_ref; m++) out[m] = m == bad ? (o->ref[at + m] + 1) % V : o->ref[at + m];
    return m;
}

typedef struct out {
    int32_t toks[MAXTOK];
    int n, done, status;
    df_generate_result res;
} out;

static int on_token(void *u, int32_t t) {
    out *o = u;
    if (o->n < MAXTOK) o->toks[o->n++] = t;
    return 0;
}
static void on_done(void *u, const df_generate_result *r, int status, const df_error *err) {
    out *o = u;
    (void)err;
    o->res = *r, o->status = status, o->done++;
}
static void hook(void *user, float *logits, int vocab, const int32_t *h, int nh) {
    (void)user;
    for (int i = 0; i < nh; i++)
        if (h[i] >= 0 && h[i] < vocab) logits[h[i]] -= 0.5f;
}

static df_sampler *sampler(int r) {
    df_sampler_params p;
    df_sampler_params_default(&p);
    p.temperature = RQ[r].temp, p.top_k = RQ[r].top_k, p.seed = RQ[r].seed;
    df_sampler *smp;
    df_error err;
    assert_int_equal(df_sampler_new(&smp, &p, &err), DF_OK);
    return smp;
}

static df_engine *open_model(const model *m) {
    df_engine_opts o = {.model_dir = m->dir, .n_threads = 2};
    if (m->streamed) o.experts = m->pack, o.expert_cache = (uint64_t)64 << 20;
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", m->name, err.msg);
    return e;
}

/* Request r's drafter, or NULL; an oracle proposes from ref. */
static df_spec *drafter(df_engine *e, const model *m, int r, oracle *orc, const out *ref, int n_prompt) {
    if (!RQ[r].draft) return NULL;
    df_spec_opts so = {.draft = strcmp(RQ[r].draft, "self") ? "lookup" : m->dir, .n_threads = 1};
    df_spec *sp;
    df_error err;
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    if (RQ[r].fixed) df_spec_set_fixed_depth(sp, RQ[r].fixed);
    if (!strcmp(RQ[r].draft, "oracle")) {
        *orc = (oracle){ref->toks, n_prompt, ref->n, 12345u + (uint32_t)r};
        df_spec_set_drafter(sp, oracle_draft, orc);
    }
    return sp;
}

static df_generate_opts opts(int r, df_sampler *smp, df_spec *sp, out *o) {
    memset(o, 0, sizeof *o);
    df_generate_opts go = {.sampler = smp, .spec = sp, .max_new = RQ[r].max_new, .on_token = on_token, .user = o};
    if (RQ[r].hook) go.logits_hook = hook;
    return go;
}

static void run_model(const model *m) {
    int32_t prompt[NREQ][64];
    int plen[NREQ];
    out plain[NREQ], solo[NREQ], got[NREQ];
    oracle orc[NREQ];
    df_error err;
    df_engine *e = open_model(m);
    V = df_engine_info(e)->vocab_size;
    for (int r = 0; r < NREQ; r++) plen[r] = make_prompt(r, prompt[r]);
    /* alone: plain, then with the drafter */
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < NREQ; r++) {
            df_session *s;
            assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
            df_sampler *smp = sampler(r);
            df_spec *sp = pass ? drafter(e, m, r, &orc[r], &plain[r], plen[r]) : NULL;
            out *o = pass ? &solo[r] : &plain[r];
            df_generate_opts go = opts(r, smp, sp, o);
            if (df_generate(s, prompt[r], plen[r], &go, &o->res, &err)) fail_msg("generate: %s", err.msg);
            df_spec_free(sp);
            df_sampler_free(smp);
            df_session_free(s);
            if (o->n != plain[r].n || memcmp(o->toks, plain[r].toks, sizeof(int32_t) * (size_t)o->n))
                fail_msg("%s: request %d: speculative df_generate differs from plain", m->name, r);
        }
    /* together */
    df_batchgen *g;
    assert_int_equal(df_batchgen_new(&g, e, 0, CTX, &err), DF_OK);
    df_session *s[NREQ];
    df_sampler *smp[NREQ];
    df_spec *sp[NREQ];
    for (int r = 0; r < NREQ; r++) {
        assert_int_equal(df_session_new(&s[r], e, CTX, &err), DF_OK);
        smp[r] = sampler(r);
        sp[r] = drafter(e, m, r, &orc[r], &plain[r], plen[r]);
        df_generate_opts go = opts(r, smp[r], sp[r], &got[r]);
        if (df_batchgen_add(g, s[r], prompt[r], plen[r], &go, on_done, &err)) fail_msg("add: %s", err.msg);
    }
    for (int step = 0; step < 200 && df_batchgen_active(g); step++)
        if (df_batchgen_step(g, &err)) fail_msg("step: %s", err.msg);
    assert_int_equal(df_batchgen_active(g), 0);
    uint64_t lookup_acc = 0, orc_acc = 0, orc_drafted = 0;
    for (int r = 0; r < NREQ; r++) {
        assert_int_equal(got[r].done, 1);
        assert_int_equal(got[r].status, DF_OK);
        if (got[r].n != plain[r].n || memcmp(got[r].toks, plain[r].toks, sizeof(int32_t) * (size_t)got[r].n))
            fail_msg("%s: request %d: %d tokens in a batch with drafting, %d plain, or different ones", m->name, r,
                     got[r].n, plain[r].n);
        assert_int_equal(got[r].res.finish, solo[r].res.finish);
        assert_int_equal(got[r].res.produced, solo[r].res.produced);
        /* the session holds the prompt and every new token but the last */
        if (got[r].res.finish == DF_FINISH_LENGTH) assert_int_equal(df_session_pos(s[r]), plen[r] + got[r].n - 1);
        assert_int_equal(memcmp(df_session_tokens(s[r]), prompt[r], sizeof(int32_t) * (size_t)plen[r]), 0);
        if (!sp[r]) continue;
        df_spec_stats st;
        df_spec_stats_get(sp[r], &st);
        if (getenv("DF_TEST_VERBOSE"))
            fprintf(stderr, "%s r%d: %llu verify passes, %llu drafted, %llu accepted\n", m->name, r,
                    (unsigned long long)st.verify_passes, (unsigned long long)st.drafted,
                    (unsigned long long)st.accepted);
        if (!strcmp(RQ[r].draft, "self")) {
            assert_true(st.drafted > 0);
            assert_int_equal(st.accepted, st.drafted); /* a model agrees with itself */
        } else if (!strcmp(RQ[r].draft, "lookup")) lookup_acc += st.accepted;
        else orc_acc += st.accepted, orc_drafted += st.drafted;
    }
    /* the random K3 model never repeats itself: lookup finds nothing to accept there */
    if (m == &MODELS[0]) assert_true(lookup_acc > 0);
    assert_true(orc_acc > 0 && orc_acc < orc_drafted);
    df_batchgen_free(g);
    for (int r = 0; r < NREQ; r++) {
        df_spec_free(sp[r]);
        df_sampler_free(smp[r]);
        df_session_free(s[r]);
    }
    df_engine_close(e);
}

static void test_qwen3_moe(void **state) { (void)state, run_model(&MODELS[0]); }
static void test_kimi_k3(void **state) { (void)state, run_model(&MODELS[1]); }

static void test_refuses(void **state) {
    (void)state;
    df_engine *e = open_model(&MODELS[0]);
    df_error err;
    df_batchgen *g;
    df_session *s, *s2;
    assert_int_equal(df_batchgen_new(&g, e, 4, CTX, &err), DF_OK);
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    assert_int_equal(df_session_new(&s2, e, CTX, &err), DF_OK);
    df_sampler *smp = sampler(0);
    df_spec *sp;
    df_spec_opts so = {.draft = "lookup"};
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    int32_t p[4] = {1, 2, 3, 4};
    out o;
    df_generate_opts go = opts(0, smp, sp, &o);
    assert_int_equal(df_batchgen_add(g, s, p, 4, &go, NULL, &err), DF_OK);
    assert_int_equal(df_batchgen_add(g, s2, p, 4, &go, NULL, &err), DF_ERR_ARG); /* its drafter is taken */
    assert_non_null(strstr(err.msg, "drafter"));
    while (df_batchgen_active(g)) assert_int_equal(df_batchgen_step(g, &err), DF_OK);
    go.spec = sp;
    assert_int_equal(df_batchgen_add(g, s2, p, 4, &go, NULL, &err), DF_OK); /* free again once it left */
    while (df_batchgen_active(g)) assert_int_equal(df_batchgen_step(g, &err), DF_OK);
    df_batchgen_free(g);
    df_spec_free(sp);
    df_sampler_free(smp);
    df_session_free(s), df_session_free(s2);
    df_engine_close(e);
}

static int32_t force_one(void *u, int i) {
    (void)u;
    return (int32_t)i;
}

static void test_refuses_force(void **state) {
    (void)state;
    df_engine *e = open_model(&MODELS[1]);
    df_error err;
    df_batchgen *g;
    df_session *s;
    assert_int_equal(df_batchgen_new(&g, e, 4, CTX, &err), DF_OK);
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    df_sampler *smp = sampler(0);
    df_spec *sp;
    df_spec_opts so = {.draft = "lookup"};
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    int32_t p[4] = {1, 2, 3, 4};
    out o;
    df_generate_opts go = opts(0, smp, sp, &o);
    go.force = force_one;
    assert_int_equal(df_batchgen_add(g, s, p, 4, &go, NULL, &err), DF_ERR_ARG);
    assert_int_equal(df_batchgen_active(g), 0);
    df_batchgen_free(g);
    df_spec_free(sp);
    df_sampler_free(smp);
    df_session_free(s);
    df_engine_close(e);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/deltafin-test-bgspec-%d", (int)getpid());
    mkdir(tmp, 0755);
    const char *d = getenv("DF_TEST_MODELS");
    for (size_t k = 0; k < sizeof MODELS / sizeof MODELS[0]; k++) {
        model *m = &MODELS[k];
        snprintf(m->dir, sizeof m->dir, "%s/%s", d ? d : "build/test-models", m->name);
        if (!m->streamed) continue;
        snprintf(m->pack, sizeof m->pack, "%s/%s-pack", tmp, m->name);
        df_error err;
        df_pack_write_opts wo = {0};
        const char *one[] = {m->pack};
        if (df_pack_write(m->dir, one, 1, &wo, NULL, &err)) return fprintf(stderr, "pack: %s\n", err.msg), -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_kimi_k3),
        cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_refuses_force),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
