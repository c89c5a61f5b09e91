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
/* Runs fn(ctx, begin, end) over [0, n) split into contiguous ranges, up to 4
 * per thread (claimed by whichever thread is free first), ranges aligned to
 * `align` items; returns when all are done. A result must not depend on how
 * [0, n) is split or on which thread runs a range. */
void df_pool_for(df_pool *p, int n, int align,
                 void (*fn)(void *ctx, int begin, int end), void *ctx);
/* Benchmarks and tests: ranges per thread and job, at most (1 .. 64; 4) */
void df_pool_set_slots(df_pool *p, int per_thread);

/* ---- weight formats --------------------------------------------------------
 * A matrix is described by its format and its bytes exactly as shipped; the
 * kernels decode values in registers, never into a widened copy.
 *
 *   elem    what one stored value is: F32, F16, BF16 (one per element);
 *           F8_E4M3 (one byte); I4 (signed 4-bit stored as q+8) and E2M1 (FP4),
 *           two per byte, the even column in the low nibble.
 *   scale   the type of the scales (NONE: the values are the weights), one
 *           scale per block_rows x block_cols values: FP8 blocks are 128x128
 *           (F32 scales, "weight_scale_inv"), INT4 and MXFP4 groups 1x32 along a
 *           row (BF16 and E8M0 scales). The scale grid is
 *           [ceil(rows/block_rows)][ceil(cols/block_cols)], row-major.
 *
 * Exactness contract for a scaled format (F8_E4M3/F32, I4/BF16, E2M1/E8M0;
 * df_wfmt_computable says which block shapes):
 *   1. An element decodes to w = fl(decode(q) * scale) in f32: decode(q) is
 *      exact in f32 (e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits,
 *      e = 0 subnormal, 0x7F/0xFF NaN, no infinity; e2m1: bit 3 sign, bits 0-2
 *      index {0, 0.5, 1, 1.5, 2, 3, 4, 6}; I4: the nibble minus 8), the scale
 *      is exact in f32 (F32; BF16 widened; E8M0 s as ldexpf(1, s - 127), s = 0
 *      the subnormal 2^-127, s = 255 NaN), and the one product is rounded to
 *      nearest even. It is exact for INT4 and MXFP4 unless it overflows or
 *      falls below 2^-126 (few significant bits), one rounding for FP8 x F32.
 *      It is computed with a plain multiply, never fused into the
 *      accumulation.
 *   2. w then enters the reduction below exactly as an F32 weight would: the
 *      same 16 lanes, element k in lane k % 16, the same zero padding (+0
 *      weights, not decoded padding) and the same tree. So the result does
 *      not depend on block or group boundaries, the batch size, the thread
 *      count or the ISA path, and a scaled matrix gives bit for bit what the
 *      F32 matrix of its decoded weights (df_wview_decode_rows) gives. The
 *      SIMD paths decode 8 to 32 values at a time in registers (for e4m3 the
 *      bits placed in an F16 and widened by vcvtph2ps, or, where no code has
 *      e = 0 (AVX-512, AVX2), placed in an F32, so that no F32
 *      subnormal reaches a multiply; a 16-entry table already multiplied by
 *      the group's scale for the 4-bit formats: a table entry is the same
 *      fl(decode(q) * scale));
 *      nothing is widened into a copy of the matrix (over many tokens a few
 *      rows at a time are decoded into a stack scratch that stays in L2 and
 *      multiplied as F32: DF_STAGE_BYTES below). Where an FP8 block's scale
 *      is a power of two and x * scale is exact, the AVX-512 one-token products
 *      form the same real product w * x as decode(q) * (x * scale) (one multiply
 *      of x for several rows), which the FMA rounds the same way. A path may keep the 16
 *      lanes in another order in its registers (the AVX-512 4-bit products
 *      do) as long as each lane sums the same products in the same order.
 *   3. Hugging Face's path materialises BF16 weights first (the DeepSeek
 *      reference's weight_dequant and compressed-tensors' decompression
 *      produce bf16(decode(q) * scale), then a BF16 GEMM); deltafin keeps the
 *      f32 product, which is the exact dequantized weight for INT4 and MXFP4
 *      and within half an f32 ulp of it for FP8, where BF16 is within half a
 *      BF16 ulp (2^-9 relative). The two therefore differ by that BF16
 *      rounding (and the GEMM's own order) and are compared with a tolerance,
 *      while deltafin's own paths agree bit for bit.
 */
typedef enum df_elem {
    DF_EL_F32 = 0,
    DF_EL_F16,
    DF_EL_BF16,
    DF_EL_F8_E4M3,
    DF_EL_I4,
    DF_EL_E2M1,
    DF_EL_COUNT
} df_elem;

typedef enum df_scale_type { DF_SC_NONE = 0, DF_SC_F32, DF_SC_BF16, DF_SC_E8M0 } df_scale_type;

typedef struct df_wfmt {
    df_elem elem;
    df_scale_type scale;
    int block_rows, block_cols; /* 0 when scale is NONE */
} df_wfmt;

/* A matrix [rows][cols] in format fmt: the kernels' view of a weight. A view
 * of some rows of a scaled matrix (df_wview_rows) keeps the grid's layout:
 * scale points at the grid row of the view's row 0, which is row row0 of its
 * block of block_rows rows. */
typedef struct df_wview {
    df_wfmt fmt;
    const void *data;  /* values, row-major, df_wfmt_row_bytes per row */
    const void *scale; /* the scale grid, or NULL when fmt.scale is NONE */
    int rows, cols;
    int row0; /* 0 <= row0 < block_rows; 0 for a whole matrix */
    /* FP8 only, optional: which 64-code groups need the F16 form (df_fp8_map_build), at the
     * view's row 0; NULL: the kernels test the codes themselves. Either way the same w. */
    const uint64_t *f16map;
} df_wview;

/* The unscaled format of a stored dtype (F32, F16, BF16, F8_E4M3); false if
 * the dtype is no weight format. */
bool df_wfmt_of_dtype(df_dtype t, df_wfmt *out);
const char *df_wfmt_name(df_wfmt f);     /* "BF16", "F8_E4M3/F32[128x128]" ... */
/* The kernels implement it: F32, F16, BF16, and the three scaled formats
 * (F8_E4M3/F32, I4/BF16, E2M1/E8M0) with blocks of block_rows >= 1 rows and
 * block_cols a positive multiple of 16 columns (as shipped: 128x128, 1x32). */
bool df_wfmt_computable(df_wfmt f);
size_t df_wfmt_row_bytes(df_wfmt f, int cols);
uint64_t df_wfmt_bytes(df_wfmt f, int rows, int cols);       /* the values */
uint64_t df_wfmt_scale_bytes(df_wfmt f, int rows, int cols); /* the scale grid */
static inline df_wview df_wview_make(const void *data, df_dtype t, int rows, int cols) {
    df_wview v = {{DF_EL_F32, DF_SC_NONE, 0, 0}, data, NULL, rows, cols, 0, NULL};
    df_wfmt_of_dtype(t, &v.fmt);
    return v;
}

/* The formats as shipped: DeepSeek-V3/R1 and Kimi K2 FP8 (e4m3 values, F32
 * "weight_scale_inv" per 128x128 block, multiplied); compressed-tensors
 * "pack-quantized" INT4 (BF16 scale per 32 along a row; the checkpoint's I32
 * words [out][in/8] read as little-endian bytes are the I4 layout above);
 * MXFP4 "mxfp4-pack-quantized" (E8M0 scale per 32 along a row). */
static inline df_wfmt df_wfmt_fp8_block(void) { return (df_wfmt){DF_EL_F8_E4M3, DF_SC_F32, 128, 128}; }
static inline df_wfmt df_wfmt_int4_group(void) { return (df_wfmt){DF_EL_I4, DF_SC_BF16, 1, 32}; }
static inline df_wfmt df_wfmt_mxfp4(void) { return (df_wfmt){DF_EL_E2M1, DF_SC_E8M0, 1, 32}; }

/* A scaled matrix: values and the scale grid (df_wfmt_scale_bytes) as shipped. */
static inline df_wview df_wview_scaled(df_wfmt f, const void *data, const void *scale, int rows, int cols) {
    df_wview v = {f, data, scale, rows, cols, 0, NULL};
    return v;
}
/* The F16-form map of an FP8 matrix: per row, df_fp8_map_words(cols) words; bit g of a
 * row's word g / 64 is set where the codes [64g, 64g + 64) hold one that the SIMD
 * products test for before their F32 form ((q + 1) & 0x70 == 0: e = 0, e = 1 with m < 7,
 * NaN). The last group of a row whose cols are not a multiple of 64 has a bit too, over
 * the codes it has (AVX2 reads it for a 32-value step there).
 * Made once from the shipped bytes of a resident weight; it only selects between two
 * exact decodings, so a view with or without it gives the same products. */
size_t df_fp8_map_words(int cols);
void df_fp8_map_build(uint64_t *map, const df_wview *v);
/* Rows [r0, r0 + n) of v (any format; the scale grid and the map follow). */
df_wview df_wview_rows(const df_wview *v, int r0, int n);
/* Rows [r0, r0 + n) of v decoded exactly to F32 (dst[n][cols]): the w of the
 * contract, which is also what df_matmul multiplies by. For callers that need
 * a row as numbers (an absorbed attention head); never a whole matrix. */
void df_wview_decode_rows(float *dst, const df_wview *v, int r0, int n);

/* The element and scale decodings of the contract, one value at a time (the
 * definitions that the SIMD paths reproduce). */
float df_e4m3_to_f32(uint8_t b);
float df_e2m1_to_f32(unsigned nibble); /* low 4 bits */
float df_i4_to_f32(unsigned nibble);   /* low 4 bits, minus 8 */
float df_e8m0_to_f32(uint8_t s);

/* ---- products ----------------------------------------------------------- */
/* y[t*ldy + n] = sum_k w[n][k] * x[t*ldx + k], for t < T, n < w->rows, over
 * k < w->cols. Threads split the rows. */
void df_matmul(df_pool *pool, float *y, int ldy, const float *x, int ldx, const df_wview *w, int T);
/* Products of a scaled format over many tokens decode rows into DF_STAGE_BYTES
 * of stack per thread (matmul.c) and multiply them as F32: the same results
 * with fewer decodings. The memory budget counts it per thread. */
#define DF_STAGE_BYTES ((size_t)256 << 10)
/* Single-threaded form over output rows [n0, n1) (for callers that already
 * split work themselves). */
void df_matmul_rows(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0,
                    int n1);
/* Dot product of two F32 vectors with the same reduction order. */
float df_dot_f32(const float *a, const float *b, int n);
/* y[i] += a * x[i] (elementwise, exact per element) */
void df_axpy_f32(float *y, float a, const float *x, int n);
/* x[i] *= s (elementwise, one rounding per element: the same on every path) */
void df_scale_f32(float *x, int n, float s);
/* A product whose reduction runs down the rows of x: for r < R and c0 <= c < c1,
 *   y[r*ldy + c] = fma(a[r*lda + j], x[j*ldx + c], y[r*ldy + c])  for j = 0 .. n[r]-1 in order,
 * i.e. exactly df_axpy_f32(y_r, a[r][j], x_j) applied for every j in turn, so
 * the result does not depend on the path, the blocking or which rows and
 * columns a call is given. y accumulates (zero it for a plain product). x is
 * [*][ldx] values of dtype xt (F32, F16 or BF16; widened exactly). One thread;
 * callers split columns or rows. Blocked so that x is read once for all R rows
 * (MLA's weighted latent sum and absorbed query, src/model/mla.c). */
void df_axpy_rows(float *y, int ldy, const float *a, int lda, const void *x, df_dtype xt, int ldx, int R,
                  const int *n, int c0, int c1);

/* x = softmax(scale * x) in place over n elements, the same bits on every path:
 * max, e = exp(x - max) by softmax.h's polynomial (about 1 ulp; below -87 it
 * is +0), the sum in the 16 lanes and tree of the products above, then
 * e * (1 / sum). NaNs are skipped by the max and come out as NaN. */
void df_softmax_f32(float *x, int n, float scale);
/* Its unnormalised part: the same x = e in place, *sum = S (+0 for n <= 0),
 * returns m, the max of scale * x (-inf when every element is NaN or n <= 0).
 * Online softmax over fixed blocks of positions builds on it (mla.c). */
float df_softmax_exp_f32(float *x, int n, float scale, float *sum);
/* softmax.h's exponential of one value: the bits every path's lanes give. */
float df_exp_f32(float x);

/* Widens n elements of a dtype to F32. */
void df_to_f32(float *dst, const void *src, df_dtype t, size_t n);

#endif
