/*
 * test_kernels_fmt.c - the scaled weight formats of kernels.h (FP8 e4m3 with
 * F32 128x128 block scales, INT4 with BF16 and MXFP4 with E8M0 group scales):
 * the decodings against references computed here in double precision from
 * the format descriptions (every e4m3 and e2m1 code, all 256 E8M0 scales, the
 * INT4 offset and nibble order), and the products: every ISA path this CPU
 * runs is bit-identical to the C path, to T single-row calls, to 1-3 threads
 * and to the F32 product of the decoded matrix; close to a double reference;
 * tails, edge blocks, row views, NaN codes and extreme scales included.
 * (Kept apart from test_kernels.c, which covers the dense formats and the pool.)
 */
#include "testutil.h"

#include "kernels/kernels.h"
#include "kernels/scaled.h"

#include <math.h>
#include <string.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }
static int n_isas(void) { return (int)df_isa_detect() + 1; }

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- references in double, written from the format descriptions ---------- */

/* e4m3fn: sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0; e = 0 is
 * subnormal (2^-6 * m/8); S.1111.111 is NaN; no infinity. */
static double ref_e4m3(unsigned b) {
    unsigned s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double mag = e == 0 ? pow(2.0, -6) * (m / 8.0) : pow(2.0, (double)e - 7) * (1.0 + m / 8.0);
    return s ? -mag : mag;
}
/* e2m1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; e = 0 is
 * subnormal (m * 0.5). */
static double ref_e2m1(unsigned n) {
    unsigned s = (n >> 3) & 1, e = (n >> 1) & 3, m = n & 1;
    double mag = e == 0 ? 0.5 * m : pow(2.0, (double)e - 1) * (1.0 + m / 2.0);
    return s ? -mag : mag;
}
static double ref_i4(unsigned n) { return (double)(n & 15) - 8.0; }
static double ref_e8m0(unsigned s) { return s == 255 ? NAN : pow(2.0, (double)s - 127); }
static double ref_bf16(uint16_t h) { return (double)f_of((uint32_t)h << 16); }

/* A double rounded to F32 (nearest even), inf past the overflow threshold. */
static float to_f32(double d) {
    if (isnan(d)) return NAN;
    if (fabs(d) >= 0x1.ffffffp127) return d > 0 ? INFINITY : -INFINITY;
    return (float)d;
}

static bool same(float a, float b) { return (isnan(a) && isnan(b)) || u_of(a) == u_of(b); }

/* ---- scaled matrices ------------------------------------------------------- */

typedef struct {
    df_wview v;
    uint8_t *vals, *sc;
    double *w; /* exact dequantized weights [N][K] (double) */
} qmat;

/* FP8 codes as a checkpoint holds them (g_fp8_real): e >= 2 but for one code
 * of the F16 form's (e <= 1, NaN) in some 64-value groups (fp8_sprinkle). */
static int g_fp8_real;

static uint8_t rnd_code(df_elem el, int nan_ok) {
    if (el != DF_EL_F8_E4M3) return (uint8_t)(rnd() & 15);
    uint8_t b = (uint8_t)rnd();
    if (g_fp8_real && (b & 0x78) < 0x10) b |= 0x10;
    if ((!nan_ok || g_fp8_real) && (b & 0x7f) == 0x7f) b ^= 1;
    return b;
}

/* In half of a row's 64-value groups (counted from the row's start, as the
 * SIMD paths test them), one code at a random place that only the F16 form
 * decodes: every e = 0 and e = 1 code of either sign in turn, and the NaN
 * codes if nan_ok. */
static void fp8_sprinkle(uint8_t *row, int K, int nan_ok) {
    static unsigned turn;
    for (int g = 0; g * 64 < K; g++) {
        if (rnd() % 2) continue;
        unsigned c = turn++ % (nan_ok ? 34 : 32);
        uint8_t b = c < 32 ? (uint8_t)((c & 15) | (c & 16) << 3) : c == 32 ? 0x7f : 0xff;
        int n = K - g * 64 < 64 ? K - g * 64 : 64;
        row[g * 64 + (int)(rnd() % (unsigned)n)] = b;
    }
}

/* F32 scales powers of two (g_pow2, as DeepSeek-V3.1's): special ones at and past the
 * ends of the range that the one-token FP8 products move onto the activations. */
static int g_pow2;

/* A scale: ordinary for its format, or (special) one of the extremes. */
static void put_scale(uint8_t *p, df_scale_type t, int special) {
    if (t == DF_SC_F32 && g_pow2) {
        static const int ks[] = {-120, -121, 119, 120, -126, -127, 0, -8, -9, 60};
        float s = special && rnd() % 2 ? ldexpf(1.0f, ks[rnd() % (sizeof ks / sizeof *ks)])
                                       : ldexpf(1.0f, -7 - (int)(rnd() % 12));
        memcpy(p, &s, 4);
    } else if (t == DF_SC_F32) {
        static const uint32_t odd[] = {0x3f800000u, 0x7b800000u /* 2^120: two-multiply form */, 0x7f000000u,
                                       0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0x00400000u,
                                       0x80000000u, 0x00000000u, 0x1f000000u, 0x5f000000u};
        float s = special && rnd() % 2 ? f_of(odd[rnd() % (sizeof odd / 4)]) : ldexpf(1.0f + rndf() / 2, -7 - (int)(rnd() % 6));
        memcpy(p, &s, 4);
    } else if (t == DF_SC_BF16) {
        static const uint16_t odd[] = {0x3f80, 0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0x0001, 0x0040, 0x8000, 0x0000, 0x0080};
        uint16_t h = special && rnd() % 2 ? odd[rnd() % (sizeof odd / 2)] : df_f32_to_bf16(ldexpf(1.0f + rndf() / 2, -3 - (int)(rnd() % 6)));
        memcpy(p, &h, 2);
    } else {
        *p = special && rnd() % 2 ? (uint8_t)rnd() : (uint8_t)(118 + rnd() % 12);
    }
}

static double scale_ref(const uint8_t *p, df_scale_type t) {
    if (t == DF_SC_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (t == DF_SC_BF16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return ref_bf16(h);
    }
    return ref_e8m0(*p);
}

/* Values exactly row_bytes * N and scales exactly the grid, so any read past
 * them is an ASan error. The unused high nibble of an odd row is random. */
static qmat make_q(df_wfmt f, int N, int K, int special) {
    qmat q;
    size_t rb = df_wfmt_row_bytes(f, K);
    uint64_t sb = df_wfmt_scale_bytes(f, N, K);
    q.vals = df_xmalloc(rb * (size_t)N + 1);
    q.sc = df_xmalloc((size_t)sb + 1);
    q.w = df_xmalloc(sizeof(double) * ((size_t)N * (size_t)K + 1));
    size_t es = f.scale == DF_SC_F32 ? 4 : f.scale == DF_SC_BF16 ? 2 : 1;
    for (uint64_t i = 0; i < sb / es; i++) put_scale(q.sc + i * es, f.scale, special);
    int gc = (K + f.block_cols - 1) / f.block_cols;
    for (int n = 0; n < N; n++) {
        uint8_t *row = q.vals + (size_t)n * rb;
        if (f.elem == DF_EL_F8_E4M3) {
            for (int k = 0; k < K; k++) row[k] = rnd_code(f.elem, special && rnd() % 8 == 0);
            if (g_fp8_real) fp8_sprinkle(row, K, special);
        } else {
            for (size_t b = 0; b < rb; b++) row[b] = (uint8_t)(rnd_code(f.elem, 0) | rnd_code(f.elem, 0) << 4);
        }
        for (int k = 0; k < K; k++) {
            unsigned c = f.elem == DF_EL_F8_E4M3 ? row[k] : (unsigned)(row[k / 2] >> (4 * (k % 2))) & 15;
            double d = f.elem == DF_EL_F8_E4M3 ? ref_e4m3(c) : f.elem == DF_EL_I4 ? ref_i4(c) : ref_e2m1(c);
            const uint8_t *sp = q.sc + ((size_t)(n / f.block_rows) * (size_t)gc + (size_t)(k / f.block_cols)) * es;
            q.w[(size_t)n * K + k] = d * scale_ref(sp, f.scale);
        }
    }
    q.v = df_wview_scaled(f, q.vals, q.sc, N, K);
    return q;
}

/* make_q of FP8 codes as checkpoints hold them (real) or random ones */
static qmat make_q_fp8(df_wfmt f, int N, int K, int special, int real) {
    g_fp8_real = real;
    qmat q = make_q(f, N, K, special);
    g_fp8_real = 0;
    return q;
}

static void free_q(qmat *q) {
    free(q->vals);
    free(q->sc);
    free(q->w);
}

static const df_wfmt *fmt_list(int *n) {
    static df_wfmt f[7];
    f[0] = df_wfmt_fp8_block();
    f[1] = df_wfmt_int4_group();
    f[2] = df_wfmt_mxfp4();
    f[3] = (df_wfmt){DF_EL_F8_E4M3, DF_SC_F32, 3, 48};
    f[4] = (df_wfmt){DF_EL_F8_E4M3, DF_SC_F32, 1, 16};
    f[5] = (df_wfmt){DF_EL_I4, DF_SC_BF16, 2, 16};
    f[6] = (df_wfmt){DF_EL_E2M1, DF_SC_E8M0, 1, 64};
    *n = 7;
    return f;
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

/* Decodes rows of v on one path; checks against q->w (rounded to F32) and
 * that nothing is written past the rows. */
static void check_decode(const qmat *q, df_isa isa, float *out) {
    int N = q->v.rows, K = q->v.cols;
    assert_int_equal(df_isa_set(isa), 0);
    out[(size_t)N * K] = f_of(0x7fa5a5a5u);
    df_wview_decode_rows(out, &q->v, 0, N);
    assert_int_equal(u_of(out[(size_t)N * K]), 0x7fa5a5a5u);
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (!same(out[i], to_f32(q->w[i])))
            fail_msg("%s %s N=%d K=%d: w[%zu] = %a, want %a", df_isa_name(isa), df_wfmt_name(q->v.fmt), N, K, i,
                     out[i], to_f32(q->w[i]));
}

/* ---- decodings --------------------------------------------------------------- */

static void test_e4m3_codes(void **state) {
    (void)state;
    for (unsigned b = 0; b < 256; b++) {
        double r = ref_e4m3(b);
        float f = df_e4m3_to_f32((uint8_t)b);
        if (!same(f, (float)r)) fail_msg("e4m3 0x%02x: %a, want %a", b, f, r);
    }
    assert_true(df_e4m3_to_f32(0x7e) == 448.0f && df_e4m3_to_f32(0x01) == ldexpf(1, -9));
    assert_true(signbit(df_e4m3_to_f32(0x80)) && df_e4m3_to_f32(0x80) == 0.0f);
    /* every code in a row, times scales that give exact, rounded, subnormal,
     * overflowing and NaN products, and |s| >= 2^120 (the two-multiply form;
     * 2^119 is the largest power of two without it) */
    static const uint32_t scales[] = {0x3f800000u, 0x3a83126fu, 0x00000001u, 0x00400000u, 0x0b000000u,
                                      0x43800000u, 0x7f7fffffu, 0x7f800000u, 0x7fc00000u, 0x80000000u,
                                      0xc2f6e979u, 0x3dcccccdu, 0x7b800000u, 0x7b000000u, 0xfbc00000u};
    for (size_t si = 0; si < sizeof scales / 4; si++) {
        enum { N = 3, K = 256 + 13 };
        uint8_t vals[N * K];
        float sc[1 * 3], out[N * K + 1];
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) vals[n * K + k] = (uint8_t)(k + 37 * n);
        for (int j = 0; j < 3; j++) sc[j] = f_of(scales[(si + (size_t)j) % (sizeof scales / 4)]);
        qmat q = {df_wview_scaled(df_wfmt_fp8_block(), vals, sc, N, K), vals, (uint8_t *)sc,
                  df_xmalloc(sizeof(double) * N * K)};
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) q.w[n * K + k] = ref_e4m3(vals[n * K + k]) * (double)sc[k / 128];
        for (int isa = 0; isa < n_isas(); isa++) check_decode(&q, (df_isa)isa, out);
        free(q.w);
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* All 16 e2m1 codes times all 256 E8M0 scales (one row per scale). */
static void test_e2m1_e8m0(void **state) {
    (void)state;
    for (unsigned n = 0; n < 16; n++) {
        float f = df_e2m1_to_f32(n);
        if (!same(f, (float)ref_e2m1(n))) fail_msg("e2m1 %u: %a", n, f);
    }
    assert_true(signbit(df_e2m1_to_f32(8)) && df_e2m1_to_f32(8) == 0.0f && df_e2m1_to_f32(7) == 6.0f);
    for (unsigned s = 0; s < 256; s++) {
        float f = df_e8m0_to_f32((uint8_t)s);
        if (!same(f, to_f32(ref_e8m0(s)))) fail_msg("e8m0 %u: %a", s, f);
    }
    assert_true(df_e8m0_to_f32(0) == ldexpf(1, -127) && df_e8m0_to_f32(127) == 1.0f && isnan(df_e8m0_to_f32(255)));
    enum { N = 256, K = 32 + 5 };
    uint8_t vals[N * ((K + 1) / 2)], sc[N * 2];
    float *out = df_xmalloc(sizeof(float) * (N * K + 1));
    size_t rb = (K + 1) / 2;
    qmat q = {df_wview_scaled(df_wfmt_mxfp4(), vals, sc, N, K), vals, sc, df_xmalloc(sizeof(double) * N * K)};
    for (int n = 0; n < N; n++) {
        sc[2 * n] = (uint8_t)n;
        sc[2 * n + 1] = (uint8_t)(255 - n);
        for (size_t b = 0; b < rb; b++) vals[n * rb + b] = (uint8_t)((2 * b) % 16 | ((2 * b + 1 + n) % 16) << 4);
        for (int k = 0; k < K; k++) {
            unsigned c = (vals[n * rb + k / 2] >> (4 * (k % 2))) & 15;
            q.w[n * K + k] = ref_e2m1(c) * ref_e8m0(sc[2 * n + k / 32]);
        }
    }
    for (int isa = 0; isa < n_isas(); isa++) check_decode(&q, (df_isa)isa, out);
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
    free(q.w);
    free(out);
}

/* INT4: the +8 offset, the even column in the low nibble, and the
 * checkpoint's I32 words read as little-endian bytes. */
static void test_i4_layout(void **state) {
    (void)state;
    for (unsigned n = 0; n < 16; n++) assert_true(df_i4_to_f32(n) == (float)n - 8.0f);
    /* compressed-tensors pack_to_int32: column c in word c/8 at bits 4*(c%8) */
    enum { N = 2, K = 40 };
    uint32_t words[N * K / 8];
    uint8_t bytes[sizeof words];
    int q[N][K];
    for (int n = 0; n < N; n++)
        for (int w = 0; w < K / 8; w++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++) {
                q[n][w * 8 + i] = (int)(rnd() % 16) - 8;
                v |= (uint32_t)(q[n][w * 8 + i] + 8) << (4 * i);
            }
            words[n * (K / 8) + w] = v;
        }
    for (size_t i = 0; i < sizeof words / 4; i++)
        for (int b = 0; b < 4; b++) bytes[4 * i + (size_t)b] = (uint8_t)(words[i] >> (8 * b));
    uint16_t sc[N * 2] = {0x3f80, 0x4000, 0xbf80, 0x3e80}; /* 1, 2, -1, 0.25 */
    df_wview v = df_wview_scaled(df_wfmt_int4_group(), bytes, sc, N, K);
    float out[N * K];
    for (int isa = 0; isa < n_isas(); isa++) {
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        df_wview_decode_rows(out, &v, 0, N);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                if (out[n * K + k] != (float)(q[n][k] * ref_bf16(sc[n * 2 + k / 32])))
                    fail_msg("%s i4 [%d][%d] = %g, want %d * %g", df_isa_name((df_isa)isa), n, k, out[n * K + k],
                             q[n][k], ref_bf16(sc[n * 2 + k / 32]));
        /* one byte by hand: 0x9f is column 0 = 15 - 8 = 7, column 1 = 9 - 8 = 1 */
        uint8_t b1[1] = {0x9f}, s1[2] = {0x80, 0x3f};
        df_wview v1 = df_wview_scaled(df_wfmt_int4_group(), b1, s1, 1, 2);
        df_wview_decode_rows(out, &v1, 0, 1);
        assert_true(out[0] == 7.0f && out[1] == 1.0f);
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

static void test_wfmt_api(void **state) {
    (void)state;
    assert_true(df_wfmt_computable(df_wfmt_fp8_block()));
    assert_true(df_wfmt_computable(df_wfmt_int4_group()));
    assert_true(df_wfmt_computable(df_wfmt_mxfp4()));
    assert_false(df_wfmt_computable((df_wfmt){DF_EL_F8_E4M3, DF_SC_NONE, 0, 0}));
    assert_false(df_wfmt_computable((df_wfmt){DF_EL_I4, DF_SC_F32, 1, 32}));
    assert_false(df_wfmt_computable((df_wfmt){DF_EL_E2M1, DF_SC_E8M0, 1, 24}));
    assert_false(df_wfmt_computable((df_wfmt){DF_EL_F8_E4M3, DF_SC_F32, 0, 128}));
    assert_string_equal(df_wfmt_name(df_wfmt_fp8_block()), "F8_E4M3/F32[128x128]");
    assert_string_equal(df_wfmt_name(df_wfmt_mxfp4()), "E2M1/E8M0[1x32]");
    /* kv_a_proj_with_mqa [576][7168]: scale grid [5][56] */
    assert_int_equal(df_wfmt_scale_bytes(df_wfmt_fp8_block(), 576, 7168), 5 * 56 * 4);
    assert_int_equal(df_wfmt_bytes(df_wfmt_int4_group(), 3, 7168), 3 * 3584);
    assert_int_equal(df_wfmt_scale_bytes(df_wfmt_int4_group(), 3, 7168), 3 * 224 * 2);
    assert_int_equal(df_wfmt_scale_bytes(df_wfmt_mxfp4(), 3, 33), 3 * 2);
    assert_int_equal(df_wfmt_row_bytes(df_wfmt_mxfp4(), 33), 17);
}

/* ---- products ------------------------------------------------------------------ */

static long first_diff(const float *a, const float *b, size_t n, int nan_any) {
    for (size_t i = 0; i < n; i++) {
        if (nan_any && isnan(a[i]) && isnan(b[i])) continue;
        if (u_of(a[i]) != u_of(b[i])) return (long)i;
    }
    return -1;
}

static void fill_y(float *y, int T, int N, int ldy) {
    for (size_t i = 0; i < (size_t)T * ldy; i++) y[i] = f_of(0x7fa5a5a5u);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) y[(size_t)t * ldy + n] = -12345.0f;
}

/* One matrix and batch: (a) every path == C, (b) row by row == batch, rows
 * split, (c) threads, (d) == the F32 product of the decoded matrix, (e) close
 * to the double reference (finite data). */
/* Activations with extremes (g_x_extreme: 1 in 64 of them; nan_any must be set): tiny
 * normals and subnormals, which a power-of-two block scale moved onto them would round,
 * and huge ones it would overflow, and zeros. */
static int g_x_extreme;

static float rnd_x(void) {
    if (!g_x_extreme || rnd() % 64) return rndf();
    switch (rnd() % 5) {
    case 0: return ldexpf(rndf(), -120 - (int)(rnd() % 6)); /* normal near 2^-126, or subnormal */
    case 1: return f_of(rnd() & 0x807fffffu);                /* subnormal */
    case 2: return ldexpf(rndf(), 100 + (int)(rnd() % 28));  /* huge */
    case 3: return ldexpf(rndf(), -100);
    default: return rnd() % 2 ? 0.0f : -0.0f;
    }
}

static void check_q(const qmat *q, int T, int nan_any) {
    const df_wview *v = &q->v;
    int N = v->rows, K = v->cols, ldx = K + 5, ldy = N + 3;
    size_t ny = (size_t)T * ldy;
    float *x = df_xmalloc(((size_t)T * ldx + 1) * 4), *ref = df_xmalloc(ny * 4), *y = df_xmalloc(ny * 4);
    float *wd = df_xmalloc(((size_t)N * K + 1) * 4);
    for (size_t i = 0; i < (size_t)T * ldx; i++) x[i] = f_of(0x7fa5a5a5u); /* padding: never read */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) x[(size_t)t * ldx + k] = rnd_x();
    const char *fn = df_wfmt_name(v->fmt);
    assert_int_equal(df_isa_set(DF_ISA_C), 0);
    fill_y(ref, T, N, ldy);
    df_matmul(NULL, ref, ldy, x, ldx, v, T);
    df_wview_decode_rows(wd, v, 0, N);
    df_wview dv = df_wview_make(wd, DF_DT_F32, N, K);
    for (int isa = 0; isa < n_isas(); isa++) {
        const char *in = df_isa_name((df_isa)isa);
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        fill_y(y, T, N, ldy);
        df_matmul(NULL, y, ldy, x, ldx, v, T);
        long d = first_diff(y, ref, ny, nan_any);
        if (d >= 0) fail_msg("%s %s T=%d N=%d K=%d: differs from C at %ld: %a vs %a", in, fn, T, N, K, d, y[d], ref[d]);
        fill_y(y, T, N, ldy);
        for (int t = 0; t < T; t++) df_matmul(NULL, y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, v, 1);
        if ((d = first_diff(y, ref, ny, nan_any)) >= 0) fail_msg("%s %s T=%d N=%d K=%d: T=1 differs at %ld", in, fn, T, N, K, d);
        fill_y(y, T, N, ldy);
        df_matmul_rows(y, ldy, x, ldx, v, T, 0, N / 3);
        df_matmul_rows(y, ldy, x, ldx, v, T, N / 3, N);
        if ((d = first_diff(y, ref, ny, nan_any)) >= 0) fail_msg("%s %s T=%d N=%d K=%d: rows split differs at %ld", in, fn, T, N, K, d);
        for (int p = 0; p < 3; p++) {
            fill_y(y, T, N, ldy);
            df_matmul(g_pools[p], y, ldy, x, ldx, v, T);
            if ((d = first_diff(y, ref, ny, nan_any)) >= 0)
                fail_msg("%s %s T=%d N=%d K=%d: %d threads differ at %ld", in, fn, T, N, K, p + 1, d);
        }
        fill_y(y, T, N, ldy);
        df_matmul(g_pools[1], y, ldy, x, ldx, &dv, T);
        if ((d = first_diff(y, ref, ny, nan_any)) >= 0)
            fail_msg("%s %s T=%d N=%d K=%d: F32 of the decoded matrix differs at %ld: %a vs %a", in, fn, T, N, K, d,
                     y[d], ref[d]);
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
    for (int t = 0; t < T; t++)
        for (int n = N; n < ldy; n++) assert_int_equal(u_of(ref[(size_t)t * ldy + n]), 0x7fa5a5a5u);
    if (!nan_any) {
        /* the reduction's bound plus the rounding of each weight to F32 */
        double gamma = (((K + 15) / 16 + 4) * ldexp(1.0, -24) + ldexp(1.0, -24)) * 1.01;
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double s = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    double p = q->w[(size_t)n * K + k] * x[(size_t)t * ldx + k];
                    s += p, sa += fabs(p);
                }
                double e = fabs((double)ref[(size_t)t * ldy + n] - s);
                if (e > gamma * sa + 1e-37)
                    fail_msg("%s T=%d N=%d K=%d: y[%d][%d] = %.9g, exact %.9g", fn, T, N, K, t, n,
                             ref[(size_t)t * ldy + n], s);
            }
    }
    free(x), free(ref), free(y), free(wd);
}

/* Tails (K not a multiple of 16 or 32), edge blocks (N, K not multiples of
 * 128), T = 1..9, every format and some other block shapes. */
static void test_products_grid(void **state) {
    (void)state;
    static const int Ks[] = {1, 15, 16, 17, 31, 32, 33, 63, 64, 100, 128, 129, 200, 257};
    static const int Ns[] = {1, 3, 5, 17, 130};
    int nf;
    const df_wfmt *fs = fmt_list(&nf);
    for (int fi = 0; fi < nf; fi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
                qmat q = make_q(fs[fi], Ns[ni], Ks[ki], 0);
                for (int T = 1; T <= 9; T += (Ns[ni] > 17 ? 8 : 1)) check_q(&q, T, 0);
                free_q(&q);
            }
}

/* Larger shapes: every thread gets rows, several 128-row blocks, the token
 * blocks of the T > 1 kernels and of the rows decoded once. */
static void test_products_big(void **state) {
    (void)state;
    int nf;
    const df_wfmt *fs = fmt_list(&nf);
    for (int fi = 0; fi < 3; fi++) {
        qmat q = make_q(fs[fi], 150, 1000, 0); /* FP8: a 128-row block and a 22-row edge */
        check_q(&q, 1, 0);
        check_q(&q, 9, 0);
        check_q(&q, 19, 0); /* C: 2 blocks of 8 and 3; AVX-512: 4 tiles of 4 and 3 */
        check_q(&q, 70, 0); /* rows decoded once (matmul.c): 60-row groups, a 64-token block and 6 */
        free_q(&q);
    }
    qmat q = make_q(fs[0], 40, 20000, 0);
    check_q(&q, 5, 0);
    free_q(&q);
}

/* NaN codes, extreme and non-finite scales: paths, batches, threads and the
 * decoded F32 product agree (NaN matches NaN). */
static void test_products_special(void **state) {
    (void)state;
    int nf;
    const df_wfmt *fs = fmt_list(&nf);
    for (int fi = 0; fi < nf; fi++)
        for (int rep = 0; rep < 12; rep++) {
            int N = 1 + (int)(rnd() % 140), K = 1 + (int)(rnd() % 300);
            qmat q = make_q(fs[fi], N, K, 1);
            float *out = df_xmalloc(sizeof(float) * ((size_t)N * K + 1));
            for (int isa = 0; isa < n_isas(); isa++) check_decode(&q, (df_isa)isa, out);
            check_q(&q, 1 + (int)(rnd() % 9), 1);
            check_q(&q, 1, 1);  /* T == 1 has its own tiles */
            check_q(&q, 13, 1); /* rows decoded once (matmul.c) */
            free(out);
            free_q(&q);
        }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* FP8 codes as checkpoints hold them: the AVX-512 path decodes most 64-value
 * groups of a row in its F32 form and the rest (e <= 1 or NaN codes) in its
 * F16 form, row by row; every path still equals C. Then random codes of
 * every kind in every group. Edge blocks, tails, T = 1 and the tiles of
 * T > 1, extreme scales (the two-multiply form). */
static void test_products_fp8_forms(void **state) {
    (void)state;
    static const int Ks[] = {64, 200, 448};
    static const int Ns[] = {3, 130};
    df_wfmt f = df_wfmt_fp8_block();
    for (int real = 1; real >= 0; real--)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (int special = 0; special < 2; special++) {
                    qmat q = make_q_fp8(f, Ns[ni], Ks[ki], special, real);
                    check_q(&q, 1, special);
                    check_q(&q, 5, special);
                    check_q(&q, 13, special); /* rows decoded once on both SIMD paths */
                    free_q(&q);
                }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* FP8 with power-of-two block scales (DeepSeek-V3.1's): the one-token tiles move a
 * scale shared by their rows onto the activations where that is exact, and must equal
 * C on every path, with and without maps: scales at and past the ends of the range
 * (2^-120, 2^119 and beyond), activations of every magnitude (rounded or overflowed by
 * the move, were it made for them), rows of one block and of several. */
static void test_products_fp8_pow2(void **state) {
    (void)state;
    static const int Ks[] = {64, 200, 448, 1000};
    static const int Ns[] = {3, 9, 130};
    df_wfmt fs[2] = {df_wfmt_fp8_block(), {DF_EL_F8_E4M3, DF_SC_F32, 2, 128}};
    g_pow2 = 1;
    for (int fi = 0; fi < 2; fi++)
        for (int real = 1; real >= 0; real--)
            for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                    for (int special = 0; special < 2; special++) {
                        int N = Ns[ni], K = Ks[ki];
                        qmat q = make_q_fp8(fs[fi], N, K, special, real);
                        uint64_t *map = df_xmalloc(sizeof(uint64_t) * df_fp8_map_words(K) * (size_t)N + 8);
                        df_fp8_map_build(map, &q.v);
                        for (int m = 0; m < 2; m++) {
                            q.v.f16map = m ? map : NULL;
                            for (int ext = 0; ext < 2; ext++) {
                                g_x_extreme = ext;
                                check_q(&q, 1, special || ext);
                                g_x_extreme = 0;
                            }
                        }
                        check_q(&q, 5, special);
                        free(map);
                        free_q(&q);
                    }
    g_pow2 = 0;
    /* Activations that the move would round (x * 2^(k+8) subnormal) or overflow, where
     * they make the whole sum: every path must still equal C, bit for bit. */
    enum { N = 8, K = 256 };
    qmat q = make_q_fp8(fs[0], N, K, 0, 1);
    float x[K], ref[N], y[N];
    for (int c = 0; c < 2; c++) {
        float s = c ? 1.0f : ldexpf(1.0f, -16);
        memcpy(q.sc, &s, 4), memcpy(q.sc + 4, &s, 4);
        for (int k = 0; k < K; k++)
            x[k] = c ? 0.0f : ldexpf(1.0f + (float)(rnd() % 8388608) / 8388608.0f, -125) * (rnd() % 2 ? 1 : -1);
        if (c) { /* 1.5 * 2^126 * 2^8 overflows; its weights are small: the sum is finite */
            x[5] = ldexpf(1.5f, 126);
            for (int n = 0; n < N; n++) q.vals[n * K + 5] = 0x10;
        }
        assert_int_equal(df_isa_set(DF_ISA_C), 0);
        df_matmul(NULL, ref, N, x, K, &q.v, 1);
        for (int n = 0; n < N; n++) assert_true(isfinite(ref[n]) && (c || fabsf(ref[n]) < ldexpf(1.0f, -126)));
        for (int isa = 1; isa < n_isas(); isa++) {
            assert_int_equal(df_isa_set((df_isa)isa), 0);
            df_matmul(NULL, y, N, x, K, &q.v, 1);
            for (int n = 0; n < N; n++)
                if (u_of(y[n]) != u_of(ref[n]))
                    fail_msg("%s, scale %a: row %d is %a, C %a", df_isa_name((df_isa)isa), s, n, y[n], ref[n]);
        }
    }
    free_q(&q);
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* FP8 with its F16-form map (kernels.h): the map's bits are those of a byte-by-byte
 * reference (rows of more than 64 groups: several words per row), and the products with
 * it equal C on every path, batch, row split and thread count, as without it; so do
 * views of some rows. Then a map with one bit wrongly cleared, over a group whose only
 * code outside the F32 form is a NaN code (or, on AVX-512, an e = 0 code), must change
 * the product of that row on each SIMD path (else the map would not be read at all). */
static void test_products_fp8_map(void **state) {
    (void)state;
    static const int Ks[] = {64, 200, 448, 1000, 4300};
    static const int Ns[] = {3, 130};
    df_wfmt f = df_wfmt_fp8_block();
    long flagged = 0, clear = 0; /* groups with a bit set or clear, over all shapes */
    for (int real = 1; real >= 0; real--)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (int special = 0; special < 2; special++) {
                    int N = Ns[ni], K = Ks[ki];
                    qmat q = make_q_fp8(f, N, K, special, real);
                    size_t wpr = df_fp8_map_words(K);
                    assert_int_equal(wpr, (size_t)((K + 63) / 64 + 63) / 64);
                    uint64_t *map = df_xmalloc(sizeof(uint64_t) * (wpr * (size_t)N + 1));
                    map[wpr * (size_t)N] = 0xa5a5a5a5a5a5a5a5ull;
                    df_fp8_map_build(map, &q.v);
                    assert_true(map[wpr * (size_t)N] == 0xa5a5a5a5a5a5a5a5ull);
                    for (int n = 0; n < N; n++)
                        for (int g = 0; g < (int)wpr * 64; g++) {
                            int want = 0;
                            for (int i = 0; i < 64 && 64 * g + i < K; i++)
                                want |= ((q.vals[(size_t)n * K + 64 * g + i] + 1) & 0x70) == 0;
                            int got = (int)(map[(size_t)n * wpr + g / 64] >> (g % 64)) & 1;
                            if (got != want) fail_msg("K=%d N=%d: map bit of row %d group %d is %d", K, N, n, g, got);
                            flagged += want;
                            clear += 64 * g < K && !want;
                        }
                    q.v.f16map = map;
                    check_q(&q, 1, special);
                    check_q(&q, 5, special);
                    free(map);
                    free_q(&q);
                }
    assert_true(flagged > 100 && clear > 100);
    /* a row's last group, 40 codes, holds a whole 32-value step of AVX2's: a NaN code
     * there must reach the product through the group's bit (it once had none) */
    {
        qmat q = make_q_fp8(f, 8, 1000, 0, 1);
        q.vals[2 * 1000 + 970] = 0x7f;
        uint64_t *map = df_xmalloc(sizeof(uint64_t) * df_fp8_map_words(1000) * 8);
        df_fp8_map_build(map, &q.v);
        assert_true((map[2 * df_fp8_map_words(1000)] >> 15) & 1);
        q.v.f16map = map;
        check_q(&q, 1, 1);
        free(map);
        free_q(&q);
    }
    /* views of some rows carry the map along */
    enum { N = 300, K = 448, T = 1 };
    qmat q = make_q_fp8(f, N, K, 0, 1);
    uint64_t *map = df_xmalloc(sizeof(uint64_t) * df_fp8_map_words(K) * N);
    df_fp8_map_build(map, &q.v);
    float x[K], yf[N], ys[N], ym[N];
    for (int i = 0; i < K; i++) x[i] = rndf();
    for (int isa = 0; isa < n_isas(); isa++) {
        assert_int_equal(df_isa_set((df_isa)isa), 0);
        q.v.f16map = NULL;
        df_matmul(g_pools[1], yf, N, x, K, &q.v, T);
        q.v.f16map = map;
        df_matmul(g_pools[1], ym, N, x, K, &q.v, T);
        assert_memory_equal(ym, yf, sizeof yf);
        static const int r0s[] = {1, 127, 129, 250};
        for (size_t i = 0; i < sizeof r0s / sizeof *r0s; i++) {
            int r0 = r0s[i], n = N - r0 < 45 ? N - r0 : 45;
            df_wview s = df_wview_rows(&q.v, r0, n), s2 = df_wview_rows(&s, 7, n - 7);
            assert_true(s2.f16map == map + (size_t)(r0 + 7) * df_fp8_map_words(K));
            df_matmul(g_pools[2], ys, N, x, K, &s2, T);
            assert_memory_equal(ys, yf + r0 + 7, sizeof(float) * (n - 7));
        }
    }
    /* the map is read: a bit cleared over a NaN code (every SIMD path), or over an e = 0
     * code (AVX-512, whose F32 form has no subnormals), gives the F32 form's wrong weight */
    uint8_t *row = q.vals; /* group 1 of rows 0-3 (AVX2 tests a tile's 4 rows at once): */
    for (int isa = DF_ISA_AVX2; isa < n_isas(); isa++) /* codes of e = 7 but one in row 0 */
        for (int code = 0; code < 2; code++) {
            if (code == 1 && isa != DF_ISA_AVX512) continue;
            assert_int_equal(df_isa_set((df_isa)isa), 0);
            for (int r = 0; r < 4; r++)
                for (int i = 64; i < 128; i++) row[r * K + i] = (uint8_t)(0x38 | (i & 7));
            row[70] = code ? 0x05 : 0x7f;
            x[70] = 1.0f;
            df_fp8_map_build(map, &q.v);
            assert_true((map[0] >> 1) & 1);
            q.v.f16map = map;
            df_matmul(NULL, ym, N, x, K, &q.v, T);
            q.v.f16map = NULL;
            df_matmul(NULL, yf, N, x, K, &q.v, T);
            for (int n = 0; n < N; n++) assert_true(same(ym[n], yf[n]));
            assert_true(code || isnan(yf[0]));
            map[0] &= ~(uint64_t)2;
            q.v.f16map = map;
            df_matmul(NULL, ym, N, x, K, &q.v, T);
            if (same(ym[0], yf[0])) fail_msg("%s: a cleared map bit over code %#x changed nothing", df_isa_name((df_isa)isa), row[70]);
            for (int n = 1; n < N; n++) assert_true(same(ym[n], yf[n]));
        }
    free(map);
    free_q(&q);
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

/* The scaled tables the SIMD products load: every entry is the exact
 * decode(q) * scale (both products are exact in F32). */
static void test_scaled_tables(void **state) {
    (void)state;
    const float(*e2)[16] = df_e2m1_tables(), (*i4)[16] = df_i4_tables();
    for (unsigned s = 0; s < 256; s++)
        for (unsigned q = 0; q < 16; q++) {
            double want = ref_e2m1(q) * ref_e8m0((uint8_t)s);
            if (!(e2[s][q] == (float)want || (isnan(want) && isnan(e2[s][q]))))
                fail_msg("e2m1 table [%u][%u] = %g, want %g", s, q, e2[s][q], want);
        }
    for (unsigned i = 0; i < DF_I4_TAB_N; i++)
        for (unsigned q = 0; q < 16; q++) {
            double want = ref_i4(q) * ref_bf16((uint16_t)(DF_I4_TAB_LO + i));
            if (i4[i][q] != (float)want || (double)i4[i][q] != want)
                fail_msg("int4 table [0x%x][%u] = %g, want %g", DF_I4_TAB_LO + i, q, i4[i][q], want);
        }
}

/* Every E8M0 scale code, and BF16 scales of every kind, at group positions
 * that the SIMD products widen 8 or 16 at a time (E8M0 0 and 255 are special
 * cases there: 2^-127 and NaN). INT4 twice: with scales of every kind, and
 * with scales that df_i4_tables holds, its first and last among them, and
 * two rows with one scale just outside it (AVX-512 multiplies for 16 groups
 * of a row that have any such scale). */
static void test_products_all_scales(void **state) {
    (void)state;
    static const uint16_t bf16[] = {0x3f80, 0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0x0001, 0x0040,
                                    0x8000, 0x0000, 0x0080, 0xc2f7, 0x2f7f, 0x2f80, 0x3f7f};
    static const uint16_t tabled[] = {DF_I4_TAB_LO, DF_I4_TAB_LO + DF_I4_TAB_N - 1, 0x3c01, 0x3a55, 0x3000};
    const df_wfmt fs[3] = {df_wfmt_mxfp4(), df_wfmt_int4_group(), df_wfmt_int4_group()};
    for (int fi = 0; fi < 3; fi++) {
        enum { N = 16, G = 21, K = 32 * (G - 1) + 5 };
        qmat q = make_q(fs[fi], N, K, 0);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < G; j++) {
                int c = (n * G + j) % 256;
                if (fi == 0) q.sc[n * G + j] = (uint8_t)c;
                else if (fi == 1) memcpy(q.sc + 2 * (n * G + j), &bf16[c % (sizeof bf16 / 2)], 2);
                else memcpy(q.sc + 2 * (n * G + j), &tabled[c % (sizeof tabled / 2)], 2);
            }
        if (fi == 2) { /* just outside the table at each end, among scales inside it */
            const uint16_t lo = DF_I4_TAB_LO - 1, hi = DF_I4_TAB_LO + DF_I4_TAB_N;
            memcpy(q.sc + 2 * (3 * G + 5), &hi, 2);
            memcpy(q.sc + 2 * (7 * G + 18), &lo, 2);
        }
        check_q(&q, 1, 1);
        check_q(&q, 5, 1);
        free_q(&q);
    }
}

/* Row views (df_wview_rows) at offsets inside a block give the rows of the
 * whole matrix, in products and in decoding. */
static void test_row_views(void **state) {
    (void)state;
    int nf;
    const df_wfmt *fs = fmt_list(&nf);
    for (int fi = 0; fi < nf; fi++) {
        enum { N = 300, K = 161, T = 3 };
        qmat q = make_q(fs[fi], N, K, 0);
        float x[T * K], yf[T * N], ys[T * N], wf[N * K], ws[N * K];
        for (int i = 0; i < T * K; i++) x[i] = rndf();
        for (int isa = 0; isa < n_isas(); isa++) {
            assert_int_equal(df_isa_set((df_isa)isa), 0);
            df_matmul(g_pools[1], yf, N, x, K, &q.v, T);
            df_wview_decode_rows(wf, &q.v, 0, N);
            static const int r0s[] = {0, 1, 100, 127, 128, 129, 250};
            for (size_t i = 0; i < sizeof r0s / sizeof *r0s; i++) {
                int r0 = r0s[i], n = N - r0 < 45 ? N - r0 : 45;
                df_wview s = df_wview_rows(&q.v, r0, n);
                df_wview s2 = df_wview_rows(&s, 7, n - 7); /* a view of a view */
                df_matmul(g_pools[2], ys, N, x, K, &s, T);
                for (int t = 0; t < T; t++) assert_memory_equal(ys + t * N, yf + t * N + r0, sizeof(float) * n);
                df_matmul_rows(ys, N, x, K, &s2, T, 0, n - 7);
                for (int t = 0; t < T; t++) assert_memory_equal(ys + t * N, yf + t * N + r0 + 7, sizeof(float) * (n - 7));
                df_wview_decode_rows(ws, &s, 2, n - 2);
                assert_memory_equal(ws, wf + (size_t)(r0 + 2) * K, sizeof(float) * (size_t)(n - 2) * K);
            }
        }
        free_q(&q);
    }
    assert_int_equal(df_isa_set(df_isa_detect()), 0);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wfmt_api),
        cmocka_unit_test(test_e4m3_codes),
        cmocka_unit_test(test_e2m1_e8m0),
        cmocka_unit_test(test_i4_layout),
        cmocka_unit_test(test_products_grid),
        cmocka_unit_test(test_products_big),
        cmocka_unit_test(test_products_special),
        cmocka_unit_test(test_products_fp8_forms),
        cmocka_unit_test(test_products_fp8_map),
        cmocka_unit_test(test_products_fp8_pow2),
        cmocka_unit_test(test_scaled_tables),
        cmocka_unit_test(test_products_all_scales),
        cmocka_unit_test(test_row_views),
    };
    return cmocka_run_group_tests(tests, setup_pools, teardown_pools);
}
