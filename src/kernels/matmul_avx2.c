/*
 * matmul_avx2.c - the AVX2+FMA+F16C path of the products and conversions
 * (compiled with those flags; only called when isa.c found CPU and OS support).
 *
 * The contract's 16 lanes are two __m256 accumulators per output: elements
 * 16i..16i+7 go to `lo` (lanes 0-7), 16i+8..16i+15 to `hi` (lanes 8-15), each
 * with _mm256_fmadd_ps. The reduction lo+hi is the contract's lanes[i] +=
 * lanes[i+8] step, followed by +4, +2, +1, so results match the C and AVX-512
 * paths bit for bit. The tail (K % 16 elements) is copied into zeroed stack
 * buffers and run through the same step, so padded lanes see fma(0, 0, lane).
 *
 * Tiles: T == 1 does 4 rows at once (8 accumulators); T > 1 a 3-row x 2-token
 * tile (12 accumulators + 3 weights + 1 activation = the 16 registers; it
 * measured a little faster than 2x3 and 2x2 on Zen 5).
 */
#include "kernels/kernels.h"
#include "kernels/softmax.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

void df_matmul_rows_avx2(float *y, int ldy, const float *x, int ldx, const void *w,
                         df_dtype wt, int T, int n0, int n1, int K);
float df_dot_f32_avx2(const float *a, const float *b, int n);
void df_axpy_f32_avx2(float *y, float a, const float *x, int n);
void df_scale_f32_avx2(float *x, int n, float s);
void df_axpy_rows_avx2(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                       const int *n, int c0, int c1);
void df_to_f32_avx2(float *dst, const void *src, df_dtype t, size_t n);
float df_softmax_exp_f32_avx2(float *x, int n, float scale, float *sum);
void df_to_f32_c(float *dst, const void *src, df_dtype t, size_t n);

#define INL static inline __attribute__((always_inline))

#ifndef TN
#define TN 3
#endif
#ifndef TT
#define TT 2
#endif
#ifndef GN
#define GN 4
#endif
#define MAXN 4

INL __m256 ld8(const char *p, int dt) {
    if (dt == DF_DT_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == DF_DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* lo + hi is lanes[i] += lanes[i+8]; then +4, +2, +1 */
INL float hsum2x8(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

INL void step(__m256 acc[MAXN][TT][2], const char *const *wp, const float *const *xp, int dt,
              int RN, int RT) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    #pragma GCC unroll 8
    for (int h = 0; h < 2; h++) {
        __m256 wv[MAXN];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) wv[r] = ld8(wp[r] + h * 8 * es, dt);
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) {
            __m256 xv = _mm256_loadu_ps(xp[t] + h * 8);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) acc[r][t][h] = _mm256_fmadd_ps(wv[r], xv, acc[r][t][h]);
        }
    }
}

INL void tile(float *y, int ldy, const float *x, int ldx, const char *w, size_t rs, int K,
              int dt, int RN, int RT, int pf) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    __m256 acc[MAXN][TT][2];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    const char *wp[MAXN];
    const float *xp[TT];
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            wp[r] = w + r * rs + (size_t)k * es;
            if (pf) _mm_prefetch(wp[r] + pf, _MM_HINT_T1);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) xp[t] = x + (size_t)t * ldx + k;
        step(acc, wp, xp, dt, RN, RT);
    }
    if (k < K) {
        int rem = K - k;
        _Alignas(32) char wb[MAXN][64];
        _Alignas(32) float xb[TT][16];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            memset(wb[r], 0, sizeof wb[r]);
            memcpy(wb[r], w + r * rs + (size_t)k * es, (size_t)rem * es);
            wp[r] = wb[r];
        }
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) {
            memset(xb[t], 0, sizeof xb[t]);
            memcpy(xb[t], x + (size_t)t * ldx + k, (size_t)rem * 4);
            xp[t] = xb[t];
        }
        step(acc, wp, xp, dt, RN, RT);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) y[(size_t)t * ldy + r] = hsum2x8(acc[r][t][0], acc[r][t][1]);
}

/* RN rows for nt tokens: full TT-token tiles, then one tile for the rest. */
_Static_assert(TT == 2, "strip() has a case for each leftover count 1..TT-1");
INL void strip(float *y, int ldy, const float *x, int ldx, const char *w, size_t rs, int K, int dt,
               int RN, int nt) {
    int t = 0, tf = nt - nt % TT;
    for (; t < tf; t += TT)
        tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, TT, 0);
    if (nt > tf) tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, 1, 0);
}

/* Rows [n0, n1) for tokens [0, T) of one dtype; dt is a constant after inlining. */
INL void rows(float *y, int ldy, const float *x, int ldx, const char *w, int dt, int T, int n0,
              int n1, int K) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    const size_t rs = (size_t)K * es;
    if (T == 1) {
        /* prefetch: see matmul_avx512.c */
        int pf = GN * rs <= (32u << 10) ? (int)(GN * rs) : 2048;
        int n = n0;
        for (; n + GN <= n1; n += GN) tile(y + n, ldy, x, ldx, w + n * rs, rs, K, dt, GN, 1, pf);
        for (; n < n1; n++) tile(y + n, ldy, x, ldx, w + n * rs, rs, K, dt, 1, 1, 0);
        return;
    }
    /* token blocks as in matmul_avx512.c (smaller: AVX2-era L2s are smaller) */
    int tb = (int)(((size_t)192 << 10) / ((size_t)(K ? K : 1) * 4));
    tb = tb < TT ? TT : tb - tb % TT;
    for (int t0 = 0; t0 < T; t0 += tb) {
        int t1 = t0 + tb < T ? t0 + tb : T;
        const float *xb = x + (size_t)t0 * ldx;
        float *yb = y + (size_t)t0 * ldy;
        int nt = t1 - t0;
        for (int n = n0; n < n1;) {
            const char *wn = w + n * rs;
            int rn = n + TN <= n1 ? TN : n + 2 <= n1 ? 2 : 1;
            if (rn == TN) strip(yb + n, ldy, xb, ldx, wn, rs, K, dt, TN, nt);
            else if (rn == 2) strip(yb + n, ldy, xb, ldx, wn, rs, K, dt, 2, nt);
            else strip(yb + n, ldy, xb, ldx, wn, rs, K, dt, 1, nt);
            n += rn;
        }
    }
}

static void rows_f32(float *y, int ldy, const float *x, int ldx, const void *w, int T, int n0,
                     int n1, int K) {
    rows(y, ldy, x, ldx, w, DF_DT_F32, T, n0, n1, K);
}
static void rows_f16(float *y, int ldy, const float *x, int ldx, const void *w, int T, int n0,
                     int n1, int K) {
    rows(y, ldy, x, ldx, w, DF_DT_F16, T, n0, n1, K);
}
static void rows_bf16(float *y, int ldy, const float *x, int ldx, const void *w, int T, int n0,
                      int n1, int K) {
    rows(y, ldy, x, ldx, w, DF_DT_BF16, T, n0, n1, K);
}

void df_matmul_rows_avx2(float *y, int ldy, const float *x, int ldx, const void *w,
                         df_dtype wt, int T, int n0, int n1, int K) {
    switch (wt) {
    case DF_DT_F32: rows_f32(y, ldy, x, ldx, w, T, n0, n1, K); break;
    case DF_DT_F16: rows_f16(y, ldy, x, ldx, w, T, n0, n1, K); break;
    default: rows_bf16(y, ldy, x, ldx, w, T, n0, n1, K); break;
    }
}

float df_dot_f32_avx2(const float *a, const float *b, int n) {
    float y;
    tile(&y, 1, b, 0, (const char *)a, 0, n, DF_DT_F32, 1, 1, 0);
    return y;
}

void df_axpy_f32_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) {
        /* same single rounding as the vector body, without a libm call */
        __m128 r = _mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(x[i]), _mm_set_ss(y[i]));
        y[i] = _mm_cvtss_f32(r);
    }
}

void df_scale_f32_avx2(float *x, int n, float s) {
    __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
    for (; i < n; i++) x[i] *= s;
}

/* ---- df_axpy_rows ------------------------------------------------------------
 * As on the AVX-512 path (matmul_avx512.c): tiles of RN rows x CV vectors of 8
 * columns (RN 2 x CV 4: 8 accumulators + 4 x vectors + 1 broadcast), positions in
 * blocks of AR_JB, each element's fused multiply-adds in position order; the
 * last columns that fill no vector go one by one with the same scalar FMA. */
#define AR_JB 64

INL void ar_tile(float *y, int ldy, const float *a, int lda, const char *x, size_t xs, int dt, int RN, int CV,
                 int j0, int j1) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    __m256 acc[2][4];
    #pragma GCC unroll 2
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < CV; v++) acc[r][v] = _mm256_loadu_ps(y + (size_t)r * ldy + 8 * v);
    for (int j = j0; j < j1; j++) {
        const char *xr = x + (size_t)j * xs;
        __m256 xv[4];
        #pragma GCC unroll 4
        for (int v = 0; v < CV; v++) xv[v] = ld8(xr + (size_t)8 * v * es, dt);
        #pragma GCC unroll 2
        for (int r = 0; r < RN; r++) {
            __m256 b = _mm256_set1_ps(a[(size_t)r * lda + j]);
            #pragma GCC unroll 4
            for (int v = 0; v < CV; v++) acc[r][v] = _mm256_fmadd_ps(b, xv[v], acc[r][v]);
        }
    }
    #pragma GCC unroll 2
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < CV; v++) _mm256_storeu_ps(y + (size_t)r * ldy + 8 * v, acc[r][v]);
}

/* Columns [c, c1) that fill no vector: one scalar FMA per element. */
INL void ar_cols(float *y, const float *a, const char *x, size_t xs, int dt, int c, int c1, int j0, int j1) {
    for (int cc = c; cc < c1; cc++) {
        __m128 acc = _mm_set_ss(y[cc]);
        for (int j = j0; j < j1; j++) {
            float xj;
            const char *p = x + (size_t)j * xs;
            if (dt == DF_DT_F32) xj = ((const float *)p)[cc];
            else if (dt == DF_DT_F16) xj = df_f16_to_f32(((const uint16_t *)p)[cc]);
            else xj = df_bf16_to_f32(((const uint16_t *)p)[cc]);
            acc = _mm_fmadd_ss(_mm_set_ss(a[j]), _mm_set_ss(xj), acc);
        }
        y[cc] = _mm_cvtss_f32(acc);
    }
}

INL void ar_run(float *y, int ldy, const float *a, int lda, const char *x, size_t xs, int dt, int RN, int c0,
                int c1, int j0, int j1) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    int c = c0;
    for (; c + 32 <= c1; c += 32)
        if (RN == 2) ar_tile(y + c, ldy, a, lda, x + (size_t)c * es, xs, dt, 2, 4, j0, j1);
        else ar_tile(y + c, ldy, a, lda, x + (size_t)c * es, xs, dt, 1, 4, j0, j1);
    for (; c + 8 <= c1; c += 8)
        if (RN == 2) ar_tile(y + c, ldy, a, lda, x + (size_t)c * es, xs, dt, 2, 1, j0, j1);
        else ar_tile(y + c, ldy, a, lda, x + (size_t)c * es, xs, dt, 1, 1, j0, j1);
    if (c < c1)
        for (int r = 0; r < RN; r++)
            ar_cols(y + (size_t)r * ldy, a + (size_t)r * lda, x, xs, dt, c, c1, j0, j1);
}

INL void axpy_rows(float *y, int ldy, const float *a, int lda, const char *x, int dt, int ldx, int R,
                   const int *n, int c0, int c1) {
    const size_t xs = (size_t)ldx * (dt == DF_DT_F32 ? 4 : 2);
    int nmax = 0;
    for (int r = 0; r < R; r++) nmax = n[r] > nmax ? n[r] : nmax;
    for (int jb = 0; jb < nmax; jb += AR_JB) {
        for (int r = 0; r < R;) {
            int je = n[r] < jb + AR_JB ? n[r] : jb + AR_JB;
            if (je <= jb) {
                r++;
                continue;
            }
            int rn = r + 1 < R && (n[r + 1] < jb + AR_JB ? n[r + 1] : jb + AR_JB) == je ? 2 : 1;
            ar_run(y + (size_t)r * ldy, ldy, a + (size_t)r * lda, lda, x, xs, dt, rn, c0, c1, jb, je);
            r += rn;
        }
    }
}

void df_axpy_rows_avx2(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                       const int *n, int c0, int c1) {
    switch (xt) {
    case DF_DT_F32: axpy_rows(y, ldy, a, lda, x, DF_DT_F32, ldx, R, n, c0, c1); break;
    case DF_DT_F16: axpy_rows(y, ldy, a, lda, x, DF_DT_F16, ldx, R, n, c0, c1); break;
    default: axpy_rows(y, ldy, a, lda, x, DF_DT_BF16, ldx, R, n, c0, c1); break;
    }
}

/* ---- df_softmax_exp_f32: softmax.c's C path, 8 elements at a time ---------- */

INL __m256 exp8(__m256 x) {
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(DF_EXP_LOG2E), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DF_EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DF_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(DF_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DF_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DF_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DF_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DF_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DF_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* out-of-range lanes give garbage here and are replaced below */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(DF_EXP_LO), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(DF_EXP_HI), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

float df_softmax_exp_f32_avx2(float *x, int n, float scale, float *sum) {
    __m256 sc = _mm256_set1_ps(scale), mv = _mm256_set1_ps(-INFINITY);
    int j = 0;
    /* max_ps(v, acc) returns acc where v is NaN: NaNs are skipped, as in C */
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), sc);
        _mm256_storeu_ps(x + j, v);
        mv = _mm256_max_ps(v, mv);
    }
    _Alignas(32) float b[16];
    _mm256_store_ps(b, mv);
    float mx = -INFINITY;
    for (int i = 0; i < 8; i++)
        if (b[i] > mx) mx = b[i];
    for (; j < n; j++)
        if ((x[j] *= scale) > mx) mx = x[j];
    __m256 m = _mm256_set1_ps(mx), lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), m));
        __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), m));
        _mm256_storeu_ps(x + j, e0), _mm256_storeu_ps(x + j + 8, e1);
        lo = _mm256_add_ps(lo, e0), hi = _mm256_add_ps(hi, e1);
    }
    if (j < n) {
        /* the tail padded with -inf, whose exp is +0: the lanes do not change */
        for (int i = 0; i < 16; i++) b[i] = j + i < n ? x[j + i] : -INFINITY;
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_load_ps(b), m)), e1 = exp8(_mm256_sub_ps(_mm256_load_ps(b + 8), m));
        lo = _mm256_add_ps(lo, e0), hi = _mm256_add_ps(hi, e1);
        _mm256_store_ps(b, e0), _mm256_store_ps(b + 8, e1);
        for (int i = 0; j + i < n; i++) x[j + i] = b[i];
    }
    *sum = hsum2x8(lo, hi);
    return mx;
}

void df_to_f32_avx2(float *dst, const void *src, df_dtype t, size_t n) {
    if (t != DF_DT_F16 && t != DF_DT_BF16) {
        df_to_f32_c(dst, src, t, n);
        return;
    }
    const char *s = src;
    size_t i = 0;
    if (t == DF_DT_F16) {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(s + 2 * i, DF_DT_F16));
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(s + 2 * i, DF_DT_BF16));
    }
    if (i < n) {
        _Alignas(32) uint16_t b[8] = {0};
        _Alignas(32) float f[8];
        memcpy(b, s + 2 * i, (n - i) * 2);
        _mm256_storeu_ps(f, ld8((const char *)b, t == DF_DT_F16 ? DF_DT_F16 : DF_DT_BF16));
        memcpy(dst + i, f, (n - i) * 4);
    }
}

#endif
