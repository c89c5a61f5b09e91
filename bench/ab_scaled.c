/*
 * ab_scaled.c - an A/B of two versions of one scaled-format ISA file
 * (src/kernels/scaled_avx512.c or scaled_avx2.c) inside one process, for a
 * shared machine whose speed moves between runs: bench/ab_scaled.sh compiles
 * both into this program (their entry points renamed A_qrows and B_qrows),
 * and each round times A and then B on the same data, so a swing of the host
 * falls on both. Prints the median GB/s (values + scales per second) of each
 * and the median of the per-round ratio B/A; warns if the two disagree on
 * the result (they must be bit-identical).
 *
 *   [MAP=1] [POW2=1] ab_scaled MODE FORMAT REPS TOKENS (MAP=1: FP8 views carry their F16-form
 *   map; POW2=1: FP8 block scales are powers of two, as DeepSeek-V3.1's)
 *   MODE l2: one thread, [64 x 7168] that stays in L2; ram: 2 threads,
 *   [2048 x 7168] copies cycling over 1 GiB. FORMAT fp8, int4 or mxfp4.
 *   CODES=random: FP8 codes drawn uniformly (1 in 8 at e = 0) instead of
 *   those of normal weights quantized as a checkpoint holds them
 *   (e4m3_codes.h).
 */
#include "e4m3_codes.h"
#include "kernels/kernels.h"
#include "kernels/scaled.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void qfn(float *y, int ldy, const float *x, int ldx, const df_wview *w, int T, int n0, int n1);
qfn A_qrows, B_qrows;

typedef struct {
    qfn *f;
    float *y;
    const float *x;
    const df_wview *w;
    int T;
} job;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void run_job(void *a, int b, int e) {
    job *j = a;
    j->f(j->y, j->w->rows, j->x, j->w->cols, j->w, j->T, b, e);
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void fill(df_wfmt f, uint8_t *v, size_t vb, uint8_t *s, size_t sb) {
    static uint8_t tab[65536];
    int normal = f.elem == DF_EL_F8_E4M3 && !(getenv("CODES") && !strcmp(getenv("CODES"), "random"));
    int pow2 = getenv("POW2") && !strcmp(getenv("POW2"), "1");
    srand(1);
    if (normal) bench_e4m3_table(tab, next64);
    for (size_t i = 0; i < vb; i++) {
        v[i] = normal ? tab[(unsigned)rand() & 0xffff] : (uint8_t)rand();
        if (f.elem == DF_EL_F8_E4M3 && (v[i] & 0x7f) == 0x7f) v[i] ^= 1; /* no NaN */
    }
    for (size_t i = 0; i < sb;) {
        if (f.scale == DF_SC_F32) {
            float q = pow2 ? ldexpf(1.0f, -10 - rand() % 10) : 1e-4f * (float)(1 + rand() % 100);
            memcpy(s + i, &q, 4), i += 4;
        } else if (f.scale == DF_SC_BF16) {
            uint16_t h = df_f32_to_bf16(1e-4f * (float)(1 + rand() % 100));
            memcpy(s + i, &h, 2), i += 2;
        } else {
            s[i++] = (uint8_t)(115 + rand() % 10);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s l2|ram fp8|int4|mxfp4 REPS TOKENS\n", argv[0]);
        return 2;
    }
    int ram = !strcmp(argv[1], "ram"), reps = atoi(argv[3]), T = atoi(argv[4]);
    df_wfmt f = !strcmp(argv[2], "fp8")    ? df_wfmt_fp8_block()
                : !strcmp(argv[2], "int4") ? df_wfmt_int4_group()
                                           : df_wfmt_mxfp4();
    if (reps < 1 || reps > 64 || T < 1 || T > 8) return 2;
    df_pool *pool = df_pool_new(2);
    const int N = ram ? 2048 : 64, K = 7168;
    size_t vb = (size_t)df_wfmt_bytes(f, N, K), sb = (size_t)df_wfmt_scale_bytes(f, N, K);
    size_t so = (vb + 63) & ~(size_t)63, per = (so + sb + 4095) & ~(size_t)4095;
    int copies = ram ? (int)(((size_t)1 << 30) / per) : 1;
    uint8_t *buf = aligned_alloc(4096, per * (size_t)copies);
    fill(f, buf, vb, buf + so, sb);
    for (int c = 1; c < copies; c++) memcpy(buf + (size_t)c * per, buf, per);
    float *x = aligned_alloc(64, (size_t)K * 4 * 8), *yA = malloc((size_t)N * 4 * 8), *yB = malloc((size_t)N * 4 * 8);
    for (int i = 0; i < K * 8; i++) x[i] = (float)((i * 7) % 13 - 6) * 0.01f;
    df_wview *w = malloc(sizeof *w * (size_t)copies);
    for (int c = 0; c < copies; c++) w[c] = df_wview_scaled(f, buf + (size_t)c * per, buf + (size_t)c * per + so, N, K);
    /* MAP=1: FP8 views carry the F16-form map (kernels.h) of their bytes, the same in
     * every copy; a version of the file from before the map ignores it */
    uint64_t *map = NULL;
    if (f.elem == DF_EL_F8_E4M3 && getenv("MAP") && !strcmp(getenv("MAP"), "1")) {
        map = malloc(sizeof(uint64_t) * df_fp8_map_words(K) * (size_t)N);
        df_fp8_map_build(map, &w[0]);
        for (int c = 0; c < copies; c++) w[c].f16map = map;
    }
    double gA[64], gB[64], ratio[64];
    int cur = 0;
    for (int r = 0; r < reps; r++)
        for (int arm = 0; arm < 2; arm++) {
            qfn *fn = arm ? B_qrows : A_qrows;
            float *y = arm ? yB : yA;
            double best = 1e9;
            int inner = ram ? copies : 200;
            for (int rep = 0; rep < (ram ? 2 : 5); rep++) {
                double t0 = now();
                for (int it = 0; it < inner; it++) {
                    job j = {fn, y, x, &w[ram ? cur : 0], T};
                    if (ram) {
                        cur = (cur + 1) % copies;
                        df_pool_for(pool, N, 8, run_job, &j);
                    } else {
                        run_job(&j, 0, N);
                    }
                }
                double t = (now() - t0) / inner;
                if (t < best) best = t;
            }
            (arm ? gB : gA)[r] = (double)(vb + sb) / best / 1e9;
        }
    if (memcmp(yA, yB, (size_t)N * 4 * (size_t)T)) printf("RESULTS DIFFER\n");
    for (int r = 0; r < reps; r++) ratio[r] = gB[r] / gA[r];
    qsort(gA, (size_t)reps, 8, cmpd), qsort(gB, (size_t)reps, 8, cmpd), qsort(ratio, (size_t)reps, 8, cmpd);
    printf("%s %-22s T=%d A median %.2f GB/s | B median %.2f GB/s | paired B/A median %.3f (%.3f-%.3f)\n", argv[1],
           df_wfmt_name(f), T, gA[reps / 2], gB[reps / 2], ratio[reps / 2], ratio[0], ratio[reps - 1]);
    return 0;
}
