/*
 * softmax.h - private to the kernels: the constants of df_softmax_f32's
 * exponential, shared by the C path (softmax.c) and the SIMD paths
 * (matmul_avx2.c, matmul_avx512.c), which must compute the same operations in
 * the same order so that every path gives the same bits.
 *
 * exp(x), Cephes' expf: n = floor(fma(x, log2(e), 1/2)); r = x - n ln2 in two
 * fused steps (ln2 split so that n * LN2_HI is exact); p = degree-5 polynomial
 * in r by fused Horner steps; y = fma(p, r*r, r) + 1; result y * 2^n, with 2^n
 * built from its exponent bits. About 1 ulp. Arguments below EXP_LO give +0
 * (softmax only feeds x - max <= 0; e^-87 is below any weight that matters),
 * above EXP_HI +inf, and a NaN comes back as itself.
 */
#ifndef DF_KERNELS_SOFTMAX_H
#define DF_KERNELS_SOFTMAX_H

#define DF_EXP_LO (-87.0f)
#define DF_EXP_HI 88.0f
#define DF_EXP_LOG2E 1.44269504088896341f
#define DF_EXP_LN2_HI 0.693359375f
#define DF_EXP_LN2_LO (-2.12194440e-4f)
#define DF_EXP_P0 1.9875691500e-4f
#define DF_EXP_P1 1.3981999507e-3f
#define DF_EXP_P2 8.3334519073e-3f
#define DF_EXP_P3 4.1665795894e-2f
#define DF_EXP_P4 1.6666665459e-1f
#define DF_EXP_P5 5.0000001201e-1f

#endif
