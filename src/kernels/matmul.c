/*
 * matmul.c - the products and conversions of kernels.h: dispatch to the selected
 * instruction-set path, the threaded df_matmul, and the portable C path, which
 * is also the reference the SIMD paths must match bit for bit.
 *
 * The fixed summation order (kernels.h): 16 lane accumulators, element k into
 * lane k % 16 with a fused multiply-add, the tail padded with zeros that still
 * go through fma(0, 0, lane), then lanes[i] += lanes[i+8], +4, +2, +1. The
 * padding matters: a lane can hold -0 (fma(-tiny, tiny, +0) underflows to -0)
 * and fma(0, 0, -0) is +0, so "skipping" padded elements would change signs of
 * zero. df_axpy_f32 uses one fused multiply-add per element on every path.
 *
 * Files compiled without ISA flags (this one) call fmaf(), which glibc runs as
 * a single FMA instruction where the CPU has one and emulates exactly where not.
 */
#include "kernels/scaled.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#define DF_HAVE_X86 1
/* Defined in matmul_avx2.c / matmul_avx512.c (compiled with their ISA flags). */
void df_matmul_rows_avx2(float *y, int ldy, const float *x, int ldx, const void *w,
                         df_dtype wt, int T, int n0, int n1, int K);
float df_dot_f32_avx2(const float *a, const float *b, int n);
void df_axpy_f32_avx2(float *y, float a, const float *x, int n);
void df_scale_f32_avx2(float *x, int n, float s);
void df_axpy_rows_avx2(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                       const int *n, int c0, int c1);
void df_to_f32_avx2(float *dst, const void *src, df_dtype t, size_t n);
void df_matmul_rows_avx512(float *y, int ldy, const float *x, int ldx, const void *w,
                           df_dtype wt, int T, int n0, int n1, int K);
float df_dot_f32_avx512(const float *a, const float *b, int n);
void df_axpy_f32_avx512(float *y, float a, const float *x, int n);
void df_scale_f32_avx512(float *x, int n, float s);
void df_axpy_rows_avx512(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx,
                         int R, const int *n, int c0, int c1);
void df_to_f32_avx512(float *dst, const void *src, df_dtype t, size_t n);
#else
#define DF_HAVE_X86 0
#endif

/* Portable conversions used by the C path and by every path for the dtypes
 * that the SIMD code does not special-case. */
void df_to_f32_c(float *dst, const void *src, df_dtype t, size_t n);

static void bad_dtype(df_dtype wt) {
    /* A programming error, not bad input: loaders reject non-computable dtypes
     * (df_dtype_computable) before any tensor reaches a kernel. */
    fprintf(stderr, "deltafin: kernel called with non-computable dtype %s\n",
            df_dtype_name(wt));
    abort();
}

/* ---- portable C path ----------------------------------------------------- */

static inline float load_w(const void *w, df_dtype wt, size_t k) {
    switch (wt) {
    case DF_DT_F32: return ((const float *)w)[k];
    case DF_DT_F16: return df_f16_to_f32(((const uint16_t *)w)[k]);
    default: return df_bf16_to_f32(((const uint16_t *)w)[k]);
    }
}

static inline float reduce16(float *l) {
    for (int i = 0; i < 8; i++) l[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) l[i] = l[i] + l[i + 4];
    for (int i = 0; i < 2; i++) l[i] = l[i] + l[i + 2];
    return l[0] + l[1];
}

static float dot_c(const void *w, df_dtype wt, const float *x, int K) {
    float lanes[16] = {0};
    int kp = (K + 15) & ~15;
    for (int k = 0; k < kp; k++) {
        float a = 0.0f, b = 0.0f;
        if (k < K) {
            a = load_w(w, wt, (size_t)k);
            b = x[k];
        }
        lanes[k & 15] = fmaf(a, b, lanes[k & 15]);
    }
    return reduce16(lanes);
}

static void matmul_rows_c(float *y, int ldy, const float *x, int ldx, const void *w,
                          df_dtype wt, int T, int n0, int n1, int K) {
    size_t es = df_dtype_size(wt);
    for (int n = n0; n < n1; n++) {
        const void *row = (const char *)w + (size_t)n * (size_t)K * es;
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + n] = dot_c(row, wt, x + (size_t)t * ldx, K);
    }
}

/* The scaled formats: each chunk of 16 weights is decoded once (the
 * definition, df_qdecode16_c) and used for up to 8 tokens at a time. */
void df_qrows_c(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1) {
    const int K = w->cols, kp = (K + 15) & ~15;
    size_t rb = df_wfmt_row_bytes(w->fmt, K);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)n * rb, *srow = df_scale_row(w, n);
        for (int t0 = 0; t0 < T; t0 += 8) {
            int nt = T - t0 < 8 ? T - t0 : 8;
            float lanes[8][16] = {{0}}, wv[16];
            for (int k0 = 0; k0 < kp; k0 += 16) {
                df_qdecode16_c(wv, w, row, srow, k0);
                for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)(t0 + t) * ldx;
                    for (int i = 0; i < 16; i++)
                        lanes[t][i] = fmaf(wv[i], k0 + i < K ? xt[k0 + i] : 0.0f, lanes[t][i]);
                }
            }
            for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * ldy + n] = reduce16(lanes[t]);
        }
    }
}

static float dot_f32_c(const float *a, const float *b, int n) {
    return dot_c(a, DF_DT_F32, b, n < 0 ? 0 : n);
}

static void axpy_f32_c(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* Row r, then position j, then column: each element's chain of fmaf in j order. */
static void axpy_rows_c(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                        const int *n, int c0, int c1) {
    size_t es = df_dtype_size(xt);
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * (size_t)ldy;
        for (int j = 0; j < n[r]; j++) {
            const void *xj = (const char *)x + (size_t)j * (size_t)ldx * es;
            float aj = a[(size_t)r * (size_t)lda + (size_t)j];
            for (int c = c0; c < c1; c++) yr[c] = fmaf(aj, load_w(xj, xt, (size_t)c), yr[c]);
        }
    }
}

static float f8_to_f32(uint8_t v, int ebits, int mbits, int bias, int e4m3) {
    int sign = v >> 7, e = (v >> mbits) & ((1 << ebits) - 1), m = v & ((1 << mbits) - 1);
    float r;
    if (e4m3 && e == 15 && m == 7) {
        r = NAN; /* E4M3 has no infinities, only this NaN */
    } else if (!e4m3 && e == 31) {
        r = m ? NAN : INFINITY;
    } else if (e == 0) {
        r = ldexpf((float)m, 1 - bias - mbits);
    } else {
        r = ldexpf((float)(m | (1 << mbits)), e - bias - mbits);
    }
    return sign ? -r : r;
}

void df_to_f32_c(float *dst, const void *src, df_dtype t, size_t n) {
    switch (t) {
    case DF_DT_F32: memcpy(dst, src, n * 4); return;
    case DF_DT_F16:
        for (size_t i = 0; i < n; i++) dst[i] = df_f16_to_f32(((const uint16_t *)src)[i]);
        return;
    case DF_DT_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = df_bf16_to_f32(((const uint16_t *)src)[i]);
        return;
    case DF_DT_F64:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
        return;
    case DF_DT_I64:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const int64_t *)src)[i];
        return;
    case DF_DT_I32:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const int32_t *)src)[i];
        return;
    case DF_DT_I16:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const int16_t *)src)[i];
        return;
    case DF_DT_I8:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const int8_t *)src)[i];
        return;
    case DF_DT_U8:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const uint8_t *)src)[i];
        return;
    case DF_DT_BOOL:
        for (size_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i] ? 1.0f : 0.0f;
        return;
    case DF_DT_F8_E4M3:
        for (size_t i = 0; i < n; i++) dst[i] = f8_to_f32(((const uint8_t *)src)[i], 4, 3, 7, 1);
        return;
    case DF_DT_F8_E5M2:
        for (size_t i = 0; i < n; i++) dst[i] = f8_to_f32(((const uint8_t *)src)[i], 5, 2, 15, 0);
        return;
    default:
        bad_dtype(t);
    }
}

/* ---- dispatch ------------------------------------------------------------ */

typedef void (*rows_fn)(float *, int, const float *, int, const void *, df_dtype, int, int,
                        int, int);

static rows_fn rows_for(df_isa isa) {
#if DF_HAVE_X86
    if (isa == DF_ISA_AVX512) return df_matmul_rows_avx512;
    if (isa == DF_ISA_AVX2) return df_matmul_rows_avx2;
#else
    (void)isa;
#endif
    return matmul_rows_c;
}

typedef void (*qrows_fn)(float *, int, const float *, int, const df_wview *, int, int, int);

static qrows_fn qrows_for(df_isa isa) {
#if DF_HAVE_X86
    if (isa == DF_ISA_AVX512) return df_qrows_avx512;
    if (isa == DF_ISA_AVX2) return df_qrows_avx2;
#else
    (void)isa;
#endif
    return df_qrows_c;
}

/* ---- scaled products of many tokens --------------------------------------
 * The SIMD paths' tiles decode each chunk of a row for the 4 tokens of a tile
 * (AVX2: 2), so at many tokens they decode each row many times. From a few
 * tokens on (stage_from) the rows are decoded once instead, G at a time,
 * into the exact weights fl(decode(q) * s) of the contract (F32) in a
 * DF_STAGE_BYTES scratch that stays in L2, and the F32 products run over it
 * for up to STAGE_TB tokens: the same weights in the same lanes, so the same
 * results bit for bit. bench_kernels --formats, 2 threads, [2048 x 7168]
 * (docs/benchmarks.md, "Decoded once"): AVX-512 FP8 1.45x at T = 64, 1.14x
 * at 16, slower below 12; its 4-bit tiles, which decode 16 values with a
 * shift and a vpermps, gain nothing (0.9-1.07x). AVX2: FP8 1.29x at 64, 4-bit
 * 1.77x at 64 and 1.33x at 8; slower below 8 (FP8) and 6 (4-bit). */
#define STAGE_TB 64
#define STAGE_ROWS(K) ((int)(DF_STAGE_BYTES / 4 / (size_t)(K)) / 6 * 6) /* whole F32 tiles (6 rows; AVX2 3) */

/* The fewest tokens from which a path decodes rows once; 0: never. */
static int stage_from(df_isa isa, df_elem el) {
    if (isa == DF_ISA_AVX512) return el == DF_EL_F8_E4M3 ? 12 : 0;
    if (isa == DF_ISA_AVX2) return el == DF_EL_F8_E4M3 ? 8 : 6;
    return 0; /* the C path is the definition: it stays direct */
}

static bool staged(const df_wview *w, int T, df_isa isa) {
    int from = stage_from(isa, w->fmt.elem);
    return from && T >= from && w->cols > 0 && STAGE_ROWS(w->cols) >= 6;
}

static void qrows_staged(df_isa isa, float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0,
                         int n1) {
    _Alignas(64) float buf[DF_STAGE_BYTES / 4];
    const int K = w->cols, G = STAGE_ROWS(K);
    rows_fn rows = rows_for(isa);
    for (int t0 = 0; t0 < T; t0 += STAGE_TB) {
        int nt = T - t0 < STAGE_TB ? T - t0 : STAGE_TB;
        for (int n = n0; n < n1; n += G) {
            int g = n1 - n < G ? n1 - n : G;
            df_qdecode_on(isa, buf, w, n, g);
            rows(y + (size_t)t0 * ldy + n, ldy, x + (size_t)t0 * ldx, ldx, buf, DF_DT_F32, nt, 0, g, K);
        }
    }
}

/* The scaled formats' products of rows [n0, n1) on one path. */
static void qrows_on(df_isa isa, float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0,
                     int n1) {
    if (staged(w, T, isa)) qrows_staged(isa, y, ldy, x, ldx, w, T, n0, n1);
    else qrows_for(isa)(y, ldy, x, ldx, w, T, n0, n1);
}

/* The stored dtype a dense format's values are read as; DF_DT_COUNT for a
 * scaled format. */
static df_dtype dense_dtype(const df_wview *w) {
    if (w->fmt.scale != DF_SC_NONE && df_wfmt_computable(w->fmt) && w->scale) return DF_DT_COUNT;
    switch (w->fmt.scale == DF_SC_NONE ? w->fmt.elem : DF_EL_COUNT) {
    case DF_EL_F32: return DF_DT_F32;
    case DF_EL_F16: return DF_DT_F16;
    case DF_EL_BF16: return DF_DT_BF16;
    default:
        /* A programming error, not bad input: loaders refuse formats the
         * kernels do not compute (df_wfmt_computable). */
        fprintf(stderr, "deltafin: kernel called with weight format %s\n", df_wfmt_name(w->fmt));
        abort();
    }
}

void df_matmul_rows(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0,
                    int n1) {
    df_dtype wt = dense_dtype(w);
    if (T <= 0 || n1 <= n0 || w->cols < 0) return;
    if (wt == DF_DT_COUNT) qrows_on(df_isa_get(), y, ldy, x, ldx, w, T, n0, n1);
    else rows_for(df_isa_get())(y, ldy, x, ldx, w->data, wt, T, n0, n1, w->cols);
}

struct mm_ctx {
    df_isa isa;
    rows_fn rows;
    bool scaled;
    float *y;
    const float *x;
    const df_wview *v;
    df_dtype wt;
    int ldy, ldx, T;
};

static void mm_task(void *arg, int n0, int n1) {
    const struct mm_ctx *c = arg;
    if (c->scaled) qrows_on(c->isa, c->y, c->ldy, c->x, c->ldx, c->v, c->T, n0, n1);
    else c->rows(c->y, c->ldy, c->x, c->ldx, c->v->data, c->wt, c->T, n0, n1, c->v->cols);
}

void df_matmul(df_pool *pool, float *y, int ldy, const float *x, int ldx, const df_wview *w, int T) {
    df_dtype wt = dense_dtype(w);
    if (T <= 0 || w->rows <= 0 || w->cols < 0) return;
    /* One path for the whole call, even if df_isa_set races with it. */
    df_isa isa = df_isa_get();
    struct mm_ctx c = {isa, rows_for(isa), wt == DF_DT_COUNT, y, x, w, wt, ldy, ldx, T};
    /* 16 rows: whole register tiles, and 64 bytes of each output row, so two
     * threads never write the same cache line of y (when y is 64-aligned). */
    df_pool_for(pool, w->rows, 16, mm_task, &c);
}

float df_dot_f32(const float *a, const float *b, int n) {
    if (n <= 0) return 0.0f;
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: return df_dot_f32_avx512(a, b, n);
    case DF_ISA_AVX2: return df_dot_f32_avx2(a, b, n);
    default: break;
    }
#endif
    return dot_f32_c(a, b, n);
}

void df_axpy_f32(float *y, float a, const float *x, int n) {
    if (n <= 0) return;
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: df_axpy_f32_avx512(y, a, x, n); return;
    case DF_ISA_AVX2: df_axpy_f32_avx2(y, a, x, n); return;
    default: break;
    }
#endif
    axpy_f32_c(y, a, x, n);
}

void df_scale_f32(float *x, int n, float s) {
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: df_scale_f32_avx512(x, n, s); return;
    case DF_ISA_AVX2: df_scale_f32_avx2(x, n, s); return;
    default: break;
    }
#endif
    for (int i = 0; i < n; i++) x[i] *= s;
}

void df_axpy_rows(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                  const int *n, int c0, int c1) {
    if (R <= 0 || c1 <= c0) return;
    if (xt != DF_DT_F32 && xt != DF_DT_F16 && xt != DF_DT_BF16) bad_dtype(xt);
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: df_axpy_rows_avx512(y, ldy, a, lda, x, xt, ldx, R, n, c0, c1); return;
    case DF_ISA_AVX2: df_axpy_rows_avx2(y, ldy, a, lda, x, xt, ldx, R, n, c0, c1); return;
    default: break;
    }
#endif
    axpy_rows_c(y, ldy, a, lda, x, xt, ldx, R, n, c0, c1);
}

void df_to_f32(float *dst, const void *src, df_dtype t, size_t n) {
    if (!n) return;
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: df_to_f32_avx512(dst, src, t, n); return;
    case DF_ISA_AVX2: df_to_f32_avx2(dst, src, t, n); return;
    default: break;
    }
#endif
    df_to_f32_c(dst, src, t, n);
}
