/*
 * test_multiseq.c - several sessions in one forward pass (df_eval_multi): every
 * sequence of a mixed batch (prefill chunks of different lengths, decode rows
 * of other sequences at other positions, sequences joining late, passes split
 * by a small max_rows) gets logits bit-identical to its solo run, on a
 * Qwen3-MoE, a DeepSeek-V3 (MLA, scored router) and a Kimi K3 (KDA recurrent
 * state, MXFP4 experts) checkpoint, with experts resident and streamed from a
 * pack at a small cache, prefetch off and on, 1 and 2 threads; sessions
 * evaluated alone after a batch go on exactly. Experts shared by several
 * sequences are read once per pass: the bytes read for a batch are fewer than
 * the sum of the solo runs'. Bad items fail cleanly. Routing replay per
 * session (df_session_replay_from, bench --parallel): a sequence replaying its
 * own stretch of a trace gets the logits of its solo run whatever else is in
 * the batch, including a session on the engine's shared trace counter.
 */
#include "testutil.h"

#include "deltafin.h"
#include "engine/dev.h"
#include "experts/pack.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NSEQ 4
#define MAXLEN 40
#define CTX 64

typedef struct model {
    const char *name;
    char dir[512], pack[300];
    int V;
    uint64_t slot;    /* bytes of one cache slot from the pack; 0: not asked yet */
    float *ref[NSEQ]; /* [len][V]: each sequence evaluated alone, resident */
} model;

static model MODELS[] = {{.name = "engine-moe"}, {.name = "engine-ds"}, {.name = "engine-k3-stream"}};
#define N_MODELS (int)(sizeof MODELS / sizeof MODELS[0])
static char tmp[256];

/* Sequence i: its tokens, length, prompt length (prefilled in chunks of
 * chunk rows), and the step at which it joins. */
static int32_t toks[NSEQ][MAXLEN];
static const int LEN[NSEQ] = {40, 29, 35, 22};
static const int PROMPT[NSEQ] = {17, 3, 26, 1};
static const int CHUNK[NSEQ] = {5, 3, 11, 1};
static const int JOIN[NSEQ] = {0, 2, 3, 6};

typedef struct arm {
    bool pack;
    int slots;      /* expert cache slots when streaming */
    int threads;
    const char *prefetch;
} arm;

static df_engine *open_arm(model *m, const arm *a) {
    df_engine_opts o = {.model_dir = m->dir, .n_threads = a->threads, .prefetch = a->prefetch};
    df_engine *e;
    df_error err;
    if (a->pack) {
        o.experts = m->pack;
        if (!m->slot) { /* one slot's bytes: the whole cache over its slots */
            o.expert_cache = (uint64_t)1 << 40;
            if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", m->name, err.msg);
            df_stats st;
            df_engine_stats(e, &st);
            df_engine_close(e);
            m->slot = st.cache_bytes / (uint64_t)st.cache_slots;
        }
        o.expert_cache = (uint64_t)a->slots * m->slot;
    }
    if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", m->name, err.msg);
    return e;
}

static float *solo(df_engine *e, int i, int V) {
    df_session *s;
    df_error err;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)V * LEN[i]);
    if (df_session_eval(s, toks[i], LEN[i], lg, 1, &err)) fail_msg("eval: %s", err.msg);
    df_session_free(s);
    return lg;
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/deltafin-test-multiseq-%d", (int)getpid());
    mkdir(tmp, 0755);
    uint32_t x = 4242;
    for (int i = 0; i < NSEQ; i++)
        for (int t = 0; t < MAXLEN; t++) {
            x = x * 1664525u + 1013904223u;
            toks[i][t] = (int32_t)((x >> 8) % 1000);
        }
    const char *d = getenv("DF_TEST_MODELS");
    for (int k = 0; k < N_MODELS; k++) {
        model *m = &MODELS[k];
        snprintf(m->dir, sizeof m->dir, "%s/%s", d ? d : "build/test-models", m->name);
        snprintf(m->pack, sizeof m->pack, "%s/%s-pack", tmp, m->name);
        df_error err;
        df_pack_write_opts wo = {0};
        const char *one[] = {m->pack};
        if (df_pack_write(m->dir, one, 1, &wo, NULL, &err)) return fprintf(stderr, "pack: %s\n", err.msg), -1;
        arm a = {false, 0, 2, NULL};
        df_engine *e = open_arm(m, &a);
        m->V = df_engine_info(e)->vocab_size;
        for (int i = 0; i < NSEQ; i++) m->ref[i] = solo(e, i, m->V);
        df_engine_close(e);
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int k = 0; k < N_MODELS; k++)
        for (int i = 0; i < NSEQ; i++) free(MODELS[k].ref[i]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void expect_rows(const model *m, const arm *a, int i, int pos, int n, const float *got, int step) {
    for (int r = 0; r < n; r++)
        if (memcmp(m->ref[i] + (size_t)(pos + r) * m->V, got + (size_t)r * m->V, sizeof(float) * (size_t)m->V))
            fail_msg("%s (%s, %d slots, %d threads, prefetch %s): sequence %d row %d (step %d) differs from its "
                     "solo run", m->name, a->pack ? "pack" : "resident", a->slots, a->threads,
                     a->prefetch ? a->prefetch : "off", i, pos + r, step);
}

/* The mixed schedule: sequences join at JOIN[i], prefill their prompt in
 * chunks of CHUNK[i] rows, then decode one row a step; the items' order
 * rotates every step; odd sequences ask for every row's logits, even ones for
 * the last row's; passes hold at most 7 rows, so items split across passes. */
static void mixed(model *m, const arm *a) {
    df_engine *e = open_arm(m, a);
    df_error err;
    df_session *s[NSEQ];
    for (int i = 0; i < NSEQ; i++) assert_int_equal(df_session_new(&s[i], e, CTX, &err), DF_OK);
    df_batcher *b;
    assert_int_equal(df_batcher_new(&b, e, 7, CTX, &err), DF_OK);
    int V = m->V;
    float *lg[NSEQ];
    for (int i = 0; i < NSEQ; i++) lg[i] = malloc(sizeof(float) * (size_t)V * MAXLEN);
    for (int step = 0;; step++) {
        df_eval_item it[NSEQ];
        int n = 0, from[NSEQ], who[NSEQ];
        for (int j = 0; j < NSEQ; j++) {
            int i = (j + step) % NSEQ, pos = df_session_pos(s[i]);
            if (step < JOIN[i] || pos >= LEN[i]) continue;
            int k = pos < PROMPT[i] ? (PROMPT[i] - pos < CHUNK[i] ? PROMPT[i] - pos : CHUNK[i]) : 1;
            it[n] = (df_eval_item){s[i], toks[i] + pos, k, lg[i], i % 2};
            from[n] = pos, who[n++] = i;
        }
        if (!n) break;
        if (df_eval_multi(b, it, n, &err)) fail_msg("%s: eval_multi: %s", m->name, err.msg);
        for (int j = 0; j < n; j++) {
            int i = who[j];
            assert_int_equal(df_session_pos(s[i]), from[j] + it[j].n);
            if (it[j].all_rows) expect_rows(m, a, i, from[j], it[j].n, lg[i], step);
            else expect_rows(m, a, i, from[j] + it[j].n - 1, 1, lg[i], step);
        }
    }
    for (int i = 0; i < NSEQ; i++)
        assert_memory_equal(df_session_tokens(s[i]), toks[i], sizeof(int32_t) * (size_t)LEN[i]);
    /* a session goes on alone after the batch: back two rows, then df_session_eval */
    for (int i = 0; i < NSEQ; i++) {
        int at = df_session_rollback(s[i], LEN[i] - 2, &err);
        assert_true(at >= 0 && at <= LEN[i] - 2);
        if (df_session_eval(s[i], toks[i] + at, LEN[i] - at, lg[i], 1, &err)) fail_msg("eval: %s", err.msg);
        expect_rows(m, a, i, at, LEN[i] - at, lg[i], -1);
    }
    for (int i = 0; i < NSEQ; i++) free(lg[i]), df_session_free(s[i]);
    df_batcher_free(b);
    df_engine_close(e);
}

static void all_arms(model *m) {
    const arm arms[] = {
        {false, 0, 1, NULL}, {false, 0, 2, NULL},
        {true, 2, 1, NULL},  {true, 3, 2, NULL}, {true, 2, 2, "on"}, {true, 5, 1, "router"},
    };
    for (size_t k = 0; k < sizeof arms / sizeof arms[0]; k++) mixed(m, &arms[k]);
}

static void test_qwen3_moe(void **state) { (void)state; all_arms(&MODELS[0]); }
static void test_deepseek(void **state) { (void)state; all_arms(&MODELS[1]); }
static void test_kimi_k3(void **state) { (void)state; all_arms(&MODELS[2]); }

/* Decoding NSEQ sequences together reads the union of their experts once per
 * layer; alone, each reads its own: fewer bytes together. */
static void test_union_read_once(void **state) {
    (void)state;
    model *m = &MODELS[0];
    arm a = {true, 3, 1, NULL}; /* one layer's top-3: every layer's experts are read again */
    df_error err;
    df_stats st;
    uint64_t alone = 0, together;
    {
        df_engine *e = open_arm(m, &a);
        for (int i = 0; i < NSEQ; i++) {
            df_session *s;
            assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
            for (int t = 0; t < 24; t++)
                if (df_session_eval(s, toks[i] + t, 1, NULL, 0, &err)) fail_msg("eval: %s", err.msg);
            df_session_free(s);
        }
        df_engine_stats(e, &st);
        alone = st.expert_bytes_read;
        df_engine_close(e);
    }
    {
        df_engine *e = open_arm(m, &a);
        df_session *s[NSEQ];
        df_batcher *b;
        assert_int_equal(df_batcher_new(&b, e, 0, CTX, &err), DF_OK);
        for (int i = 0; i < NSEQ; i++) assert_int_equal(df_session_new(&s[i], e, CTX, &err), DF_OK);
        for (int t = 0; t < 24; t++) {
            df_eval_item it[NSEQ];
            for (int i = 0; i < NSEQ; i++) it[i] = (df_eval_item){s[i], toks[i] + t, 1, NULL, 0};
            if (df_eval_multi(b, it, NSEQ, &err)) fail_msg("eval_multi: %s", err.msg);
        }
        df_engine_stats(e, &st);
        together = st.expert_bytes_read;
        for (int i = 0; i < NSEQ; i++) df_session_free(s[i]);
        df_batcher_free(b);
        df_engine_close(e);
    }
    printf("expert bytes: %d sequences alone %llu, together %llu\n", NSEQ, (unsigned long long)alone,
           (unsigned long long)together);
    assert_true(together > 0);
    assert_true(together < alone);
}

static void test_bad_items(void **state) {
    (void)state;
    model *m = &MODELS[0];
    arm a = {false, 0, 1, NULL};
    df_engine *e = open_arm(m, &a);
    df_error err;
    df_session *s, *s2, *big;
    df_batcher *b;
    assert_int_equal(df_session_new(&s, e, 8, &err), DF_OK);
    assert_int_equal(df_session_new(&s2, e, 8, &err), DF_OK);
    assert_int_equal(df_session_new(&big, e, 128, &err), DF_OK);
    assert_int_equal(df_batcher_new(&b, e, 4, 16, &err), DF_OK);
    int32_t bad = m->V, ok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    df_eval_item twice[2] = {{s, ok, 1, NULL, 0}, {s, ok + 1, 1, NULL, 0}};
    assert_int_equal(df_eval_multi(b, twice, 2, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "share a session"));
    df_eval_item oov[2] = {{s, ok, 1, NULL, 0}, {s2, &bad, 1, NULL, 0}};
    assert_int_equal(df_eval_multi(b, oov, 2, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    df_eval_item full[1] = {{s, ok, 9, NULL, 0}};
    assert_int_equal(df_eval_multi(b, full, 1, &err), DF_ERR_CONTEXT);
    df_eval_item wide[1] = {{big, ok, 1, NULL, 0}};
    assert_int_equal(df_eval_multi(b, wide, 1, &err), DF_ERR_ARG);
    assert_int_equal(df_eval_multi(b, NULL, 0, &err), DF_ERR_ARG);
    /* nothing was evaluated */
    assert_int_equal(df_session_pos(s), 0);
    assert_int_equal(df_session_pos(s2), 0);
    df_batcher_free(b);
    df_session_free(s), df_session_free(s2), df_session_free(big);
    df_engine_close(e);
}

/* ---- df_batchgen: each request's tokens are those of df_generate alone ---- */

#define NREQ 6
typedef struct rq {
    int plen, max_new, chunk, join; /* join: the step it joins at; -1: when request 0 has left, on its session */
    float temp;
    int top_k;
    uint64_t seed;
    int stop_after, cancel_after; /* on_token asks to stop / cancelled() says so after this many tokens; 0: never */
    int penalty;                  /* a logits hook */
} rq;

static const rq RQ[NREQ] = {
    {12, 9, 0, 0, 0.0f, 0, 1, 0, 0, 0},  {5, 14, 2, 0, 0.9f, 20, 7, 0, 0, 1}, {21, 6, 4, 2, 1.2f, 0, 9, 0, 0, 0},
    {3, 30, 0, 3, 0.7f, 5, 11, 8, 0, 0}, {14, 11, 0, -1, 0.0f, 0, 1, 0, 0, 1}, {8, 20, 3, 4, 1.0f, 0, 5, 0, 6, 0},
};

typedef struct rq_out {
    int32_t toks[64];
    int n;
    int cancel_after, stop_after;
    df_generate_result res;
    int done, status;
} rq_out;

static int rq_token(void *u, int32_t t) {
    rq_out *o = u;
    o->toks[o->n++] = t;
    return o->stop_after && o->n >= o->stop_after;
}
static int rq_cancelled(void *u) {
    rq_out *o = u;
    return o->cancel_after && o->n >= o->cancel_after;
}
static void rq_done(void *u, const df_generate_result *r, int status, const df_error *err) {
    rq_out *o = u;
    (void)err;
    o->res = *r;
    o->done++;
    o->status = status;
}
/* Lowers the logits of tokens already in the history (a hook the sampler does not know). */
static void rq_hook(void *user, float *logits, int vocab, const int32_t *h, int nh) {
    (void)user;
    for (int i = 0; i < nh; i++)
        if (h[i] >= 0 && h[i] < vocab) logits[h[i]] -= 0.5f;
}

/* Request r's prompt: sequence r's tokens; request 4's starts with request 0's prompt (prefix reuse). */
static const int32_t *rq_prompt(int r, int32_t *buf) {
    if (r != 4) return toks[r % NSEQ];
    memcpy(buf, toks[0], sizeof(int32_t) * 10);
    memcpy(buf + 10, toks[1], sizeof(int32_t) * (size_t)(RQ[4].plen - 10));
    return buf;
}

static df_sampler *rq_sampler(int r) {
    df_sampler_params p;
    df_sampler_params_default(&p);
    p.temperature = RQ[r].temp, p.top_k = RQ[r].top_k, p.seed = RQ[r].seed;
    df_sampler *smp;
    df_error err;
    assert_int_equal(df_sampler_new(&smp, &p, &err), DF_OK);
    return smp;
}

static df_generate_opts rq_opts(int r, df_sampler *smp, rq_out *o) {
    *o = (rq_out){.cancel_after = RQ[r].cancel_after, .stop_after = RQ[r].stop_after};
    df_generate_opts go = {.sampler = smp, .max_new = RQ[r].max_new, .prefill_chunk = RQ[r].chunk,
                           .reuse_prefix = 1, .on_token = rq_token, .cancelled = rq_cancelled, .user = o};
    if (RQ[r].penalty) go.logits_hook = rq_hook;
    return go;
}

static void batchgen_arm(model *m, const arm *a) {
    rq_out ref[NREQ], got[NREQ];
    int32_t pbuf[64];
    df_error err;
    { /* alone: df_generate, one request after another (4 on 0's session) */
        arm ra = {false, 0, 2, NULL};
        df_engine *e = open_arm(m, &ra);
        df_session *s[NREQ];
        for (int r = 0; r < NREQ; r++) {
            s[r] = NULL;
            if (RQ[r].join >= 0) assert_int_equal(df_session_new(&s[r], e, CTX, &err), DF_OK);
        }
        s[4] = s[0];
        for (int r = 0; r < NREQ; r++) {
            df_sampler *smp = rq_sampler(r);
            df_generate_opts go = rq_opts(r, smp, &ref[r]);
            if (df_generate(s[r], rq_prompt(r, pbuf), RQ[r].plen, &go, &ref[r].res, &err))
                fail_msg("generate: %s", err.msg);
            df_sampler_free(smp);
        }
        for (int r = 0; r < NREQ; r++)
            if (r != 4) df_session_free(s[r]);
        df_engine_close(e);
    }
    df_engine *e = open_arm(m, a);
    df_batchgen *g;
    assert_int_equal(df_batchgen_new(&g, e, 6, CTX, &err), DF_OK);
    df_session *s[NREQ];
    df_sampler *smp[NREQ];
    for (int r = 0; r < NREQ; r++) {
        s[r] = NULL, smp[r] = rq_sampler(r);
        if (RQ[r].join >= 0) assert_int_equal(df_session_new(&s[r], e, CTX, &err), DF_OK);
    }
    s[4] = s[0];
    bool added[NREQ] = {0};
    int most = 0;
    for (int step = 0; step < 200; step++) {
        for (int r = 0; r < NREQ; r++) {
            if (added[r] || (RQ[r].join >= 0 ? RQ[r].join > step : !got[0].done)) continue;
            df_generate_opts go = rq_opts(r, smp[r], &got[r]);
            if (df_batchgen_add(g, s[r], rq_prompt(r, pbuf), RQ[r].plen, &go, rq_done, &err))
                fail_msg("add: %s", err.msg);
            added[r] = true;
        }
        if (df_batchgen_active(g) > most) most = df_batchgen_active(g);
        if (!df_batchgen_active(g)) break;
        if (df_batchgen_step(g, &err)) fail_msg("step: %s", err.msg);
    }
    assert_true(most >= 4); /* requests did run together */
    for (int r = 0; r < NREQ; r++) {
        assert_int_equal(got[r].done, 1);
        assert_int_equal(got[r].status, DF_OK);
        if (got[r].n != ref[r].n || memcmp(got[r].toks, ref[r].toks, sizeof(int32_t) * (size_t)ref[r].n))
            fail_msg("%s (%s, %d threads): request %d: %d tokens in a batch, %d alone, or different ones", m->name,
                     a->pack ? "pack" : "resident", a->threads, r, got[r].n, ref[r].n);
        assert_int_equal(got[r].res.finish, ref[r].res.finish);
        assert_int_equal(got[r].res.produced, ref[r].res.produced);
        assert_int_equal(got[r].res.prompt_reused, ref[r].res.prompt_reused);
        /* the session holds the prompt and every new token but the last (0's went on to 4) */
        if (r != 0) assert_int_equal(df_session_pos(s[r]), RQ[r].plen + got[r].n - 1);
    }
    assert_true(got[4].res.prompt_reused > 0 || m == &MODELS[2]); /* recurrent: back to 0 unless kept */
    assert_int_equal(ref[5].res.finish, DF_FINISH_CANCELLED);
    assert_int_equal(ref[3].res.finish, DF_FINISH_CALLER);
    df_batchgen_free(g);
    for (int r = 0; r < NREQ; r++) {
        df_sampler_free(smp[r]);
        if (r != 4) df_session_free(s[r]);
    }
    df_engine_close(e);
}

static void test_batchgen_qwen3_moe(void **state) {
    (void)state;
    arm a = {true, 3, 1, "on"};
    batchgen_arm(&MODELS[0], &a);
}

static void test_batchgen_kimi_k3(void **state) {
    (void)state;
    arm a = {false, 0, 2, NULL};
    batchgen_arm(&MODELS[2], &a);
}

static void test_batchgen_refuses(void **state) {
    (void)state;
    arm a = {false, 0, 1, NULL};
    df_engine *e = open_arm(&MODELS[0], &a);
    df_error err;
    df_batchgen *g;
    df_session *s;
    assert_int_equal(df_batchgen_new(&g, e, 4, CTX, &err), DF_OK);
    assert_int_equal(df_session_new(&s, e, 8, &err), DF_OK);
    df_sampler *smp = rq_sampler(0);
    df_generate_opts go = {.sampler = smp};
    assert_int_equal(df_batchgen_add(g, s, toks[0], 8, &go, NULL, &err), DF_ERR_CONTEXT);
    go.prefill_progress = (df_progress_fn)1;
    assert_int_equal(df_batchgen_add(g, s, toks[0], 2, &go, NULL, &err), DF_ERR_UNSUPPORTED);
    go.prefill_progress = NULL;
    assert_int_equal(df_batchgen_add(g, s, toks[0], 2, &go, NULL, &err), DF_OK);
    assert_int_equal(df_batchgen_add(g, s, toks[0], 2, &go, NULL, &err), DF_ERR_ARG); /* its session is taken */
    while (df_batchgen_active(g)) assert_int_equal(df_batchgen_step(g, &err), DF_OK);
    assert_int_equal(df_session_pos(s), 7); /* the context ran out: prompt and 6 new tokens, the last not evaluated */
    df_sampler_free(smp);
    df_session_free(s);
    df_batchgen_free(g);
    df_engine_close(e);
}

/* Routing replay per session on engine-moe (MoE layers 0 and 2, 8 experts,
 * top-3): sequences 0 and 1 replay the trace from their own tokens, sequence
 * 2 from the engine's shared counter; 0 and 1 match their solo runs bit for
 * bit, and another start gives other logits (the replay is in effect). */
#define RP_LEN 12
static float *replay_solo(const char *trace, int i, uint64_t from, int V) {
    df_engine_opts o = {.model_dir = MODELS[0].dir, .n_threads = 1};
    df_engine_dev dev = {.replay_routing = trace};
    df_engine *e;
    df_session *s;
    df_error err;
    if (df_engine_open_dev(&e, &o, &dev, &err)) fail_msg("open: %s", err.msg);
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    df_session_replay_from(s, from);
    float *lg = malloc(sizeof(float) * (size_t)V * RP_LEN);
    for (int t = 0; t < RP_LEN; t += 4) /* passes of 4 rows: the counter advances per pass */
        if (df_session_eval(s, toks[i] + t, 4, lg + (size_t)t * V, 1, &err)) fail_msg("eval: %s", err.msg);
    df_session_free(s);
    df_engine_close(e);
    return lg;
}

static void test_replay_per_session(void **state) {
    (void)state;
    char trace[300];
    snprintf(trace, sizeof trace, "%s/rp.trace", tmp);
    FILE *f = fopen(trace, "w");
    assert_non_null(f);
    fprintf(f, "# moe-routing-trace v1\n# moe_layers: 2  experts_per_layer: 8  top_k: 3\n");
    for (int t = 0; t < 29; t++) /* distinct triples, so every start routes differently */
        fprintf(f, "%d,%d,%d %d,%d,%d\n", t % 8, (t + 1 + t / 8) % 8, (t + 3 + t / 8 * 2) % 8, (t * 3) % 8,
                (t * 3 + 2) % 8, (t * 3 + 5) % 8);
    fclose(f);
    int V = MODELS[0].V;
    const uint64_t FROM[2] = {5, 17};
    float *ref[2] = {replay_solo(trace, 0, FROM[0], V), replay_solo(trace, 1, FROM[1], V)};
    float *other = replay_solo(trace, 0, FROM[0] + 1, V);
    assert_true(memcmp(other, ref[0], sizeof(float) * (size_t)V * RP_LEN) != 0);
    free(other);
    df_engine_opts o = {.model_dir = MODELS[0].dir, .n_threads = 1};
    df_engine_dev dev = {.replay_routing = trace};
    df_engine *e;
    df_batcher *b;
    df_session *s[3];
    df_error err;
    if (df_engine_open_dev(&e, &o, &dev, &err)) fail_msg("open: %s", err.msg);
    assert_int_equal(df_batcher_new(&b, e, 0, CTX, &err), DF_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(df_session_new(&s[i], e, CTX, &err), DF_OK);
    df_session_replay_from(s[0], FROM[0]);
    df_session_replay_from(s[1], FROM[1]);
    float *lg[2] = {malloc(sizeof(float) * (size_t)V * RP_LEN), malloc(sizeof(float) * (size_t)V * RP_LEN)};
    /* the shared sequence first in each pass, then prompts of 5 and 3 rows, then a row each */
    for (int pos[2] = {0, 0}, step = 0; pos[0] < RP_LEN || pos[1] < RP_LEN; step++) {
        df_eval_item it[3] = {{s[2], toks[2] + step, 1, NULL, 0}};
        int n = 1;
        for (int i = 0; i < 2; i++) {
            int take = step == 0 ? (i ? 3 : 5) : 1;
            if (pos[i] + take > RP_LEN) take = RP_LEN - pos[i];
            if (take <= 0) continue;
            it[n++] = (df_eval_item){s[i], toks[i] + pos[i], take, lg[i] + (size_t)pos[i] * V, 1};
            pos[i] += take;
        }
        if (df_eval_multi(b, it, n, &err)) fail_msg("eval_multi: %s", err.msg);
    }
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(lg[i], ref[i], sizeof(float) * (size_t)V * RP_LEN);
        free(lg[i]), free(ref[i]);
    }
    for (int i = 0; i < 3; i++) df_session_free(s[i]);
    df_batcher_free(b);
    df_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_deepseek), cmocka_unit_test(test_kimi_k3),
        cmocka_unit_test(test_union_read_once), cmocka_unit_test(test_bad_items),
        cmocka_unit_test(test_batchgen_qwen3_moe), cmocka_unit_test(test_batchgen_kimi_k3),
        cmocka_unit_test(test_batchgen_refuses), cmocka_unit_test(test_replay_per_session),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
