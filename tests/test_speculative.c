/*
 * test_speculative.c - speculative decoding gives plain decoding's output.
 *
 * Identity: token for token the plain loop's output over many prompts, greedy
 * (with and without a repetition penalty) and sampling with a seed (exact
 * mode), for every drafter (prompt lookup, the target as its own draft, an
 * unrelated dense draft, an oracle that is right up to a random position), at
 * fixed depths and under the gate, with the experts resident and streamed from
 * a pack through a 2-slot cache. The gate: a drafter that is always wrong is
 * switched off within a bounded number of passes, and output stays the same.
 * Rejection sampling: the empirical distribution of the first tokens (1500
 * seeded runs) matches plain sampling by a chi-square test at a strict level,
 * for a draft model (q != p: rejections and residual draws), a one-hot drafter
 * and the target as its own draft; the same test tells two temperatures apart,
 * so it can fail. Errors: a draft with another vocabulary is refused by name.
 * The greedy identity holds for a DeepSeek-V3 target and a Kimi K3-shaped one
 * (recurrent state: few kept positions, recomputation) too (drafted by itself,
 * by a DeepSeek-V2 MoE model, by lookup and the oracles), whose latent cache
 * a rejected draft leaves rows in past the position it rolls back to.
 */
#include "testutil.h"

#include "decode/speculative.h"
#include "deltafin.h"
#include "experts/pack.h"
#include "engine/dev.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_NEW 32
#define N_PROMPTS 6

static char moe_dir[512], dense_dir[512], v512_dir[512], tmp[256], pack_dir[300];
static char ds_dir[512], ds_v2_dir[512], ds_pack_dir[300];
static char k3_dir[512], k3_other_dir[512], k3_pack_dir[300];
static int V;
/* The target model of the identity tests, its pack, and an unrelated draft
 * with its tokenizer: engine-moe and engine-dense, or engine-ds and engine-ds-v2. */
static const char *target = moe_dir, *target_pack = pack_dir, *other_draft = dense_dir;
static int n_prompts = N_PROMPTS; /* of the identity tests: 3 cover greedy, a penalty and sampling */

static const char *models(void) {
    const char *d = getenv("DF_TEST_MODELS");
    return d ? d : "build/test-models";
}

static df_engine *open_target(bool streamed, int threads) {
    df_engine_opts o = {.model_dir = target, .n_threads = threads};
    if (streamed) {
        /* two cache slots: nearly every expert use in a batch is a read */
        df_engine_opts probe = {.model_dir = target, .n_threads = 1, .experts = target_pack,
                                .expert_cache = (uint64_t)1 << 40};
        df_engine *e;
        df_error err;
        if (df_engine_open(&e, &probe, &err)) fail_msg("open: %s", err.msg);
        df_stats st;
        df_engine_stats(e, &st);
        df_engine_close(e);
        o.experts = target_pack;
        o.expert_cache = 2 * (st.cache_bytes / (uint64_t)st.cache_slots);
    }
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

/* Prompts: random ones of several lengths and repetitive ones that lookup can use. */
static int make_prompt(int i, int32_t *p) {
    uint32_t x = 1234u + 77u * (uint32_t)i;
    int n = 1 + (i * 7) % 23;
    for (int j = 0; j < n; j++) {
        x = x * 1664525u + 1013904223u;
        p[j] = (int32_t)((x >> 8) % 1000);
    }
    if (i % 3 == 0) { /* a phrase said three times */
        int m = n < 6 ? n : 6;
        for (int r = 1; r < 3; r++)
            for (int j = 0; j < m; j++) p[n++] = p[j];
    }
    return n;
}

/* The plain loop of `deltafin run`. */
static int plain_decode(df_engine *e, const int32_t *prompt, int n, df_sampler_params *sp, int max_new,
                        int32_t *out) {
    df_error err;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, n + max_new + 1, &err), DF_OK);
    df_sampler *smp;
    assert_int_equal(df_sampler_new(&smp, sp, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + max_new + 1));
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    int nh = n, k = 0;
    if (df_session_eval(s, prompt, n, lg, 0, &err)) fail_msg("eval: %s", err.msg);
    for (; k < max_new; k++) {
        int32_t t = df_sampler_sample(smp, lg, V, hist, nh);
        hist[nh++] = t;
        out[k] = t;
        if (k + 1 == max_new) break;
        if (df_session_eval(s, &t, 1, lg, 0, &err)) fail_msg("eval: %s", err.msg);
    }
    free(hist);
    free(lg);
    df_sampler_free(smp);
    df_session_free(s);
    return max_new;
}

static int spec_decode(df_engine *e, df_spec *sp, const int32_t *prompt, int n, df_sampler_params *par,
                       int max_new, int32_t *out) {
    df_error err;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, n + max_new + 1, &err), DF_OK);
    df_sampler *smp;
    assert_int_equal(df_sampler_new(&smp, par, &err), DF_OK);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + max_new + 17));
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    int nh = n, produced = 0;
    if (n > 1 && df_session_eval(s, prompt, n - 1, NULL, 0, &err)) fail_msg("eval: %s", err.msg);
    while (produced < max_new) {
        int32_t got[17];
        int ng;
        if (df_spec_step(sp, s, smp, hist, nh, got, max_new - produced, &ng, &err)) fail_msg("step: %s", err.msg);
        assert_true(ng >= 1 && ng <= max_new - produced);
        for (int i = 0; i < ng; i++) out[produced++] = hist[nh++] = got[i];
        assert_int_equal(df_session_pos(s), nh - 1);
    }
    free(hist);
    df_sampler_free(smp);
    df_session_free(s);
    return produced;
}

/* ---- drafters for tests ------------------------------------------------------------ */

/* Knows the plain output; proposes it, wrong from a pseudo-random offset on
 * (or always wrong with wrong_always), so acceptance stops at every position. */
typedef struct oracle {
    const int32_t *prompt, *ref;
    int n_prompt, n_ref;
    uint32_t rng;
    bool wrong_always;
    int calls;
} oracle;

static int oracle_draft(void *user, const int32_t *ctx, int n_ctx, int32_t *out, int k) {
    oracle *o = user;
    o->calls++;
    int at = n_ctx - o->n_prompt; /* index into ref of the token to propose */
    o->rng = o->rng * 1664525u + 1013904223u;
    int bad = o->wrong_always ? 0 : (int)((o->rng >> 8) % (uint32_t)(k + 2)); /* k, k+1: all right */
    int m = 0;
    (void)ctx;
    for (; m < k && at + m < o->n_ref; m++) {
        int32_t t = o->ref[at + m];
        out[m] = m == bad ? (t + 1) % V : t;
    }
    return m;
}

/* ---- greedy identity --------------------------------------------------------------- */

typedef struct arm {
    const char *draft; /* "lookup", a dir, or "oracle" / "wrong" */
    int fixed, k_max, lookup_n;
} arm;

static void check_identity(bool streamed, int threads) {
    df_engine *e = open_target(streamed, threads);
    arm arms[] = {
        {"lookup", 0, 0, 0},  {"lookup", 4, 0, 1},    {"lookup", 8, 0, 3},   {target, 0, 0, 0},
        {target, 3, 0, 0},    {other_draft, 2, 0, 0}, {other_draft, 0, 0, 0},  {"oracle", 1, 0, 0},
        {"oracle", 5, 8, 0},  {"oracle", 0, 0, 0},    {"wrong", 0, 0, 0},
    };
    int n_arms = (int)(sizeof arms / sizeof arms[0]);
    uint64_t accepted_lookup = 0, accepted_self = 0, drafted_self = 0, accepted_oracle = 0, drafted_oracle = 0;
    df_sampler_params par;
    df_sampler_params_default(&par); /* greedy */
    /* one df_spec per arm, reused across prompts as the server does */
    df_spec *sps[16];
    oracle orc[16];
    for (int a = 0; a < n_arms; a++) {
        bool is_fn = !strcmp(arms[a].draft, "oracle") || !strcmp(arms[a].draft, "wrong");
        df_spec_opts so = {.draft = is_fn ? "lookup" : arms[a].draft, .k_max = arms[a].k_max,
                           .lookup_n = arms[a].lookup_n, .n_threads = threads};
        df_error err;
        if (df_spec_new(&sps[a], e, &so, &err)) fail_msg("spec: %s", err.msg);
        df_spec_set_fixed_depth(sps[a], arms[a].fixed);
        if (is_fn) df_spec_set_drafter(sps[a], oracle_draft, &orc[a]);
    }
    for (int pi = 0; pi < n_prompts; pi++) {
        int32_t prompt[64], ref[MAX_NEW], got[MAX_NEW];
        int n = make_prompt(pi, prompt);
        /* greedy, greedy with a penalty (history matters per row), sampling with a seed */
        df_sampler_params_default(&par);
        if (pi % 3 == 1) par.repeat_penalty = 1.3f, par.repeat_last_n = 16;
        if (pi % 3 == 2) par.temperature = 0.9f, par.top_k = 20, par.top_p = 0.95f, par.seed = 7u + (uint64_t)pi;
        plain_decode(e, prompt, n, &par, MAX_NEW, ref);
        for (int a = 0; a < n_arms; a++) {
            df_spec *sp = sps[a];
            orc[a] = (oracle){prompt, ref, n, MAX_NEW, 99u + (uint32_t)pi, !strcmp(arms[a].draft, "wrong"), 0};
            df_spec_stats before, after;
            df_spec_stats_get(sp, &before);
            memset(got, 0xff, sizeof got);
            spec_decode(e, sp, prompt, n, &par, MAX_NEW, got);
            for (int i = 0; i < MAX_NEW; i++)
                if (got[i] != ref[i])
                    fail_msg("%s: prompt %d, draft %s fixed %d (%s, %d threads): token %d is %d, plain "
                             "decoding gives %d",
                             target, pi, arms[a].draft, arms[a].fixed, streamed ? "streamed" : "resident", threads, i,
                             got[i], ref[i]);
            df_spec_stats_get(sp, &after);
            assert_int_equal(after.tokens - before.tokens, MAX_NEW);
            if (arms[a].fixed && strcmp(arms[a].draft, "lookup") != 0)
                assert_true(after.verify_passes > before.verify_passes);
        }
    }
    for (int a = 0; a < n_arms; a++) {
        df_spec_stats st;
        df_spec_stats_get(sps[a], &st);
        if (!strcmp(arms[a].draft, "lookup")) accepted_lookup += st.accepted;
        if (!strcmp(arms[a].draft, target)) accepted_self += st.accepted, drafted_self += st.drafted;
        if (!strcmp(arms[a].draft, "oracle") && arms[a].fixed)
            accepted_oracle += st.accepted, drafted_oracle += st.drafted;
        df_spec_free(sps[a]);
    }
    /* the paths under test were taken: drafts accepted, partly and wholly (the
     * K3-shaped random model never repeats itself: no lookup hits there, the
     * oracle's partial acceptances take the recomputation path) */
    if (target != k3_dir) assert_true(accepted_lookup > 0);
    assert_true(drafted_self > 0);
    assert_int_equal(accepted_self, drafted_self); /* a model agrees with itself */
    assert_true(accepted_oracle > 0 && accepted_oracle < drafted_oracle);
    df_engine_close(e);
}

static void test_greedy_identity_resident(void **st) { (void)st; check_identity(false, 1); }
static void test_greedy_identity_streamed(void **st) { (void)st; check_identity(true, 2); }

/* cmocka per-test setups: the identity tests' target (and V, its vocabulary) */
static int set_target(const char *dir, const char *pack, const char *other, int prompts) {
    target = dir, target_pack = pack, other_draft = other, n_prompts = prompts;
    df_engine_opts o = {.model_dir = target};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) return -1;
    V = df_engine_info(e)->vocab_size;
    df_engine_close(e);
    return 0;
}
static int on_ds(void **st) { (void)st; return set_target(ds_dir, ds_pack_dir, ds_v2_dir, 3); }
/* a Kimi K3-shaped target: recurrent state, which rolls back only to the few
 * positions it keeps (rejected drafts past them are recomputed) */
static int on_k3(void **st) { (void)st; return set_target(k3_dir, k3_pack_dir, k3_other_dir, 3); }
static int on_moe(void **st) { (void)st; return set_target(moe_dir, pack_dir, dense_dir, N_PROMPTS); }

/* ---- the gate ---------------------------------------------------------------------- */

static void test_gate_switches_off_wrong_drafter(void **st) {
    (void)st;
    df_engine *e = open_target(true, 1);
    enum { N = 120 };
    int32_t prompt[64], ref[N];
    int n = make_prompt(3, prompt);
    df_sampler_params par;
    df_sampler_params_default(&par);
    plain_decode(e, prompt, n, &par, N, ref);
    df_spec_opts so = {.draft = "lookup"};
    df_spec *sp;
    df_error err;
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    oracle o = {prompt, ref, n, N, 1, true, 0};
    df_spec_set_drafter(sp, oracle_draft, &o);

    df_session *s;
    assert_int_equal(df_session_new(&s, e, n + N + 1, &err), DF_OK);
    df_sampler *smp;
    assert_int_equal(df_sampler_new(&smp, &par, &err), DF_OK);
    int32_t hist[64 + N + 17];
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    int nh = n, produced = 0, first_off = -1, passes = 0;
    assert_int_equal(df_session_eval(s, prompt, n - 1, NULL, 0, &err), DF_OK);
    while (produced < N) {
        int32_t got[17];
        int ng;
        assert_int_equal(df_spec_step(sp, s, smp, hist, nh, got, N - produced, &ng, &err), DF_OK);
        assert_int_equal(ng, 1); /* nothing is ever accepted */
        assert_int_equal(got[0], ref[produced]);
        hist[nh++] = got[0];
        produced++;
        passes++;
        df_spec_stats ss;
        df_spec_stats_get(sp, &ss);
        if (first_off < 0 && ss.switched_off > 0) first_off = passes;
    }
    df_spec_stats ss;
    df_spec_stats_get(sp, &ss);
    /* Bounded whatever the timings: 3 plain steps, then a probe of at most
     * PROBE_MAX = 9 passes (gate.c). */
    assert_true(first_off > 0 && first_off <= 12);
    assert_int_equal(ss.accepted, 0);
    /* back-offs of >= 16, then >= 64 plain steps between probes of <= 9 passes */
    assert_true(ss.verify_passes <= 9 * 3);
    assert_true(ss.switched_off >= 1);
    assert_true(ss.verify_passes == ss.drafted || ss.drafted >= ss.verify_passes);
    df_sampler_free(smp);
    df_session_free(s);
    df_spec_free(sp);
    df_engine_close(e);
}

/* ---- sampling: the distribution is the target's ----------------------------------- */

#define RUNS 1500
#define NTOK 3

/* Two-sample chi-square homogeneity over categories with counts a, b (equal
 * totals), pooling categories with fewer than 10 together; returns chi2 / the
 * critical value at p = 1e-6 (Wilson-Hilferty): < 1 means "same distribution". */
static double chi2_ratio(const int *a, const int *b, int n_cat) {
    double chi = 0.0, pa = 0, pb = 0;
    int df = -1;
    for (int i = 0; i < n_cat; i++) {
        if (a[i] + b[i] < 10) {
            pa += a[i];
            pb += b[i];
            continue;
        }
        chi += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
        df++;
    }
    if (pa + pb > 0) {
        chi += (pa - pb) * (pa - pb) / (pa + pb);
        df++;
    }
    if (df < 1) return 0.0;
    double z = 4.753, h = 2.0 / (9.0 * df);
    double crit = df * pow(1.0 - h + z * sqrt(h), 3);
    return chi / crit;
}

/* Counts of token j (j < NTOK) and of the pair (t0, t1) over RUNS seeded runs. */
static void sample_runs(df_engine *e, df_spec_opts *so, int fixed, bool one_hot, float temp, int *marg, int *pairs,
                        uint64_t seed0, uint64_t *accepted, uint64_t *drafted) {
    int32_t prompt[64];
    int n = make_prompt(0, prompt);
    df_sampler_params par;
    df_sampler_params_default(&par);
    par.temperature = temp;
    par.top_k = 20;
    par.top_p = 0.95f;
    par.repeat_penalty = 1.1f;
    df_spec *sp = NULL;
    df_error err;
    int32_t greedy_ref[NTOK];
    if (so) {
        if (df_spec_new(&sp, e, so, &err)) fail_msg("spec: %s", err.msg);
        df_spec_set_fixed_depth(sp, fixed);
        if (one_hot) {
            df_sampler_params g;
            df_sampler_params_default(&g);
            plain_decode(e, prompt, n, &g, NTOK, greedy_ref);
        }
    }
    oracle o = {prompt, greedy_ref, n, NTOK, 5, false, 0};
    if (sp && one_hot) df_spec_set_drafter(sp, oracle_draft, &o);
    for (int r = 0; r < RUNS; r++) {
        par.seed = seed0 + (uint64_t)r;
        int32_t out[NTOK];
        if (sp) spec_decode(e, sp, prompt, n, &par, NTOK, out);
        else plain_decode(e, prompt, n, &par, NTOK, out);
        for (int j = 0; j < NTOK; j++) marg[j * V + out[j]]++;
        pairs[out[0] * V + out[1]]++;
    }
    if (sp) {
        df_spec_stats st;
        df_spec_stats_get(sp, &st);
        *accepted = st.accepted;
        *drafted = st.drafted;
        df_spec_free(sp);
    }
}

static void check_same(const int *ma, const int *pa, const int *mb, const int *pb, const char *what, bool want_same) {
    double worst = 0.0;
    for (int j = 0; j < NTOK; j++) {
        double r = chi2_ratio(ma + j * V, mb + j * V, V);
        if (r > worst) worst = r;
    }
    double rp = chi2_ratio(pa, pb, V * V);
    if (rp > worst) worst = rp;
    if (want_same && worst >= 1.0) fail_msg("%s: distributions differ (chi2 / critical = %.3f)", what, worst);
    if (!want_same && worst < 1.0) fail_msg("%s: the test cannot tell them apart (%.3f)", what, worst);
}

static void test_sampling_distribution(void **st) {
    (void)st;
    df_engine *e = open_target(false, 1);
    size_t nm = (size_t)NTOK * (size_t)V, np = (size_t)V * (size_t)V;
    int *m0 = calloc(nm, sizeof(int)), *p0 = calloc(np, sizeof(int));
    int *m1 = calloc(nm, sizeof(int)), *p1 = calloc(np, sizeof(int));
    uint64_t acc, dr;
    sample_runs(e, NULL, 0, false, 0.8f, m0, p0, 1000000, NULL, NULL);

    struct {
        const char *draft;
        bool one_hot;
        const char *what;
    } arms[] = {{dense_dir, false, "unrelated draft model"},
                {moe_dir, false, "target as its own draft"},
                {"lookup", true, "one-hot drafter"}};
    for (int a = 0; a < 3; a++) {
        memset(m1, 0, nm * sizeof(int));
        memset(p1, 0, np * sizeof(int));
        df_spec_opts so = {.draft = arms[a].draft, .n_threads = 1, .rejection = 1};
        sample_runs(e, &so, 2, arms[a].one_hot, 0.8f, m1, p1, 5000000 + 100000 * (uint64_t)a, &acc, &dr);
        /* both outcomes of the accept/reject draw happened */
        assert_true(dr > 0);
        if (arms[a].draft == moe_dir) assert_true(acc > dr * 9 / 10);
        else assert_true(acc > 0 && acc < dr);
        check_same(m0, p0, m1, p1, arms[a].what, true);
    }
    /* power: plain sampling at another temperature is told apart */
    memset(m1, 0, nm * sizeof(int));
    memset(p1, 0, np * sizeof(int));
    sample_runs(e, NULL, 0, false, 0.6f, m1, p1, 9000000, NULL, NULL);
    check_same(m0, p0, m1, p1, "temperature 0.8 vs 0.6", false);
    free(m0);
    free(p0);
    free(m1);
    free(p1);
    df_engine_close(e);
}

/* ---- errors ------------------------------------------------------------------------- */

static void test_draft_errors(void **st) {
    (void)st;
    df_engine *e = open_target(false, 1);
    df_spec *sp = NULL;
    df_error err;
    df_spec_opts so = {.draft = v512_dir};
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_ERR_UNSUPPORTED);
    assert_null(sp);
    assert_non_null(strstr(err.msg, "vocabulary"));
    assert_non_null(strstr(err.msg, "draft-v512"));
    so.draft = "/nonexistent/draft";
    assert_int_not_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    assert_non_null(strstr(err.msg, "/nonexistent/draft"));
    so = (df_spec_opts){.draft = "lookup", .k_max = 17};
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_ERR_ARG);
    so = (df_spec_opts){.draft = "lookup"};
    assert_int_equal(df_spec_new(&sp, e, &so, &err), DF_OK);
    /* a session that is not one token behind the history is refused */
    df_session *s;
    df_sampler *smp;
    assert_int_equal(df_session_new(&s, e, 16, &err), DF_OK);
    assert_int_equal(df_sampler_new(&smp, NULL, &err), DF_OK);
    int32_t hist[3] = {1, 2, 3}, out[4];
    int ng;
    assert_int_equal(df_spec_step(sp, s, smp, hist, 3, out, 4, &ng, &err), DF_ERR_ARG);
    df_sampler_free(smp);
    df_session_free(s);
    df_spec_free(sp);
    df_engine_close(e);
}

static int setup(void **state) {
    (void)state;
    snprintf(moe_dir, sizeof moe_dir, "%s/engine-moe", models());
    snprintf(dense_dir, sizeof dense_dir, "%s/engine-dense", models());
    snprintf(v512_dir, sizeof v512_dir, "%s/draft-v512", models());
    snprintf(tmp, sizeof tmp, "/tmp/deltafin-test-spec-%d", (int)getpid());
    mkdir(tmp, 0755);
    snprintf(pack_dir, sizeof pack_dir, "%s/pack", tmp);
    snprintf(ds_dir, sizeof ds_dir, "%s/engine-ds", models());
    snprintf(ds_v2_dir, sizeof ds_v2_dir, "%s/engine-ds-v2", models());
    snprintf(ds_pack_dir, sizeof ds_pack_dir, "%s/pack-ds", tmp);
    snprintf(k3_dir, sizeof k3_dir, "%s/engine-k3-stream", models());
    snprintf(k3_other_dir, sizeof k3_other_dir, "%s/engine-k3", models());
    snprintf(k3_pack_dir, sizeof k3_pack_dir, "%s/pack-k3", tmp);
    df_error err;
    df_pack_write_opts wo = {0};
    const char *one[] = {pack_dir}, *ds_one[] = {ds_pack_dir}, *k3_one[] = {k3_pack_dir};
    if (df_pack_write(moe_dir, one, 1, &wo, NULL, &err) || df_pack_write(ds_dir, ds_one, 1, &wo, NULL, &err) ||
        df_pack_write(k3_dir, k3_one, 1, &wo, NULL, &err)) {
        fprintf(stderr, "pack: %s\n", err.msg);
        return -1;
    }
    df_engine_opts o = {.model_dir = moe_dir};
    df_engine *e;
    if (df_engine_open(&e, &o, &err)) return -1;
    V = df_engine_info(e)->vocab_size;
    df_engine_close(e);
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
        cmocka_unit_test(test_greedy_identity_resident),
        cmocka_unit_test(test_greedy_identity_streamed),
        cmocka_unit_test_setup_teardown(test_greedy_identity_resident, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_greedy_identity_streamed, on_ds, on_moe),
        cmocka_unit_test_setup_teardown(test_greedy_identity_resident, on_k3, on_moe),
        cmocka_unit_test_setup_teardown(test_greedy_identity_streamed, on_k3, on_moe),
        cmocka_unit_test(test_gate_switches_off_wrong_drafter),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_draft_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
