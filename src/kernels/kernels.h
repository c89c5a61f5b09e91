/*
 * kernels.h - the numeric kernels and the thread pool.
 *
 * Exactness contract: every output element of a matmul or dot product is the
 * same sum in the same order whatever the batch size T, the thread count, and the
 * instruction-set path (AVX-512, AVX2, portable C). The order is: 16 lane
 * accumulators, element k goes to lane k % 16 (fused multiply-add, zero-padded
 * tail), then the fixed tree lanes[i] += lanes[i+8], +4, +2, +1. Work is split
 * over output rows, never over the reduction.
 */
#ifndef DF_KERNELS_H
#define DF_KERNELS_H

#include "util/util.h"

typedef enum df_isa { DF_ISA_C = 0, DF_ISA_AVX2 = 1, DF_ISA_AVX512 = 2 } df_isa;

df_isa df_isa_detect(void);          /* best path this CPU supports */
const char *df_isa_name(df_isa isa); /* "c", "avx2", "avx512" */
int df_isa_from_name(const char *s); /* -1 if unknown; "auto" -> detected */
/* Selects the path used by all following kernel calls (process-wide). Returns
 * 0, or -1 if the CPU cannot run it. */
int df_isa_set(df_isa isa);
df_isa df_isa_get(void);

/* ---- thread pool -------------------------------------------------------- */
typedef struct df_pool df_pool;
df_pool *df_pool_new(int n_threads); /* n_threads >= 1; the caller is thread 0 */
void df_pool_free(df_pool *p);
int df_pool_size(const df_pool *p);
/* Runs fn(ctx, begin, end) over [0, n) split into contiguous ranges, one per
 * thread, ranges aligned to `align` items; returns when all are done. */
void df_pool_for(df_pool *p, int n, int align,
                 void (*fn)(void *ctx, int begin, int end), void *ctx);

/* ---- products ----------------------------------------------------------- */
/* y[t*ldy + n] = sum_k w[n*K + k] * x[t*ldx + k], for t < T, n < N.
 * w is row-major [N][K] in dtype wt (F32, F16 or BF16). Threads split N. */
void df_matmul(df_pool *pool, float *y, int ldy, const float *x, int ldx,
               const void *w, df_dtype wt, int T, int N, int K);
/* Single-threaded form over output rows [n0, n1) (for callers that already
 * split work themselves). */
void df_matmul_rows(float *y, int ldy, const float *x, int ldx, const void *w,
                    df_dtype wt, int T, int n0, int n1, int K);
/* Dot product of two F32 vectors with the same reduction order. */
float df_dot_f32(const float *a, const float *b, int n);
/* y[i] += a * x[i] (elementwise, exact per element) */
void df_axpy_f32(float *y, float a, const float *x, int n);

/* Widens n elements of a dtype to F32. */
void df_to_f32(float *dst, const void *src, df_dtype t, size_t n);

#endif
