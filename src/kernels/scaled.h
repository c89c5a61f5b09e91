/*
 * scaled.h - internal to the kernels room: what the paths of the scaled
 * formats (kernels.h: FP8 blocks, INT4 and MXFP4 groups) share: where a row's
 * scales are, the scales' values, and each ISA path's entry points.
 */
#ifndef DF_KERNELS_SCALED_H
#define DF_KERNELS_SCALED_H

#include "kernels/kernels.h"

#include <string.h>

static inline size_t df_sc_size(df_scale_type t) { return t == DF_SC_F32 ? 4 : t == DF_SC_BF16 ? 2 : 1; }

/* The scale grid row (bytes) that row n of the view uses. */
static inline const uint8_t *df_scale_row(const df_wview *w, int n) {
    size_t gc = ((size_t)w->cols + (size_t)w->fmt.block_cols - 1) / (size_t)w->fmt.block_cols;
    size_t gr = (size_t)(w->row0 + n) / (size_t)w->fmt.block_rows;
    return (const uint8_t *)w->scale + gr * gc * df_sc_size(w->fmt.scale);
}

/* FP8's F16-form map (kernels.h) as the products read it: row n's words when the view
 * has a map they can use (its blocks' 64-value steps then start on the map's 64-column
 * groups), else NULL; and the bit of the group at column k (a multiple of 64). */
static inline const uint64_t *df_fp8_map_row(const df_wview *w, int n) {
    if (!w->f16map || w->fmt.block_cols % 64) return NULL;
    return w->f16map + (size_t)n * df_fp8_map_words(w->cols);
}
static inline int df_fp8_map_bit(const uint64_t *row, int k) { return (int)(row[k >> 12] >> ((k >> 6) & 63)) & 1; }

/* E8M0 as F32 bits, 2^(s - 127): s = 0 is the subnormal 2^-127, s = 255 NaN.
 * The SIMD paths' form of df_e8m0_to_f32 (which uses ldexpf); the tests check
 * the two agree on all 256 values. */
static inline uint32_t df_e8m0_bits(uint8_t s) {
    return s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : (uint32_t)s << 23;
}

/* Scale j of a grid row as F32, the SIMD paths' form (exact widening). */
static inline float df_scale_at(const uint8_t *srow, df_scale_type t, int j) {
    uint32_t u;
    if (t == DF_SC_F32) {
        memcpy(&u, srow + 4 * (size_t)j, 4);
    } else if (t == DF_SC_BF16) {
        uint16_t h;
        memcpy(&h, srow + 2 * (size_t)j, 2);
        u = (uint32_t)h << 16;
    } else {
        u = df_e8m0_bits(srow[j]);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* MXFP4's scaled tables: entry [s][q] is fl(e2m1(q) * e8m0(s)), the weight of
 * code q in a group of scale s, for all 256 scales (16 KiB, computed once).
 * A group's table is then one load where the other formats multiply a base
 * table by the group's scale; the scales a matrix uses are few, so the lines
 * read stay in L1. */
const float (*df_e2m1_tables(void))[16];

/* INT4's scaled tables: entry [i][q] is fl((q - 8) * s) for the BF16 scale s
 * with bits DF_I4_TAB_LO + i: the positive scales from 2^-32 up to 1, which
 * hold a checkpoint's (a group's largest weight over 7), 4096 of them (256 KiB,
 * computed once; a matrix's scales span a few binary orders, so the lines
 * read stay in L1 or L2). A group with another scale multiplies. */
#define DF_I4_TAB_LO 0x2f80u
#define DF_I4_TAB_N 0x1000u
const float (*df_i4_tables(void))[16];

/* The one-token tile of a SIMD path's 4-bit formats for 32-value groups, as a
 * function of its own: NAME(y, x, w, rs, srow, K, pf, spf) calls that file's
 * qtile4 with the group size and the rows (RN) as constants. Inlined into its
 * qrows with the other tiles, the AVX2 one reloaded rows' scales from the
 * stack in every step of 16 values (docs/benchmarks.md, "AVX2 E2M1"). */
#define DF_QTILE4_T1(NAME, EL, RN)                                                                           \
    static __attribute__((noinline)) void NAME(float *y, const float *x, const uint8_t *w, size_t rs,        \
                                               const uint8_t *const *srow, int K, int pf,                   \
                                               const uint8_t *const *spf) {                                 \
        qtile4(y, 1, x, 0, w, rs, srow, K, 32, 32, EL, RN, 1, pf, spf);                                    \
    }

/* The portable definition: w for elements [k0, k0 + 16) of a row (values at
 * row, scales at srow), +0 past the row's end. */
void df_qdecode16_c(float w[16], const df_wview *v, const uint8_t *row, const uint8_t *srow, int k0);

/* Products over rows [n0, n1) of a scaled view, per path (same contract as
 * df_matmul_rows), and the exact decoding of rows [r0, r0 + n). */
void df_qrows_c(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1);
void df_qdecode_c(float *dst, const df_wview *w, int r0, int n);
/* The exact decoding of rows [r0, r0 + n) of a scaled view on the given path (wfmt.c):
 * df_wview_decode_rows on the selected one, and the products of many tokens (matmul.c)
 * on the one their call took. */
void df_qdecode_on(df_isa isa, float *dst, const df_wview *w, int r0, int n);
#if defined(__x86_64__) || defined(__i386__)
void df_qrows_avx2(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1);
void df_qdecode_avx2(float *dst, const df_wview *w, int r0, int n);
void df_qrows_avx512(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1);
void df_qdecode_avx512(float *dst, const df_wview *w, int r0, int n);
#endif

#endif
