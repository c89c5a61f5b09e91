/*
 * bench_mla.c - the MLA block (src/model/mla.c) alone: the time of one
 * df_mla_attend call for one layer, decode (one row at position CTX-1) and a
 * prefill chunk (ROWS rows ending at CTX-1), on a random latent cache and a
 * random BF16 kv_b of the shape given. The suite's `deepseek` section uses the
 * decode figure to check the share of attention in a decode step measured from
 * whole runs (bench/suite.sh), and it is the quick loop for work on mla.c.
 *
 * Build: make build/bench_mla
 * Run:   build/bench_mla [--ctx N] [--rows N] [--threads N] [--reps N] [--isa P]
 *                        [--heads 16 --nope 128 --rope 64 --v 128 --kvl 512]
 * Prints `mla_decode_ms <ms>` and `mla_prefill_ms_per_row <ms>` (medians of
 * --reps calls, per layer; the least in parentheses: on a shared machine the
 * least is the block's own cost) and a checksum of the row at position CTX-1 computed
 * alone and as the chunk's last row (equal, and the same on every ISA path and
 * thread count: a quick exactness check, not a test).
 */
#include "kernels/kernels.h"
#include "model/blocks.h"
#include "model/forward.h"
#include "model/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static uint32_t checksum(const float *x, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        h = (h ^ u) * 16777619u;
    }
    return h;
}

/* Median (and in *best the least) milliseconds of `reps` calls over rows
 * [ctx - rows, ctx). */
static double time_attend(df_pool *p, df_seq *s, const df_mla *a, const df_weight *kv_b, int ctx, int rows,
                          int reps, df_mla_work *w, uint32_t *sum, double *best) {
    int qd = a->nope + a->rope, *pos = malloc(sizeof(int) * (size_t)rows);
    df_seq **seq = malloc(sizeof(df_seq *) * (size_t)rows);
    int32_t *tok = calloc((size_t)rows, sizeof(int32_t));
    float *q = df_aligned_alloc(sizeof(float) * (size_t)rows * (size_t)a->nh * (size_t)qd);
    float *out = df_aligned_alloc(sizeof(float) * (size_t)rows * (size_t)a->nh * (size_t)a->v);
    size_t rq = (size_t)a->nh * (size_t)qd;
    for (int t = 0; t < rows; t++) {
        pos[t] = ctx - rows + t, seq[t] = s;
        rng = 777u + 31u * (uint32_t)pos[t]; /* a position's query is the same in any chunk */
        for (size_t i = 0; i < rq; i++) q[(size_t)t * rq + i] = frand();
    }
    df_batch b = {rows, tok, pos, seq};
    double *ms = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double t0 = df_now();
        df_mla_attend(p, &b, 0, a, kv_b, q, out, w);
        ms[r] = (df_now() - t0) * 1e3;
    }
    /* the last row: the decode row at the same position must match it */
    *sum = checksum(out + (size_t)(rows - 1) * (size_t)a->nh * (size_t)a->v, (size_t)a->nh * (size_t)a->v);
    qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
    double med = ms[reps / 2];
    *best = ms[0];
    free(pos), free(seq), free(tok), free(q), free(out), free(ms);
    return med;
}

int main(int argc, char **argv) {
    int ctx = 4096, rows = 512, threads = 2, reps = 9;
    df_mla a = {16, 128, 64, 128, 512, 0.0721688f};
    const char *isa = "auto";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i];
        int v = atoi(argv[i + 1]);
        if (!strcmp(k, "--ctx")) ctx = v;
        else if (!strcmp(k, "--rows")) rows = v;
        else if (!strcmp(k, "--threads")) threads = v;
        else if (!strcmp(k, "--reps")) reps = v;
        else if (!strcmp(k, "--isa")) isa = argv[i + 1];
        else if (!strcmp(k, "--heads")) a.nh = v;
        else if (!strcmp(k, "--nope")) a.nope = v;
        else if (!strcmp(k, "--rope")) a.rope = v;
        else if (!strcmp(k, "--v")) a.v = v;
        else if (!strcmp(k, "--kvl")) a.kvl = v;
        else {
            fprintf(stderr, "bench_mla: unknown option %s\n", k);
            return 2;
        }
    }
    if (ctx < 1 || rows < 1 || rows > ctx || threads < 1 || reps < 1 || df_isa_from_name(isa) < 0 ||
        df_isa_set((df_isa)df_isa_from_name(isa))) {
        fprintf(stderr, "bench_mla: bad --ctx/--rows/--threads/--reps/--isa\n");
        return 2;
    }
    int dim = a.kvl + a.rope, kvb_rows = a.nh * (a.nope + a.v);
    /* kv_b as a BF16 tensor */
    uint16_t *wb = df_aligned_alloc(sizeof(uint16_t) * (size_t)kvb_rows * (size_t)a.kvl);
    for (size_t i = 0; i < (size_t)kvb_rows * (size_t)a.kvl; i++) wb[i] = bf16(frand() * 0.05f);
    df_tensor t = {.name = "kv_b", .dtype = DF_DT_BF16, .ndim = 2, .shape = {kvb_rows, a.kvl},
                   .nbytes = sizeof(uint16_t) * (uint64_t)kvb_rows * (uint64_t)a.kvl, .data = wb};
    df_weight kv_b = {df_wview_make(wb, DF_DT_BF16, kvb_rows, a.kvl), &t, NULL};
    /* one sequence of one layer, its cache full up to ctx */
    df_error err = {0};
    df_seq *s = df_seq_new(1, ctx);
    df_lstate *st;
    if (df_latent_state_new(&st, ctx, dim, &err)) {
        fprintf(stderr, "bench_mla: %s\n", err.msg);
        return 1;
    }
    df_seq_set(s, 0, st);
    float *row = malloc(sizeof(float) * (size_t)dim);
    for (int j = 0; j < ctx; j++) {
        for (int c = 0; c < dim; c++) row[c] = frand();
        st->ops->append(st, j, row);
    }
    df_pool *p = df_pool_new(threads);
    df_mla_work *w = df_mla_work_new(&a, rows, ctx);
    uint32_t sd, sp;
    double dmin, pmin;
    double dec = time_attend(p, s, &a, &kv_b, ctx, 1, reps, w, &sd, &dmin);
    double pre = time_attend(p, s, &a, &kv_b, ctx, rows, reps > 3 ? 3 : reps, w, &sp, &pmin);
    printf("# MLA block: %d heads, nope %d, rope %d, v %d, kv_lora %d; ctx %d, %d threads, isa %s\n", a.nh,
           a.nope, a.rope, a.v, a.kvl, ctx, threads, df_isa_name(df_isa_get()));
    printf("mla_decode_ms %.4f (least %.4f)\n", dec, dmin);
    printf("mla_prefill_ms_per_row %.4f (least %.4f; %d rows ending at position %d)\n", pre / rows, pmin / rows,
           rows, ctx - 1);
    printf("checksum of the last row: decode %08x prefill %08x%s\n", sd, sp, sd == sp ? "" : " DIFFER");
    df_mla_work_free(w);
    df_pool_free(p);
    df_seq_free(s);
    free(row), free(wb);
    return 0;
}
