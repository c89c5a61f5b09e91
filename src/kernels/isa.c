/*
 * isa.c - which instruction-set path the kernels run: CPU + OS detection and the
 * process-wide selection (df_isa_detect/set/get/name/from_name).
 *
 * A path is usable only when the CPU has the instructions AND the OS saves the
 * register state they use (XCR0): a CPU with AVX-512 under an OS or hypervisor
 * that does not enable ZMM state must fall back to AVX2, or the first ZMM
 * instruction faults.
 */
#include "kernels/kernels.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    /* xgetbv needs no -m flag as an asm mnemonic; only reached when OSXSAVE. */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static df_isa detect_x86(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return DF_ISA_C;
    const unsigned osxsave = 1u << 27, avx = 1u << 28, fma = 1u << 12, f16c = 1u << 29;
    if (!(c & osxsave) || !(c & avx)) return DF_ISA_C;
    uint64_t xcr0 = xgetbv0();
    /* XMM|YMM state (bits 1,2); AVX-512 adds opmask, ZMM_Hi256, Hi16_ZMM (5,6,7). */
    int os_ymm = (xcr0 & 0x6) == 0x6;
    int os_zmm = (xcr0 & 0xe6) == 0xe6;
    if (!os_ymm || !(c & fma) || !(c & f16c)) return DF_ISA_C;
    if (__get_cpuid_max(0, NULL) < 7) return DF_ISA_C;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned avx2 = 1u << 5, avx512f = 1u << 16, avx512dq = 1u << 17,
                   avx512bw = 1u << 30, avx512vl = 1u << 31;
    if (!(b & avx2)) return DF_ISA_C;
    /* Cross-check with gcc's own view (it also consults XCR0). */
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return DF_ISA_C;
    unsigned need512 = avx512f | avx512dq | avx512bw | avx512vl;
    /* avx512_bf16 is deliberately not required: the dot products never use
     * VDPBF16PS (see matmul_avx512.c), so Skylake-X/Ice Lake can run this path. */
    if (os_zmm && (b & need512) == need512 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return DF_ISA_AVX512;
    return DF_ISA_AVX2;
}
#endif

static atomic_int g_detected = -1;
static atomic_int g_selected = -1;

df_isa df_isa_detect(void) {
    int v = atomic_load_explicit(&g_detected, memory_order_relaxed);
    if (v < 0) {
#if defined(__x86_64__) || defined(__i386__)
        v = (int)detect_x86();
#else
        v = DF_ISA_C;
#endif
        atomic_store_explicit(&g_detected, v, memory_order_relaxed);
    }
    return (df_isa)v;
}

const char *df_isa_name(df_isa isa) {
    switch (isa) {
    case DF_ISA_C: return "c";
    case DF_ISA_AVX2: return "avx2";
    case DF_ISA_AVX512: return "avx512";
    }
    return "?";
}

int df_isa_from_name(const char *s) {
    if (!s) return -1;
    if (strcmp(s, "auto") == 0) return (int)df_isa_detect();
    for (int i = DF_ISA_C; i <= DF_ISA_AVX512; i++)
        if (strcmp(s, df_isa_name((df_isa)i)) == 0) return i;
    return -1;
}

int df_isa_set(df_isa isa) {
    if ((int)isa < DF_ISA_C || (int)isa > DF_ISA_AVX512) return -1;
    if ((int)isa > (int)df_isa_detect()) return -1;
    atomic_store_explicit(&g_selected, (int)isa, memory_order_relaxed);
    return 0;
}

df_isa df_isa_get(void) {
    int v = atomic_load_explicit(&g_selected, memory_order_relaxed);
    if (v < 0) {
        v = (int)df_isa_detect();
        int expect = -1;
        /* a concurrent df_isa_set wins over the lazy default */
        if (!atomic_compare_exchange_strong(&g_selected, &expect, v)) v = expect;
    }
    return (df_isa)v;
}
