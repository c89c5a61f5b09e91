/*
 * bench_kernels.c - kernel speed against the machine's memory bandwidth.
 *
 * 1. memory read bandwidth: threads stream over a buffer far larger than the
 *    caches (median of several runs); printed as `membw_gbs <GB/s>` for
 *    bench/run.sh.
 * 2. pool dispatch cost: the same short job on 1 and on N threads.
 * 3. BF16 GEMV (T=1) and small GEMM (T=64) for [2048 x 2048] and [768 x 2048]
 *    weights on every ISA path: weight GB/s, fraction of memory bandwidth, and
 *    time per token. The weights cycle through many copies (>> L3), so decode
 *    is measured against RAM as it is in a real model, not against the cache.
 * 4. --formats (instead of 2 and 3): the weight formats as shipped (BF16 for
 *    comparison, F8_E4M3/F32[128x128], I4/BF16[1x32], E2M1/E8M0[1x32]) on a
 *    [2048 x 7168] matrix, cycling over copies that fill the --mem-mib
 *    buffer: packed GB/s (values + scales per second) as a fraction of the
 *    read bandwidth measured between the rounds; `cached`: the same product
 *    on the first rows only, which stay in the caches (about 1 MiB per
 *    thread), timed in each round too, and c/membw, that speed over the read
 *    bandwidth: below 1 the decoding alone cannot keep up with memory
 *    (compute-bound), above 1 a shortfall of of_membw is in overlapping the
 *    reads with the work.
 *    --tokens 1,2,8 picks the batch sizes (default 1); the C path only with
 *    --isa c. FP8 views carry their F16-form maps (kernels.h), as the engine's
 *    resident FP8 weights do; --no-fp8-map leaves them out.
 *
 * Build: make B=build build/bench_kernels   (also part of `make bench`)
 * Run:   build/bench_kernels [--threads N] [--mem-mib M] [--isa c|avx2|avx512]
 *                            [--membw-only] [--formats [--tokens LIST] [--no-fp8-map]] [--slots N]
 *        (bench/run.sh and bench/suite.sh read the `membw_gbs` line)
 */
#include "e4m3_codes.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- memory read bandwidth -------------------------------------------------- */

struct rd_ctx {
    const uint64_t *buf;
    int vec;
    uint64_t sink[64];
};

#define BLOCK_WORDS 131072 /* 1 MiB of uint64 */

static uint64_t read_scalar(const uint64_t *p, size_t n) {
    /* 8 independent accumulators so the loop is bound by loads, not by xor */
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i < n; i += 8) {
        a0 ^= p[i], a1 ^= p[i + 1], a2 ^= p[i + 2], a3 ^= p[i + 3];
        a4 ^= p[i + 4], a5 ^= p[i + 5], a6 ^= p[i + 6], a7 ^= p[i + 7];
    }
    return a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* 32-byte loads like the kernels' (only called when AVX2 is usable) */
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 16) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
#endif

static void rd_task(void *arg, int b, int e) {
    struct rd_ctx *c = arg;
    const uint64_t *p = c->buf + (size_t)b * BLOCK_WORDS;
    size_t n = (size_t)(e - b) * BLOCK_WORDS;
    uint64_t r;
#if defined(__x86_64__)
    r = c->vec ? read_avx2(p, n) : read_scalar(p, n);
#else
    r = read_scalar(p, n);
#endif
    c->sink[b % 64] = r;
}

/* One timed pass over `mib` MiB; GB/s. */
static double mem_read_once(df_pool *pool, const uint64_t *buf, size_t mib) {
    struct rd_ctx c = {buf, df_isa_detect() >= DF_ISA_AVX2, {0}};
    double t0 = df_now();
    df_pool_for(pool, (int)mib, 1, rd_task, &c);
    return (double)mib * 1048576.0 / (df_now() - t0) / 1e9;
}

static double mem_read_gbs(df_pool *pool, const uint64_t *buf, size_t mib, int reps) {
    double v[64];
    mem_read_once(pool, buf, mib); /* warm-up */
    for (int r = 0; r < reps; r++) v[r] = mem_read_once(pool, buf, mib);
    return median(v, reps);
}

/* ---- pool dispatch ---------------------------------------------------------- */

/* A job of n items, each a short dependent integer chain (~1 ns), so the
 * split and the dispatch are what is measured. */
static void work_task(void *arg, int b, int e) {
    _Atomic uint64_t *sink = arg;
    uint64_t h = (uint64_t)b;
    for (int i = b; i < e; i++)
        for (int j = 0; j < 4; j++) h = h * 6364136223846793005ull + 1442695040888963407ull;
    atomic_fetch_add_explicit(sink, h, memory_order_relaxed);
}

/* Time per df_pool_for of an n-item job (median of batches). */
static double pool_call_us(df_pool *pool, int n) {
    _Atomic uint64_t sink = 0;
    double v[9];
    for (int r = 0; r < 9; r++) {
        int calls = 2000;
        double t0 = df_now();
        for (int i = 0; i < calls; i++) df_pool_for(pool, n, 16, work_task, &sink);
        v[r] = (df_now() - t0) / calls * 1e6;
    }
    return median(v, 9);
}

/* ---- matmul ----------------------------------------------------------------- */

struct mm_res {
    double ms_call, gbs, us_tok, membw, cached_gbs;
};

/* Mean time per call of df_matmul on view v, calls repeated until `budget`
 * seconds pass; with nv > 1 cycling over the views v[0..nv) (all alike). */
static double time_calls(df_pool *pool, const df_wview *v, int nv, int *ci, int T, float *x, float *y,
                         double budget) {
    int calls = 0, N = v[0].rows, K = v[0].cols;
    double t0 = df_now(), t1;
    do {
        df_matmul(pool, y, N, x, K, &v[*ci], T);
        *ci = (*ci + 1) % nv;
        calls++;
        t1 = df_now();
    } while (t1 - t0 < budget);
    return (t1 - t0) / calls;
}

/* Median time per call of df_matmul cycling over the views (all [rows][cols]
 * alike) until `budget` seconds pass, over `reps` such rounds; `packed` bytes
 * per view. A memory-bandwidth pass over rdmib MiB of rdbuf runs before each
 * round, so each row's fraction of bandwidth compares numbers taken at the same
 * time: this machine is shared and its bandwidth drifts. With cached, each
 * round also times the product on that view alone, which stays in the caches
 * (res.cached_gbs, packed GB/s; cpacked: its bytes). */
static struct mm_res bench_views(df_pool *pool, const df_wview *v, int nv, uint64_t packed, int T, float *x,
                                 float *y, const uint64_t *rdbuf, size_t rdmib, double budget, int reps,
                                 const df_wview *cached, uint64_t cpacked) {
    double t[16], bwv[16], tc[16];
    int ci = 0, c0 = 0;
    df_matmul(pool, y, v[0].rows, x, v[0].cols, &v[0], T); /* warm-up */
    for (int r = 0; r < reps; r++) {
        bwv[r] = mem_read_once(pool, rdbuf, rdmib);
        t[r] = time_calls(pool, v, nv, &ci, T, x, y, budget);
        if (cached) {
            df_matmul(pool, y, cached->rows, x, cached->cols, cached, T); /* into the caches */
            tc[r] = time_calls(pool, cached, 1, &c0, T, x, y, budget / 2);
        }
    }
    double s = median(t, reps);
    struct mm_res res = {s * 1e3, (double)packed / s / 1e9, s / T * 1e6, median(bwv, reps),
                         cached ? (double)cpacked / median(tc, reps) / 1e9 : 0};
    return res;
}

/* The first rows of a format's view that stay in the caches: about 1 MiB of
 * values and scales per thread (each thread's share fits its L2), a multiple
 * of 128 rows; *cpacked: their bytes. Divided by the read bandwidth, the
 * product's speed on them says whether the decoding alone could keep up with
 * memory (>= 1) or makes the product compute-bound. */
static df_wview cached_rows(const df_wview *v, int threads, uint64_t *cpacked) {
    df_wview c = *v;
    bool sc = c.fmt.scale != DF_SC_NONE;
    size_t row = df_wfmt_row_bytes(c.fmt, c.cols) + (sc ? (size_t)df_wfmt_scale_bytes(c.fmt, 128, c.cols) / 128 : 0);
    int rows = (int)(((size_t)threads << 20) / row) / 128 * 128;
    c.rows = rows < 128 ? 128 : rows > v->rows ? v->rows : rows;
    *cpacked = df_wfmt_bytes(c.fmt, c.rows, c.cols) + (sc ? df_wfmt_scale_bytes(c.fmt, c.rows, c.cols) : 0);
    return c;
}

/* BF16 [N][K] weights: consecutive copies in `wbig`, cycled (bench_views;
 * the bandwidth pass reads 256 MiB of wbig, or all of it if smaller). */
static struct mm_res bench_mm(df_pool *pool, const uint8_t *wbig, size_t wbytes_total,
                              int N, int K, int T, float *x, float *y, double budget, int reps) {
    size_t mbytes = (size_t)N * K * 2;
    size_t copies = wbytes_total / mbytes;
    if (copies < 1) copies = 1;
    df_wview *v = malloc(sizeof *v * copies);
    for (size_t i = 0; i < copies; i++) v[i] = df_wview_make(wbig + i * mbytes, DF_DT_BF16, N, K);
    size_t rdmib = wbytes_total >> 20 < 256 ? wbytes_total >> 20 : 256;
    struct mm_res res = bench_views(pool, v, (int)copies, mbytes, T, x, y, (const uint64_t *)wbig, rdmib, budget, reps,
                                    NULL, 0);
    free(v);
    return res;
}

/* ---- weight formats (--formats) ----------------------------------------------- */

#define FM_N 2048
#define FM_K 7168

static uint64_t fm_rng = 0x9e3779b97f4a7c15ull;
static uint64_t fm_next(void) {
    fm_rng ^= fm_rng << 13, fm_rng ^= fm_rng >> 7, fm_rng ^= fm_rng << 17;
    return fm_rng;
}

/* FP8 codes as a checkpoint holds them (e4m3_codes.h) */
static const uint8_t *fm_e4m3_table(void) {
    static uint8_t t[65536];
    static int done;
    if (!done) bench_e4m3_table(t, fm_next);
    done = 1;
    return t;
}

/* Fills one copy's values and scales with what a real checkpoint holds: e4m3
 * codes of normal weights, finite scales of ordinary size (so the kernels
 * take their common paths), random 4-bit codes. */
static void fm_fill(df_wfmt f, uint8_t *vals, size_t vb, uint8_t *sc, size_t sb, bool pow2) {
    const uint8_t *e4 = f.elem == DF_EL_F8_E4M3 ? fm_e4m3_table() : NULL;
    for (size_t i = 0; i < vb; i += 8) {
        uint64_t r = fm_next();
        if (f.elem == DF_EL_BF16) r = (r & 0x807f807f807f807full) | 0x3c003c003c003c00ull;
        if (e4) {
            uint64_t c = 0;
            for (int j = 0; j < 4; j++) c |= (uint64_t)e4[(r >> 16 * j) & 0xffff] << 8 * j;
            r = fm_next();
            for (int j = 0; j < 4; j++) c |= (uint64_t)e4[(r >> 16 * j) & 0xffff] << 8 * (j + 4);
            r = c;
        }
        memcpy(vals + i, &r, vb - i < 8 ? vb - i : 8);
    }
    for (size_t i = 0; i < sb;) {
        uint32_t r = (uint32_t)fm_next();
        if (f.scale == DF_SC_F32) {
            float v = pow2 ? ldexpf(1.0f, -10 - (int)(r % 10)) : (float)(r % 1000 + 1) * 1e-6f;
            memcpy(sc + i, &v, 4), i += 4;
        } else if (f.scale == DF_SC_BF16) {
            uint16_t h = df_f32_to_bf16((float)(r % 1000 + 1) * 1e-5f);
            memcpy(sc + i, &h, 2), i += 2;
        } else {
            sc[i++] = (uint8_t)(115 + r % 10);
        }
    }
}

/* Copies of one format's [FM_N x FM_K] matrix laid out back to back in buf
 * (values, then scales, each 64-byte aligned). */
static int fm_views(df_wfmt f, bool pow2, uint8_t *buf, size_t bytes, df_wview *v, int maxv, uint64_t *packed,
                    uint64_t *maps) {
    size_t vb = (size_t)df_wfmt_bytes(f, FM_N, FM_K), sb = (size_t)df_wfmt_scale_bytes(f, FM_N, FM_K);
    size_t step = ((vb + 63) & ~(size_t)63) + ((sb + 63) & ~(size_t)63);
    size_t mw = df_fp8_map_words(FM_K) * FM_N;
    int n = 0;
    for (size_t off = 0; off + step <= bytes && n < maxv; off += step, n++) {
        uint8_t *vals = buf + off, *sc = vals + ((vb + 63) & ~(size_t)63);
        fm_fill(f, vals, vb, sc, sb, pow2);
        v[n] = f.scale == DF_SC_NONE ? df_wview_make(vals, DF_DT_BF16, FM_N, FM_K)
                                     : df_wview_scaled(f, vals, sc, FM_N, FM_K);
        if (maps && f.elem == DF_EL_F8_E4M3) { /* as the engine's resident FP8 weights have */
            df_fp8_map_build(maps + (size_t)n * mw, &v[n]);
            v[n].f16map = maps + (size_t)n * mw;
        }
    }
    *packed = vb + sb;
    return n;
}

/* Parses "1,2,8" into ts (at most 8 sizes, each 1..64); the count, 0 if bad. */
static int parse_tokens(const char *s, int *ts) {
    int n = 0;
    for (const char *p = s; *p && n < 8;) {
        char *e;
        long t = strtol(p, &e, 10);
        if (e == p || t < 1 || t > 64) return 0;
        ts[n++] = (int)t;
        p = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return 0;
    }
    return n;
}

static void bench_formats(df_pool *pool, uint64_t *buf, size_t mem_mib, int only_isa, const int *ts, int nt,
                          int threads, bool fp8_map) {
    static const df_wfmt BF16 = {DF_EL_BF16, DF_SC_NONE, 0, 0};
    /* the second FP8: power-of-two block scales, as DeepSeek-V3.1's (scale_fmt ue8m0) */
    const df_wfmt fmts[5] = {BF16, df_wfmt_fp8_block(), df_wfmt_fp8_block(), df_wfmt_int4_group(), df_wfmt_mxfp4()};
    enum { MAXV = 1024 };
    df_wview *v = malloc(sizeof *v * MAXV);
    /* FP8's F16-form maps: 1/512 of the values, not counted in GB/s */
    uint64_t *maps = fp8_map ? malloc(sizeof(uint64_t) * df_fp8_map_words(FM_K) * FM_N * MAXV) : NULL;
    float *x = df_aligned_alloc((size_t)64 * FM_K * 4), *y = df_aligned_alloc((size_t)64 * FM_N * 4);
    for (int i = 0; i < 64 * FM_K; i++) x[i] = (float)((int)(((int64_t)i * 7919) % 2001) - 1000) / 1000.0f;
    printf("\n# weight formats, [%d x %d] copies cycling over %zu MiB; GB/s = (values + scales) / time\n", FM_N,
           FM_K, mem_mib);
    printf("%-7s %-22s %4s %3s %6s %10s %8s %8s %8s %10s %8s %8s\n", "isa", "format", "T", "thr", "copies",
           "ms/call", "GB/s", "membw", "of_membw", "us/token", "cached", "c/membw");
    for (int fi = 0; fi < 5; fi++) {
        uint64_t packed;
        /* the buffer doubles as the bandwidth pass's: refilled per format */
        int nv = fm_views(fmts[fi], fi == 2, (uint8_t *)buf, mem_mib << 20, v, MAXV, &packed, maps);
        uint64_t cpacked;
        df_wview cv = cached_rows(&v[0], threads, &cpacked);
        for (int isa = (int)df_isa_detect(); isa >= 0; isa--) {
            if (only_isa >= 0 ? isa != only_isa : isa == DF_ISA_C) continue;
            df_isa_set((df_isa)isa);
            for (int ti = 0; ti < nt; ti++) {
                double budget = isa == DF_ISA_C ? 0.5 : 0.25;
                struct mm_res r = bench_views(pool, v, nv, packed, ts[ti], x, y, buf, mem_mib < 256 ? mem_mib : 256, budget,
                                              isa == DF_ISA_C ? 3 : 7, &cv, cpacked);
                double c = r.cached_gbs;
                printf("%-7s %-22s %4d %3d %6d %10.3f %8.2f %8.2f %8.2f %10.1f %8.2f %8.2f\n",
                       df_isa_name((df_isa)isa), fi == 2 ? "F8_E4M3/2^k[128x128]" : df_wfmt_name(fmts[fi]), ts[ti], threads, nv, r.ms_call, r.gbs,
                       r.membw, r.gbs / r.membw, r.us_tok, c, c / r.membw);
                fflush(stdout);
            }
        }
    }
    df_isa_set(df_isa_detect());
    free(v);
    free(maps);
    free(x);
    free(y);
}

/* The BF16 products (N x K, T = 1 and 64) on every path, weights cycling through the
 * buffer; then one thread's decode for reference. bw: the 2-thread read bandwidth. */
static void bench_bf16(df_pool *pool, df_pool *pool1, uint64_t *buf, size_t mem_mib, int only_isa, int threads,
                       double bw) {
    int Ts[2] = {1, 64};
    int shapes[2][2] = {{2048, 2048}, {768, 2048}};
    int Kmax = 2048;
    float *x = df_aligned_alloc((size_t)64 * Kmax * 4);
    float *y = df_aligned_alloc((size_t)64 * 2048 * 4);
    for (int i = 0; i < 64 * Kmax; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;

    printf("\n# BF16 matmul, weights cycling over %zu MiB; GB/s = weight bytes / time\n", mem_mib);
    printf("%-7s %-11s %4s %3s %10s %8s %8s %8s %10s %9s\n", "isa", "N x K", "T", "thr",
           "ms/call", "GB/s", "membw", "of_membw", "us/token", "vs_T=1");
    for (int isa = (int)df_isa_detect(); isa >= 0; isa--) {
        if (only_isa >= 0 && isa != only_isa) continue;
        df_isa_set((df_isa)isa);
        for (int si = 0; si < 2; si++) {
            int N = shapes[si][0], K = shapes[si][1];
            double tok1 = 0;
            for (int ti = 0; ti < 2; ti++) {
                int T = Ts[ti];
                /* the C path is ~100x slower; keep its runs short */
                double budget = isa == DF_ISA_C ? 0.2 : 0.25;
                int reps = isa == DF_ISA_C ? 3 : 5;
                struct mm_res r =
                    bench_mm(pool, (const uint8_t *)buf, mem_mib << 20, N, K, T, x, y, budget, reps);
                if (T == 1) tok1 = r.us_tok;
                char shape[32];
                snprintf(shape, sizeof shape, "%dx%d", N, K);
                printf("%-7s %-11s %4d %3d %10.3f %8.2f %8.2f %8.2f %10.1f %8.1fx\n",
                       df_isa_name((df_isa)isa), shape, T, threads, r.ms_call, r.gbs, r.membw,
                       r.gbs / r.membw, r.us_tok, tok1 / r.us_tok);
                fflush(stdout);
            }
        }
    }
    /* single-thread decode for reference */
    df_isa_set(df_isa_detect());
    struct mm_res r1 = bench_mm(pool1, (const uint8_t *)buf, mem_mib << 20, 2048, 2048, 1, x, y, 0.25, 5);
    printf("%-7s %-11s %4d %3d %10.3f %8.2f %8.2f %8.2f %10.1f\n", df_isa_name(df_isa_detect()),
           "2048x2048", 1, 1, r1.ms_call, r1.gbs, r1.membw, r1.gbs / r1.membw, r1.us_tok);
    printf("# membw column: read bandwidth with the same thread count, measured between\n"
           "# the rounds of that row (medians); membw_gbs above: %.2f GB/s\n", bw);

    free(x);
    free(y);
}

int main(int argc, char **argv) {
    int threads = 2;
    size_t mem_mib = 1024;
    int only_isa = -1;
    bool membw_only = false, formats = false, fp8_map = true;
    int ts[8] = {1}, nt = 1, slots = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mem-mib") && i + 1 < argc) mem_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only_isa = df_isa_from_name(argv[++i]);
        else if (!strcmp(argv[i], "--membw-only")) membw_only = true; /* interleaving with runs */
        else if (!strcmp(argv[i], "--formats")) formats = true;
        else if (!strcmp(argv[i], "--no-fp8-map")) fp8_map = false; /* FP8 testing its codes itself */
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc) slots = atoi(argv[++i]); /* pool A/Bs */
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc && (nt = parse_tokens(argv[++i], ts)) > 0) continue;
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--mem-mib M] [--isa c|avx2|avx512] [--membw-only]\n"
                    "       [--formats [--tokens T1,T2,...] [--no-fp8-map]] [--slots RANGES_PER_THREAD]\n",
                    argv[0]);
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (mem_mib < 64) mem_mib = 64;

    df_pool *pool = df_pool_new(threads), *pool1 = df_pool_new(1);
    if (slots) df_pool_set_slots(pool, slots);
    uint64_t *buf = df_aligned_alloc(mem_mib << 20);
    /* BF16 values in [-2, 2) with random mantissas, so no value is special */
    uint64_t s = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < (mem_mib << 20) / 8; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        buf[i] = (s & 0x807f807f807f807full) | 0x3f003f003f003f00ull;
    }

    printf("# memory read bandwidth (%zu MiB buffer, median of 9)\n", mem_mib);
    double bw1 = mem_read_gbs(pool1, buf, mem_mib, 9);
    double bw = mem_read_gbs(pool, buf, mem_mib, 9);
    printf("membw_1thread_gbs %.2f\n", bw1);
    printf("membw_gbs %.2f\n", bw);
    if (membw_only) {
        free(buf);
        df_pool_free(pool);
        df_pool_free(pool1);
        return 0;
    }
    if (formats) {
        bench_formats(pool, buf, mem_mib, only_isa, ts, nt, threads, fp8_map);
        free(buf);
        df_pool_free(pool);
        df_pool_free(pool1);
        return 0;
    }
    {
        /* the same job on 1 and on `threads` threads: the excess over the ideal
         * split is the dispatch cost (wake-up, claim, completion wait) */
        double t1 = pool_call_us(pool1, 4000), tn = pool_call_us(pool, 4000);
        printf("# pool: a %.1f us job takes %.2f us on %d threads (ideal %.2f): dispatch ~%.2f us\n",
               t1, tn, threads, t1 / threads, tn - t1 / threads);
    }

    bench_bf16(pool, pool1, buf, mem_mib, only_isa, threads, bw);
    free(buf);
    df_pool_free(pool);
    df_pool_free(pool1);
    return 0;
}
