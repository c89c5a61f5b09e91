/*
 * test_kernels.c - the kernels' exactness contract and the thread pool.
 *
 * For F32/F16/BF16 weights over a grid of awkward shapes: every ISA path this
 * CPU can run gives y bit-identical to the portable C path; a batch of T rows
 * equals T single-row calls; 1, 2 and 3 threads agree; y is close to a double
 * reference; special values (signed zeros, F16 subnormals, inf, NaN) agree
 * across paths. Also df_dot_f32, df_axpy_f32, df_scale_f32, df_axpy_rows,
 * df_softmax_f32, df_to_f32, the ISA API, and the pool's range splitting,
 * wake-up after sleep, nesting and concurrent callers.
 */
#include "testutil.h"

#include "kernels/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The products over a raw (data, dtype) matrix [N][K], as a view. */
static void mm(df_pool *p, float *y, int ldy, const float *x, int ldx, const void *w, df_dtype dt, int T,
               int N, int K) {
    df_wview v = df_wview_make(w, dt, N, K);
    df_matmul(p, y, ldy, x, ldx, &v, T);
}
static void mm_rows(float *y, int ldy, const float *x, int ldx, const void *w, df_dtype dt, int T, int n0,
                    int n1, int K) {
    df_wview v = df_wview_make(w, dt, n1, K);
    df_matmul_rows(y, ldy, x, ldx, &v, T, n0, n1);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

static int n_isas(void) { return (int)df_isa_detect() + 1; }

static const df_dtype DTS[3] = {DF_DT_F32, DF_DT_F16, DF_DT_BF16};

/* Random weights of dtype dt; also returns their exact F32 values. */
static void *make_w(df_dtype dt, size_t n, float *wf) {
    void *w = df_xmalloc(n * df_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = rndf();
        if (dt == DF_DT_F32) {
            ((float *)w)[i] = v;
            wf[i] = v;
        } else if (dt == DF_DT_F16) {
            uint16_t h = df_f32_to_f16(v);
            ((uint16_t *)w)[i] = h;
            wf[i] = df_f16_to_f32(h);
        } else {
            uint16_t h = df_f32_to_bf16(v);
            ((uint16_t *)w)[i] = h;
            wf[i] = df_bf16_to_f32(h);
        }
    }
    return w;
}

/* NaN bits used to fill padding that no kernel may read or write. */
static float poison(void) {
    uint32_t u = 0x7fa5a5a5u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* First index where a and b differ bitwise (NaNs compare equal to any NaN when
 * nan_any), or -1. */
static long first_diff(const float *a, const float *b, size_t n, int nan_any) {
    for (size_t i = 0; i < n; i++) {
        if (nan_any && isnan(a[i]) && isnan(b[i])) continue;
        if (memcmp(&a[i], &b[i], 4) != 0) return (long)i;
    }
    return -1;
}

static void matmul_isa(df_isa isa, df_pool *pool, float *y, int ldy, const float *x, int ldx,
                       const void *w, df_dtype dt, int T, int N, int K) {
    assert_int_equal(df_isa_set(isa), 0);
    mm(pool, y, ldy, x, ldx, w, dt, T, N, K);
}

/* (a)-(c): every ISA path, whole batch, T = 1 rows, split rows and thread
 * counts, against the C path's ref. */
static void check_paths(df_dtype dt, int T, int N, int K, int ldx, int ldy, const void *w,
                        const float *x, const float *ref, df_pool **pools, int nan_any) {
    size_t ny = (size_t)T * ldy;
    float *y = df_xmalloc(ny * 4);
    for (int isa = 0; isa < n_isas(); isa++) {
        /* (a) whole batch on this path == C path */
        memcpy(y, ref, ny * 4);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) y[(size_t)t * ldy + n] = -12345.0f;
        matmul_isa((df_isa)isa, NULL, y, ldy, x, ldx, w, dt, T, N, K);
        long d = first_diff(y, ref, ny, nan_any);
        if (d >= 0)
            fail_msg("%s %s T=%d N=%d K=%d: path differs from C at %ld: %a vs %a",
                     df_isa_name((df_isa)isa), df_dtype_name(dt), T, N, K, d, y[d], ref[d]);
        /* (b) row by row (T=1) == batch */
        memcpy(y, ref, ny * 4);
        for (int t = 0; t < T; t++)
            matmul_isa((df_isa)isa, NULL, y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, dt,
                       1, N, K);
        d = first_diff(y, ref, ny, nan_any);
        if (d >= 0)
            fail_msg("%s %s T=%d N=%d K=%d: T=1 rows differ from batch at %ld",
                     df_isa_name((df_isa)isa), df_dtype_name(dt), T, N, K, d);
        /* df_matmul_rows over a split of the rows == whole */
        memcpy(y, ref, ny * 4);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) y[(size_t)t * ldy + n] = -12345.0f;
        int mid = N / 3;
        mm_rows(y, ldy, x, ldx, w, dt, T, 0, mid, K);
        mm_rows(y, ldy, x, ldx, w, dt, T, mid, N, K);
        d = first_diff(y, ref, ny, nan_any);
        if (d >= 0)
            fail_msg("%s %s T=%d N=%d K=%d: df_matmul_rows split differs at %ld",
                     df_isa_name((df_isa)isa), df_dtype_name(dt), T, N, K, d);
        /* (c) threads */
        for (int p = 0; pools && p < 3; p++) {
            memcpy(y, ref, ny * 4);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) y[(size_t)t * ldy + n] = -12345.0f;
            matmul_isa((df_isa)isa, pools[p], y, ldy, x, ldx, w, dt, T, N, K);
            d = first_diff(y, ref, ny, nan_any);
            if (d >= 0)
                fail_msg("%s %s T=%d N=%d K=%d: %d threads differ at %ld",
                         df_isa_name((df_isa)isa), df_dtype_name(dt), T, N, K,
                         df_pool_size(pools[p]), d);
        }
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
    free(y);
}

/* (d) accuracy of ref against a double-precision reference (finite data only) */
static void check_accuracy(df_dtype dt, int T, int N, int K, int ldx, int ldy, const float *wf,
                           const float *x, const float *ref) {
    double gamma = ((K + 15) / 16 + 4) * ldexp(1.0, -24) * 1.01;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)wf[(size_t)n * K + k] * x[(size_t)t * ldx + k];
                s += p;
                sa += fabs(p);
            }
            double e = fabs((double)ref[(size_t)t * ldy + n] - s);
            if (e > gamma * sa + 1e-37)
                fail_msg("%s T=%d N=%d K=%d: y[%d][%d]=%.9g, exact %.9g (err %g > %g)",
                         df_dtype_name(dt), T, N, K, t, n, ref[(size_t)t * ldy + n], s, e,
                         gamma * sa);
        }
}

/* One shape: checks (a) paths, (b) T vs row by row, (c) threads, (d) accuracy,
 * and that padding of x and y is neither used nor touched. */
static void check_shape(df_dtype dt, int T, int N, int K, df_pool **pools, int nan_any,
                        const void *w_in, const float *x_in) {
    int ldx = K + 5, ldy = N + 3;
    size_t ny = (size_t)T * ldy;
    float *wf = df_xmalloc(((size_t)N * K + 1) * 4);
    void *w;
    if (w_in) {
        w = (void *)w_in;
        df_to_f32(wf, w, dt, (size_t)N * K);
    } else {
        w = make_w(dt, (size_t)N * K, wf);
    }
    float *x = df_xmalloc(((size_t)T * ldx + 1) * 4);
    for (size_t i = 0; i < (size_t)T * ldx; i++) x[i] = poison();
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            x[(size_t)t * ldx + k] = x_in ? x_in[(size_t)t * K + k] : rndf();

    float *ref = df_xmalloc(ny * 4);
    for (size_t i = 0; i < ny; i++) ref[i] = poison();
    matmul_isa(DF_ISA_C, NULL, ref, ldy, x, ldx, w, dt, T, N, K);
    for (int t = 0; t < T; t++)
        for (int n = N; n < ldy; n++) {
            uint32_t u;
            memcpy(&u, &ref[(size_t)t * ldy + n], 4);
            assert_int_equal(u, 0x7fa5a5a5u); /* y padding untouched */
        }

    check_paths(dt, T, N, K, ldx, ldy, w, x, ref, pools, nan_any);
    if (!nan_any) check_accuracy(dt, T, N, K, ldx, ldy, wf, x, ref);
    if (!w_in) free(w);
    free(wf);
    free(x);
    free(ref);
}

static df_pool *g_pools[3];

static int setup_pools(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) g_pools[i] = df_pool_new(i + 1);
    return 0;
}
static int teardown_pools(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) df_pool_free(g_pools[i]);
    return 0;
}

static void test_isa_api(void **state) {
    (void)state;
    df_isa best = df_isa_detect();
    assert_true(best >= DF_ISA_C && best <= DF_ISA_AVX512);
    assert_string_equal(df_isa_name(DF_ISA_C), "c");
    assert_string_equal(df_isa_name(DF_ISA_AVX2), "avx2");
    assert_string_equal(df_isa_name(DF_ISA_AVX512), "avx512");
    for (int i = 0; i <= 2; i++) assert_int_equal(df_isa_from_name(df_isa_name((df_isa)i)), i);
    assert_int_equal(df_isa_from_name("auto"), (int)best);
    assert_int_equal(df_isa_from_name("sse9"), -1);
    assert_int_equal(df_isa_from_name(NULL), -1);
    assert_int_equal(df_isa_set((df_isa)7), -1);
    assert_int_equal(df_isa_set((df_isa)-1), -1);
    for (int i = 0; i <= (int)best; i++) {
        assert_int_equal(df_isa_set((df_isa)i), 0);
        assert_int_equal(df_isa_get(), i);
    }
    if (best < DF_ISA_AVX512) assert_int_equal(df_isa_set(DF_ISA_AVX512), -1);
    assert_int_equal(df_isa_set(best), 0);
    fprintf(stderr, "# kernels: best ISA on this CPU: %s\n", df_isa_name(best));
}

static void test_matmul_grid(void **state) {
    (void)state;
    static const int Ks[] = {1, 3, 8, 15, 16, 17, 31, 33, 64, 100, 257};
    static const int Ns[] = {1, 2, 3, 4, 5, 7, 17, 33};
    static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 9, 13, 29};
    for (int di = 0; di < 3; di++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                    int T = Ts[ti], N = Ns[ni], K = Ks[ki];
                    /* threads only where rows can actually be split */
                    check_shape(DTS[di], T, N, K, N >= 17 ? g_pools : NULL, 0, NULL, NULL);
                }
}

/* Shapes large enough for every thread to get rows, and the token blocking of
 * the T > 1 kernels (several blocks for big K: 256 KiB of activations per
 * block, so K = 4099 gives 2 blocks of 12 and K = 20000 4 blocks of 4). */
static void test_matmul_big(void **state) {
    (void)state;
    check_shape(DF_DT_BF16, 13, 100, 300, g_pools, 0, NULL, NULL);
    check_shape(DF_DT_F16, 9, 133, 1000, g_pools, 0, NULL, NULL);
    check_shape(DF_DT_F32, 23, 51, 4099, g_pools, 0, NULL, NULL);
    check_shape(DF_DT_BF16, 13, 20, 20000, g_pools, 0, NULL, NULL);
    check_shape(DF_DT_BF16, 3, 5, 0, g_pools, 0, NULL, NULL); /* K = 0: y = +0 */
}

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Signed zeros, subnormals, inf, NaN: all paths, batch/rows and threads agree
 * (NaN payloads may differ, so NaN matches NaN). */
static void test_matmul_special(void **state) {
    (void)state;
    const uint16_t f16s[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400,
                             0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00,
                             0x7d00, 0x1234, 0x9234};
    const float xs[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-40f, -1e-40f, 3e38f, -3e38f,
                        INFINITY, -INFINITY, 0.5f, 1e-20f, -1e-20f};
    for (int dt_i = 0; dt_i < 3; dt_i++) {
        df_dtype dt = DTS[dt_i];
        for (int rep = 0; rep < 30; rep++) {
            int T = 1 + (int)(rnd() % 9), N = 1 + (int)(rnd() % 21), K = 1 + (int)(rnd() % 40);
            /* mostly ordinary values with a sprinkling of specials */
            int rate = rep < 10 ? 2 : 12;
            void *w = df_xmalloc((size_t)N * K * df_dtype_size(dt));
            for (int i = 0; i < N * K; i++) {
                uint16_t h = (rnd() % rate == 0) ? f16s[rnd() % (sizeof f16s / 2)]
                                                 : df_f32_to_f16(rndf());
                if (dt == DF_DT_F16) {
                    ((uint16_t *)w)[i] = h;
                } else {
                    float f = df_f16_to_f32(h);
                    if (rnd() % 5 == 0) f = f_of(rnd() % 2 ? 0x00000001u : 0x80400000u); /* f32 subnormals */
                    if (dt == DF_DT_F32) ((float *)w)[i] = f;
                    else ((uint16_t *)w)[i] = (uint16_t)(rnd() % 4 ? df_f32_to_bf16(f) : 0x8000);
                }
            }
            float *x = df_xmalloc((size_t)T * K * 4);
            for (int i = 0; i < T * K; i++)
                x[i] = (rnd() % rate == 0) ? xs[rnd() % (sizeof xs / 4)] : rndf();
            check_shape(dt, T, N, K, g_pools, 1, w, x);
            free(w);
            free(x);
        }
    }
}

/* Exact expected signs of zero: lanes can hold -0 (an underflowing negative
 * product), and the zero padding turns -0 lanes into +0. */
static void test_signed_zero_padding(void **state) {
    (void)state;
    for (int isa = 0; isa < n_isas(); isa++) {
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        for (int dt_i = 0; dt_i < 3; dt_i++) {
            df_dtype dt = DTS[dt_i];
            float xv[48];
            uint8_t wbuf[48 * 4];
            for (int K = 16; K <= 48; K++) {
                for (int k = 0; k < K; k++) {
                    float wf = -ldexpf(1.0f, -100), xf = ldexpf(1.0f, -100);
                    xv[k] = xf;
                    if (dt == DF_DT_F32) memcpy(wbuf + 4 * k, &wf, 4);
                    else if (dt == DF_DT_BF16) {
                        uint16_t h = df_f32_to_bf16(wf);
                        memcpy(wbuf + 2 * k, &h, 2);
                    } else {
                        /* F16 cannot reach 2^-100: -2^-24 * 2^-130 (subnormal x) */
                        uint16_t h = 0x8001;
                        memcpy(wbuf + 2 * k, &h, 2);
                        xv[k] = ldexpf(1.0f, -130);
                    }
                }
                float y = 1.0f;
                mm(g_pools[1], &y, 1, xv, K, wbuf, dt, 1, 1, K);
                /* every lane -0 only when K is a multiple of 16 */
                int want_neg = (K % 16) == 0;
                if (y != 0.0f || (signbit(y) != 0) != want_neg)
                    fail_msg("%s %s K=%d: got %a, want %s0", df_isa_name((df_isa)isa),
                             df_dtype_name(dt), K, y, want_neg ? "-" : "+");
                float d = df_dot_f32(xv, xv, K); /* positive tiny products: +0 */
                assert_true(d == 0.0f && !signbit(d));
            }
        }
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* inf and NaN behave as IEEE says on every path. */
static void test_inf_nan(void **state) {
    (void)state;
    for (int isa = 0; isa < n_isas(); isa++) {
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        float w[20], x[20], y;
        for (int k = 0; k < 20; k++) w[k] = x[k] = 1.0f;
        w[3] = INFINITY;
        mm(NULL, &y, 1, x, 20, w, DF_DT_F32, 1, 1, 20);
        assert_true(isinf(y) && y > 0);
        w[18] = -INFINITY; /* different lane: inf + -inf in the tree */
        mm(NULL, &y, 1, x, 20, w, DF_DT_F32, 1, 1, 20);
        assert_true(isnan(y));
        w[18] = 1.0f;
        x[3] = 0.0f; /* inf * 0 */
        mm(NULL, &y, 1, x, 20, w, DF_DT_F32, 1, 1, 20);
        assert_true(isnan(y));
        x[3] = 1.0f;
        w[3] = NAN;
        assert_true(isnan(df_dot_f32(w, x, 20)));
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

static void test_dot_axpy(void **state) {
    (void)state;
    float a[300] = {0}, b[300] = {0}, ref[300] = {0}, y0[300], y1[300];
    for (int n = 0; n <= 300; n += (n < 70 ? 1 : 23)) {
        for (int i = 0; i < n; i++) a[i] = rndf(), b[i] = rndf() * 100.0f;
        assert_int_equal(df_isa_set(DF_ISA_C), 0);
        float r = df_dot_f32(a, b, n);
        double s = 0, sa = 0;
        for (int i = 0; i < n; i++) s += (double)a[i] * b[i], sa += fabs((double)a[i] * b[i]);
        assert_true(fabs(r - s) <= ((n + 15) / 16 + 4) * ldexp(1.0, -24) * 1.01 * sa + 1e-37);
        float ya = rndf();
        for (int i = 0; i < n; i++) ref[i] = fmaf(ya, b[i], a[i]);
        for (int isa = 0; isa < n_isas(); isa++) {
            assert_int_equal(df_isa_set((df_isa)isa), 0);
            float q = df_dot_f32(a, b, n);
            if (memcmp(&q, &r, 4) != 0)
                fail_msg("%s dot n=%d: %a vs C %a", df_isa_name((df_isa)isa), n, q, r);
            /* same order as a one-row matmul */
            float m;
            mm(NULL, &m, 1, b, n, a, DF_DT_F32, 1, 1, n);
            assert_memory_equal(&m, &r, 4);
            memcpy(y0, a, sizeof y0);
            memcpy(y1, a, sizeof y1);
            df_axpy_f32(y0, ya, b, n);
            assert_int_equal(first_diff(y0, ref, (size_t)n, 0), -1);
            assert_int_equal(first_diff(y0 + n, y1 + n, 300 - (size_t)n, 0), -1); /* untouched */
            /* df_scale_f32: one rounded product per element, the rest untouched */
            memcpy(y0, b, sizeof y0);
            df_scale_f32(y0, n, ya);
            for (int i = 0; i < 300; i++) {
                float want = i < n ? b[i] * ya : b[i];
                if (memcmp(&y0[i], &want, 4)) fail_msg("%s scale n=%d: element %d", df_isa_name((df_isa)isa), n, i);
            }
        }
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* df_axpy_rows is df_axpy_f32 applied row by row, position by position: on
 * every path, for F32/F16/BF16 x, rows of different lengths (runs that end
 * inside a position block), column ranges that start and end off a vector and
 * signed zeros (fma(-0, x, -0) keeps -0, which a product that skipped zeros
 * or started from +0 would not). */
static void test_axpy_rows(void **state) {
    (void)state;
    enum { R = 11, LDA = 150, NX = 140, LDX = 83 };
    static float a[R * LDA], xf[NX * LDX], y0[R * LDX], ref[R * LDX], y[R * LDX];
    static uint16_t xh[NX * LDX];
    const int n[R] = {0, 1, 64, 65, 65, 65, 65, 130, 140, 7, 140};
    const int cuts[][2] = {{0, LDX}, {3, 80}, {16, 64}, {5, 6}, {64, 83}, {0, 17}};
    for (int i = 0; i < R * LDA; i++) a[i] = rnd() % 9 ? rndf() : (rnd() % 2 ? 0.0f : -0.0f);
    for (int i = 0; i < R * LDX; i++) y0[i] = rnd() % 5 ? rndf() * 4.0f : -0.0f;
    for (int dt = 0; dt < 3; dt++) {
        df_dtype xt = dt == 0 ? DF_DT_F32 : dt == 1 ? DF_DT_F16 : DF_DT_BF16;
        for (int i = 0; i < NX * LDX; i++) {
            float f = rnd() % 7 ? rndf() * 3.0f : -0.0f;
            xh[i] = xt == DF_DT_F16 ? df_f32_to_f16(f) : df_f32_to_bf16(f);
            xf[i] = xt == DF_DT_F32 ? f : xt == DF_DT_F16 ? df_f16_to_f32(xh[i]) : df_bf16_to_f32(xh[i]);
        }
        const void *x = xt == DF_DT_F32 ? (const void *)xf : (const void *)xh;
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            int c0 = cuts[c][0], c1 = cuts[c][1];
            memcpy(ref, y0, sizeof ref);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < n[r]; j++)
                    for (int k = c0; k < c1; k++)
                        ref[r * LDX + k] = fmaf(a[r * LDA + j], xf[j * LDX + k], ref[r * LDX + k]);
            for (int isa = 0; isa < n_isas(); isa++) {
                assert_int_equal(df_isa_set((df_isa)isa), 0);
                memcpy(y, y0, sizeof y);
                df_axpy_rows(y, LDX, a, LDA, x, xt, LDX, R, n, c0, c1);
                long d = first_diff(y, ref, R * LDX, 0);
                if (d >= 0)
                    fail_msg("%s %s cols [%d,%d): element %ld (row %ld) %a vs %a", df_isa_name((df_isa)isa),
                             df_dtype_name(xt), c0, c1, d, d / LDX, y[d], ref[d]);
                /* row by row, as one-row calls */
                memcpy(y, y0, sizeof y);
                for (int r = 0; r < R; r++)
                    df_axpy_rows(y + r * LDX, LDX, a + r * LDA, LDA, x, xt, LDX, 1, &n[r], c0, c1);
                assert_int_equal(first_diff(y, ref, R * LDX, 0), -1);
            }
        }
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* df_softmax_f32: every path gives the C path's bits (lengths that hit every
 * tail; scores spread over the exponential's whole range, down to underflow;
 * NaN, -inf, +inf and signed zeros), each result is within a few ulp of a
 * double softmax, and the weights sum to 1. */
static void test_softmax(void **state) {
    (void)state;
    static float in[700], ref[700], y[700];
    for (int n = 1; n <= 700; n += (n < 40 ? 1 : 37)) {
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < n; i++) {
                float spread = kind == 0 ? 2.0f : kind == 1 ? 60.0f : kind == 2 ? 400.0f : 0.0f;
                in[i] = rndf() * spread;
            }
            if (kind == 3 && n > 5) in[1] = -0.0f, in[2] = -INFINITY, in[4] = 0.0f;
            float scale = kind == 2 ? 0.25f : 1.0f;
            assert_int_equal(df_isa_set(DF_ISA_C), 0);
            memcpy(ref, in, sizeof in);
            df_softmax_f32(ref, n, scale);
            double mx = -INFINITY, sum = 0, got = 0;
            for (int i = 0; i < n; i++) mx = fmax(mx, (double)(in[i] * scale));
            for (int i = 0; i < n; i++) sum += exp((double)(in[i] * scale) - mx);
            for (int i = 0; i < n; i++) {
                double arg = (double)(in[i] * scale) - mx, want = exp(arg) / sum;
                got += ref[i];
                /* a few ulp, plus the rounding of the float argument x - max
                 * (half an ulp of |x - max|, which exp turns into a relative error) */
                if (fabs(ref[i] - want) > (4e-7 - arg * 6e-8) * want + 1e-37)
                    fail_msg("softmax n=%d kind %d [%d]: %a vs %a", n, kind, i, ref[i], want);
            }
            assert_true(fabs(got - 1.0) < 1e-5);
            for (int isa = 0; isa < n_isas(); isa++) {
                assert_int_equal(df_isa_set((df_isa)isa), 0);
                memcpy(y, in, sizeof in);
                df_softmax_f32(y, n, scale);
                long d = first_diff(y, ref, 700, 0);
                if (d >= 0)
                    fail_msg("%s softmax n=%d kind %d: [%ld] %a vs C %a", df_isa_name((df_isa)isa), n, kind, d, y[d],
                             ref[d]);
            }
        }
    }
    /* NaN and +inf: NaN rows agree across paths (any NaN), finite ones are 0 */
    for (int n = 1; n <= 40; n++) {
        for (int i = 0; i < n; i++) in[i] = rndf();
        in[n / 2] = n % 2 ? NAN : INFINITY;
        assert_int_equal(df_isa_set(DF_ISA_C), 0);
        memcpy(ref, in, sizeof in);
        df_softmax_f32(ref, n, 1.0f);
        for (int isa = 0; isa < n_isas(); isa++) {
            assert_int_equal(df_isa_set((df_isa)isa), 0);
            memcpy(y, in, sizeof in);
            df_softmax_f32(y, n, 1.0f);
            assert_int_equal(first_diff(y, ref, (size_t)n, 1), -1);
        }
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* Every F16 and BF16 bit pattern, at lengths and offsets that hit the tails. */
static void test_to_f32(void **state) {
    (void)state;
    uint16_t *h = df_xmalloc(65536 * 2);
    float *ref16 = df_xmalloc(65536 * 4), *refb = df_xmalloc(65536 * 4);
    float *out = df_xmalloc(65537 * 4);
    for (int i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i;
        ref16[i] = df_f16_to_f32((uint16_t)i);
        refb[i] = df_bf16_to_f32((uint16_t)i);
    }
    for (int isa = 0; isa < n_isas(); isa++) {
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        df_to_f32(out, h, DF_DT_F16, 65536);
        assert_int_equal(first_diff(out, ref16, 65536, 0), -1);
        df_to_f32(out, h, DF_DT_BF16, 65536);
        assert_int_equal(first_diff(out, refb, 65536, 0), -1);
        for (int n = 1; n < 40; n++) {
            int off = (int)(rnd() % 60000);
            out[n] = poison();
            df_to_f32(out, h + off, DF_DT_F16, (size_t)n);
            assert_int_equal(first_diff(out, ref16 + off, (size_t)n, 0), -1);
            df_to_f32(out, h + off, DF_DT_BF16, (size_t)n);
            assert_int_equal(first_diff(out, refb + off, (size_t)n, 0), -1);
            assert_true(isnan(out[n])); /* no write past n */
            df_to_f32(out, ref16 + off, DF_DT_F32, (size_t)n);
            assert_int_equal(first_diff(out, ref16 + off, (size_t)n, 0), -1);
        }
        /* the other dtypes (tools only) */
        const int32_t i32[3] = {-5, 0, 16777217};
        df_to_f32(out, i32, DF_DT_I32, 3);
        assert_true(out[0] == -5.0f && out[1] == 0.0f && out[2] == 16777216.0f);
        const uint8_t e4[4] = {0x38, 0xb8, 0x7e, 0x7f}; /* 1, -1, 448, NaN */
        df_to_f32(out, e4, DF_DT_F8_E4M3, 4);
        assert_true(out[0] == 1.0f && out[1] == -1.0f && out[2] == 448.0f && isnan(out[3]));
        const uint8_t e5[4] = {0x3c, 0x01, 0x7c, 0xfc}; /* 1, 2^-16, inf, -inf */
        df_to_f32(out, e5, DF_DT_F8_E5M2, 4);
        assert_true(out[0] == 1.0f && out[1] == ldexpf(1, -16) && isinf(out[2]) && out[3] < 0);
        const double f64[2] = {0.1, -1e300};
        df_to_f32(out, f64, DF_DT_F64, 2);
        assert_true(out[0] == 0.1f && isinf(out[1]) && out[1] < 0);
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
    free(h);
    free(ref16);
    free(refb);
    free(out);
}

/* The comparisons above can fail: a one-ulp change, and the same products
 * summed in another order, are both caught. */
static void test_detects_perturbation(void **state) {
    (void)state;
    enum { T = 3, N = 9, K = 257 };
    float wf[N * K], x[T * K], y[T * N], y2[T * N];
    void *w = make_w(DF_DT_BF16, N * K, wf);
    for (int i = 0; i < T * K; i++) x[i] = rndf();
    mm(g_pools[1], y, N, x, K, w, DF_DT_BF16, T, N, K);
    memcpy(y2, y, sizeof y);
    assert_int_equal(first_diff(y, y2, T * N, 0), -1);
    uint32_t u;
    memcpy(&u, &y2[7], 4);
    u ^= 1;
    memcpy(&y2[7], &u, 4);
    assert_int_equal(first_diff(y, y2, T * N, 0), 7);
    /* plain sequential summation: a different order, so (for this data) some
     * element differs in its last bits */
    int differs = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            float s = 0;
            for (int k = 0; k < K; k++) s = fmaf(wf[n * K + k], x[t * K + k], s);
            y2[t * N + n] = s;
        }
    differs = first_diff(y, y2, T * N, 0) >= 0;
    assert_true(differs);
    free(w);
}

/* ---- pool ------------------------------------------------------------------ */

struct cover {
    pthread_mutex_t mu;
    int n_ranges;
    int b[64], e[64];
    int *hits;
};

static void cover_fn(void *arg, int b, int e) {
    struct cover *c = arg;
    for (int i = b; i < e; i++) c->hits[i]++; /* disjoint ranges: no race */
    pthread_mutex_lock(&c->mu);
    if (c->n_ranges < 64) {
        c->b[c->n_ranges] = b;
        c->e[c->n_ranges] = e;
    }
    c->n_ranges++;
    pthread_mutex_unlock(&c->mu);
}

static void test_pool_ranges(void **state) {
    (void)state;
    const int threads[] = {1, 2, 3, 5};
    const int ns[] = {1, 2, 7, 16, 17, 100, 1000, 4097};
    const int aligns[] = {1, 3, 16, 64};
    const int slots[] = {1, 4, 12}; /* ranges per thread, at most; 4: the default */
    for (int ti = 0; ti < 4; ti++) {
        df_pool *p = df_pool_new(threads[ti]);
        assert_int_equal(df_pool_size(p), threads[ti]);
        for (int si = 0; si < 3; si++) {
            int most = threads[ti] * slots[si];
            df_pool_set_slots(p, slots[si]);
            for (int ni = 0; ni < 8; ni++)
                for (int ai = 0; ai < 4; ai++) {
                    int n = ns[ni], al = aligns[ai];
                    struct cover c = {.n_ranges = 0};
                    pthread_mutex_init(&c.mu, NULL);
                    c.hits = df_xcalloc((size_t)n, sizeof(int));
                    df_pool_for(p, n, al, cover_fn, &c);
                    for (int i = 0; i < n; i++) assert_int_equal(c.hits[i], 1);
                    int chunks = (n + al - 1) / al;
                    /* as many ranges as allowed, or one per chunk */
                    assert_int_equal(c.n_ranges, threads[ti] == 1 || n <= al ? 1 : chunks < most ? chunks : most);
                    for (int r = 0; r < c.n_ranges; r++) {
                        assert_int_equal(c.b[r] % al, 0);
                        assert_true(c.e[r] == n || c.e[r] % al == 0);
                        assert_true(c.b[r] < c.e[r]);
                    }
                    /* balanced: no range longer than a fair share rounded up to align */
                    int maxlen = ((chunks + most - 1) / most) * al;
                    for (int r = 0; r < c.n_ranges && threads[ti] > 1; r++) assert_true(c.e[r] - c.b[r] <= maxlen);
                    free(c.hits);
                    pthread_mutex_destroy(&c.mu);
                }
        }
        df_pool_for(p, 0, 4, cover_fn, NULL); /* nothing to do: fn not called */
        df_pool_free(p);
    }
    df_pool_free(NULL);
}

/* A slow thread: ranges run outside the calling thread take 20 ms more. */
struct slow {
    pthread_t caller;
    _Atomic int by_caller, by_others;
};
static void slow_fn(void *arg, int b, int e) {
    struct slow *c = arg;
    (void)b, (void)e;
    if (pthread_equal(pthread_self(), c->caller)) {
        atomic_fetch_add(&c->by_caller, 1);
    } else {
        atomic_fetch_add(&c->by_others, 1);
        usleep(20000);
    }
}

/* The ranges go to whichever thread is free: with 2 threads and 8 ranges, the
 * fast caller runs 7 while the slow worker sleeps through one. With
 * one range per thread each would run one (the slow one setting the pace). */
static void test_pool_balance(void **state) {
    (void)state;
    df_pool *p = df_pool_new(2);
    for (int it = 0; it < 5; it++) {
        struct slow c = {.caller = pthread_self()};
        df_pool_for(p, 64, 1, slow_fn, &c);
        assert_int_equal(atomic_load(&c.by_caller) + atomic_load(&c.by_others), 8);
        assert_true(atomic_load(&c.by_others) <= 3); /* 1, unless the caller was descheduled */
    }
    df_pool_free(p);
}

static void add_fn(void *arg, int b, int e) {
    _Atomic long *s = arg;
    long v = 0;
    for (int i = b; i < e; i++) v += i;
    atomic_fetch_add(s, v);
}

/* Many tiny jobs back to back, and again after the workers fell asleep. */
static void test_pool_stress_and_sleep(void **state) {
    (void)state;
    alarm(120); /* a lost slot hangs the caller: end the binary instead */
    df_pool *p = df_pool_new(3);
    _Atomic long s = 0;
    long want = 0;
    /* n from 1 to 50: jobs of 1 to 12 slots back to back, so that a worker
     * still looking at one job's state meets the next job's */
    for (int it = 0; it < 20000; it++) {
        int n = 1 + it % 50;
        df_pool_for(p, n, 1, add_fn, &s);
        want += (long)n * (n - 1) / 2;
    }
    assert_int_equal(atomic_load(&s), want);
    for (int round = 0; round < 3; round++) {
        usleep(300000); /* > spin time: workers now sleep on the futex */
        atomic_store(&s, 0);
        df_pool_for(p, 1000, 1, add_fn, &s);
        assert_int_equal(atomic_load(&s), 999L * 1000 / 2);
    }
    df_pool_free(p);
    alarm(0);
}

struct nest {
    df_pool *p;
    _Atomic long sum;
};
static void nest_inner(void *arg, int b, int e) {
    struct nest *c = arg;
    atomic_fetch_add(&c->sum, (long)(e - b));
}
static void nest_outer(void *arg, int b, int e) {
    struct nest *c = arg;
    for (int i = b; i < e; i++) df_pool_for(c->p, 10, 1, nest_inner, c);
}
static void test_pool_nested(void **state) {
    (void)state;
    struct nest c = {df_pool_new(2), 0};
    df_pool_for(c.p, 8, 1, nest_outer, &c);
    assert_int_equal(atomic_load(&c.sum), 80);
    df_pool_free(c.p);
}

struct caller {
    df_pool *p;
    _Atomic long sum;
};
static void *caller_main(void *arg) {
    struct caller *c = arg;
    for (int i = 0; i < 2000; i++) df_pool_for(c->p, 64, 4, add_fn, &c->sum);
    return NULL;
}
static void test_pool_concurrent_callers(void **state) {
    (void)state;
    struct caller c = {df_pool_new(2), 0};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, caller_main, &c);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&c.sum), 2L * 2000 * (63 * 64 / 2));
    df_pool_free(c.p);
}

int main(int argc, char **argv) {
    /* optional test-name filter (glob), e.g. test_kernels 'test_pool*' */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_api),
        cmocka_unit_test(test_detects_perturbation),
        cmocka_unit_test(test_matmul_grid),
        cmocka_unit_test(test_matmul_big),
        cmocka_unit_test(test_matmul_special),
        cmocka_unit_test(test_signed_zero_padding),
        cmocka_unit_test(test_inf_nan),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_axpy_rows),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_to_f32),
        cmocka_unit_test(test_pool_ranges),
        cmocka_unit_test(test_pool_balance),
        cmocka_unit_test(test_pool_stress_and_sleep),
        cmocka_unit_test(test_pool_nested),
        cmocka_unit_test(test_pool_concurrent_callers),
    };
    return cmocka_run_group_tests(tests, setup_pools, teardown_pools);
}
