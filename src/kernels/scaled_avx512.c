/*
 * scaled_avx512.c - the AVX-512 path of the scaled formats (kernels.h: FP8
 * e4m3 with F32 block scales, INT4 with BF16 and E2M1 with E8M0 group scales):
 * products and the exact decoding of rows. Compiled with the AVX-512 flags;
 * only called when isa.c found CPU and OS support.
 *
 * Each chunk of 16 values is decoded in registers into the 16 weights
 * w = fl(decode(q) * scale) of the contract, which then go into one __m512
 * accumulator per output exactly as F32 weights do in matmul_avx512.c (lane j
 * sums elements k = j mod 16, zero-masked tail, the same hsum16 tree). So the
 * results are bit-identical to the C path (matmul.c, df_qdecode16_c).
 *
 * Decoding, per format:
 *  - e4m3: the sign-extended byte shifted left 7 and masked to 0xbf80 is the
 *    F16 with e4m3's sign, exponent field and mantissa in place, which is
 *    decode(q) * 2^-8 exactly (e = 0 lands on F16 subnormals, so e4m3
 *    subnormals come out right); vcvtph2ps widens it to a normal F32. (Placing
 *    the bits in an F32 instead gives decode(q) * 2^-120, whose e = 0 codes
 *    are F32 subnormals: Intel CPUs multiply those through a microcode assist,
 *    measured 30x slower on random codes.) The block's scale is pre-multiplied
 *    by 2^8: fl(f * (s * 2^8)) rounds the same real number as fl(decode(q) *
 *    s), so it is the same w, provided s * 2^8 is exact, i.e. finite (|s| <
 *    2^120) or s itself is not finite. A block with a larger finite scale takes
 *    the two-multiply form (f * 2^8, exact, then * s). The products take the
 *    same f in three operations instead of four and a half where a row's 64
 *    values have no e = 0 and no NaN code (dec16n: the byte's bits placed in
 *    an F32 with exponent field e + 112), as almost all of a checkpoint's
 *    do: normal weights scaled to a block maximum of 448 put about one code
 *    in 2000 at e <= 1 (+6-14 % in L2, 0-9 % from RAM; random codes, where
 *    every group needs the F16 form, lose 16-20 % to the extra test and the
 *    rows decoded one by one). A view with an F16-form map (kernels.h: the
 *    always-active FP8 matrices have one) gives that test's answer per 64
 *    values from a bit instead (+5-10 % in L2, +8 % from RAM on Zen 4, where
 *    the test was an eighth of the operations; one-token tiles only).
 *    0x7F/0xFF (NaN) are found with one byte compare per 64 values; only a
 *    group that has one blends NaN into its lanes. Where a one-token tile's rows
 *    share a power-of-two block scale (DeepSeek-V3.1) and moving it onto the
 *    activations is exact, the F32 form skips its multiply (qblock_xs: +16 % in
 *    L2, +10 % from RAM on Zen 4).
 *  - INT4 and E2M1: a 16-entry table of decode(q), multiplied by the group's
 *    scale once per group (each entry is then fl(decode(q) * scale)), looked up
 *    with vpermps, which reads the low 4 bits of each index lane. E2M1 has
 *    only 256 scales, so its products load the group's table ready-made
 *    (df_e2m1_tables, scaled.h) instead of multiplying: one vector operation
 *    fewer per group and row, of about 7.5 (+9-14 % in L2 on an idle core,
 *    +3-6 % with the host's other work on it, +5-9 % from RAM). INT4 does the
 *    same with df_i4_tables, which holds the positive BF16 scales from 2^-32
 *    to 1 (+9-10 % in L2, +2.5 % from RAM, +4 % at T = 4); 16 groups of a
 *    row with any other scale multiply as before. Products
 *    (qtile4) put the 16 nibbles of a chunk into index lanes with one shift of
 *    the broadcast 8 bytes, which yields them in the lane order sig (see
 *    there); the activations are permuted to match and the accumulators put
 *    back before the tree. The group scales are widened 16 at a time into a
 *    small buffer as their tables' offsets.
 *    The row decoding (qdecode) keeps the
 *    natural order: 8 bytes zero-extended to 8 qwords, OR'ed with themselves
 *    shifted left by 28, put byte i's low nibble in lane 2i and its high
 *    nibble in lane 2i+1.
 *
 * Tiles as in matmul_avx512.c: T == 1 does 4 rows (FP8) or 8 rows (4-bit:
 * +15-20 % from RAM; 32-value groups in a function of its own, qtile4_t1_*,
 * that steps through a whole group without a loop: +14 % in L2, from RAM
 * within the noise) at once with a software prefetch of the next group
 * (values, and for the 4-bit formats the scale rows, a separate stream). FP8
 * chooses the form of each row's 64 values on their own (qblock); the F16
 * form decodes 32 values at a time where they have no NaN code (dec32: byte
 * permutes with VBMI measured no faster on Sapphire Rapids, where VPERMT2B
 * takes two cycles of port 5). T > 1 a 4-row x 4-token tile (16
 * accumulators, 4 tables or scales, 4 weights: fits the 32 registers).
 */
#include "kernels/scaled.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#define INL static inline __attribute__((always_inline))

#define QN 4 /* rows per tile (T > 1; T == 1 FP8) */
#define QN1 8 /* rows per tile at T == 1 (4-bit formats): more streams in flight */
#define QNM 8 /* the larger of the two: array sizes */
#define QT 4 /* tokens per tile (T > 1) */

enum { FP8 = DF_EL_F8_E4M3, I4 = DF_EL_I4, E2M1 = DF_EL_E2M1 };

INL __m512 base_table(int el) {
    if (el == I4)
        return _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f, 3.0f,
                              4.0f, 5.0f, 6.0f, 7.0f);
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,
                          -3.0f, -4.0f, -6.0f);
}

/* FP8: the weights fl(decode(q) * s) from f = decode(q) * 2^-8 (exact) and the
 * block state st (s * 2^8, or s itself in the two-multiply form). */
INL __m512 fp8_scaled(__m512 f, __m512 st, int two) {
    if (two) f = _mm512_mul_ps(f, _mm512_set1_ps(0x1p8f));
    return _mm512_mul_ps(f, st);
}

/* 16 weights at column k (a multiple of 16) of a row; st: the row's block
 * state (FP8: the broadcast scale, times 2^8 unless two; 4-bit: the scaled
 * table); FP8's NaN codes are blended in (dec32 is the form for groups
 * without them). tail: only rem < 16 values are left (masked loads; the
 * other lanes are +0). */
INL __m512 dec16(int el, const uint8_t *row, int k, __m512 st, int two, int tail, int rem) {
    __mmask16 m = tail ? (__mmask16)((1u << rem) - 1) : (__mmask16)0xffff;
    __m512 w;
    if (el == FP8) {
        __m128i b = tail ? _mm_maskz_loadu_epi8(m, row + k) : _mm_loadu_si128((const __m128i *)(row + k));
        __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
        __m512 f = _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80)));
        w = fp8_scaled(f, st, two);
        __mmask16 nm = _mm_cmpeq_epi8_mask(_mm_or_si128(b, _mm_set1_epi8((char)0x80)), _mm_set1_epi8(-1));
        if (nm) w = _mm512_mask_mov_ps(w, nm, _mm512_set1_ps(NAN));
    } else {
        const uint8_t *p = row + (k >> 1);
        __m128i b = tail ? _mm_maskz_loadu_epi8((__mmask16)((1u << ((rem + 1) >> 1)) - 1), p)
                         : _mm_loadl_epi64((const __m128i *)p);
        __m512i q = _mm512_cvtepu8_epi64(b);
        w = _mm512_permutexvar_ps(_mm512_or_si512(q, _mm512_slli_epi64(q, 28)), st);
    }
    return tail ? _mm512_maskz_mov_ps(m, w) : w;
}

/* The block state of each row for block column j; returns `two` (FP8 only). */
INL int block_state(__m512 *st, const uint8_t *const *srow, df_scale_type sct, int j, int el, int RN) {
    if (el != FP8) {
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++)
            st[r] = _mm512_mul_ps(base_table(el), _mm512_set1_ps(df_scale_at(srow[r], sct, j)));
        return 0;
    }
    float s[QNM];
    int two = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        s[r] = df_scale_at(srow[r], DF_SC_F32, j);
        two |= isfinite(s[r]) && !isfinite(s[r] * 0x1p8f);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) st[r] = _mm512_set1_ps(two ? s[r] : s[r] * 0x1p8f);
    return two;
}

/* acc[r][t] += w(row r, chunk k) * x[t][chunk k] */
INL void qstep(__m512 acc[QNM][QT], const float *x, int ldx, const uint8_t *w, size_t rs, const __m512 *st,
               int k, int el, int RN, int RT, int two, int tail, int rem) {
    __m512 wv[QNM];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) wv[r] = dec16(el, w + r * rs, k, st[r], two, tail, rem);
    __mmask16 m = tail ? (__mmask16)((1u << rem) - 1) : (__mmask16)0xffff;
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++) {
        const float *xp = x + (size_t)t * ldx + k;
        __m512 xv = tail ? _mm512_maskz_loadu_ps(m, xp) : _mm512_loadu_ps(xp);
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}

/* FP8 without NaN codes: the 32 weights at column k of a row, as two chunks
 * of 16. One widening of 32 bytes to words, one shift and one mask make the
 * 32 F16 of dec16 in one register; its halves are widened by vcvtph2ps. Per
 * value, that is half of dec16's widening, shift and mask. */
INL void dec32(const uint8_t *row, int k, __m512 st, int two, __m512 *w0, __m512 *w1) {
    __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(row + k))), 7);
    h = _mm512_and_si512(h, _mm512_set1_epi16((short)0xbf80));
    __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h)), f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    *w0 = fp8_scaled(f0, st, two);
    *w1 = fp8_scaled(f1, st, two);
}

/* FP8, the F32 form: the 16 weights at column k of a row whose codes all have
 * e >= 1 and are not NaN. The sign-extended byte shifted left 20, masked to
 * 0x87f00000 and OR'ed with 0x38000000 (one vpternlogd) is the F32 with
 * e4m3's sign and mantissa and the exponent field e + 112: decode(q) * 2^-8,
 * the same f as the F16 form, so the same weight. Three operations per 16
 * values where the F16 form takes four and a half (vcvtph2ps is two). */
INL __m512 dec16f(const uint8_t *row, int k) {
    __m512i d = _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + k))), 20);
    d = _mm512_ternarylogic_epi32(d, _mm512_set1_epi32((int)0x87f00000u), _mm512_set1_epi32(0x38000000), 0xea);
    return _mm512_castsi512_ps(d);
}
INL __m512 dec16n(const uint8_t *row, int k, __m512 st, int two) { return fp8_scaled(dec16f(row, k), st, two); }

/* acc[t] += w(chunk k + c) * x[t][chunk k + c] for the 16 weights w */
INL void fma_tokens(__m512 *acc, __m512 w, const float *x, int ldx, int k, int RT) {
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + (size_t)t * ldx + k), acc[t]);
}

/* Whether the 64 codes at p have one that the F32 form cannot take: e = 0
 * (an e4m3 subnormal has no implicit 1, which the F32 form's exponent field
 * 112 would give it) or NaN. The test, (q + 1) & 0x70 == 0,
 * is two operations and also catches e = 1, m < 7. The load is in the asm so
 * that the compiler cannot reuse it for the decoding: it would extract the
 * 16-byte quarters through the stack instead of loading each with the
 * widening vpmovsxbd (measured 2x slower). */
INL int f16_codes64(const uint8_t *p) {
    __m512i b;
    __asm__("vpaddb %1, %2, %0" : "=v"(b) : "m"(*(const uint8_t(*)[64])p), "v"(_mm512_set1_epi8(1)));
    return _mm512_testn_epi8_mask(b, _mm512_set1_epi8(0x70)) != 0;
}

/* Whether the 64 codes at p have a NaN code (0x7f, 0xff); asm as above */
INL int nan_codes64(const uint8_t *p) {
    __m512i b;
    __asm__("vpord %1, %2, %0" : "=v"(b) : "m"(*(const uint8_t(*)[64])p), "v"(_mm512_set1_epi8((char)0x80)));
    return _mm512_cmpeq_epi8_mask(b, _mm512_set1_epi8(-1)) != 0;
}

/* acc[t] += the 64 weights at column k of one row times x[t]: the F32 form,
 * or the F16 form where a code needs it, with NaN blended in where one is. */
INL void row64(__m512 *acc, const float *x, int ldx, const uint8_t *row, __m512 st, int k, int RT, int two,
               int f16) {
    if (__builtin_expect(!f16, 1)) {
        #pragma GCC unroll 4
        for (int c = 0; c < 64; c += 16) fma_tokens(acc, dec16n(row, k + c, st, two), x, ldx, k + c, RT);
    } else if (!nan_codes64(row + k)) {
        #pragma GCC unroll 2
        for (int c = 0; c < 64; c += 32) {
            __m512 w0, w1;
            dec32(row, k + c, st, two, &w0, &w1);
            fma_tokens(acc, w0, x, ldx, k + c, RT);
            fma_tokens(acc, w1, x, ldx, k + c + 16, RT);
        }
    } else {
        #pragma GCC unroll 4
        for (int c = 0; c < 64; c += 16) fma_tokens(acc, dec16(FP8, row, k + c, st, two, 0, 16), x, ldx, k + c, RT);
    }
}

/* Columns [kb, ke) of one scale block: 64 values of each row at a time, each
 * row in the form its codes allow (a branch per row: with one for all rows,
 * the F16 form ran four times as often), then 16 at a time. */
INL void qblock(__m512 acc[QNM][QT], const float *x, int ldx, const uint8_t *w, size_t rs, const __m512 *st,
                int kb, int ke, int el, int RN, int RT, int two, const uint64_t *const *mr) {
    int k = kb;
    if (el == FP8) {
        for (; k + 64 <= ke; k += 64) {
            int f16[QNM];
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++)
                f16[r] = mr ? df_fp8_map_bit(mr[r], k) : f16_codes64(w + r * rs + k);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) row64(acc[r], x, ldx, w + r * rs, st[r], k, RT, two, f16[r]);
        }
    }
    for (; k + 16 <= ke; k += 16) qstep(acc, x, ldx, w, rs, st, k, el, RN, RT, two, 0, 16);
    if (k < ke) qstep(acc, x, ldx, w, rs, st, k, el, RN, RT, two, 1, ke - k);
}

/* lanes[i] += lanes[i+8]; +4; +2; +1 -> lane 0 (as matmul_avx512.c) */
INL float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* ---- FP8 with a power-of-two scale, one token ---------------------------------
 * Where the rows of a one-token tile share a block scale s = 2^k (DeepSeek-V3.1's
 * checkpoints hold almost only such scales), the F32 form's f = decode(q) * 2^-8 is
 * multiplied by x * 2^(k+8) instead of the weight fl(f * s * 2^8) by x: one multiply per
 * 16 values for the tile's rows instead of one per row. It is the same sum bit for bit:
 * f * (x * 2^(k+8)) is the real product decode(q) * s * x that the FMA of w by x rounds
 * into the lane, provided w = decode(q) * s exactly (k in [-120, 119]: every e >= 1
 * code's product is a normal F32) and x * 2^(k+8) is exact for every x (xs_range).
 * Groups in the F16 form multiply their weights as before. */

/* The shifts j for which x * 2^j is exact for every x[0 .. K): [xj[0], xj[1]], empty if
 * xj[0] > xj[1]. A normal x of exponent field e stays exact for 1 <= e + j <= 254, a
 * subnormal one for 0 <= j <= 253; zeros, infinities and NaN for any j. */
INL void xs_range(const float *x, int K, int xj[2]) {
    __m512i emin = _mm512_set1_epi32(255), emax = _mm512_setzero_si512();
    __mmask16 sub = 0;
    for (int k = 0; k < K; k += 16) {
        __mmask16 m = K - k < 16 ? (__mmask16)((1u << (K - k)) - 1) : (__mmask16)0xffff;
        __m512i b = _mm512_maskz_loadu_epi32(m, x + k);
        __m512i e = _mm512_and_si512(_mm512_srli_epi32(b, 23), _mm512_set1_epi32(255));
        __mmask16 nz = _mm512_test_epi32_mask(b, _mm512_set1_epi32(0x7fffffff));
        __mmask16 e0 = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
        __mmask16 nrm = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), _mm512_set1_epi32(254));
        sub |= e0 & nz;
        emin = _mm512_mask_min_epu32(emin, nrm, emin, e);
        emax = _mm512_mask_max_epu32(emax, nrm, emax, e);
    }
    int lo = (int)_mm512_reduce_min_epu32(emin), hi = (int)_mm512_reduce_max_epu32(emax);
    xj[0] = lo == 255 ? -1000 : 1 - lo;
    xj[1] = hi == 0 ? 1000 : 254 - hi;
    if (sub) {
        xj[0] = xj[0] > 0 ? xj[0] : 0;
        xj[1] = xj[1] < 253 ? xj[1] : 253;
    }
}

/* One token's activations and, once a block asks (a matrix without power-of-two scales
 * never does), their xs_range. */
typedef struct xs_x {
    const float *x;
    int K, done, j[2];
} xs_x;

/* Whether the RN rows' scales of block column j are one positive 2^k, k in [-120, 119],
 * with x * 2^(k+8) exact (xs_range). Their state st[0] is then 2^(k+8). */
INL int xs_block(const uint8_t *const *srow, int j, int RN, xs_x *xr) {
    uint32_t b0, b;
    memcpy(&b0, srow[0] + 4 * (size_t)j, 4);
    #pragma GCC unroll 8
    for (int r = 1; r < RN; r++) {
        memcpy(&b, srow[r] + 4 * (size_t)j, 4);
        if (b != b0) return 0;
    }
    int k = (int)(b0 >> 23) - 127;
    if ((b0 & 0x807fffffu) || k < -120 || k > 119) return 0;
    if (!xr->done) xs_range(xr->x, xr->K, xr->j), xr->done = 1;
    return k + 8 >= xr->j[0] && k + 8 <= xr->j[1];
}

/* qblock for one token when xs_block holds: st[0] (= every row's st) = 2^(k+8). */
INL void qblock_xs(__m512 acc[QNM][QT], const float *x, const uint8_t *w, size_t rs, const __m512 *st, int kb,
                   int ke, int RN, const uint64_t *const *mr) {
    int k = kb;
    for (; k + 64 <= ke; k += 64) {
        int f16[QNM];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) f16[r] = mr ? df_fp8_map_bit(mr[r], k) : f16_codes64(w + r * rs + k);
        __m512 xs[4];
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) xs[c] = _mm512_mul_ps(_mm512_loadu_ps(x + k + 16 * c), st[0]);
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            if (__builtin_expect(!f16[r], 1)) {
                #pragma GCC unroll 4
                for (int c = 0; c < 4; c++) acc[r][0] = _mm512_fmadd_ps(dec16f(w + r * rs, k + 16 * c), xs[c], acc[r][0]);
            } else {
                row64(acc[r], x, 0, w + r * rs, st[r], k, 1, 0, 1);
            }
        }
    }
    for (; k + 16 <= ke; k += 16) qstep(acc, x, 0, w, rs, st, k, FP8, RN, 1, 0, 0, 16);
    if (k < ke) qstep(acc, x, 0, w, rs, st, k, FP8, RN, 1, 0, 1, ke - k);
}

/* y[t][r] for RN rows at w (stride rs bytes; scale rows srow), RT tokens: FP8. mr: the
 * rows' F16-form maps (kernels.h), when bc is a multiple of 64 (their groups are then
 * the steps of qblock), or NULL. xr: the one token's activations (xs_block), or NULL. */
INL void qtile8(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
                const uint8_t *const *srow, int K, int bc, int RN, int RT, int pf, const uint64_t *const *mr,
                xs_x *xr) {
    const int el = FP8;
    __m512 acc[QNM][QT];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int kb = 0, j = 0; kb < K; kb += bc, j++) {
        int ke = K - kb < bc ? K : kb + bc;
        if (pf) {
            /* each 64-byte line of this block, once, in the row group pf bytes on */
            for (int o = (kb + 63) & ~63; o < ke; o += 64)
                #pragma GCC unroll 8
                for (int r = 0; r < RN; r++) _mm_prefetch((const char *)w + r * rs + o + pf, _MM_HINT_T1);
        }
        __m512 st[QNM];
        int two = block_state(st, srow, DF_SC_F32, j, el, RN);
        if (RT == 1 && xr && xs_block(srow, j, RN, xr)) qblock_xs(acc, x, w, rs, st, kb, ke, RN, mr);
        else if (two) qblock(acc, x, ldx, w, rs, st, kb, ke, el, RN, RT, 1, mr);
        else qblock(acc, x, ldx, w, rs, st, kb, ke, el, RN, RT, 0, mr);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) y[(size_t)t * ldy + r] = hsum16(acc[r][t]);
}

/* ---- the 4-bit formats' products -------------------------------------------
 * Accumulator lane i holds the contract's lane sig(i) = i/2 + 8 * (i & 1):
 * the 8 bytes of a chunk broadcast to every qword and shifted right by 4q in
 * qword q put nibble q in the low bits of dword 2q and nibble q + 8 in those
 * of dword 2q + 1, so one shift and one vpermps decode 16 values. The
 * activations are permuted the same way (one vpermps per chunk and token,
 * shared by the tile's rows) and the lanes put back in contract order before
 * the tree. Each lane still sums the same products in the same order. */

INL __m512i sig_fwd(void) { return _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15); }
INL __m512i sig_inv(void) { return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15); }

/* The lanes (in sig order) of the first rem values of a chunk. */
INL __mmask16 sig_mask(int rem) {
    unsigned m = 0;
    for (int q = 0; q < 8; q++) m |= (unsigned)(q < rem) << (2 * q) | (unsigned)(q + 8 < rem) << (2 * q + 1);
    return (__mmask16)m;
}

/* 16 weights in sig order from the 8 bytes at p (tail: only rem < 16 values
 * are there; the other lanes are +0). */
INL __m512 dec4(const uint8_t *p, __m512 tab, int tail, int rem) {
    __m512i b;
    if (tail) {
        b = _mm512_broadcastq_epi64(_mm_maskz_loadu_epi8((__mmask16)((1u << ((rem + 1) >> 1)) - 1), p));
    } else {
        int64_t v;
        memcpy(&v, p, 8);
        b = _mm512_set1_epi64(v);
    }
    __m512i idx = _mm512_srlv_epi64(b, _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28));
    __m512 w = _mm512_permutexvar_ps(idx, tab);
    return tail ? _mm512_maskz_mov_ps(sig_mask(rem), w) : w;
}

/* Scales j0 .. j0 + 15 (those below gc) of each row, as the byte offsets of
 * their tables: MXFP4's E8M0 in df_e2m1_tables (s * 64), INT4's BF16 in
 * df_i4_tables ((bits - DF_I4_TAB_LO) * 64). Returns 0 if an INT4 scale has
 * no table there (the caller then multiplies for these 16 groups). */
INL int load_scales(uint32_t sb[QNM][16], const uint8_t *const *srow, int el, int j0, int gc, int RN) {
    int n = gc - j0 < 16 ? gc - j0 : 16;
    __mmask16 m = (__mmask16)((1u << n) - 1), in = m;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        __m512i v;
        if (el == I4) {
            v = _mm512_sub_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, srow[r] + 2 * (size_t)j0)),
                                 _mm512_set1_epi32((int)DF_I4_TAB_LO));
            in &= _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32((int)DF_I4_TAB_N));
        } else {
            v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, srow[r] + j0));
        }
        _mm512_store_si512(sb[r], _mm512_slli_epi32(v, 6));
    }
    return in == m;
}

/* acc[r][t] += w(row r, chunk k) * x[t][chunk k], all in sig order */
INL void qstep4(__m512 acc[QNM][QT], const float *x, int ldx, const uint8_t *w, size_t rs, const __m512 *tab,
                int k, int RN, int RT, int tail, int rem) {
    __m512 wv[QNM];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) wv[r] = dec4(w + r * rs + (k >> 1), tab[r], tail, rem);
    __mmask16 m = tail ? (__mmask16)((1u << rem) - 1) : (__mmask16)0xffff;
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++) {
        const float *xp = x + (size_t)t * ldx + k;
        __m512 xv = _mm512_permutexvar_ps(sig_fwd(), tail ? _mm512_maskz_loadu_ps(m, xp) : _mm512_loadu_ps(xp));
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}

/* As qtile8 for I4 and E2M1; bc is a constant (32) or 0 (read bcv). */
INL void qtile4(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
                const uint8_t *const *srow, int K, int bc, int bcv, int el, int RN, int RT, int pf,
                const uint8_t *const *spf) {
    if (!bc) bc = bcv;
    __m512 acc[QNM][QT];
    _Alignas(64) uint32_t sb[QNM][16];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t] = _mm512_setzero_ps();
    const int gc = (K + bc - 1) / bc;
    const float(*tabs)[16] = el == E2M1 ? df_e2m1_tables() : df_i4_tables();
    int tabled = 1;
    for (int kb = 0, j = 0; kb < K; kb += bc, j++) {
        int ke = K - kb < bc ? K : kb + bc;
        if ((j & 15) == 0) {
            tabled = load_scales(sb, srow, el, j, gc, RN);
            if (pf) {
                /* the lines of these 16 blocks, in the row group pf bytes on */
                int b0 = kb >> 1, b1 = (K - kb < 16 * bc ? K + 1 : kb + 16 * bc) >> 1;
                for (int o = (b0 + 63) & ~63; o < b1; o += 64)
                    #pragma GCC unroll 8
                    for (int r = 0; r < RN; r++) _mm_prefetch((const char *)w + r * rs + o + pf, _MM_HINT_T1);
                /* and their scales: the scale rows are separate streams that
                 * the values' prefetch does not cover (without it the demand
                 * misses on them cost INT4 a third of its speed in RAM) */
                #pragma GCC unroll 8
                for (int r = 0; r < RN; r++)
                    _mm_prefetch((const char *)spf[r] + (size_t)j * (el == I4 ? 2 : 1), _MM_HINT_T1);
            }
        }
        __m512 tab[QNM];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++)
            tab[r] = el == E2M1 || __builtin_expect(tabled, 1)
                         ? _mm512_load_ps((const char *)tabs + sb[r][j & 15])
                         : _mm512_mul_ps(base_table(el), _mm512_set1_ps(df_scale_at(srow[r], DF_SC_BF16, j)));
        int k = kb;
        if (bc == 32 && ke - kb == 32) { /* a whole group: two steps, no loop */
            qstep4(acc, x, ldx, w, rs, tab, k, RN, RT, 0, 16);
            qstep4(acc, x, ldx, w, rs, tab, k + 16, RN, RT, 0, 16);
            continue;
        }
        for (; k + 16 <= ke; k += 16) qstep4(acc, x, ldx, w, rs, tab, k, RN, RT, 0, 16);
        if (k < ke) qstep4(acc, x, ldx, w, rs, tab, k, RN, RT, 1, ke - k);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) y[(size_t)t * ldy + r] = hsum16(_mm512_permutexvar_ps(sig_inv(), acc[r][t]));
}

/* spf: where to prefetch each row's scales (with pf; 4-bit formats only) */
INL void qtile(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
               const uint8_t *const *srow, int K, int bc, int el, int RN, int RT, int pf,
               const uint8_t *const *spf) {
    if (el == FP8) qtile8(y, ldy, x, ldx, w, rs, srow, K, bc, RN, RT, pf, NULL, NULL);
    else if (bc == 32) qtile4(y, ldy, x, ldx, w, rs, srow, K, 32, bc, el, RN, RT, pf, spf);
    else qtile4(y, ldy, x, ldx, w, rs, srow, K, 0, bc, el, RN, RT, pf, spf);
}

/* RN rows for nt tokens: full QT-token tiles, then one tile for the rest. */
_Static_assert(QT == 4, "qstrip() has a case for each leftover count 1..QT-1");
INL void qstrip(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
                const uint8_t *const *srow, int K, int bc, int el, int RN, int nt) {
    int t = 0, tf = nt - nt % QT;
    for (; t < tf; t += QT) qtile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, srow, K, bc, el, RN, QT, 0, NULL);
    float *yt = y + (size_t)t * ldy;
    const float *xt = x + (size_t)t * ldx;
    switch (nt - tf) {
    case 3: qtile(yt, ldy, xt, ldx, w, rs, srow, K, bc, el, RN, 3, 0, NULL); break;
    case 2: qtile(yt, ldy, xt, ldx, w, rs, srow, K, bc, el, RN, 2, 0, NULL); break;
    case 1: qtile(yt, ldy, xt, ldx, w, rs, srow, K, bc, el, RN, 1, 0, NULL); break;
    default: break;
    }
}

/* The one-token 4-bit tiles of 32-value groups (scaled.h) */
DF_QTILE4_T1(qtile4_t1_i4, I4, QN1)
DF_QTILE4_T1(qtile4_t1_e2m1, E2M1, QN1)

/* T == 1: RN-row groups, each prefetching the next one (its values and
 * scales; further ahead, or into L1 or NTA, measured no better). */
INL void qrows1(float *y, const float *x, const df_wview *v, int n0, int n1, int el, int RN) {
    const uint8_t *w = v->data;
    const int K = v->cols, bc = v->fmt.block_cols;
    const size_t rs = df_wfmt_row_bytes(v->fmt, K);
    const uint8_t *sr[QNM], *spf[QNM];
    const uint64_t *mr[QNM];
    const bool map = el == FP8 && df_fp8_map_row(v, 0);
    xs_x xr = {x, K, 0, {0, 0}};
    /* prefetch: see matmul_avx512.c */
    int next = RN * rs <= (32u << 10), pf = next ? (int)(RN * rs) : 2048;
    /* the scales pf bytes of values on: a later group's rows, or further in the row */
    size_t spo = el == FP8 ? 0 : (size_t)(2 * pf / bc) * (el == I4 ? 2 : 1);
    int n = n0;
    for (; n + RN <= n1; n += RN) {
        for (int r = 0; r < RN; r++) {
            int nr = n + RN + r;
            sr[r] = df_scale_row(v, n + r);
            spf[r] = next ? df_scale_row(v, nr < n1 ? nr : n1 - 1) : sr[r] + spo;
            if (map) mr[r] = df_fp8_map_row(v, n + r);
        }
        if (el == FP8 && map) /* two copies: the one without a map tests as before */
            qtile8(y + n, 1, x, 0, w + n * rs, rs, sr, K, bc, RN, 1, pf, mr, &xr);
        else if (el == FP8)
            qtile8(y + n, 1, x, 0, w + n * rs, rs, sr, K, bc, RN, 1, pf, NULL, &xr);
        else if (bc == 32 && RN == QN1)
            (el == I4 ? qtile4_t1_i4 : qtile4_t1_e2m1)(y + n, x, w + n * rs, rs, sr, K, pf, spf);
        else
            qtile(y + n, 1, x, 0, w + n * rs, rs, sr, K, bc, el, RN, 1, pf, spf);
    }
    for (; n < n1; n++) {
        sr[0] = df_scale_row(v, n);
        qtile(y + n, 1, x, 0, w + n * rs, rs, sr, K, bc, el, 1, 1, 0, NULL);
    }
}

INL void qrows(float *y, int ldy, const float *x, int ldx, const df_wview *v, int T, int n0, int n1, int el) {
    const uint8_t *w = v->data;
    const int K = v->cols, bc = v->fmt.block_cols;
    const size_t rs = df_wfmt_row_bytes(v->fmt, K);
    const uint8_t *sr[QN];
    if (T == 1) {
        if (el != FP8) qrows1(y, x, v, n0, n1, el, QN1);
        else qrows1(y, x, v, n0, n1, el, QN);
        return;
    }
    /* token blocks whose activations stay in L2 (see matmul_avx512.c) */
    int tb = (int)(((size_t)256 << 10) / ((size_t)(K ? K : 1) * 4));
    tb = tb < QT ? QT : tb - tb % QT;
    for (int t0 = 0; t0 < T; t0 += tb) {
        int nt = t0 + tb < T ? tb : T - t0;
        const float *xb = x + (size_t)t0 * ldx;
        float *yb = y + (size_t)t0 * ldy;
        int n = n0;
        for (; n + QN <= n1; n += QN) {
            for (int r = 0; r < QN; r++) sr[r] = df_scale_row(v, n + r);
            qstrip(yb + n, ldy, xb, ldx, w + n * rs, rs, sr, K, bc, el, QN, nt);
        }
        for (; n < n1; n++) {
            sr[0] = df_scale_row(v, n);
            qstrip(yb + n, ldy, xb, ldx, w + n * rs, rs, sr, K, bc, el, 1, nt);
        }
    }
}

static void qrows_fp8(float *y, int ldy, const float *x, int ldx, const df_wview *v, int T, int n0, int n1) {
    qrows(y, ldy, x, ldx, v, T, n0, n1, FP8);
}
static void qrows_i4(float *y, int ldy, const float *x, int ldx, const df_wview *v, int T, int n0, int n1) {
    qrows(y, ldy, x, ldx, v, T, n0, n1, I4);
}
static void qrows_e2m1(float *y, int ldy, const float *x, int ldx, const df_wview *v, int T, int n0, int n1) {
    qrows(y, ldy, x, ldx, v, T, n0, n1, E2M1);
}

void df_qrows_avx512(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1) {
    switch ((int)w->fmt.elem) {
    case FP8: qrows_fp8(y, ldy, x, ldx, w, T, n0, n1); break;
    case I4: qrows_i4(y, ldy, x, ldx, w, T, n0, n1); break;
    default: qrows_e2m1(y, ldy, x, ldx, w, T, n0, n1); break;
    }
}

INL void qdecode(float *dst, const df_wview *v, int r0, int n, int el) {
    const int K = v->cols, bc = v->fmt.block_cols;
    const size_t rs = df_wfmt_row_bytes(v->fmt, K);
    for (int i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)v->data + (size_t)(r0 + i) * rs, *srow = df_scale_row(v, r0 + i);
        float *d = dst + (size_t)i * (size_t)K;
        for (int kb = 0, j = 0; kb < K; kb += bc, j++) {
            int ke = K - kb < bc ? K : kb + bc, k = kb;
            __m512 st;
            int two = block_state(&st, &srow, v->fmt.scale, j, el, 1);
            /* FP8 in the F32 form where 64 codes allow it (the products of
             * many tokens decode their rows here, matmul.c) */
            for (; el == FP8 && k + 64 <= ke; k += 64) {
                int f16 = f16_codes64(row + k);
                #pragma GCC unroll 4
                for (int c = 0; c < 64; c += 16)
                    _mm512_storeu_ps(d + k + c, __builtin_expect(!f16, 1) ? dec16n(row, k + c, st, two)
                                                                          : dec16(el, row, k + c, st, two, 0, 16));
            }
            for (; k + 16 <= ke; k += 16) _mm512_storeu_ps(d + k, dec16(el, row, k, st, two, 0, 16));
            if (k < ke)
                _mm512_mask_storeu_ps(d + k, (__mmask16)((1u << (ke - k)) - 1),
                                      dec16(el, row, k, st, two, 1, ke - k));
        }
    }
}

void df_qdecode_avx512(float *dst, const df_wview *w, int r0, int n) {
    switch ((int)w->fmt.elem) {
    case FP8: qdecode(dst, w, r0, n, FP8); break;
    case I4: qdecode(dst, w, r0, n, I4); break;
    default: qdecode(dst, w, r0, n, E2M1); break;
    }
}

#endif
