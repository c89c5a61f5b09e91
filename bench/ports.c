/*
 * bench/ports.c - how many core cycles the scaled-format kernels' vector operations take, alone
 * and in the mixes of their inner loops, on the CPU at hand (AVX-512 only; no performance
 * counters needed). Each figure is the best of 5 runs of an asm loop with independent
 * destinations (throughput, not latency), in cycles per operation or per chunk-row (16 values
 * of one row: one accumulator's FMA). The core's clock is taken from a chain of dependent
 * adds (one cycle each), so the figures hold under turbo, but not if the clock drops for
 * AVX-512 code. docs/benchmarks.md reads them (AMD EPYC Zen 4 in session 14).
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vbmi -mgfni bench/ports.c -o /tmp/ports && taskset -c 0 /tmp/ports
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <x86intrin.h>

#define N 20000000L

static uint8_t buf[4096] __attribute__((aligned(64)));
static double g_cpt; /* core cycles per TSC tick */

#define CLOB                                                                                                 \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",  \
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",      \
        "xmm24", "xmm25", "xmm26", "xmm27", "k1", "k2", "memory"

/* Registers: zmm0 activations (loaded and permuted once per iteration), zmm1 shift counts or
 * masks, zmm23 a scale, zmm24/25 constants, zmm26 ones; row R decodes into zmmR and
 * accumulates into zmm1R. Eight rows per iteration, at offsets O (bytes) of one line. */
#define I4(R, O)                                                                                             \
    "vpbroadcastq " #O "(%0),%%zmm" #R "\n vpsrlvq %%zmm1,%%zmm" #R ",%%zmm" #R                              \
    "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
/* the same with the broadcast and the shift in one vpmultishiftqb (VBMI) */
#define I4_MSHIFT(R, O)                                                                                      \
    "vpmultishiftqb " #O "(%0)%{1to8%},%%zmm1,%%zmm" #R "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R            \
    "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
#define I4_NOBC(R, O)                                                                                        \
    "vpsrlvq %%zmm1,%%zmm25,%%zmm" #R "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R                              \
    "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
/* the 4-bit step another way (session 16): 16 bytes zero-extended to dwords put the low nibbles of
 * 32 values in index lanes, an immediate shift the high ones; two chunk-rows, so LOOP2 */
#define I4ZX(R, S, O)                                                                                        \
    "vpmovzxbd " #O "(%0),%%zmm" #R "\n vpsrld $4,%%zmm" #R ",%%zmm" #S                                      \
    "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R "\n vpermps %%zmm24,%%zmm" #S ",%%zmm" #S                     \
    "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n vfmadd231ps %%zmm0,%%zmm" #S ",%%zmm1" #S "\n"
#define SRLD_PERM(R, O) "vpsrld $4,%%zmm25,%%zmm" #R "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R "\n"
#define SRLD_FMA(R, O) "vpsrld $4,%%zmm25,%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
#define ZX_PERM(R, O) "vpmovzxbd " #O "(%0),%%zmm" #R "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R "\n"
#define LOOP2(M)                                                                                             \
    "vmovups (%0),%%zmm0\n vpermps %%zmm0,%%zmm23,%%zmm0\n" M(2, 3, 0) M(4, 5, 16) M(6, 7, 32) M(8, 9, 48) "9:\n"
#define PERM_FMA(R, O) "vpermps %%zmm24,%%zmm25,%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
#define SHIFT_FMA(R, O) "vpsrlvq %%zmm24,%%zmm25,%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
#define SHIFT_PERM(R, O) "vpsrlvq %%zmm24,%%zmm25,%%zmm" #R "\n vpermps %%zmm24,%%zmm" #R ",%%zmm" #R "\n"
#define FMA(R, O) "vfmadd231ps %%zmm0,%%zmm25,%%zmm1" #R "\n"
/* FP8's F32 form, 16 values per row (O in units of 16 bytes) */
#define F8(R, O)                                                                                             \
    "vpmovsxbd " #O "*2(%0),%%zmm" #R "\n vpslld $20,%%zmm" #R ",%%zmm" #R                                   \
    "\n vpternlogd $0xea,%%zmm25,%%zmm24,%%zmm" #R "\n vmulps %%zmm23,%%zmm" #R ",%%zmm" #R                   \
    "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
#define F8_NOMUL(R, O)                                                                                       \
    "vpmovsxbd " #O "*2(%0),%%zmm" #R "\n vpslld $20,%%zmm" #R ",%%zmm" #R                                   \
    "\n vpternlogd $0xea,%%zmm25,%%zmm24,%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
/* FP8's F32 form where the block's scale is a power of two: an integer add to the exponent
 * field instead of the multiply */
#define F8_POW2(R, O)                                                                                        \
    "vpmovsxbd " #O "*2(%0),%%zmm" #R "\n vpslld $20,%%zmm" #R ",%%zmm" #R                                   \
    "\n vpternlogd $0xea,%%zmm25,%%zmm24,%%zmm" #R "\n vpaddd %%zmm26,%%zmm" #R ",%%zmm" #R                   \
    "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
/* FP8 with GFNI and VBMI: two vgf2p8affineqb per 64 codes make the F32 pattern's bytes 3 and 2
 * (bit permutations of the code, with a constant), one zero-masked vpermi2b per 16 values
 * puts them in place (zmm20/21: the two byte vectors, the byte index loaded each time (a load, where a register copy would be a vector operation), k2 the mask) */
#define F8_VBMI(R, O)                                                                                        \
    ".if (" #R " %% 4) == 2\n vmovdqu64 (%0),%%zmm27\n vgf2p8affineqb $0x38,%%zmm1,%%zmm27,%%zmm20\n"          \
    " vgf2p8affineqb $0x00,%%zmm26,%%zmm27,%%zmm21\n .endif\n"                                               \
    "vmovdqu64 256(%0),%%zmm" #R "\n vpermi2b %%zmm21,%%zmm20,%%zmm" #R "%{%%k2%}%{z%}\n"                     \
    "vmulps %%zmm23,%%zmm" #R ",%%zmm" #R "\n vfmadd231ps %%zmm0,%%zmm" #R ",%%zmm1" #R "\n"
/* and its test of 64 codes for the F16 form (f16_codes64), once per 4 chunk-rows */
#define F8_CHK(R, O) F8(R, O) ".if (" #R " %% 4) == 0\n vpaddb (%0),%%zmm26,%%zmm27\n vptestnmb %%zmm1,%%zmm27,%%k1\n kortestq %%k1,%%k1\n jne 9f\n .endif\n"

#define LOOP(M)                                                                                              \
    "vmovups (%0),%%zmm0\n vpermps %%zmm0,%%zmm23,%%zmm0\n" M(2, 0) M(3, 8) M(4, 16) M(5, 24) M(6, 32)          \
        M(7, 40) M(8, 48) M(9, 56) "9:\n"

/* the same loop with the activations scaled once per 4 rows (a power-of-two block scale moved
 * onto x: FP8 tiles of 4 rows then decode without the multiply) */
#define LOOP_XS(M)                                                                                           \
    "vmovups (%0),%%zmm0\n vpermps %%zmm0,%%zmm23,%%zmm0\n vmulps %%zmm23,%%zmm0,%%zmm0\n" M(2, 0) M(3, 8)     \
        M(4, 16) M(5, 24) "vmulps %%zmm23,%%zmm0,%%zmm0\n" M(6, 32) M(7, 40) M(8, 48) M(9, 56) "9:\n"

#define ONE(OP) OP "16\n" OP "17\n" OP "18\n" OP "19\n" OP "20\n" OP "21\n" OP "22\n" OP "27\n"

static double best_of(void (*f)(long), double per_iter) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = __rdtsc();
        f(N);
        double t = (double)(__rdtsc() - t0) / N * g_cpt / per_iter;
        if (t < best) best = t;
    }
    return best;
}

/* the registers' starting values: no subnormal or NaN operand slows a loop */
#define INIT                                                                                                 \
    "vpbroadcastd %1,%%zmm0\n vmovdqa32 %%zmm0,%%zmm23\n vpbroadcastd %2,%%zmm1\n vpbroadcastd %3,%%zmm24\n"  \
    "vpbroadcastd %4,%%zmm25\n vpbroadcastd %5,%%zmm26\n vpxord %%zmm12,%%zmm12,%%zmm12\n"                     \
    "vmovdqa32 %%zmm12,%%zmm13\n vmovdqa32 %%zmm12,%%zmm14\n vmovdqa32 %%zmm12,%%zmm15\n"                       \
    "vmovdqa32 %%zmm12,%%zmm16\n vmovdqa32 %%zmm12,%%zmm17\n vmovdqa32 %%zmm12,%%zmm18\n"                       \
    "vmovdqa32 %%zmm12,%%zmm19\n"

#define KERNEL(name, body)                                                                                   \
    static void name(long n) {                                                                               \
        __asm__ volatile(INIT ::"r"(buf), "r"(0x3f800000), "r"(0x70707070), "r"((int)0x87f00000u),          \
                         "r"(0x38000000), "r"(0x01010101)                                                    \
                         : CLOB);                                                                            \
        for (long i = 0; i < n; i++) __asm__ volatile(body ::"r"(buf) : CLOB);                               \
    }

KERNEL(k_fma, ONE("vfmadd231ps %%zmm0,%%zmm1,%%zmm"))
KERNEL(k_perm, ONE("vpermps %%zmm0,%%zmm1,%%zmm"))
KERNEL(k_srlv, ONE("vpsrlvq %%zmm0,%%zmm1,%%zmm"))
KERNEL(k_bcast, ONE("vpbroadcastq 8(%0),%%zmm"))
KERNEL(k_movsx, ONE("vpmovsxbd 16(%0),%%zmm"))
KERNEL(k_tern, ONE("vpternlogd $0xea,%%zmm0,%%zmm1,%%zmm"))
KERNEL(k_cvtph, ONE("vcvtph2ps %%ymm0,%%zmm"))
KERNEL(k_mshift, ONE("vpmultishiftqb 8(%0)%{1to8%},%%zmm1,%%zmm"))
KERNEL(m_i4, LOOP(I4))
KERNEL(m_i4_nobc, LOOP(I4_NOBC))
KERNEL(m_i4_mshift, LOOP(I4_MSHIFT))
KERNEL(m_perm_fma, LOOP(PERM_FMA))
KERNEL(m_shift_fma, LOOP(SHIFT_FMA))
KERNEL(m_shift_perm, LOOP(SHIFT_PERM))
KERNEL(m_fma, LOOP(FMA))
KERNEL(m_i4zx, LOOP2(I4ZX))
KERNEL(m_srld_perm, LOOP(SRLD_PERM))
KERNEL(m_srld_fma, LOOP(SRLD_FMA))
KERNEL(m_zx_perm, LOOP(ZX_PERM))
KERNEL(k_srld, ONE("vpsrld $4,%%zmm0,%%zmm"))
KERNEL(k_zx, ONE("vpmovzxbd 16(%0),%%zmm"))
KERNEL(m_f8, LOOP(F8))
KERNEL(m_f8_nomul, LOOP(F8_NOMUL))
KERNEL(m_f8_pow2, LOOP(F8_POW2))
KERNEL(m_f8_xs, LOOP_XS(F8_NOMUL))
KERNEL(m_f8_chk, LOOP(F8_CHK))
KERNEL(m_f8_vbmi, LOOP(F8_VBMI))
KERNEL(k_vpermt2b, ONE("vpermt2b %%zmm0,%%zmm1,%%zmm"))
KERNEL(k_vpermb, ONE("vpermb %%zmm0,%%zmm1,%%zmm"))
KERNEL(k_gf2p8, ONE("vgf2p8affineqb $0x38,%%zmm0,%%zmm1,%%zmm"))

int main(void) {
    memset(buf, 0x40, sizeof buf); /* e4m3 codes with e = 8: the F32 form, no F16 branch */
    uint64_t t0 = __rdtsc();
    long x = 0;
    for (long i = 0; i < 100000000L; i++)
        __asm__ volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0"
                         : "+r"(x));
    g_cpt = 8e8 / (double)(__rdtsc() - t0);
    printf("core cycles per TSC tick %.3f\n\n# one operation, 512-bit, cycles each (0.5: two per cycle)\n", g_cpt);
    struct { const char *name; void (*f)(long); } ops[] = {
        {"vfmadd231ps", k_fma}, {"vpermps", k_perm}, {"vpsrlvq", k_srlv}, {"vpbroadcastq m64", k_bcast},
        {"vpmovsxbd m128", k_movsx}, {"vpternlogd", k_tern}, {"vcvtph2ps", k_cvtph},
        {"vpmultishiftqb m64{1to8}", k_mshift}, {"vpermt2b", k_vpermt2b}, {"vpermb", k_vpermb},
        {"vgf2p8affineqb", k_gf2p8}, {"vpsrld imm", k_srld}, {"vpmovzxbd m128", k_zx}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) printf("%-28s %.3f\n", ops[i].name, best_of(ops[i].f, 8));
    printf("\n# inner-loop mixes, cycles per chunk-row (8 rows, activations loaded and permuted once)\n");
    struct { const char *name; void (*f)(long); } mix[] = {
        {"4-bit: bcast srlv perm fma", m_i4}, {"4-bit without the bcast", m_i4_nobc},
        {"4-bit: mshift{1to8} perm fma", m_i4_mshift},
        {"4-bit: zext srld 2perm 2fma", m_i4zx}, {"srld perm", m_srld_perm}, {"srld fma", m_srld_fma},
        {"zext perm", m_zx_perm},
        {"perm fma", m_perm_fma}, {"srlv fma", m_shift_fma}, {"srlv perm", m_shift_perm}, {"fma", m_fma},
        {"FP8 F32 form (5 ops)", m_f8}, {"FP8 F32 form without the mul", m_f8_nomul},
        {"FP8 F32 form, power-of-two scale: vpaddd", m_f8_pow2},
        {"FP8 F32 form, power-of-two scale on x, 4 rows", m_f8_xs},
        {"FP8 F32 form + 64-code test", m_f8_chk}, {"FP8 by GFNI + vpermi2b", m_f8_vbmi}};
    for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++) printf("%-28s %.3f\n", mix[i].name, best_of(mix[i].f, 8));
    return 0;
}
