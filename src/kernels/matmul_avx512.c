/*
 * matmul_avx512.c - the AVX-512 path of the products and conversions (compiled
 * with the AVX-512 flags; only called when isa.c found CPU and OS support).
 *
 * One __m512 accumulator per output element is exactly the 16 lanes of the
 * contract: lane j of the vector sums elements k = j (mod 16) with
 * _mm512_fmadd_ps, the tail is loaded with zero-masking so the padded lanes
 * still see fma(0, 0, lane), and hsum16 adds the halves in the fixed tree order.
 * Results are therefore bit-identical to the C path.
 *
 * Why the avx512_bf16 dot-product instruction (VDPBF16PS) is not used: it takes
 * BOTH operands in BF16, so the F32 activations would have to be rounded to
 * BF16 first, and it sums pairs of products with its own intermediate rounding
 * (and flushes denormals). That loses precision this project does not give up
 * and breaks the bit-exact order shared with the AVX2 and C paths. BF16 weights
 * are instead widened exactly (zero-extend, shift left 16) and multiplied in F32.
 *
 * Speed: decode (T = 1) is bound by streaming the weights, so 4 rows are done
 * together to share each activation load and keep several independent FMA
 * chains and memory streams in flight, with a software prefetch (see rows()).
 * For T > 1 a 6-row x 4-token register tile (24 accumulators) loads and widens
 * each weight vector once for 4 tokens (measured best of 4x4, 4x5, 4x6, 5x4,
 * 6x4, 8x3: ~87% of peak FMA rate on Zen 5); tokens are processed in blocks
 * whose activations stay in L2 while the weights stream past. The tile sizes
 * only change speed, never results: every output has its own accumulator.
 */
#include "kernels/kernels.h"
#include "kernels/softmax.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

void df_matmul_rows_avx512(float *y, int ldy, const float *x, int ldx, const void *w,
                           df_dtype wt, int T, int n0, int n1, int K);
float df_dot_f32_avx512(const float *a, const float *b, int n);
void df_axpy_f32_avx512(float *y, float a, const float *x, int n);
void df_scale_f32_avx512(float *x, int n, float s);
void df_axpy_rows_avx512(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx,
                         int R, const int *n, int c0, int c1);
void df_to_f32_avx512(float *dst, const void *src, df_dtype t, size_t n);
float df_softmax_exp_f32_avx512(float *x, int n, float scale, float *sum);
void df_to_f32_c(float *dst, const void *src, df_dtype t, size_t n);

#define INL static inline __attribute__((always_inline))

/* Register tile (TN rows x TT tokens) for T > 1, and the row group for T == 1.
 * Overridable with -D for tuning experiments. */
#ifndef TN
#define TN 6
#endif
#ifndef TT
#define TT 4
#endif
#ifndef GN
#define GN 4
#endif

INL __m512 ld16(const char *p, int dt) {
    if (dt == DF_DT_F32) return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (dt == DF_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL __m512 ld16m(const char *p, int dt, __mmask16 m) {
    if (dt == DF_DT_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (dt == DF_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* lanes[i] += lanes[i+8]; +4; +2; +1 -> lane 0 */
INL float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* y[t][r] for r < RN rows starting at w (row stride rs bytes), t < RT tokens. */
INL void tile(float *y, int ldy, const float *x, int ldx, const char *w, size_t rs, int K,
              int dt, int RN, int RT, int pf) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    __m512 acc[TN > GN ? TN : GN][TT];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[TN > GN ? TN : GN];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            const char *p = w + r * rs + (size_t)k * es;
            if (pf) _mm_prefetch(p + pf, _MM_HINT_T1);
            wv[r] = ld16(p, dt);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)t * ldx + k);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 wv[TN > GN ? TN : GN];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) wv[r] = ld16m(w + r * rs + (size_t)k * es, dt, m);
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + k);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) y[(size_t)t * ldy + r] = hsum16(acc[r][t]);
}

/* RN rows for nt tokens: full TT-token tiles, then one tile for the rest. */
_Static_assert(TT == 4, "strip() has a case for each leftover count 1..TT-1");
INL void strip(float *y, int ldy, const float *x, int ldx, const char *w, size_t rs, int K, int dt,
               int RN, int nt) {
    int t = 0, tf = nt - nt % TT;
    for (; t < tf; t += TT)
        tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, TT, 0);
    switch (nt - tf) {
    case 3: tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, 3, 0); break;
    case 2: tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, 2, 0); break;
    case 1: tile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, K, dt, RN, 1, 0); break;
    default: break;
    }
}

/* Rows [n0, n1) for tokens [0, T) of one dtype; dt is a constant after inlining. */
INL void rows(float *y, int ldy, const float *x, int ldx, const char *w, int dt, int T, int n0,
              int n1, int K) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    const size_t rs = (size_t)K * es;
    if (T == 1) {
        /* Software prefetch (into L2) of the same offset in the next row
         * group: the 4 rows of a group are short streams (4 KB for K = 2048),
         * too short for the hardware prefetcher to reach full distance (+40%
         * bandwidth on Zen 5; T1 measured ~5% better than T0). Long rows
         * instead prefetch 2 KB ahead in their own row. */
        int pf = GN * rs <= (32u << 10) ? (int)(GN * rs) : 2048;
        int n = n0;
        for (; n + GN <= n1; n += GN) tile(y + n, ldy, x, ldx, w + n * rs, rs, K, dt, GN, 1, pf);
        for (; n < n1; n++) tile(y + n, ldy, x, ldx, w + n * rs, rs, K, dt, 1, 1, 0);
        return;
    }
    /* Token block: its activations (TB x K floats) should stay in L2 while all
     * rows of this range stream past them. */
    int tb = (int)(((size_t)256 << 10) / ((size_t)(K ? K : 1) * 4));
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

void df_matmul_rows_avx512(float *y, int ldy, const float *x, int ldx, const void *w,
                           df_dtype wt, int T, int n0, int n1, int K) {
    switch (wt) {
    case DF_DT_F32: rows_f32(y, ldy, x, ldx, w, T, n0, n1, K); break;
    case DF_DT_F16: rows_f16(y, ldy, x, ldx, w, T, n0, n1, K); break;
    default: rows_bf16(y, ldy, x, ldx, w, T, n0, n1, K); break;
    }
}

float df_dot_f32_avx512(const float *a, const float *b, int n) {
    float y;
    tile(&y, 1, b, 0, (const char *)a, 0, n, DF_DT_F32, 1, 1, 0);
    return y;
}

void df_axpy_f32_avx512(float *y, float a, const float *x, int n) {
    __m512 av = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

void df_scale_f32_avx512(float *x, int n, float s) {
    __m512 sv = _mm512_set1_ps(s);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sv));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv));
    }
}

/* ---- df_axpy_rows ------------------------------------------------------------
 * A tile is RN rows x 64 columns (4 vectors, the last ones masked at the edge):
 * 16 accumulators live in registers across a block of positions, each step
 * loads 4 vectors of x once for the RN rows and broadcasts one a per row.
 * Positions go in blocks of AR_JB so that a block of x (AR_JB rows of one
 * thread's columns) stays in L2 while every row passes over it: x is read from
 * memory once per call, not once per row. Each element still sees its fused
 * multiply-adds in position order, so the result is df_axpy_f32's. */
#define AR_JB 64

INL void ar_tile(float *y, int ldy, const float *a, int lda, const char *x, size_t xs, int dt, int RN,
                 const __mmask16 *m, int j0, int j1) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2;
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_maskz_loadu_ps(m[v], y + (size_t)r * ldy + 16 * v);
    for (int j = j0; j < j1; j++) {
        const char *xr = x + (size_t)j * xs;
        __m512 xv[4];
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) xv[v] = ld16m(xr + (size_t)16 * v * es, dt, m[v]);
        #pragma GCC unroll 4
        for (int r = 0; r < RN; r++) {
            __m512 b = _mm512_set1_ps(a[(size_t)r * lda + j]);
            #pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_fmadd_ps(b, xv[v], acc[r][v]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * v, m[v], acc[r][v]);
}

INL void axpy_rows(float *y, int ldy, const float *a, int lda, const char *x, int dt, int ldx, int R,
                   const int *n, int c0, int c1) {
    const size_t es = dt == DF_DT_F32 ? 4 : 2, xs = (size_t)ldx * es;
    int nmax = 0;
    for (int r = 0; r < R; r++) nmax = n[r] > nmax ? n[r] : nmax;
    for (int jb = 0; jb < nmax; jb += AR_JB) {
        for (int c = c0; c < c1; c += 64) {
            __mmask16 m[4];
            for (int v = 0; v < 4; v++) {
                int left = c1 - c - 16 * v;
                m[v] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            }
            /* rows in runs of up to 4 that end this block at the same position */
            for (int r = 0; r < R;) {
                int je = n[r] < jb + AR_JB ? n[r] : jb + AR_JB;
                if (je <= jb) {
                    r++;
                    continue;
                }
                int rn = 1;
                while (rn < 4 && r + rn < R && (n[r + rn] < jb + AR_JB ? n[r + rn] : jb + AR_JB) == je) rn++;
                float *yt = y + (size_t)r * ldy + c;
                const float *at = a + (size_t)r * lda;
                const char *xt = x + (size_t)c * es;
                switch (rn) {
                case 4: ar_tile(yt, ldy, at, lda, xt, xs, dt, 4, m, jb, je); break;
                case 3: ar_tile(yt, ldy, at, lda, xt, xs, dt, 3, m, jb, je); break;
                case 2: ar_tile(yt, ldy, at, lda, xt, xs, dt, 2, m, jb, je); break;
                default: ar_tile(yt, ldy, at, lda, xt, xs, dt, 1, m, jb, je); break;
                }
                r += rn;
            }
        }
    }
}

void df_axpy_rows_avx512(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx,
                         int R, const int *n, int c0, int c1) {
    switch (xt) {
    case DF_DT_F32: axpy_rows(y, ldy, a, lda, x, DF_DT_F32, ldx, R, n, c0, c1); break;
    case DF_DT_F16: axpy_rows(y, ldy, a, lda, x, DF_DT_F16, ldx, R, n, c0, c1); break;
    default: axpy_rows(y, ldy, a, lda, x, DF_DT_BF16, ldx, R, n, c0, c1); break;
    }
}

/* ---- df_softmax_exp_f32: softmax.c's C path, 16 elements at a time --------- */

INL __m512 exp16(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(DF_EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DF_EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DF_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(DF_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DF_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DF_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DF_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DF_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DF_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* out-of-range lanes give garbage here and are replaced below */
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(DF_EXP_LO), _CMP_LT_OQ), _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(DF_EXP_HI), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

float df_softmax_exp_f32_avx512(float *x, int n, float scale, float *sum) {
    __m512 sc = _mm512_set1_ps(scale), mx = _mm512_set1_ps(-INFINITY);
    int j = 0;
    /* max_ps(v, acc) returns acc where v is NaN: NaNs are skipped, as in C */
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), sc);
        _mm512_storeu_ps(x + j, v);
        mx = _mm512_max_ps(v, mx);
    }
    __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
    if (j < n) {
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), sc);
        _mm512_mask_storeu_ps(x + j, m, v);
        mx = _mm512_mask_max_ps(mx, m, v, mx);
    }
    __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), lanes = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
        _mm512_storeu_ps(x + j, e);
        lanes = _mm512_add_ps(lanes, e);
    }
    if (j < n) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), mv));
        _mm512_mask_storeu_ps(x + j, m, e);
        lanes = _mm512_mask_add_ps(lanes, m, lanes, e);
    }
    *sum = hsum16(lanes);
    return _mm512_cvtss_f32(mv);
}

void df_to_f32_avx512(float *dst, const void *src, df_dtype t, size_t n) {
    if (t != DF_DT_F16 && t != DF_DT_BF16) {
        df_to_f32_c(dst, src, t, n);
        return;
    }
    const char *s = src;
    size_t i = 0;
    if (t == DF_DT_F16) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld16(s + 2 * i, DF_DT_F16));
        if (i < n) {
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            _mm512_mask_storeu_ps(dst + i, m, ld16m(s + 2 * i, DF_DT_F16, m));
        }
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld16(s + 2 * i, DF_DT_BF16));
        if (i < n) {
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            _mm512_mask_storeu_ps(dst + i, m, ld16m(s + 2 * i, DF_DT_BF16, m));
        }
    }
}

#endif
