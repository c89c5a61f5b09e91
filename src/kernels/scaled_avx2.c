/*
 * scaled_avx2.c - the AVX2+FMA path of the scaled formats (kernels.h):
 * products and the exact decoding of rows. Compiled with those flags; only
 * called when isa.c found CPU and OS support.
 *
 * As in matmul_avx2.c, the contract's 16 lanes are two __m256 accumulators
 * per output (elements 16i..16i+7 in `lo`, 16i+8..16i+15 in `hi`), reduced by
 * the same tree, so results match the C and AVX-512 paths bit for bit. The
 * decodings are those of scaled_avx512.c (see there why they are exact), in
 * 8-lane form:
 *  - e4m3: sign-extend to 16 bits, shift left 7, mask 0xbf80, vcvtph2ps
 *    (decode(q) * 2^-8, never an F32 subnormal), times the block scale
 *    pre-multiplied by 2^8 (or the two-multiply form for |s| >= 2^120); a byte
 *    compare per 32 values finds NaN codes, and only then are they blended in.
 *    Without them, one-token products decode 16 values of a row at once (dec16:
 *    one widening, shift and mask of 16 bytes for both halves). The products
 *    take the F32 form (dec8n: the bits placed in an F32, decode(q) * 2^-120,
 *    times s * 2^120) where the 32 values of the rows have no e = 0 and no
 *    NaN code, which is almost always in a checkpoint (+10-14 % at T = 4 in
 *    L2 on an idle core, 1-3 % with the host's other work on it; at T = 1
 *    +7-8 % in L2 and +3 % from RAM in session 13, where session 12 had
 *    measured -6 to +4 % and left it to T > 1). A view with an F16-form map
 *    (kernels.h) answers that test at T = 1 from the bits of the 64-code
 *    groups instead (+5 % on Zen 4).
 *  - E2M1: vpermps reads only 3 index bits, so the table holds the scaled
 *    magnitudes of codes 0-7 and the code's bit 3 becomes the sign with one
 *    xor (e2m1_sign): fl(-d * s) = -fl(d * s). (A second table and vblendvps
 *    per 8 values took 1.3-1.4x as long.) The products take the magnitudes
 *    from df_e2m1_tables (scaled.h) instead of multiplying (+1-8 % at T = 1).
 *  - INT4: the rows' decoding uses two scaled 8-entry halves (nibbles 0-7 and
 *    8-15), the nibble's bit 3, shifted into the sign bit, picking one with
 *    vblendvps. The products decode without a table: (n ^ 8) sign-extended
 *    is n - 8, converted exactly and multiplied by the scale, the same
 *    fl((n - 8) * s) as the table entry.
 *  - The products of both (qstep4) keep the lanes in a permuted order so that
 *    one shift per 8 values extracts the nibbles, and widen the group scales 8
 *    at a time into a small buffer (load_scales), as scaled_avx512.c does.
 * The tail (K % 16 values) is decoded from a zeroed copy of its bytes and
 * masked to +0 past the row's end.
 *
 * Tiles: T == 1 does 4 rows at once for FP8 (8 accumulators) and 3 for the
 * 4-bit formats (6 accumulators, 3 tables: with 4 rows GCC kept 4
 * accumulators in memory), with the software prefetch of matmul_avx2.c; T > 1
 * a 2-row x 2-token tile (8 accumulators and the rows' tables within the 16
 * registers). The one-token 4-bit tile of 32-value groups is a function of its
 * own (qtile4_t1_*) that steps through a whole group without a loop (inlined
 * with the rest, GCC reloaded rows' scales from the stack in every step); the
 * two together took INT4 from 0.26 to 0.35 of the bandwidth
 * (docs/benchmarks.md).
 */
#include "kernels/scaled.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#define INL static inline __attribute__((always_inline))

#define QG 4 /* rows per group, T == 1 */
#define QG4 3 /* rows per group, T == 1, 4-bit formats */
#define QN 2 /* rows per tile, T > 1 */
#define QT 2 /* tokens per tile, T > 1 */
#define QMAX 4 /* the largest of QG, QG4, QN */

enum { FP8 = DF_EL_F8_E4M3, I4 = DF_EL_I4, E2M1 = DF_EL_E2M1 };

/* A row's state for one scale block: FP8: the broadcast scale (unless two,
 * times 2^8 in a, 2^120 in b); 4-bit: the scaled table halves. */
typedef struct {
    __m256 a, b;
} qstate;

/* E2M1's state from its scaled magnitudes m (codes 0-7): entry i xored with
 * i << 28, which e2m1_sign takes out again */
INL qstate e2m1_state(__m256 m) {
    qstate q;
    q.a = q.b = _mm256_xor_ps(m, _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28,
                                                                       5 << 28, 6 << 28, 7 << 28)));
    return q;
}

INL qstate make_state(int el, float s, int two, int prod) {
    qstate q;
    __m256 sv = _mm256_set1_ps(s);
    if (el == I4 && prod) {
        q.a = q.b = sv; /* products convert the INT4 value and multiply (dec4p) */
    } else if (el == FP8) { /* a: the F16 form's, b: the F32 form's (dec8n) */
        q.a = _mm256_set1_ps(two ? s : s * 0x1p8f);
        q.b = _mm256_set1_ps(two ? s : s * 0x1p120f);
    } else if (el == I4) {
        q.a = _mm256_mul_ps(_mm256_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f), sv);
        q.b = _mm256_mul_ps(_mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f), sv);
    } else { /* E2M1: the magnitudes' table */
        q = e2m1_state(_mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), sv));
    }
    return q;
}

/* FP8: the weights fl(decode(q) * s) from f = decode(q) * 2^-8 (exact) and the
 * block state (s * 2^8, or s itself in the two-multiply form). */
INL __m256 fp8_scaled(__m256 f, qstate st, int two) {
    return _mm256_mul_ps(two ? _mm256_mul_ps(f, _mm256_set1_ps(0x1p8f)) : f, st.a);
}

/* E2M1: t is the table entry of the nibble's bits 0-2 (vpermps reads no more),
 * fl(|d| * s) ^ (bits 0-2 << 28); xoring the nibble << 28 takes those bits
 * out again and puts its bit 3 into the sign: fl(-|d| * s) = -fl(|d| * s).
 * One xor instead of a second lookup and a blend. */
INL __m256 e2m1_sign(__m256 t, __m256i idx) {
    return _mm256_xor_ps(t, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* 8 weights at column k (a multiple of 8) of a row (p: the row's bytes or a
 * zeroed copy of its tail). nanchk: FP8 lanes may hold NaN codes. */
INL __m256 dec8(int el, const uint8_t *row, int k, qstate st, int two, int nanchk) {
    if (el == FP8) {
        __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(row + k))), 7);
        h = _mm_and_si128(h, _mm_set1_epi16((short)0xbf80));
        __m256 f = _mm256_cvtph_ps(h);
        __m256 w = fp8_scaled(f, st, two);
        if (nanchk) { /* 0x7f/0xff are the F16 +-0x3f80 (1.875): no other code is */
            __m256 mag = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), f);
            w = _mm256_blendv_ps(w, _mm256_set1_ps(NAN), _mm256_cmp_ps(mag, _mm256_set1_ps(1.875f), _CMP_EQ_OQ));
        }
        return w;
    }
    int32_t b4;
    memcpy(&b4, row + (k >> 1), 4);
    __m256i q = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(b4));
    __m256i idx = _mm256_or_si256(q, _mm256_slli_epi64(q, 28));
    if (el == E2M1) return e2m1_sign(_mm256_permutevar8x32_ps(st.a, idx), idx);
    __m256 lo = _mm256_permutevar8x32_ps(st.a, idx), hi = _mm256_permutevar8x32_ps(st.b, idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* FP8 without NaN codes: the 16 weights at column k of a row, as dec8 gives
 * them for k and k + 8, from one widening, shift and mask of 16 bytes. */
INL void dec16(const uint8_t *row, int k, qstate st, int two, __m256 *w0, __m256 *w1) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + k))), 7);
    h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80));
    __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    *w0 = fp8_scaled(f0, st, two);
    *w1 = fp8_scaled(f1, st, two);
}

/* FP8, the F32 form: the 8 weights at column k of a row whose codes all have
 * e >= 1 and are not NaN. The sign-extended byte shifted left 20 and masked
 * to 0x87f00000 is the F32 decode(q) * 2^-120, a normal number; times the
 * scale pre-multiplied by 2^120 it is fl(decode(q) * s) (the argument of the
 * F16 form, with 2^120 for 2^8). Three operations per 8 values where the F16
 * form takes four and a half (vcvtph2ps is two). */
INL __m256 dec8n(const uint8_t *row, int k, qstate st, int two) {
    __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k)));
    __m256 f = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), _mm256_set1_epi32((int)0x87f00000u)));
    return _mm256_mul_ps(two ? _mm256_mul_ps(f, _mm256_set1_ps(0x1p120f)) : f, st.b);
}

/* The state of each row for block column j; returns `two` (FP8 only). */
INL int block_state(qstate *st, const uint8_t *const *srow, df_scale_type sct, int j, int el, int RN) {
    float s[QMAX];
    int two = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        s[r] = df_scale_at(srow[r], sct, j);
        if (el == FP8) two |= isfinite(s[r]) && !isfinite(s[r] * 0x1p120f);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) st[r] = make_state(el, s[r], two, 0);
    return two;
}

/* NaN codes among the n (16 or 32) FP8 bytes at p of each row */
INL int fp8_has_nan(const uint8_t *w, size_t rs, int k, int RN, int n) {
    int any = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        const uint8_t *p = w + r * rs + k;
        if (n == 32) {
            __m256i b = _mm256_loadu_si256((const __m256i *)p);
            any |= _mm256_movemask_epi8(
                _mm256_cmpeq_epi8(_mm256_or_si256(b, _mm256_set1_epi8((char)0x80)), _mm256_set1_epi8(-1)));
        } else {
            __m128i b = _mm_loadu_si128((const __m128i *)p);
            any |= _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_or_si128(b, _mm_set1_epi8((char)0x80)), _mm_set1_epi8(-1)));
        }
    }
    return any;
}

/* ---- the 4-bit formats' products ------------------------------------------
 * The two accumulators of an output hold the contract's lanes in the order
 * of _mm256_unpacklo/hi_ps(x[0..7], x[8..15]): {0,8,1,9,4,12,5,13} and
 * {2,10,3,11,6,14,7,15}. The chunk's 8 bytes, broadcast to the 4 qwords and
 * shifted per qword, give exactly those nibbles in 8 dword lanes (qword
 * shift 4n puts nibble n in the low bits of its low dword and n + 8 in those
 * of its high dword; shift 28 - 4n puts them in the top bits), so a chunk
 * costs one shift per 8 values before the lookup, and the activations one
 * unpack per 8, shared by the rows. qtile puts the lanes back before the
 * tree; each lane sums the same products in the same order. */

/* The lanes (contract order) of the two accumulators, for tail masks. */
INL __m256i sig_a(void) { return _mm256_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13); }
INL __m256i sig_b(void) { return _mm256_setr_epi32(2, 10, 3, 11, 6, 14, 7, 15); }

/* 8 weights of half h (0: sig_a lanes, 1: sig_b) of the chunk whose 8 bytes
 * are broadcast in b. INT4: (n ^ 8) sign-extended from 4 bits is n - 8,
 * converted exactly and multiplied by the scale: fl((n - 8) * s), the table's
 * entry. E2M1: the two scaled 8-entry tables and bit 3, as dec8. */
INL __m256 dec4p(int el, __m256i b, int h, qstate st) {
    if (el == I4) {
        __m256i sh = h ? _mm256_setr_epi64x(20, 16, 4, 0) : _mm256_setr_epi64x(28, 24, 12, 8);
        __m256i t = _mm256_srai_epi32(_mm256_sllv_epi64(b, sh), 28);
        return _mm256_mul_ps(_mm256_cvtepi32_ps(t), st.a);
    }
    __m256i sh = h ? _mm256_setr_epi64x(8, 12, 24, 28) : _mm256_setr_epi64x(0, 4, 16, 20);
    __m256i idx = _mm256_srlv_epi64(b, sh);
    return e2m1_sign(_mm256_permutevar8x32_ps(st.a, idx), idx);
}

/* acc[r][t] += w(row r, chunk k) * x[t][chunk k] in the lane order above.
 * tail: the rows and activations are zeroed copies, rem < 16 values real. */
INL void qstep4(__m256 acc[QMAX][QT][2], const float *x, int ldx, const uint8_t *w, size_t rs, const qstate *st,
                int k, int el, int RN, int RT, int tail, int rem) {
    __m256 xa[QT], xb[QT], keep[2];
    if (tail) {
        keep[0] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem), sig_a()));
        keep[1] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem), sig_b()));
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++) {
        const float *xp = x + (size_t)t * ldx + k;
        __m256 l = _mm256_loadu_ps(xp), h = _mm256_loadu_ps(xp + 8);
        xa[t] = _mm256_unpacklo_ps(l, h);
        xb[t] = _mm256_unpackhi_ps(l, h);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        int64_t v;
        memcpy(&v, w + r * rs + (k >> 1), 8);
        __m256i b = _mm256_set1_epi64x(v);
        if (el == I4) b = _mm256_xor_si256(b, _mm256_set1_epi8((char)0x88));
        __m256 wa = dec4p(el, b, 0, st[r]), wb = dec4p(el, b, 1, st[r]);
        if (tail) wa = _mm256_and_ps(wa, keep[0]), wb = _mm256_and_ps(wb, keep[1]);
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) {
            acc[r][t][0] = _mm256_fmadd_ps(wa, xa[t], acc[r][t][0]);
            acc[r][t][1] = _mm256_fmadd_ps(wb, xb[t], acc[r][t][1]);
        }
    }
}

/* acc[r][t] += w(row r, 16 values at k) * x[t][k..k+15]. tail: the rows are
 * zeroed copies and only rem < 16 values are real. */
INL void qstep(__m256 acc[QMAX][QT][2], const float *x, int ldx, const uint8_t *w, size_t rs, const qstate *st,
               int k, int el, int RN, int RT, int two, int nanchk, int tail, int rem) {
    if (el != FP8) {
        qstep4(acc, x, ldx, w, rs, st, k, el, RN, RT, tail, rem);
        return;
    }
    __m256 wv[QMAX][2];
    __m256 keep[2];
    if (tail) {
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        keep[0] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lane));
        keep[1] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8), lane));
    }
    if (RT == 1 && !tail && !nanchk) {
        /* one row's two weight vectors live at a time: the 4-row group's 8
         * accumulators and states then fit the 16 registers (decoding all 8
         * weights first spilled the accumulators) */
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            __m256 w0, w1;
            dec16(w + r * rs, k, st[r], two, &w0, &w1);
            acc[r][0][0] = _mm256_fmadd_ps(w0, x0, acc[r][0][0]);
            acc[r][0][1] = _mm256_fmadd_ps(w1, x1, acc[r][0][1]);
        }
        return;
    }
    if (RT == 1 && !tail) {
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 xv = _mm256_loadu_ps(x + k + 8 * h);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++)
                acc[r][0][h] = _mm256_fmadd_ps(dec8(el, w + r * rs, k + 8 * h, st[r], two, nanchk), xv, acc[r][0][h]);
        }
        return;
    }
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            wv[r][h] = dec8(el, w + r * rs, k + 8 * h, st[r], two, nanchk);
            if (tail) wv[r][h] = _mm256_and_ps(wv[r][h], keep[h]);
        }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * ldx + k + 8 * h);
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) acc[r][t][h] = _mm256_fmadd_ps(wv[r][h], xv, acc[r][t][h]);
        }
}

/* The last rem < 16 values of a block: from zeroed copies of the rows' bytes
 * and of the activations. */
INL void qtail(__m256 acc[QMAX][QT][2], const float *x, int ldx, const uint8_t *w, size_t rs, const qstate *st,
               int k, int rem, int el, int RN, int RT, int two) {
    _Alignas(32) uint8_t wb[QMAX][16];
    _Alignas(32) float xb[QT][16];
    size_t nb = el == FP8 ? (size_t)rem : (size_t)(rem + 1) / 2, off = el == FP8 ? (size_t)k : (size_t)k / 2;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        memset(wb[r], 0, 16);
        memcpy(wb[r], w + r * rs + off, nb);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++) {
        memset(xb[t], 0, sizeof xb[t]);
        memcpy(xb[t], x + (size_t)t * ldx + k, (size_t)rem * 4);
    }
    qstep(acc, &xb[0][0], 16, &wb[0][0], 16, st, 0, el, RN, RT, two, 1, 1, rem);
}

/* Whether the 32 codes at p have one that the F32 form cannot take: e = 0
 * (an F32 subnormal, which Intel CPUs multiply through a microcode assist) or
 * NaN; the test, (q + 1) & 0x70 == 0, also catches e = 1, m < 7. */
INL int f16_codes32(const uint8_t *p) {
    __m256i b = _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8(1));
    b = _mm256_and_si256(b, _mm256_set1_epi8(0x70));
    return _mm256_movemask_epi8(_mm256_cmpeq_epi8(b, _mm256_setzero_si256())) != 0;
}

/* acc[r][t][c / 8 % 2] += the F32 form's weights at columns k + c (c: 0, 8,
 * 16, 24) of each row times x[t]; one weight vector live at a time, so that
 * the accumulators stay in the 16 registers. */
INL void qstepn(__m256 acc[QMAX][QT][2], const float *x, int ldx, const uint8_t *w, size_t rs, const qstate *st,
                int k, int RN, int RT, int two) {
    #pragma GCC unroll 4
    for (int c = 0; c < 32; c += 8)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) {
            __m256 wv = dec8n(w + r * rs, k + c, st[r], two);
            #pragma GCC unroll 8
            for (int t = 0; t < RT; t++)
                acc[r][t][c / 8 % 2] =
                    _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)t * ldx + k + c), acc[r][t][c / 8 % 2]);
        }
}

/* Columns [kb, ke) of one FP8 scale block (the 4-bit formats: qtile4): 32
 * values at a time, in the F32 form unless a row's codes there need
 * the F16 form (one test for all rows: with a branch per row, as
 * scaled_avx512.c has, GCC kept the accumulators in memory), then 16 at a
 * time. */
INL void qblock(__m256 acc[QMAX][QT][2], const float *x, int ldx, const uint8_t *w, size_t rs, const qstate *st,
                int kb, int ke, int RN, int RT, int two, const uint64_t *const *mr) {
    int k = kb;
    for (; k + 32 <= ke; k += 32) {
        int f16 = 0; /* the F32 form unless a row's codes need the F16 form */
        if (mr) { /* the rows' maps (kernels.h): their 64-code group holds these 32 */
            #pragma GCC unroll 8
            for (int r = 0; r < RN; r++) f16 |= df_fp8_map_bit(mr[r], k);
        } else {
            #pragma GCC unroll 8
            for (int r = 0; r < RN && !f16; r++) f16 |= f16_codes32(w + r * rs + k);
        }
        /* as in scaled_avx512.c: no loads hoisted above the test */
        __asm__ volatile("" ::: "memory");
        if (__builtin_expect(!f16, 1)) {
            __asm__ volatile("" ::: "memory");
            qstepn(acc, x, ldx, w, rs, st, k, RN, RT, two);
            continue;
        }
        int nan = fp8_has_nan(w, rs, k, RN, 32);
        __asm__ volatile("" ::: "memory");
        if (__builtin_expect(!nan, 1)) {
            __asm__ volatile("" ::: "memory");
            qstep(acc, x, ldx, w, rs, st, k, FP8, RN, RT, two, 0, 0, 16);
            qstep(acc, x, ldx, w, rs, st, k + 16, FP8, RN, RT, two, 0, 0, 16);
        } else {
            qstep(acc, x, ldx, w, rs, st, k, FP8, RN, RT, two, 1, 0, 16);
            qstep(acc, x, ldx, w, rs, st, k + 16, FP8, RN, RT, two, 1, 0, 16);
        }
    }
    if (k + 16 <= ke) {
        int nan = fp8_has_nan(w, rs, k, RN, 16);
        if (__builtin_expect(!nan, 1)) qstep(acc, x, ldx, w, rs, st, k, FP8, RN, RT, two, 0, 0, 16);
        else qstep(acc, x, ldx, w, rs, st, k, FP8, RN, RT, two, 1, 0, 16);
        k += 16;
    }
    if (k < ke) qtail(acc, x, ldx, w, rs, st, k, ke - k, FP8, RN, RT, two);
}

/* lo + hi is lanes[i] += lanes[i+8]; then +4, +2, +1 (as matmul_avx2.c) */
INL float hsum2x8(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* Scales j0 .. j0 + 7 (those below gc) of each row: INT4's BF16 widened
 * exactly to F32 (bits), for broadcasts from memory; MXFP4's E8M0 as the
 * byte offset of its table in df_e2m1_tables (s * 64). */
INL void load_scales(uint32_t sb[QMAX][8], const uint8_t *const *srow, int el, int j0, int gc, int RN) {
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++) {
        if (gc - j0 < 8) { /* the row's last scales: no reads past them */
            for (int i = 0; i < gc - j0; i++) {
                uint16_t h = 0;
                if (el == I4) memcpy(&h, srow[r] + 2 * (size_t)(j0 + i), 2);
                sb[r][i] = el == I4 ? (uint32_t)h << 16 : (uint32_t)srow[r][j0 + i] << 6;
            }
            continue;
        }
        __m256i v;
        if (el == I4)
            v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(srow[r] + 2 * (size_t)j0))),
                                  16);
        else
            v = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(srow[r] + j0))), 6);
        _mm256_store_si256((__m256i *)sb[r], v);
    }
}

/* A group's state from load_scales' entry u: INT4 from the scale (memcpy:
 * GCC broadcasts it from memory, as a float); E2M1 from its ready-made table
 * (entries 0-7 are fl(|d| * s)): one operation where make_state takes two. */
INL qstate group_state(int el, uint32_t u, const float (*e2t)[16]) {
    if (el == E2M1) return e2m1_state(_mm256_load_ps((const float *)((const char *)e2t + u)));
    float s;
    memcpy(&s, &u, 4);
    return make_state(el, s, 0, 1);
}

/* As qtile for I4 and E2M1, the group scales widened 8 at a time (load_scales)
 * and each group's state made from them (group_state). bc: a constant
 * (32) or 0 (read bcv). spf: where to prefetch each row's scales (with pf). */
INL void qtile4(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
                const uint8_t *const *srow, int K, int bc, int bcv, int el, int RN, int RT, int pf,
                const uint8_t *const *spf) {
    if (!bc) bc = bcv;
    __m256 acc[QMAX][QT][2];
    _Alignas(32) uint32_t sb[QMAX][8];
    const float(*e2t)[16] = el == E2M1 ? df_e2m1_tables() : NULL;
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    const int gc = (K + bc - 1) / bc;
    for (int kb = 0, j = 0; kb < K; kb += bc, j++) {
        int ke = K - kb < bc ? K : kb + bc;
        if ((j & 7) == 0) {
            load_scales(sb, srow, el, j, gc, RN);
            if (pf) {
                int b0 = kb >> 1, b1 = (K - kb < 8 * bc ? K + 1 : kb + 8 * bc) >> 1;
                for (int o = (b0 + 63) & ~63; o < b1; o += 64)
                    #pragma GCC unroll 8
                    for (int r = 0; r < RN; r++) _mm_prefetch((const char *)w + r * rs + o + pf, _MM_HINT_T1);
                #pragma GCC unroll 8
                for (int r = 0; r < RN; r++)
                    _mm_prefetch((const char *)spf[r] + (size_t)j * (el == I4 ? 2 : 1), _MM_HINT_T1);
            }
        }
        qstate st[QMAX];
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) st[r] = group_state(el, sb[r][j & 7], e2t);
        int k = kb;
        if (bc == 32 && ke - kb == 32) { /* a whole group: two steps, no loop */
            qstep4(acc, x, ldx, w, rs, st, k, el, RN, RT, 0, 16);
            qstep4(acc, x, ldx, w, rs, st, k + 16, el, RN, RT, 0, 16);
            continue;
        }
        for (; k + 16 <= ke; k += 16) qstep4(acc, x, ldx, w, rs, st, k, el, RN, RT, 0, 16);
        if (k < ke) qtail(acc, x, ldx, w, rs, st, k, ke - k, el, RN, RT, 0);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) /* back to lanes 0-7 and 8-15 (qstep4) */
            y[(size_t)t * ldy + r] = hsum2x8(_mm256_shuffle_ps(acc[r][t][0], acc[r][t][1], _MM_SHUFFLE(2, 0, 2, 0)),
                                             _mm256_shuffle_ps(acc[r][t][0], acc[r][t][1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The one-token 4-bit tiles of 32-value groups (scaled.h) */
DF_QTILE4_T1(qtile4_t1_i4, I4, QG4)
DF_QTILE4_T1(qtile4_t1_e2m1, E2M1, QG4)

/* FP8 here; the 4-bit formats in qtile4 (spf: see there). mr: FP8 rows' F16-form maps
 * when bc is a multiple of 64, or NULL. */
INL void qtile(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
               const uint8_t *const *srow, df_scale_type sct, int K, int bc, int el, int RN, int RT, int pf,
               const uint8_t *const *spf, const uint64_t *const *mr) {
    if (el != FP8) {
        if (bc == 32) qtile4(y, ldy, x, ldx, w, rs, srow, K, 32, bc, el, RN, RT, pf, spf);
        else qtile4(y, ldy, x, ldx, w, rs, srow, K, 0, bc, el, RN, RT, pf, spf);
        return;
    }
    __m256 acc[QMAX][QT][2];
    #pragma GCC unroll 8
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < RT; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    for (int kb = 0, j = 0; kb < K; kb += bc, j++) {
        int ke = K - kb < bc ? K : kb + bc;
        if (pf)
            for (int o = (kb + 63) & ~63; o < ke; o += 64)
                #pragma GCC unroll 8
                for (int r = 0; r < RN; r++) _mm_prefetch((const char *)w + r * rs + o + pf, _MM_HINT_T1);
        qstate st[QMAX];
        if (block_state(st, srow, sct, j, FP8, RN)) qblock(acc, x, ldx, w, rs, st, kb, ke, RN, RT, 1, mr);
        else qblock(acc, x, ldx, w, rs, st, kb, ke, RN, RT, 0, mr);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < RT; t++)
        #pragma GCC unroll 8
        for (int r = 0; r < RN; r++) y[(size_t)t * ldy + r] = hsum2x8(acc[r][t][0], acc[r][t][1]);
}

_Static_assert(QT == 2, "qstrip() has a case for each leftover count 1..QT-1");
INL void qstrip(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t rs,
                const uint8_t *const *srow, df_scale_type sct, int K, int bc, int el, int RN, int nt) {
    int t = 0, tf = nt - nt % QT;
    for (; t < tf; t += QT)
        qtile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, srow, sct, K, bc, el, RN, QT, 0, NULL, NULL);
    if (nt > tf)
        qtile(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, rs, srow, sct, K, bc, el, RN, 1, 0, NULL, NULL);
}

INL void qrows(float *y, int ldy, const float *x, int ldx, const df_wview *v, int T, int n0, int n1, int el) {
    const uint8_t *w = v->data;
    const int K = v->cols, bc = v->fmt.block_cols;
    const size_t rs = df_wfmt_row_bytes(v->fmt, K);
    const df_scale_type sct = v->fmt.scale;
    const uint8_t *sr[QMAX], *spf[QMAX];
    if (T == 1) {
        const int G = el == FP8 ? QG : QG4;
        const uint64_t *mr[QMAX];
        const bool map = el == FP8 && df_fp8_map_row(v, 0);
        int next = G * rs <= (32u << 10), pf = next ? (int)(G * rs) : 2048;
        /* the 4-bit formats' scales pf bytes of values on (as scaled_avx512.c) */
        size_t spo = el == FP8 ? 0 : (size_t)(2 * pf / bc) * (el == I4 ? 2 : 1);
        int n = n0;
        for (; n + G <= n1; n += G) {
            for (int r = 0; r < G; r++) {
                int nr = n + G + r;
                sr[r] = df_scale_row(v, n + r);
                spf[r] = next ? df_scale_row(v, nr < n1 ? nr : n1 - 1) : sr[r] + spo;
                if (map) mr[r] = df_fp8_map_row(v, n + r);
            }
            if (el != FP8 && bc == 32)
                (el == I4 ? qtile4_t1_i4 : qtile4_t1_e2m1)(y + n, x, w + n * rs, rs, sr, K, pf, spf);
            else if (map) /* two copies: the one without a map tests as before */
                qtile(y + n, ldy, x, ldx, w + n * rs, rs, sr, sct, K, bc, el, G, 1, pf, spf, mr);
            else
                qtile(y + n, ldy, x, ldx, w + n * rs, rs, sr, sct, K, bc, el, G, 1, pf, spf, NULL);
        }
        for (; n < n1; n++) {
            sr[0] = df_scale_row(v, n);
            qtile(y + n, ldy, x, ldx, w + n * rs, rs, sr, sct, K, bc, el, 1, 1, 0, NULL, NULL);
        }
        return;
    }
    int tb = (int)(((size_t)192 << 10) / ((size_t)(K ? K : 1) * 4));
    tb = tb < QT ? QT : tb - tb % QT;
    for (int t0 = 0; t0 < T; t0 += tb) {
        int nt = t0 + tb < T ? tb : T - t0;
        const float *xb = x + (size_t)t0 * ldx;
        float *yb = y + (size_t)t0 * ldy;
        int n = n0;
        for (; n + QN <= n1; n += QN) {
            for (int r = 0; r < QN; r++) sr[r] = df_scale_row(v, n + r);
            qstrip(yb + n, ldy, xb, ldx, w + n * rs, rs, sr, sct, K, bc, el, QN, nt);
        }
        for (; n < n1; n++) {
            sr[0] = df_scale_row(v, n);
            qstrip(yb + n, ldy, xb, ldx, w + n * rs, rs, sr, sct, K, bc, el, 1, nt);
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

void df_qrows_avx2(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1) {
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
            qstate st;
            int two = block_state(&st, &srow, v->fmt.scale, j, el, 1);
            for (; k + 8 <= ke; k += 8) _mm256_storeu_ps(d + k, dec8(el, row, k, st, two, 1));
            if (k < ke) {
                /* k is a multiple of 8: the bytes of 8 values from a zeroed copy */
                _Alignas(32) uint8_t wb[8] = {0};
                _Alignas(32) float f[8];
                if (el == FP8) memcpy(wb, row + k, (size_t)(ke - k));
                else memcpy(wb, row + k / 2, (size_t)(ke - k + 1) / 2);
                _mm256_storeu_ps(f, dec8(el, wb, 0, st, two, 1));
                memcpy(d + k, f, sizeof(float) * (size_t)(ke - k));
            }
        }
    }
}

void df_qdecode_avx2(float *dst, const df_wview *w, int r0, int n) {
    switch ((int)w->fmt.elem) {
    case FP8: qdecode(dst, w, r0, n, FP8); break;
    case I4: qdecode(dst, w, r0, n, I4); break;
    default: qdecode(dst, w, r0, n, E2M1); break;
    }
}

#endif
