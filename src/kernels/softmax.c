/*
 * softmax.c - df_softmax_exp_f32: dispatch to the selected instruction-set
 * path, and the portable C path, which the SIMD paths match bit for bit;
 * df_softmax_f32 on top of it, and the exponential alone (df_exp_f32).
 *
 * In place: x = scale * x; m = max (NaNs skipped); e = exp(x - m) (softmax.h);
 * S = the sum of e in 16 lanes, element j into lane j % 16, then the fixed
 * tree lanes[i] += lanes[i+8], +4, +2, +1 (kernels.h's order, with plain adds).
 * Every e is >= +0, so lanes start at +0 and a padded lane's +0 changes
 * nothing: the C path simply stops at n. df_softmax_f32 then sets x = e * (1 / S).
 */
#include "kernels/kernels.h"
#include "kernels/softmax.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#define DF_HAVE_X86 1
float df_softmax_exp_f32_avx2(float *x, int n, float scale, float *sum);
float df_softmax_exp_f32_avx512(float *x, int n, float scale, float *sum);
#else
#define DF_HAVE_X86 0
#endif

static float exp_c(float x) {
    if (isnan(x)) return x;
    if (x < DF_EXP_LO) return 0.0f;
    if (x > DF_EXP_HI) return INFINITY;
    float n = floorf(fmaf(x, DF_EXP_LOG2E, 0.5f));
    float r = fmaf(n, -DF_EXP_LN2_HI, x);
    r = fmaf(n, -DF_EXP_LN2_LO, r);
    float p = DF_EXP_P0;
    p = fmaf(p, r, DF_EXP_P1);
    p = fmaf(p, r, DF_EXP_P2);
    p = fmaf(p, r, DF_EXP_P3);
    p = fmaf(p, r, DF_EXP_P4);
    p = fmaf(p, r, DF_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return y * s;
}

float df_exp_f32(float x) { return exp_c(x); }

static float softmax_exp_c(float *x, int n, float scale, float *sum) {
    float mx = -INFINITY, lanes[16] = {0};
    for (int j = 0; j < n; j++) {
        x[j] *= scale;
        if (x[j] > mx) mx = x[j];
    }
    for (int j = 0; j < n; j++) lanes[j & 15] += x[j] = exp_c(x[j] - mx);
    for (int i = 0; i < 8; i++) lanes[i] = lanes[i] + lanes[i + 8];
    for (int i = 0; i < 4; i++) lanes[i] = lanes[i] + lanes[i + 4];
    for (int i = 0; i < 2; i++) lanes[i] = lanes[i] + lanes[i + 2];
    *sum = lanes[0] + lanes[1];
    return mx;
}

float df_softmax_exp_f32(float *x, int n, float scale, float *sum) {
    *sum = 0.0f;
    if (n <= 0) return -INFINITY;
#if DF_HAVE_X86
    switch (df_isa_get()) {
    case DF_ISA_AVX512: return df_softmax_exp_f32_avx512(x, n, scale, sum);
    case DF_ISA_AVX2: return df_softmax_exp_f32_avx2(x, n, scale, sum);
    default: break;
    }
#endif
    return softmax_exp_c(x, n, scale, sum);
}

void df_softmax_f32(float *x, int n, float scale) {
    float sum;
    df_softmax_exp_f32(x, n, scale, &sum);
    df_scale_f32(x, n, 1.0f / sum);
}
