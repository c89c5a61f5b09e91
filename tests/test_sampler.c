/*
 * test_sampler.c - the public sampler API (src/decode/sampler.c): parameter
 * validation, greedy and its tie rule, seeded reproducibility, top-k / top-p /
 * min-p filtering, the repetition penalty, the empirical distribution against
 * softmax, hostile logits (NaN, +-inf), and an exact comparison of the
 * pre-filtered fast path against a full-sort reference at vocab 152k.
 */
#include "testutil.h"

#include "deltafin.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* deterministic test data */
static uint64_t lcg_state;
static void lcg_seed(uint64_t s) { lcg_state = s * 2862933555777941757ull + 3037000493ull; }
static double lcg_u(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}
/* roughly normal (Irwin-Hall) */
static float lcg_normal(void) {
    double s = 0;
    for (int i = 0; i < 12; i++) s += lcg_u();
    return (float)(s - 6.0);
}

static df_sampler *mk(df_sampler_params p) {
    df_sampler *s = NULL;
    df_error err = {0};
    int rc = df_sampler_new(&s, &p, &err);
    if (rc != DF_OK) fail_msg("df_sampler_new: %s", err.msg);
    assert_non_null(s);
    return s;
}

static df_sampler_params params(float temp) {
    df_sampler_params p;
    df_sampler_params_default(&p);
    p.temperature = temp;
    return p;
}

/* samples from a copy, since the sampler rewrites the logits */
static int32_t draw(df_sampler *s, const float *logits, int v, const int32_t *hist, int nh) {
    float buf[4096];
    assert_true(v <= 4096);
    memcpy(buf, logits, (size_t)v * sizeof *buf);
    return df_sampler_sample(s, buf, v, hist, nh);
}

/* ---- params ------------------------------------------------------------- */

static void test_defaults(void **st) {
    (void)st;
    df_sampler_params p;
    memset(&p, 0x5a, sizeof p);
    df_sampler_params_default(&p);
    assert_true(p.temperature == 0.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.top_p == 1.0f);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repeat_penalty == 1.0f);
    assert_int_equal(p.repeat_last_n, 64);
    assert_true(p.seed == 0);
    df_sampler *s = mk(p);
    df_sampler_free(s);
    df_sampler_free(NULL);
    /* NULL params mean the defaults */
    df_error err = {0};
    assert_int_equal(df_sampler_new(&s, NULL, &err), DF_OK);
    df_sampler_free(s);
    assert_int_equal(df_sampler_new(NULL, &p, &err), DF_ERR_ARG);
}

static void expect_bad(df_sampler_params p, const char *field) {
    df_sampler *s = (df_sampler *)&p; /* must be reset to NULL */
    df_error err = {0};
    int rc = df_sampler_new(&s, &p, &err);
    assert_int_equal(rc, DF_ERR_ARG);
    assert_int_equal(err.code, DF_ERR_ARG);
    assert_null(s);
    if (!strstr(err.msg, field)) fail_msg("error '%s' does not name '%s'", err.msg, field);
}

static void test_validation(void **st) {
    (void)st;
    df_sampler_params p;
#define BAD(field, val)                      \
    do {                                     \
        df_sampler_params_default(&p);       \
        p.field = (val);                     \
        expect_bad(p, #field);               \
    } while (0)
    BAD(temperature, -0.1f);
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_p, 0.0f);
    BAD(top_p, -0.5f);
    BAD(top_p, 1.0001f);
    BAD(top_p, NAN);
    BAD(min_p, 1.0f);
    BAD(min_p, -0.01f);
    BAD(min_p, NAN);
    BAD(top_k, -1);
    BAD(repeat_penalty, 0.0f);
    BAD(repeat_penalty, -1.0f);
    BAD(repeat_penalty, NAN);
    BAD(repeat_penalty, INFINITY);
    BAD(repeat_last_n, -1);
#undef BAD
    /* edges that are allowed */
    df_sampler_params_default(&p);
    p.top_p = 1.0f;
    p.min_p = 0.999f;
    p.top_k = 0;
    p.temperature = 0.0f;
    p.repeat_penalty = 0.5f;
    p.repeat_last_n = 0;
    df_sampler_free(mk(p));
}

/* ---- greedy ------------------------------------------------------------- */

static void test_greedy(void **st) {
    (void)st;
    df_sampler *s = mk(params(0.0f));
    float a[] = {0.1f, 3.0f, -2.0f, 2.9f, 3.0f};
    assert_int_equal(draw(s, a, 5, NULL, 0), 1); /* tie 1 vs 4 -> lowest id */
    float b[] = {-1.0f, -1.0f, -1.0f};
    assert_int_equal(draw(s, b, 3, NULL, 0), 0);
    float c[] = {NAN, 1.0f, NAN, 5.0f, NAN};
    assert_int_equal(draw(s, c, 5, NULL, 0), 3);
    float d[] = {-INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(draw(s, d, 3, NULL, 0), 0);
    float e[] = {NAN, NAN};
    assert_int_equal(draw(s, e, 2, NULL, 0), 0);
    float f[] = {1.0f, INFINITY, 2.0f, INFINITY};
    assert_int_equal(draw(s, f, 4, NULL, 0), 1);
    /* bad calls never crash */
    assert_int_equal(df_sampler_sample(s, NULL, 5, NULL, 0), -1);
    assert_int_equal(df_sampler_sample(s, a, 0, NULL, 0), -1);
    assert_int_equal(df_sampler_sample(NULL, a, 5, NULL, 0), -1);
    /* a larger random case against a plain scan */
    lcg_seed(7);
    float big[4096];
    for (int i = 0; i < 4096; i++) big[i] = lcg_normal();
    int best = 0;
    for (int i = 1; i < 4096; i++)
        if (big[i] > big[best]) best = i;
    assert_int_equal(draw(s, big, 4096, NULL, 0), best);
    df_sampler_free(s);
}

/* ---- reproducibility ---------------------------------------------------- */

static void seq(uint64_t seed, int32_t *out, int n) {
    df_sampler_params p = params(1.0f);
    p.seed = seed;
    df_sampler *s = mk(p);
    float l[1000];
    lcg_seed(11);
    for (int i = 0; i < 1000; i++) l[i] = 0.5f * lcg_normal();
    for (int i = 0; i < n; i++) out[i] = draw(s, l, 1000, NULL, 0);
    df_sampler_free(s);
}

static void test_seed(void **st) {
    (void)st;
    int32_t a[200], b[200], c[200];
    seq(42, a, 200);
    seq(42, b, 200);
    seq(43, c, 200);
    assert_memory_equal(a, b, sizeof a);
    int same = 0, distinct_vals = 0;
    for (int i = 0; i < 200; i++) {
        same += a[i] == c[i];
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= a[j] == a[i];
        distinct_vals += !seen;
    }
    assert_true(same < 20);           /* different seeds: different sequences */
    assert_true(distinct_vals > 100); /* and the draws actually vary */
    for (int i = 0; i < 200; i++) assert_true(a[i] >= 0 && a[i] < 1000);
}

/* ---- filters equal to greedy --------------------------------------------- */

static void test_topk1_and_tiny_topp_are_greedy(void **st) {
    (void)st;
    df_sampler_params pk = params(1.3f), pp = params(0.8f);
    pk.top_k = 1;
    pk.seed = 5;
    pp.top_p = 1e-6f;
    pp.seed = 6;
    df_sampler *g = mk(params(0.0f)), *sk = mk(pk), *sp = mk(pp);
    lcg_seed(3);
    float l[2000];
    for (int it = 0; it < 200; it++) {
        int v = 2 + (int)(lcg_u() * 1998);
        for (int i = 0; i < v; i++) l[i] = 2.0f * lcg_normal();
        if (it % 3 == 0) { /* ties at the top: the lowest id must win everywhere */
            int a = (int)(lcg_u() * v), b = (int)(lcg_u() * v);
            l[a] = l[b] = 100.0f;
        }
        if (it % 5 == 0) l[(int)(lcg_u() * v)] = NAN;
        int32_t want = draw(g, l, v, NULL, 0);
        assert_int_equal(draw(sk, l, v, NULL, 0), want);
        assert_int_equal(draw(sp, l, v, NULL, 0), want);
    }
    df_sampler_free(g);
    df_sampler_free(sk);
    df_sampler_free(sp);
}

static void test_topk3(void **st) {
    (void)st;
    df_sampler_params p = params(2.0f); /* hot, so the rest of the vocab would be hit */
    p.top_k = 3;
    p.seed = 9;
    df_sampler *s = mk(p);
    lcg_seed(21);
    float l[1000];
    for (int i = 0; i < 1000; i++) l[i] = 0.3f * lcg_normal();
    int top[3] = {-1, -1, -1};
    for (int r = 0; r < 3; r++) {
        int best = -1;
        for (int i = 0; i < 1000; i++) {
            if (i == top[0] || i == top[1]) continue;
            if (best < 0 || l[i] > l[best]) best = i;
        }
        top[r] = best;
    }
    int hits[3] = {0};
    for (int it = 0; it < 5000; it++) {
        int32_t t = draw(s, l, 1000, NULL, 0);
        int k = t == top[0] ? 0 : t == top[1] ? 1 : t == top[2] ? 2 : -1;
        if (k < 0) fail_msg("draw %d returned %d outside the top 3", it, t);
        hits[k]++;
    }
    for (int k = 0; k < 3; k++) assert_true(hits[k] > 1000);
    df_sampler_free(s);
}

static void test_min_p(void **st) {
    (void)st;
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    df_sampler_params p = params(1.0f);
    p.min_p = 0.2f; /* keeps p >= 0.1 */
    p.seed = 1;
    df_sampler *s = mk(p);
    int hits[4] = {0};
    for (int i = 0; i < 20000; i++) hits[draw(s, l, 4, NULL, 0)]++;
    assert_int_equal(hits[3], 0);
    assert_true(hits[2] > 2000); /* 0.15/0.95 of 20000 ~ 3158 */
    /* the survivors are renormalized: 0.5/0.95 of the draws */
    assert_true(fabs(hits[0] / 20000.0 - 0.5 / 0.95) < 0.02);
    df_sampler_free(s);

    p.min_p = 0.7f; /* p >= 0.35: only token 0 */
    s = mk(p);
    for (int i = 0; i < 2000; i++) assert_int_equal(draw(s, l, 4, NULL, 0), 0);
    df_sampler_free(s);
}

/* ---- repetition penalty ------------------------------------------------- */

static void test_repeat_penalty(void **st) {
    (void)st;
    df_sampler_params p = params(0.0f);
    p.repeat_penalty = 1.5f;
    df_sampler *s = mk(p);
    float l[4] = {2.0f, 1.9f, -1.0f, 0.5f};
    assert_int_equal(draw(s, l, 4, NULL, 0), 0);
    int32_t h[] = {0, 0, 2, 0};
    float buf[4];
    memcpy(buf, l, sizeof l);
    assert_int_equal(df_sampler_sample(s, buf, 4, h, 4), 1); /* 2/1.5 < 1.9 */
    /* each distinct token once; positive divides, negative multiplies */
    assert_true(buf[0] == 2.0f / 1.5f);
    assert_true(buf[1] == 1.9f);
    assert_true(buf[2] == -1.5f);
    assert_true(buf[3] == 0.5f);
    /* out-of-range history ids are ignored */
    int32_t bad[] = {-1, 4, 1 << 30};
    assert_int_equal(draw(s, l, 4, bad, 3), 0);
    df_sampler_free(s);

    /* the window: only the last repeat_last_n tokens count */
    p.repeat_last_n = 1;
    s = mk(p);
    int32_t h2[] = {0, 3};
    assert_int_equal(draw(s, l, 4, h2, 2), 0);
    int32_t h3[] = {3, 0};
    assert_int_equal(draw(s, l, 4, h3, 2), 1);
    df_sampler_free(s);

    /* and it applies before sampling too: top_k = 1 follows the penalized argmax */
    p = params(1.0f);
    p.top_k = 1;
    p.repeat_penalty = 1.5f;
    s = mk(p);
    assert_int_equal(draw(s, l, 4, h, 4), 1);
    df_sampler_free(s);

    /* penalty 1 leaves the logits alone */
    p = params(0.0f);
    s = mk(p);
    memcpy(buf, l, sizeof l);
    df_sampler_sample(s, buf, 4, h, 4);
    assert_memory_equal(buf, l, sizeof l);
    df_sampler_free(s);
}

/* ---- distribution ------------------------------------------------------- */

/* Chi-square of 100k draws against the expected probabilities. With the fixed seed
 * the statistic is fixed too; the bound is the ~99.99% quantile for <= 7 degrees of
 * freedom, so a wrong distribution (e.g. temperature misapplied) fails hard. */
static double chi2(df_sampler_params p, const float *l, int v, const double *expect) {
    df_sampler *s = mk(p);
    int hits[16] = {0};
    const int N = 100000;
    for (int i = 0; i < N; i++) {
        int32_t t = draw(s, l, v, NULL, 0);
        assert_true(t >= 0 && t < v);
        hits[t]++;
    }
    df_sampler_free(s);
    double x = 0;
    for (int i = 0; i < v; i++) {
        double e = expect[i] * N;
        if (e == 0) {
            assert_int_equal(hits[i], 0);
            continue;
        }
        x += (hits[i] - e) * (hits[i] - e) / e;
    }
    return x;
}

static void softmax_ref(const float *l, int v, double temp, double *p) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < v; i++) mx = fmax(mx, l[i] / temp);
    for (int i = 0; i < v; i++) sum += p[i] = exp(l[i] / temp - mx);
    for (int i = 0; i < v; i++) p[i] /= sum;
}

static void test_distribution(void **st) {
    (void)st;
    float l[8] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f, -3.0f, 0.25f};
    double e[8];
    df_sampler_params p = params(1.0f);
    p.seed = 1234;
    softmax_ref(l, 8, 1.0, e);
    double x = chi2(p, l, 8, e);
    print_message("chi2 T=1: %.2f (df 7)\n", x);
    assert_true(x < 30.0);

    p.temperature = 0.6f;
    p.seed = 99;
    softmax_ref(l, 8, 0.6f, e);
    x = chi2(p, l, 8, e);
    print_message("chi2 T=0.6: %.2f (df 7)\n", x);
    assert_true(x < 30.0);

    /* top_p 0.8 at T=1: sorted probs .37 .22 .14 .13 .08 ... -> keep 4 (cum .86) */
    p.temperature = 1.0f;
    p.top_p = 0.8f;
    p.seed = 7;
    softmax_ref(l, 8, 1.0, e);
    const int keep[8] = {1, 1, 1, 0, 0, 1, 0, 0}; /* 0 (2.0), 5 (1.5), 1 (1.0), 2 (0.5) */
    double kept = 0;
    for (int i = 0; i < 8; i++) kept += keep[i] ? e[i] : 0;
    assert_true(kept >= 0.8 && kept - e[2] < 0.8); /* the test's own premise */
    for (int i = 0; i < 8; i++) e[i] = keep[i] ? e[i] / kept : 0;
    x = chi2(p, l, 8, e);
    print_message("chi2 top_p=0.8: %.2f (df 3)\n", x);
    assert_true(x < 22.0);
}

/* ---- hostile logits ------------------------------------------------------ */

static void test_nan_inf_sampling(void **st) {
    (void)st;
    df_sampler_params p = params(1.0f);
    p.seed = 3;
    df_sampler *s = mk(p);
    float a[5] = {NAN, 0.0f, NAN, 0.0f, NAN};
    for (int i = 0; i < 200; i++) {
        int32_t t = draw(s, a, 5, NULL, 0);
        assert_true(t == 1 || t == 3);
    }
    float b[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int i = 0; i < 10; i++) assert_int_equal(draw(s, b, 3, NULL, 0), 0);
    float c[3] = {NAN, NAN, NAN};
    for (int i = 0; i < 10; i++) assert_int_equal(draw(s, c, 3, NULL, 0), 0);
    float d[4] = {1e30f, INFINITY, 3e38f, 5.0f};
    for (int i = 0; i < 50; i++) assert_int_equal(draw(s, d, 4, NULL, 0), 1);
    float e[3] = {-INFINITY, 7.0f, -INFINITY};
    for (int i = 0; i < 10; i++) assert_int_equal(draw(s, e, 3, NULL, 0), 1);
    df_sampler_free(s);

    /* l / T would overflow float here; the sampler must still tend to greedy */
    p.temperature = 1e-39f;
    s = mk(p);
    float f[3] = {1.0f, 3.0f, 2.0f};
    assert_int_equal(draw(s, f, 3, NULL, 0), 1);
    df_sampler_free(s);

    /* all filters together over all -inf */
    p = params(0.9f);
    p.top_k = 2;
    p.top_p = 0.5f;
    p.min_p = 0.1f;
    s = mk(p);
    assert_int_equal(draw(s, b, 3, NULL, 0), 0);
    assert_int_equal(draw(s, c, 3, NULL, 0), 0);
    df_sampler_free(s);
}

/* ---- the fast path equals a full sort ----------------------------------- */

/* The documented pipeline, written the slow way: full sort of the vocabulary. */
typedef struct ref_item {
    double w;
    float l;
    int32_t id;
} ref_item;

static int ref_cmp(const void *pa, const void *pb) {
    const ref_item *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}
static int ref_cmp_logit(const void *pa, const void *pb) {
    const ref_item *a = pa, *b = pb;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}
static int ref_cmp_id(const void *pa, const void *pb) {
    const ref_item *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
typedef struct ref_rng {
    uint64_t s[4];
} ref_rng;
static void ref_rng_seed(ref_rng *r, uint64_t x) {
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        r->s[i] = z ^ (z >> 31);
    }
}
static double ref_u(ref_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(res >> 11) * 0x1.0p-53;
}

static int32_t ref_sample(const df_sampler_params *p, ref_rng *rng, float *l, int v,
                          const int32_t *hist, int nh, ref_item *it) {
    if (p->repeat_penalty != 1.0f && nh > 0) {
        int start = p->repeat_last_n > 0 && nh > p->repeat_last_n ? nh - p->repeat_last_n : 0;
        for (int i = start; i < nh; i++) {
            bool dup = false;
            for (int j = start; j < i; j++) dup |= hist[j] == hist[i];
            if (dup || hist[i] < 0 || hist[i] >= v) continue;
            float x = l[hist[i]];
            l[hist[i]] = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
        }
    }
    float mx = -INFINITY;
    for (int i = 0; i < v; i++) {
        float x = l[i];
        if (isnan(x)) x = -INFINITY;
        if (x > FLT_MAX) x = FLT_MAX;
        l[i] = x;
        mx = fmaxf(mx, x);
        it[i] = (ref_item){0, x, i};
    }
    if (mx == -INFINITY) return 0;
    int n = v;
    if (p->top_k > 0 && p->top_k < v) {
        qsort(it, (size_t)v, sizeof *it, ref_cmp_logit);
        n = p->top_k;
        qsort(it, (size_t)n, sizeof *it, ref_cmp_id);
    }
    double total = 0;
    int npos = 0;
    for (int i = 0; i < n; i++) {
        total += it[i].w = exp(((double)it[i].l - (double)mx) / p->temperature);
        npos += it[i].w > 0;
    }
    qsort(it, (size_t)n, sizeof *it, ref_cmp);
    int m = npos; /* zero weights sort last and can never be drawn */
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < npos; i++)
            if ((cum += it[i].w) >= (double)p->top_p * total) {
                m = i + 1;
                break;
            }
    }
    if (p->min_p > 0.0f) {
        int i = 1;
        while (i < m && it[i].w >= (double)p->min_p) i++;
        m = i;
    }
    double mass = total;
    if (m < npos) {
        mass = 0;
        for (int i = 0; i < m; i++) mass += it[i].w;
    }
    double r = ref_u(rng) * mass, cum = 0;
    for (int i = 0; i < m; i++)
        if (r < (cum += it[i].w)) return it[i].id;
    return it[m - 1].id;
}

static void test_fast_path_matches_full_sort(void **st) {
    (void)st;
    enum { V = 151936, S = 24000, DRAWS = 6 };
    float *base = malloc(V * sizeof *base), *a = malloc(V * sizeof *a),
          *b = malloc(V * sizeof *b);
    ref_item *it = malloc(V * sizeof *it);
    assert_non_null(base);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(it);
    int32_t hist[100];
    /* seeds whose first uniform is > 0.9999998 (found by brute force): that draw
     * lands in the last ~2e-7 of the mass, deep in the lazily sorted tail */
    enum { U_NEAR_1_A = 215760, U_NEAR_1_B = 2340784 };
    struct {
        float temp, top_p, min_p, pen;
        int top_k, last_n;
        float spread, floor;
        uint64_t seed; /* 0: 1000 + config */
        int v;         /* vocabulary size, Qwen3's or smaller to save time */
    } cfg[] = {
        {1.0f, 1.0f, 0.0f, 1.0f, 0, 64, 3.0f, 0, 0, V},       /* plain temperature */
        {0.7f, 0.9f, 0.0f, 1.0f, 0, 64, 3.0f, 0, 0, V},       /* nucleus */
        {1.0f, 1.0f, 0.05f, 1.0f, 0, 64, 3.0f, 0, 0, S},      /* min-p */
        {0.8f, 0.95f, 0.02f, 1.1f, 40, 64, 3.0f, 0, 0, V},    /* the usual chat settings */
        {1.2f, 1.0f, 0.0f, 1.3f, 5000, 0, 2.0f, 0, 0, S},     /* big k, whole-history penalty */
        {2.0f, 0.5f, 0.0f, 1.0f, 0, 64, 0.2f, 0, 0, S},       /* flat: everything in the head */
        {1.0f, 0.999f, 0.001f, 1.0f, 0, 64, 0.001f, 0, 0, S}, /* near-ties everywhere */
        /* every w rounds to 1.0: the order is decided by the logits alone */
        {1e20f, 1.0f, 0.0f, 1.0f, 0, 64, 3.0f, 0, 0, S},
        /* ~3e-5 of the mass in a floor of tokens below the head threshold: the
         * nucleus scan, the min-p scan and the first draw walk into the tail */
        {1.0f, 0.99999f, 0.0f, 1.0f, 0, 64, 0.02f, -19.0f, U_NEAR_1_A, V},
        {1.0f, 1.0f, 1e-10f, 1.0f, 0, 64, 0.02f, -19.0f, U_NEAR_1_B, V},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        df_sampler_params p = params(cfg[c].temp);
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.repeat_penalty = cfg[c].pen;
        p.top_k = cfg[c].top_k;
        p.repeat_last_n = cfg[c].last_n;
        p.seed = cfg[c].seed ? cfg[c].seed : 1000 + c;
        const int v = cfg[c].v;
        df_sampler *s = mk(p);
        ref_rng rng;
        ref_rng_seed(&rng, p.seed);
        lcg_seed(c + 1);
        /* an LLM-like row: a noisy floor and a handful of strong candidates */
        for (int i = 0; i < v; i++) base[i] = cfg[c].floor + cfg[c].spread * lcg_normal();
        for (int i = 0; i < 30; i++)
            base[(int)(lcg_u() * v)] = cfg[c].spread * (4.0f + 2.0f * (float)lcg_u());
        for (int i = 0; i < 100; i++) hist[i] = (int32_t)(lcg_u() * v);
        int distinct = 0;
        int32_t prev = -1;
        for (int d = 0; d < DRAWS; d++) {
            /* nudge the row so every draw sees a different distribution */
            for (int i = 0; i < 50; i++) base[(int)(lcg_u() * v)] += (float)lcg_u();
            memcpy(a, base, (size_t)v * sizeof *a);
            memcpy(b, base, (size_t)v * sizeof *b);
            int32_t got = df_sampler_sample(s, a, v, hist, 100);
            int32_t want = ref_sample(&p, &rng, b, v, hist, 100, it);
            if (got != want)
                fail_msg("config %zu draw %d: sampler %d, full-sort reference %d", c, d,
                         got, want);
            if (d == 0 && cfg[c].seed && !(base[got] < cfg[c].floor + 1.5f))
                fail_msg("config %zu: the first draw %d is not from the tail", c, got);
            distinct += got != prev;
            prev = got;
        }
        assert_true(distinct > 1 || cfg[c].top_p < 0.6f);
        df_sampler_free(s);
    }
    free(base);
    free(a);
    free(b);
    free(it);
}

/* df_sampler_probs is the distribution df_sampler_sample draws from: for each
 * pipeline setting, 20000 draws fit it by chi-square (p = 1e-6 critical value),
 * it sums to 1, and it leaves the random stream alone. */
static void test_probs_match_draws(void **state) {
    (void)state;
    enum { NV = 3000, DRAWS = 20000 };
    static float base[NV], lg[NV], pr[NV];
    static int cnt[NV];
    uint32_t x = 4242;
    for (int i = 0; i < NV; i++) {
        x = x * 1664525u + 1013904223u;
        base[i] = (float)((x >> 8) % 10000) / 1000.0f;
    }
    int32_t hist[6] = {1, 2, 3, 2, 2500, 7};
    df_sampler_params cases[4];
    for (int c = 0; c < 4; c++) df_sampler_params_default(&cases[c]);
    cases[0].temperature = 0.7f, cases[0].top_k = 50;
    cases[1].temperature = 1.0f, cases[1].top_p = 0.9f, cases[1].repeat_penalty = 1.5f;
    cases[2].temperature = 1.3f, cases[2].min_p = 0.05f;
    cases[3].temperature = 0.9f, cases[3].top_k = 200, cases[3].top_p = 0.95f, cases[3].min_p = 0.01f,
    cases[3].repeat_penalty = 0.8f;
    for (int c = 0; c < 4; c++) {
        df_sampler *s, *s2;
        df_error err;
        cases[c].seed = 99 + (uint64_t)c;
        assert_int_equal(df_sampler_new(&s, &cases[c], &err), DF_OK);
        assert_int_equal(df_sampler_new(&s2, &cases[c], &err), DF_OK);
        memcpy(lg, base, sizeof lg);
        assert_int_equal(df_sampler_probs(s, lg, NV, hist, 6, pr), 0);
        double sum = 0.0;
        for (int i = 0; i < NV; i++) sum += pr[i];
        assert_true(fabs(sum - 1.0) < 1e-4);
        memset(cnt, 0, sizeof cnt);
        for (int d = 0; d < DRAWS; d++) {
            memcpy(lg, base, sizeof lg);
            int32_t t = df_sampler_sample(s, lg, NV, hist, 6);
            memcpy(lg, base, sizeof lg);
            assert_int_equal(df_sampler_sample(s2, lg, NV, hist, 6), t); /* probs drew nothing */
            assert_true(pr[t] > 0.0f);
            cnt[t]++;
        }
        double chi = 0.0, other_e = 0.0, other_o = 0.0;
        int df = -1;
        for (int i = 0; i < NV; i++) {
            double e = pr[i] * DRAWS;
            if (e < 5) {
                other_e += e;
                other_o += cnt[i];
                continue;
            }
            chi += (cnt[i] - e) * (cnt[i] - e) / e;
            df++;
        }
        if (other_e >= 5) chi += (other_o - other_e) * (other_o - other_e) / other_e, df++;
        assert_true(df >= 1);
        double h = 2.0 / (9.0 * df), crit = df * pow(1.0 - h + 4.753 * sqrt(h), 3);
        if (chi >= crit) fail_msg("case %d: chi2 %.1f >= %.1f (df %d)", c, chi, crit, df);
        df_sampler_free(s);
        df_sampler_free(s2);
    }
    /* greedy: one-hot at the argmax */
    df_sampler *g;
    df_error err;
    assert_int_equal(df_sampler_new(&g, NULL, &err), DF_OK);
    memcpy(lg, base, sizeof lg);
    assert_int_equal(df_sampler_probs(g, lg, NV, NULL, 0, pr), 0);
    memcpy(lg, base, sizeof lg);
    int32_t am = df_sampler_sample(g, lg, NV, NULL, 0);
    for (int i = 0; i < NV; i++) assert_true(pr[i] == (i == am ? 1.0f : 0.0f));
    df_sampler_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_probs_match_draws),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_topk1_and_tiny_topp_are_greedy),
        cmocka_unit_test(test_topk3),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_nan_inf_sampling),
        cmocka_unit_test(test_fast_path_matches_full_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
