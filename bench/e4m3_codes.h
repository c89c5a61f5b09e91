/*
 * e4m3_codes.h - the benchmarks' FP8 codes (bench_kernels, ab_scaled): those
 * of normal weights quantized as a block-scaled checkpoint holds them, the
 * block's maximum (about 8 sigma) at 448, so codes near zero (e <= 1, which
 * the AVX-512 products decode in their slower F16 form) are as rare as in a
 * real checkpoint, about 1 in 2000. tools/gen_quant.py draws --fast-init's
 * FP8 codes the same way.
 */
#ifndef DF_BENCH_E4M3_CODES_H
#define DF_BENCH_E4M3_CODES_H

#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>

/* The e4m3 code nearest to v (ties to the even code), |v| <= 448 */
static inline uint8_t bench_e4m3(double v) {
    int lo = 0, hi = 126; /* codes 0..126 are the magnitudes, increasing */
    double a = fabs(v);
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (df_e4m3_to_f32((uint8_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo < 126) {
        double dl = a - df_e4m3_to_f32((uint8_t)lo), dh = df_e4m3_to_f32((uint8_t)(lo + 1)) - a;
        if (dh < dl || (dh == dl && (lo & 1))) lo++;
    }
    return (uint8_t)(lo | (v < 0 ? 0x80 : 0));
}

/* 65536 such codes (to be looked up with 16 random bits), from next's
 * 64-bit random numbers */
static inline void bench_e4m3_table(uint8_t t[65536], uint64_t (*next)(void)) {
    for (int i = 0; i < 65536; i += 2) {
        double u1 = ((double)(next() >> 11) + 1) / 9007199254740993.0, u2 = (double)(next() >> 11) / 9007199254740992.0;
        double r = sqrt(-2 * log(u1)) * 56.0;
        t[i] = bench_e4m3(fmax(-448, fmin(448, r * cos(2 * M_PI * u2))));
        t[i + 1] = bench_e4m3(fmax(-448, fmin(448, r * sin(2 * M_PI * u2))));
    }
}

#endif
