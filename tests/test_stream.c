/*
 * test_stream.c - expert streaming is exact: logits through the expert store
 * (from a pack with 1 or 2 stripes, or straight from the safetensors) are
 * bit-identical to the all-resident run, for every cache size from one slot
 * to every expert, with 1 and 2 threads, in batches and token by token, with
 * every prefetch mode and depth and either cache policy; and read faults
 * (corrupted record, missing pack) are clean errors. The always-active
 * matrices a streaming engine reads from its own copy in RAM hold the
 * checkpoint's bytes, and a checkpoint cut short is a clean error.
 *
 * The same checks run on the Qwen3-MoE checkpoint and on the DeepSeek-V3
 * family's (MLA, a scored router with groups and a correction bias or a
 * softmax one, shared experts and a dense first layer, all kept in RAM); on
 * a DeepSeek-V3 checkpoint whose layers between two routers add nothing, the
 * router lookahead must predict the second router's choice exactly, which
 * only the family's own router can.
 */
#include "testutil.h"

#include "deltafin.h"
#include "experts/pack.h"
#include "model/model.h"
#include "engine/dev.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NTOK 40

/* A checkpoint under test, its packs and its all-resident logits. */
typedef struct model {
    const char *name;    /* under $DF_TEST_MODELS */
    int moe_layers[2];   /* its MoE layers */
    int top_k, n_experts; /* routed experts per token; in all MoE layers */
    char dir[512], pack1[300], pack2a[300], pack2b[300], packs2[700];
    float *ref;
    int V;
    size_t slot[3];      /* slot bytes from the safetensors, pack1, packs2; 0: not known yet */
} model;

static model MODELS[] = {
    {.name = "engine-moe", .moe_layers = {0, 2}, .top_k = 3, .n_experts = 16},
    {.name = "engine-ds", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    {.name = "engine-ds-v2", .moe_layers = {1, 2}, .top_k = 3, .n_experts = 16},
    /* weights as shipped (issue 22): FP8 everywhere; INT4 experts; MXFP4 experts + INT4 dense */
    {.name = "engine-fp8-ds", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    {.name = "engine-int4-kimi", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    {.name = "engine-mixed-kimi", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    /* the Kimi-Linear family (issue 23): KDA + NoPE MLA; K3's shape with MXFP4 experts in a
     * latent width, attention residuals; per-channel A_log, grouped routing */
    {.name = "engine-k3-stream", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    {.name = "engine-kda-chan", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
    /* DeepSeek-V3.1's FP8: power-of-two block scales */
    {.name = "engine-fp8-ue8m0", .moe_layers = {1, 2}, .top_k = 4, .n_experts = 32},
};
#define N_MODELS (int)(sizeof MODELS / sizeof MODELS[0])
static model *M = &MODELS[0]; /* the model the tests run on */
static char tmp[256];
static int32_t toks[NTOK];

typedef struct arm {
    const char *experts; /* NULL: safetensors */
    int slots;           /* 0: no store (resident) */
    int threads;
    int step;            /* tokens per eval call */
    const char *prefetch; /* NULL: the default (gated) */
    int depth;
} arm;

static double sim_gbs;      /* run() with a simulated disk of this bandwidth; 0: none */
static const char *policy;  /* run() with this cache policy; NULL: the default */

/* Bytes of one cache slot: asked of an engine once per model and source
 * (each open parses a tokenizer, most of a run's time under the sanitizers). */
static size_t slot_bytes(const char *experts) {
    int k = !experts ? 0 : !strcmp(experts, M->pack1) ? 1 : !strcmp(experts, M->packs2) ? 2 : -1;
    if (k >= 0 && M->slot[k]) return M->slot[k];
    df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = experts,
                        .expert_cache = (uint64_t)1 << 40};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    df_stats st;
    df_engine_stats(e, &st);
    df_engine_close(e);
    size_t b = st.cache_bytes / (size_t)st.cache_slots;
    if (k >= 0) M->slot[k] = b;
    return b;
}

static float *run_dev(const arm *a, df_stats *st_out, df_dev_stats *dev_out) {
    df_engine_opts o = {.model_dir = M->dir, .n_threads = a->threads, .experts = a->experts,
                        .prefetch = a->prefetch, .cache_policy = policy};
    df_engine_dev dev = {.prefetch_depth = a->depth, .sim_disk_bps = sim_gbs * 1e9};
    if (a->slots) o.expert_cache = (uint64_t)a->slots * slot_bytes(a->experts);
    df_engine *e;
    df_error err;
    if (df_engine_open_dev(&e, &o, &dev, &err)) fail_msg("open: %s", err.msg);
    df_session *s;
    assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)M->V * NTOK);
    for (int i = 0; i < NTOK; i += a->step) {
        int k = NTOK - i < a->step ? NTOK - i : a->step;
        if (df_session_eval(s, toks + i, k, lg + (size_t)i * M->V, 1, &err)) fail_msg("eval: %s", err.msg);
    }
    if (st_out) df_engine_stats(e, st_out);
    if (dev_out) df_engine_dev_stats(e, dev_out);
    df_session_free(s);
    df_engine_close(e);
    return lg;
}

static float *run(const arm *a, df_stats *st_out) { return run_dev(a, st_out, NULL); }

/* Packs model m with 1 and 2 stripes and runs it all resident. */
static int setup_model(model *m) {
    const char *d = getenv("DF_TEST_MODELS");
    snprintf(m->dir, sizeof m->dir, "%s/%s", d ? d : "build/test-models", m->name);
    snprintf(m->pack1, sizeof m->pack1, "%s/%s-p1", tmp, m->name);
    snprintf(m->pack2a, sizeof m->pack2a, "%s/%s-p2a", tmp, m->name);
    snprintf(m->pack2b, sizeof m->pack2b, "%s/%s-p2b", tmp, m->name);
    snprintf(m->packs2, sizeof m->packs2, "%s,%s", m->pack2b, m->pack2a); /* any order */
    df_error err;
    df_pack_write_opts wo = {0};
    const char *one[] = {m->pack1}, *two[] = {m->pack2a, m->pack2b};
    if (df_pack_write(m->dir, one, 1, &wo, NULL, &err) || df_pack_write(m->dir, two, 2, &wo, NULL, &err)) {
        fprintf(stderr, "pack %s: %s\n", m->name, err.msg);
        return -1;
    }
    df_model_info info;
    {
        df_engine_opts o = {.model_dir = m->dir, .n_threads = 1};
        df_engine *e;
        if (df_engine_open(&e, &o, &err)) return fprintf(stderr, "open %s: %s\n", m->name, err.msg), -1;
        info = *df_engine_info(e);
        df_engine_close(e);
    }
    /* the table above describes the checkpoint */
    if (info.n_experts_active != m->top_k || info.n_experts * 2 != m->n_experts) {
        fprintf(stderr, "%s: top-%d of %d experts, not as the test says\n", m->name, info.n_experts_active,
                info.n_experts);
        return -1;
    }
    m->V = info.vocab_size;
    model *was = M;
    M = m;
    arm r = {NULL, 0, 2, NTOK, NULL, 0};
    m->ref = run(&r, NULL);
    M = was;
    return 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/deltafin-test-stream-%d", (int)getpid());
    mkdir(tmp, 0755);
    uint32_t x = 777;
    for (int i = 0; i < NTOK; i++) {
        x = x * 1664525u + 1013904223u;
        toks[i] = (int32_t)((x >> 8) % 1000);
    }
    for (int i = 0; i < N_MODELS; i++)
        if (setup_model(&MODELS[i])) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_MODELS; i++) free(MODELS[i].ref);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* cmocka per-test setups: which model the test runs on */
static int on_moe(void **state) { (void)state; M = &MODELS[0]; return 0; }
static int on_ds(void **state) { (void)state; M = &MODELS[1]; return 0; }
static int on_ds_v2(void **state) { (void)state; M = &MODELS[2]; return 0; }
static int on_fp8(void **state) { (void)state; M = &MODELS[3]; return 0; }
static int on_int4(void **state) { (void)state; M = &MODELS[4]; return 0; }
static int on_mixed(void **state) { (void)state; M = &MODELS[5]; return 0; }
static int on_ue8m0(void **state) { (void)state; M = &MODELS[8]; return 0; }

static void check(const arm *a) {
    float *got = run(a, NULL);
    for (int r = 0; r < NTOK; r++)
        if (memcmp(M->ref + (size_t)r * M->V, got + (size_t)r * M->V, sizeof(float) * (size_t)M->V))
            fail_msg("%s: experts %s, %d slots, %d threads, step %d, prefetch %s depth %d, policy %s: row %d "
                     "differs from resident",
                     M->name, a->experts ? a->experts : "safetensors", a->slots, a->threads, a->step,
                     a->prefetch ? a->prefetch : "default", a->depth, policy ? policy : "default", r);
    free(got);
}

/* 8 experts x 2 MoE layers; top-3: one layer's active experts = 3 slots. */
static void test_pack_every_budget(void **state) {
    (void)state;
    int slots[] = {1, 2, 3, 5, 8, 16, 64};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        for (int th = 1; th <= 2; th++) {
            arm a = {M->pack1, slots[i], th, i % 2 ? 1 : NTOK, NULL, 0};
            check(&a);
        }
}

static void test_striped(void **state) {
    (void)state;
    int slots[] = {1, 3, 16};
    for (size_t i = 0; i < 3; i++) {
        arm a = {M->packs2, slots[i], 2, i == 1 ? 1 : 7, NULL, 0};
        check(&a);
    }
}

static void test_safetensors_path(void **state) {
    (void)state;
    int slots[] = {1, 3, 16};
    for (size_t i = 0; i < 3; i++) {
        arm a = {NULL, slots[i], 1 + (int)(i % 2), i == 0 ? 1 : NTOK, NULL, 0};
        check(&a);
    }
}

/* Counters: with room for every expert, each is read exactly once. */
static void test_stats(void **state) {
    (void)state;
    df_stats all, one;
    arm a = {M->pack1, 64, 1, 1, NULL, 0}; /* more than every expert: capped to all + transient */
    free(run(&a, &all));
    assert_true(all.expert_misses <= (uint64_t)M->n_experts);
    assert_int_equal(all.expert_hits + all.expert_misses, all.expert_requests);
    assert_true(all.expert_hits > 0);
    assert_string_equal(all.expert_source, "pack");
    arm b = {M->pack1, 1, 1, 1, NULL, 0};
    free(run(&b, &one));
    assert_true(one.expert_misses > all.expert_misses);
    assert_true(one.expert_bytes_read > all.expert_bytes_read);
    assert_int_equal(one.expert_rereads, 0);
}

/* Reading ahead changes when bytes arrive, never which: every prefetch mode and
 * depth, with caches from one slot up, token by token and in batches, from a
 * pack and from the safetensors, gives the resident logits. */
static void test_prefetch_exact(void **state) {
    (void)state;
    const char *modes[] = {"off", "on", "router", "prev"};
    int slots[] = {1, 5, 16};
    int k = 0;
    for (int m = 0; m < 4; m++)
        for (int depth = 1; depth <= 2; depth++)
            for (int i = 0; i < 3; i++, k++) {
                if (m == 0 && depth == 2) continue; /* off: depth means nothing */
                arm a = {k % 5 == 4 ? NULL : k % 3 ? M->pack1 : M->packs2, slots[i], 1 + k % 2,
                         k % 3 == 0 ? NTOK : k % 3 == 1 ? 1 : 7, modes[m], depth};
                check(&a);
            }
}

/* Every read made on a prediction is accounted once: used by its layer, or
 * wasted; per-layer counts are consistent; "off" reads nothing ahead. */
static void test_prefetch_stats(void **state) {
    (void)state;
    const char *modes[] = {"router", "prev", "on"};
    for (int m = 0; m < 3; m++) {
        /* "on" reads only ranks whose uncached predictions were used, and which
         * those are in a few steps depends on which reads were still in flight:
         * a threshold under the prior makes it read whatever it predicts */
        df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = M->pack1,
                            .expert_cache = 5 * slot_bytes(M->pack1), .prefetch = modes[m]};
        df_engine_dev dev = {.prefetch_depth = 1, .prefetch_min_precision = 0.01};
        df_engine *e;
        df_error err;
        if (df_engine_open_dev(&e, &o, &dev, &err)) fail_msg("open: %s", err.msg);
        df_session *s;
        assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
        float *lg = malloc(sizeof(float) * (size_t)M->V);
        for (int i = 0; i < NTOK; i++) assert_int_equal(df_session_eval(s, toks + i, 1, lg, 0, &err), DF_OK);
        df_stats st;
        df_engine_stats(e, &st);
        df_dev_stats ds;
        df_engine_dev_stats(e, &ds);
        assert_string_equal(st.prefetch, modes[m]);
        assert_int_equal(ds.prefetch_depth, 1);
        assert_true(st.prefetch_reads > 0);
        assert_true(st.prefetch_hits > 0);
        assert_true(st.prefetch_hits <= st.expert_misses);
        /* bytes read on predictions are used or wasted, never both */
        uint64_t acc = st.prefetch_bytes_used + st.prefetch_bytes_wasted;
        assert_true(st.prefetch_bytes_used > 0);
        assert_true(acc <= st.prefetch_reads * slot_bytes(M->pack1));
        assert_true(acc <= st.expert_bytes_read);
        df_prefetch_layer pl[4];
        assert_int_equal(df_engine_prefetch_layers(e, pl, 4), 2);
        assert_int_equal(pl[0].layer, M->moe_layers[0]);
        assert_int_equal(pl[1].layer, M->moe_layers[1]);
        uint64_t correct = 0;
        for (int l = 0; l < 2; l++) {
            assert_true(pl[l].correct <= pl[l].predicted);
            assert_true(pl[l].correct <= pl[l].actual);
            assert_true(pl[l].actual > 0);
            assert_true(pl[l].recall_router >= 0 && pl[l].recall_router <= 1);
            assert_true(pl[l].precision_first >= 0 && pl[l].precision_first <= 1);
            assert_true(pl[l].precision_prev >= 0 && pl[l].precision_prev <= 1);
            assert_true(pl[l].ranks_read >= 0 && pl[l].ranks_read <= M->top_k);
            correct += pl[l].correct;
        }
        assert_true(correct > 0); /* the predictions are right at least sometimes */
        free(lg);
        df_session_free(s);
        df_engine_close(e);
    }
    df_stats off;
    arm b = {M->pack1, 5, 1, 1, "off", 1};
    free(run(&b, &off));
    assert_string_equal(off.prefetch, "off");
    assert_int_equal(off.prefetch_reads, 0);
    assert_int_equal(off.prefetch_hits, 0);
}

static void test_prefetch_bad_options(void **state) {
    (void)state;
    df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = M->pack1, .prefetch = "sometimes"};
    df_engine *e;
    df_error err;
    assert_int_not_equal(df_engine_open(&e, &o, &err), DF_OK);
    assert_non_null(strstr(err.msg, "sometimes"));
    o.prefetch = "on";
    df_engine_dev dev = {.prefetch_depth = 9};
    assert_int_not_equal(df_engine_open_dev(&e, &o, &dev, &err), DF_OK);
    assert_non_null(strstr(err.msg, "depth"));
    dev.prefetch_depth = 1;
    dev.prefetch_min_precision = 1.5;
    assert_int_not_equal(df_engine_open_dev(&e, &o, &dev, &err), DF_OK);
    assert_non_null(strstr(err.msg, "precision"));
}

/* The heat histogram persists next to the pack; --pin reads the hottest
 * experts at start-up; a corrupt heat file is not fatal; lru is exact too. */
static void test_heat_and_pin(void **state) {
    (void)state;
    char heat[400];
    snprintf(heat, sizeof heat, "%s/experts.heat", M->pack1);
    unlink(heat);
    arm a = {M->pack1, 8, 1, NTOK, NULL, 0};
    check(&a); /* writes the heat at close */
    struct stat sb;
    assert_int_equal(stat(heat, &sb), 0);
    size_t sz = slot_bytes(M->pack1);
    df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = M->pack1,
                        .expert_cache = 8 * sz, .pin_bytes = 4 * sz};
    df_engine *e;
    df_error err;
    assert_int_equal(df_engine_open(&e, &o, &err), DF_OK);
    df_stats st;
    df_engine_stats(e, &st);
    assert_int_equal(st.pinned_experts, 4);
    df_engine_close(e);
    FILE *f = fopen(heat, "wb");
    fputs("garbage", f);
    fclose(f);
    assert_int_equal(df_engine_open(&e, &o, &err), DF_OK);
    df_engine_stats(e, &st);
    assert_int_equal(st.pinned_experts, 0); /* nothing known to pin, but it runs */
    df_engine_close(e);
    o.cache_policy = "mru";
    assert_int_equal(df_engine_open(&e, &o, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "mru"));
    /* lru through the same store */
    float *got;
    {
        df_engine_opts lo = {.model_dir = M->dir, .n_threads = 2, .experts = M->pack1,
                             .expert_cache = 3 * sz, .cache_policy = "lru"};
        assert_int_equal(df_engine_open(&e, &lo, &err), DF_OK);
        df_session *s;
        assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
        got = malloc(sizeof(float) * (size_t)M->V * NTOK);
        for (int i = 0; i < NTOK; i++)
            assert_int_equal(df_session_eval(s, toks + i, 1, got + (size_t)i * M->V, 1, &err), DF_OK);
        df_session_free(s);
        df_engine_close(e);
    }
    assert_memory_equal(M->ref, got, sizeof(float) * (size_t)M->V * NTOK);
    free(got);
}

static void test_corrupt_record(void **state) {
    (void)state;
    char path[400];
    snprintf(path, sizeof path, "%s/experts.bin", M->pack1);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 5000, SEEK_SET); /* inside the first record (layer 0 expert 0 or 1) */
    int c = fgetc(f);
    fseek(f, 5000, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = M->pack1,
                        .expert_cache = (uint64_t)1 << 40};
    df_engine *e;
    df_error err;
    assert_int_equal(df_engine_open(&e, &o, &err), DF_OK);
    df_session *s;
    assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
    int rc = DF_OK;
    for (int i = 0; i < NTOK && rc == DF_OK; i++) rc = df_session_eval(s, toks + i, 1, NULL, 0, &err);
    assert_int_equal(rc, DF_ERR_IO);
    assert_non_null(strstr(err.msg, "checksum mismatch"));
    assert_non_null(strstr(err.msg, "expert"));
    df_stats st;
    df_engine_stats(e, &st);
    assert_int_equal(st.expert_rereads, 1); /* read once more before failing */
    df_session_free(s);
    df_engine_close(e);
    /* put it back so later tests see a good pack */
    f = fopen(path, "r+b");
    fseek(f, 5000, SEEK_SET);
    fputc(c, f);
    fclose(f);
}

/* Short reads and EINTR, as the kernel may report them, are continued and
 * retried: the results stay exact (and the checksums pass). */
static void test_short_reads_and_eintr(void **state) {
    (void)state;
    setenv("DF_TEST_IO_FAULTS", "short,eintr", 1);
    arm a = {M->pack1, 3, 2, 1, NULL, 0}, b = {M->packs2, 5, 1, NTOK, NULL, 0}, c = {NULL, 2, 2, 7, NULL, 0};
    check(&a);
    check(&b);
    check(&c);
    df_stats st;
    arm d = {M->pack1, 3, 1, NTOK, NULL, 0};
    free(run(&d, &st));
    unsetenv("DF_TEST_IO_FAULTS");
    assert_int_equal(st.expert_rereads, 0);
    assert_true(st.expert_misses > 0);
}

/* The simulated disk changes when reads are handed over, never what they
 * hold: exact with and without prefetch, striped, 1 and 2 threads. It never
 * delivers faster than its bandwidth (bytes read / wall time), and it needs a
 * pack: without one it is a clear error. */
static void test_sim_disk(void **state) {
    (void)state;
    arm a[] = {{M->pack1, 3, 2, 1, "off", 0}, {M->packs2, 5, 1, 7, "router", 1},
               {M->pack1, 1, 2, NTOK, "on", 2}, {M->pack1, 16, 1, 1, "prev", 1}};
    sim_gbs = 0.05;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) check(&a[i]);
    sim_gbs = 0;
    df_stats st;
    arm slow = {M->pack1, 3, 1, 1, "off", 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    free(run(&slow, &st));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double plain = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    /* a bandwidth at which the reads alone take 3x the whole run on the real
     * disk: without the pacing the check below could not pass */
    sim_gbs = (double)st.expert_bytes_read / (3 * plain + 0.1) / 1e9;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    df_stats ss;
    df_dev_stats sd;
    float *lg = run_dev(&slow, &ss, &sd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double rate = sim_gbs * 1e9;
    sim_gbs = 0;
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_memory_equal(lg, M->ref, sizeof(float) * (size_t)M->V * NTOK);
    free(lg);
    assert_true(sd.sim_disk_bps > 0);
    assert_true(ss.expert_bytes_read == st.expert_bytes_read);
    if ((double)ss.expert_bytes_read / secs > rate * 1.01)
        fail_msg("%llu bytes in %.3f s: faster than the simulated %.0f B/s",
                 (unsigned long long)ss.expert_bytes_read, secs, rate);
    df_engine_opts o = {.model_dir = M->dir};
    df_engine_dev dev = {.sim_disk_bps = 1e9};
    df_engine *e;
    df_error err;
    assert_int_equal(df_engine_open_dev(&e, &o, &dev, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "simulated disk"));
    o.expert_cache = 3 * slot_bytes(NULL); /* streaming from the safetensors */
    assert_int_equal(df_engine_open_dev(&e, &o, &dev, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "simulated disk"));
}

static void test_missing_pack(void **state) {
    (void)state;
    df_engine_opts o = {.model_dir = M->dir, .experts = "/nonexistent/pack-dir"};
    df_engine *e;
    df_error err;
    int rc = df_engine_open(&e, &o, &err);
    assert_int_not_equal(rc, DF_OK);
    assert_non_null(strstr(err.msg, "/nonexistent/pack-dir"));
    /* only one of the two stripes */
    o.experts = M->pack2a;
    assert_int_not_equal(df_engine_open(&e, &o, &err), DF_OK);
    /* a budget too small for even one expert */
    o.experts = M->pack1;
    o.expert_cache = 100;
    assert_int_equal(df_engine_open(&e, &o, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "one expert"));
}

/* ---- the always-active matrices' copy (streaming reads them from RAM) ---------- */

static bool in_ram(const df_model *m, const df_weight *w) {
    const uint8_t *p = w->v.data, *r = m->ram;
    return r && p >= r && p + w->t->nbytes <= r + m->ram_bytes;
}

/* A copied weight holds the checkpoint's bytes (read through the mapping). */
static void check_copied(const df_model *m, const df_weight *w) {
    assert_true(in_ram(m, w));
    assert_ptr_equal(df_model_ram_copy(m, w->t), w->v.data);
    assert_int_equal(memcmp(w->v.data, w->t->data, w->t->nbytes), 0);
    if (w->ts) { /* a scaled matrix: its scale grid too */
        assert_ptr_equal(df_model_ram_copy(m, w->ts), w->v.scale);
        assert_int_equal(memcmp(w->v.scale, w->ts->data, w->ts->nbytes), 0);
    }
}

static void check_dense_copy(const char *dir, bool tied) {
    df_model m;
    df_error err;
    assert_int_equal(df_model_load(&m, dir, &err), DF_OK);
    assert_null(m.ram);
    assert_int_equal(df_model_dense_to_ram(&m, &err), DF_OK);
    assert_non_null(m.ram);
    void *ram = m.ram;
    assert_int_equal(df_model_dense_to_ram(&m, &err), DF_OK); /* once only */
    assert_ptr_equal(m.ram, ram);
    check_copied(&m, &m.lm_head);
    assert_true(in_ram(&m, &m.embed) == tied); /* untied: one row per token, left mapped */
    if (!tied) assert_null(df_model_ram_copy(&m, m.embed.t));
    /* Every matrix the forward pass uses (attention, routers, dense MLPs) is
     * copied and used from the copy; routed experts stream, never copied. */
    for (int i = 0; i < m.n_active; i++) check_copied(&m, m.active[i]);
    int n_copied = 0, n_matrices = 0;
    for (size_t i = 0; i < df_st_count(m.st); i++) {
        const df_tensor *t = df_st_at(m.st, i);
        if (m.is_expert[i]) {
            assert_null(df_model_ram_copy(&m, t));
            continue;
        }
        if (t->ndim != 2 || (t == m.embed.t && !tied)) continue;
        n_matrices++;
        n_copied += df_model_ram_copy(&m, t) != NULL;
    }
    assert_int_equal(n_copied, n_matrices);
    int n_moe = 0, n_dense = 0;
    for (int li = 0; li < m.cfg.num_hidden_layers; li++) {
        if (m.cfg.layer_is_moe[li]) n_moe++;
        else n_dense++;
    }
    assert_true(n_dense > 0);
    assert_true(n_moe > 0 || m.cfg.num_experts == 0);
    /* shared experts are always active: copied (gate, up, down per MoE layer), never packed */
    int n_shared = 0;
    for (size_t i = 0; i < df_st_count(m.st); i++) {
        const df_tensor *t = df_st_at(m.st, i);
        if (!strstr(t->name, ".shared_experts.") || strstr(t->name, ".weight_shape")) continue;
        assert_false(m.is_expert[i]);
        assert_non_null(df_model_ram_copy(&m, t));
        n_shared += !strstr(t->name, ".weight_scale"); /* the values; scales copied too */
    }
    assert_int_equal(n_shared, m.cfg.n_shared_experts ? 3 * n_moe : 0);
    df_model_free(&m);
}

static void test_dense_copy(void **state) {
    (void)state;
    char dense[600];
    snprintf(dense, sizeof dense, "%s/../engine-dense", M->dir);
    check_dense_copy(M->dir, false); /* sharded, a dense MLP layer among MoE ones */
    check_dense_copy(dense, true);
    /* a checkpoint cut short after it was opened: a clean error naming the tensor */
    char dir[300], from[700], to[400];
    snprintf(dir, sizeof dir, "%s/cut", tmp);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", dense, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        df_test_copy_file(from, to);
    }
    df_model m;
    df_error err;
    assert_int_equal(df_model_load(&m, dir, &err), DF_OK);
    struct stat sb;
    assert_int_equal(stat(to, &sb), 0);
    assert_int_equal(truncate(to, sb.st_size / 2), 0);
    assert_int_equal(df_model_dense_to_ram(&m, &err), DF_ERR_IO);
    assert_non_null(strstr(err.msg, "model.safetensors: tensor '"));
    assert_non_null(strstr(err.msg, "end of file"));
    assert_null(m.ram);
    df_model_free(&m);
}

/* The DeepSeek-V3 family's always-active matrices: MLA's, the dense first
 * layer's and the shared experts' are copied, routed experts are not. */
static void test_dense_copy_family(void **state) {
    (void)state;
    check_dense_copy(M->dir, false);
}

/* ---- the DeepSeek-V3 family ------------------------------------------------------ */

/* The arms of the tests above, fewer (each open parses a tokenizer): a pack of
 * 1 and 2 stripes and the safetensors; caches of one slot (less than one
 * token's top-k), a few, and every expert; 1 and 2 threads, token by token and
 * in batches; every prefetch mode at depths 1 and 2; lru; a simulated disk.
 * every: 1 runs them all, 2 every other one of the first nine. */
static void family_arms(int every) {
    const arm arms[] = {
        {M->pack1, 1, 1, 1, "off", 0},     {M->pack1, 3, 2, NTOK, "off", 0},
        {M->pack1, 6, 2, 7, "router", 1},  {M->pack1, 64, 1, NTOK, "router", 2},
        {M->packs2, 2, 2, 1, "on", 1},     {M->packs2, 5, 1, 7, "prev", 1},
        {NULL, 1, 2, 1, "router", 2},      {NULL, 5, 1, NTOK, "on", 2},
        {M->pack1, 2, 1, 7, NULL, 0},
    };
    for (size_t i = 0; i < sizeof arms / sizeof arms[0]; i += (size_t)every) check(&arms[i]);
    /* resident, token by token: the one-token products of an FP8 model read the F16-form
     * maps of its always-active matrices and resident experts, the reference's batch does not */
    arm token = {NULL, 0, 2, 1, NULL, 0};
    check(&token);
    policy = "lru";
    arm lru = {M->pack1, 4, 2, 1, "on", 1};
    check(&lru);
    policy = NULL;
    sim_gbs = 0.05;
    arm slow = {M->packs2, 3, 2, 7, "router", 1};
    check(&slow);
    sim_gbs = 0;
}

static void test_family_arms(void **state) { (void)state; family_arms(1); }
/* Power-of-two FP8 scales: the one-token products (resident with the FP8 maps, streamed
 * without) equal the batched reference, whose tiles never move a scale onto x. */
static void test_pow2_arms(void **state) {
    (void)state;
    const arm arms[] = {{NULL, 0, 2, 1, NULL, 0}, {NULL, 0, 1, 1, NULL, 0}, {M->pack1, 3, 2, 1, "off", 0},
                        {M->packs2, 5, 1, 7, "router", 1}};
    for (size_t i = 0; i < sizeof arms / sizeof arms[0]; i++) check(&arms[i]);
}
/* engine-ds-v2 differs in its router (softmax, greedy, not renormalised), two
 * shared experts and q_proj: what streaming sees is the same */
static void test_family_arms_few(void **state) { (void)state; family_arms(2); }

/* Copies the regular files of directory `from` into `to` (made). */
static void copy_dir(const char *from, const char *to) {
    mkdir(to, 0755);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *de;
    char a[1100], b[1100];
    while ((de = readdir(d))) {
        snprintf(a, sizeof a, "%s/%s", from, de->d_name);
        struct stat sb;
        if (stat(a, &sb) || !S_ISREG(sb.st_mode)) continue;
        snprintf(b, sizeof b, "%s/%s", to, de->d_name);
        df_test_copy_file(a, b);
    }
    closedir(d);
}

/* Zeros tensor `name` (as m, loaded from elsewhere, lays it out) in the copy in dir. */
static void zero_tensor(const df_model *m, const char *dir, const char *name) {
    const df_tensor *t = df_st_find(m->st, name);
    if (!t) fail_msg("no tensor %s", name);
    const char *path = df_st_file_path(m->st, t->file), *base = strrchr(path, '/');
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, base ? base + 1 : path);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    void *z = calloc(1, t->nbytes);
    assert_int_equal(pwrite(fd, z, t->nbytes, (off_t)t->file_offset), (ssize_t)t->nbytes);
    free(z);
    close(fd);
}

/* The router lookahead runs the family's own router. In a copy of the
 * checkpoint where nothing between the first MoE layer's router and the
 * second's changes the residual stream (the first layer's routed and shared
 * experts and the second's attention output are zero), the second router's
 * choice read ahead equals the choice it then makes, every step: any other
 * router (no correction bias, no groups, softmax for sigmoid) would differ
 * somewhere. The first MoE layer, predicted from the embeddings, is not
 * exact (so the check can tell). Results stay those of the resident run. */
static void test_lookahead_family_router(void **state) {
    (void)state;
    char dir[400], n[200];
    snprintf(dir, sizeof dir, "%s/%s-flat", tmp, M->name);
    copy_dir(M->dir, dir);
    df_model m;
    df_error err;
    assert_int_equal(df_model_load(&m, M->dir, &err), DF_OK);
    int l1 = M->moe_layers[0], l2 = M->moe_layers[1];
    for (int e = 0; e < m.cfg.num_experts; e++) {
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.down_proj.weight", l1, e);
        zero_tensor(&m, dir, n);
    }
    snprintf(n, sizeof n, "model.layers.%d.mlp.shared_experts.down_proj.weight", l1);
    zero_tensor(&m, dir, n);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.weight", l2);
    zero_tensor(&m, dir, n);
    df_model_free(&m);
    float *lg[2];
    for (int streamed = 0; streamed < 2; streamed++) {
        df_engine_opts o = {.model_dir = dir, .n_threads = 2};
        if (streamed) o.expert_cache = 5 * slot_bytes(NULL), o.prefetch = "router";
        df_engine_dev dev = {.prefetch_depth = 1};
        df_engine *e;
        if (df_engine_open_dev(&e, &o, &dev, &err)) fail_msg("open: %s", err.msg);
        df_session *s;
        assert_int_equal(df_session_new(&s, e, NTOK, &err), DF_OK);
        lg[streamed] = malloc(sizeof(float) * (size_t)M->V * NTOK);
        for (int i = 0, k; i < NTOK; i += k) { /* token by token, then batches */
            k = i < NTOK / 2 ? 1 : NTOK - i < 7 ? NTOK - i : 7;
            if (df_session_eval(s, toks + i, k, lg[streamed] + (size_t)i * M->V, 1, &err))
                fail_msg("eval: %s", err.msg);
        }
        if (streamed) {
            df_prefetch_layer pl[2];
            assert_int_equal(df_engine_prefetch_layers(e, pl, 2), 2);
            assert_int_equal(pl[1].layer, l2);
            if (pl[1].actual == 0 || pl[1].correct != pl[1].actual || pl[1].predicted != pl[1].actual)
                fail_msg("layer %d read ahead: %llu predicted, %llu right, %llu used", l2,
                         (unsigned long long)pl[1].predicted, (unsigned long long)pl[1].correct,
                         (unsigned long long)pl[1].actual);
            assert_true(pl[0].correct < pl[0].actual);
            df_stats st;
            df_engine_stats(e, &st);
            assert_true(st.prefetch_hits > 0);
        }
        df_session_free(s);
        df_engine_close(e);
    }
    assert_memory_equal(lg[0], lg[1], sizeof(float) * (size_t)M->V * NTOK);
    free(lg[0]);
    free(lg[1]);
}

/* Sizes that would wrap give every expert a slot and no more: no budget (an
 * unlimited cache once became a negative slot count, "less than one
 * expert"), budgets and caches up to 2^64 - 1 bytes, a pinned tier as large;
 * and the stats say what set the cache's size and what the engine expects
 * to be resident. */
static void test_huge_sizes(void **state) {
    (void)state;
    const uint64_t huge[] = {0, (uint64_t)400 << 40, UINT64_MAX};
    df_stats every;
    arm a = {M->pack1, 64, 1, NTOK, NULL, 0}; /* more than every expert: capped to all + transient */
    free(run(&a, &every));
    for (int src = 0; src < 2; src++) {
        for (int i = 0; i < 3; i++) {
            for (int as_cache = 0; as_cache < 2; as_cache++) {
                if (!huge[i] && (as_cache || !src)) continue; /* no budget: only with a pack */
                df_engine_opts o = {.model_dir = M->dir, .n_threads = 1, .experts = src ? M->pack1 : NULL};
                if (as_cache) o.expert_cache = huge[i], o.pin_bytes = huge[i];
                else o.ram_budget = huge[i];
                df_engine *e;
                df_error err;
                if (df_engine_open(&e, &o, &err))
                    fail_msg("%s, %s %llu: %s", src ? "pack" : "safetensors", as_cache ? "cache" : "budget",
                             (unsigned long long)huge[i], err.msg);
                df_stats st;
                df_engine_stats(e, &st);
                assert_int_equal(st.cache_slots, every.cache_slots);
                assert_true(st.pinned_experts <= st.cache_slots);
                assert_non_null(st.cache_sizing);
                assert_string_equal(st.cache_sizing, "all experts fit");
                assert_true(st.mem_estimate >= st.mem_resident + st.cache_bytes);
                assert_int_equal(st.ram_budget, o.ram_budget);
                df_engine_close(e);
            }
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_every_budget), cmocka_unit_test(test_striped),
        cmocka_unit_test(test_safetensors_path),  cmocka_unit_test(test_stats),
        cmocka_unit_test(test_heat_and_pin),
        cmocka_unit_test(test_corrupt_record),    cmocka_unit_test(test_short_reads_and_eintr),
        cmocka_unit_test(test_missing_pack),      cmocka_unit_test(test_sim_disk),
        cmocka_unit_test(test_prefetch_exact),    cmocka_unit_test(test_prefetch_stats),
        cmocka_unit_test(test_prefetch_bad_options), cmocka_unit_test(test_dense_copy),
        cmocka_unit_test(test_huge_sizes),
        /* the DeepSeek-V3 family */
        cmocka_unit_test_setup_teardown(test_family_arms, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_family_arms_few, on_ds_v2, on_moe),
        cmocka_unit_test_setup_teardown(test_family_arms_few, on_fp8, on_moe),
        cmocka_unit_test_setup_teardown(test_family_arms_few, on_int4, on_moe),
        cmocka_unit_test_setup_teardown(test_family_arms_few, on_mixed, on_moe),
        cmocka_unit_test_setup_teardown(test_dense_copy_family, on_fp8, on_moe),
        cmocka_unit_test_setup_teardown(test_pow2_arms, on_ue8m0, on_moe),
        cmocka_unit_test_setup_teardown(test_stats, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_prefetch_stats, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_lookahead_family_router, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_dense_copy_family, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_dense_copy_family, on_ds_v2, on_moe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
