/*
 * test_mla.c - the MLA block (src/model/mla.c) on its own, over contexts of
 * several of its position blocks: every row against a float64 reference of
 * the absorbed attention written from the definition (scores of the absorbed
 * query with the cache, softmax, the weighted latent, W_UV), and bit for bit
 * the same alone or in batches of any size, with rows of two sequences mixed,
 * with 1-3 threads, on every instruction-set path the CPU has (the portable
 * one on rows at the block edges), and with a scratch sized for a short
 * context (more waves of blocks, smaller groups).
 */
#include "testutil.h"

#include "kernels/kernels.h"
#include "model/blocks.h"
#include "model/forward.h"
#include "model/state.h"

#include <math.h>
#include <string.h>

/* Odd widths: no dimension is a whole number of vectors. 700 positions are
 * three blocks of 256, the last partial. */
enum { NH = 3, NOPE = 16, ROPE = 8, VD = 12, KVL = 40, DIM = KVL + ROPE, QD = NOPE + ROPE, CTX = 700 };
static const df_mla A = {NH, NOPE, ROPE, VD, KVL, 0.5f};

static uint16_t kvb[NH * (NOPE + VD) * KVL]; /* BF16 */
static float q[2][CTX][NH * QD];
static df_seq *seq[2];
static df_tensor kvb_t;
static df_weight kv_b;

/* uniform in [-1, 1) */
static float frand(void) { return (float)df_test_rnd(1u << 20) / (float)(1u << 19) - 1.0f; }

static int setup(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof kvb / sizeof kvb[0]; i++) {
        float f = frand() * 1.2f;
        uint32_t u;
        memcpy(&u, &f, 4);
        kvb[i] = (uint16_t)(u >> 16);
    }
    kvb_t = (df_tensor){.name = "kv_b", .dtype = DF_DT_BF16, .ndim = 2, .shape = {NH * (NOPE + VD), KVL},
                        .nbytes = sizeof kvb, .data = kvb};
    kv_b = (df_weight){df_wview_make(kvb, DF_DT_BF16, NH * (NOPE + VD), KVL), &kvb_t, NULL};
    for (int s = 0; s < 2; s++) {
        df_error err;
        df_lstate *ls;
        seq[s] = df_seq_new(1, CTX);
        assert_int_equal(df_latent_state_new(&ls, CTX, DIM, &err), 0);
        df_seq_set(seq[s], 0, ls);
        float row[DIM];
        for (int j = 0; j < CTX; j++) {
            for (int c = 0; c < DIM; c++) row[c] = frand();
            /* a late spike in sequence 0: the running max moves in a later block */
            if (s == 0 && j == 600) row[0] = 6.0f;
            ls->ops->append(ls, j, row);
            for (int i = 0; i < NH * QD; i++) q[s][j][i] = frand();
        }
    }
    return 0;
}

static int teardown(void **st) {
    (void)st;
    df_seq_free(seq[0]), df_seq_free(seq[1]);
    return 0;
}

/* out[i] for rows (sequence sq[i], position ps[i]), i < n, computed in calls
 * of `step` rows with `threads` threads on path isa, the scratch sized for
 * max_ctx positions and `step` rows. */
static void attend(int n, const int *sq, const int *ps, int step, int threads, const char *isa, int max_ctx,
                   float *out) {
    assert_int_equal(df_isa_set((df_isa)df_isa_from_name(isa)), 0);
    df_pool *p = df_pool_new(threads);
    df_mla_work *w = df_mla_work_new(&A, step, max_ctx);
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        int32_t *tok = calloc((size_t)k, sizeof *tok);
        const df_seq **sv = malloc(sizeof *sv * (size_t)k);
        float *qb = malloc(sizeof(float) * (size_t)k * NH * QD);
        for (int t = 0; t < k; t++) {
            sv[t] = seq[sq[i + t]];
            memcpy(qb + (size_t)t * NH * QD, q[sq[i + t]][ps[i + t]], sizeof(float) * NH * QD);
        }
        df_batch b = {k, tok, ps + i, (df_seq **)sv};
        df_mla_attend(p, &b, 0, &A, &kv_b, qb, out + (size_t)i * NH * VD, w);
        free(qb), free(tok), free(sv);
    }
    df_mla_work_free(w);
    df_pool_free(p);
    df_isa_set(df_isa_detect());
}

/* The float64 reference of one row, written from the definition. */
static void reference(int s, int pos, float scale, double *out) {
    const float *cache = df_latent_of(seq[s]->layer[0])->row;
    double *p = malloc(sizeof(double) * (pos + 1));
    for (int h = 0; h < NH; h++) {
        const float *qh = q[s][pos] + h * QD;
        double ql[KVL] = {0}, o[KVL] = {0}, mx = -INFINITY, sum = 0;
        for (int c = 0; c < KVL; c++)
            for (int i = 0; i < NOPE; i++)
                ql[c] += (double)qh[i] * df_bf16_to_f32(kvb[(h * (NOPE + VD) + i) * KVL + c]);
        for (int j = 0; j <= pos; j++) {
            const float *cj = cache + (size_t)j * DIM;
            double d = 0;
            for (int c = 0; c < KVL; c++) d += ql[c] * cj[c];
            for (int r = 0; r < ROPE; r++) d += (double)qh[NOPE + r] * cj[KVL + r];
            p[j] = d * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j <= pos; j++) sum += p[j] = exp(p[j] - mx);
        for (int j = 0; j <= pos; j++)
            for (int c = 0; c < KVL; c++) o[c] += p[j] / sum * cache[(size_t)j * DIM + c];
        for (int v = 0; v < VD; v++) {
            double y = 0;
            for (int c = 0; c < KVL; c++) y += df_bf16_to_f32(kvb[(h * (NOPE + VD) + NOPE + v) * KVL + c]) * o[c];
            out[h * VD + v] = y;
        }
    }
    free(p);
}

/* Largest |got - ref| / (1 + |ref|) over the rows. */
static double ref_error(int n, const int *sq, const int *ps, const float *got, float scale) {
    double worst = 0, ref[NH * VD];
    for (int i = 0; i < n; i++) {
        reference(sq[i], ps[i], scale, ref);
        for (int k = 0; k < NH * VD; k++) {
            double e = fabs(got[(size_t)i * NH * VD + k] - ref[k]) / (1 + fabs(ref[k]));
            if (e > worst) worst = e;
        }
    }
    return worst;
}

static int all_pos[2 * CTX], all_seq[2 * CTX];

/* Every position of sequence 0 (rows 0..CTX-1), then of sequence 1. */
static void all_rows(void) {
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < CTX; j++) all_seq[s * CTX + j] = s, all_pos[s * CTX + j] = j;
}

static void test_matches_reference(void **st) {
    (void)st;
    all_rows();
    float *got = malloc(sizeof(float) * 2 * CTX * NH * VD);
    attend(2 * CTX, all_seq, all_pos, 64, 2, "auto", CTX, got);
    double e = ref_error(2 * CTX, all_seq, all_pos, got, A.scale);
    if (e > 2e-5) fail_msg("MLA vs the float64 reference: relative error %.3g", e);
    /* the comparison can fail: a 1% different softmax scale is noticed */
    assert_true(ref_error(2 * CTX, all_seq, all_pos, got, A.scale * 1.01f) > 1e-3);
    free(got);
}

/* Rows around the block edges and the ends, of both sequences (the C path
 * under the sanitizers is slow: the other paths check these). */
static int sub_pos[2 * 12], sub_seq[2 * 12];

static void subset_rows(void) {
    const int at[12] = {0, 1, 2, 254, 255, 256, 257, 511, 512, 600, 698, 699};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 12; i++) sub_seq[s * 12 + i] = s, sub_pos[s * 12 + i] = at[i];
}

static void test_bit_identical(void **st) {
    (void)st;
    all_rows(), subset_rows();
    size_t per = NH * VD, n = 2 * CTX;
    float *ref = malloc(sizeof(float) * n * per), *got = malloc(sizeof(float) * n * per);
    /* each row alone, one thread */
    attend((int)n, all_seq, all_pos, 1, 1, "auto", CTX, ref);
    struct { int step, threads; const char *isa; int max_ctx; bool subset; } arms[] = {
        {1, 2, "auto", CTX, 0}, {CTX, 2, "auto", CTX, 0}, {37, 3, "auto", CTX, 0},
        /* every row of both sequences in one call */
        {2 * CTX, 2, "auto", CTX, 0},
        /* a scratch for 16 positions: one block per wave, one row per group */
        {CTX, 2, "auto", 16, 0}, {3, 1, "auto", 16, 0},
        {1, 1, "c", CTX, 1}, {24, 2, "c", CTX, 1}, {5, 3, "c", 16, 1},
        {1, 2, "avx2", CTX, 1}, {24, 1, "avx2", CTX, 1}, {256, 2, "avx2", CTX, 0},
        {1, 2, "avx512", CTX, 1}, {5, 2, "avx512", CTX, 0},
    };
    for (size_t a = 0; a < sizeof arms / sizeof arms[0]; a++) {
        if (strcmp(arms[a].isa, "auto") && !df_test_isa_available(arms[a].isa)) continue;
        const int *sq = arms[a].subset ? sub_seq : all_seq, *ps = arms[a].subset ? sub_pos : all_pos;
        int rows = arms[a].subset ? 24 : (int)n;
        attend(rows, sq, ps, arms[a].step, arms[a].threads, arms[a].isa, arms[a].max_ctx, got);
        for (int i = 0; i < rows; i++)
            if (memcmp(ref + ((size_t)sq[i] * CTX + ps[i]) * per, got + (size_t)i * per, sizeof(float) * per))
                fail_msg("arm %zu (step %d, %d threads, %s, scratch for %d): sequence %d position %d differs", a,
                         arms[a].step, arms[a].threads, arms[a].isa, arms[a].max_ctx, sq[i], ps[i]);
    }
    /* rows of both sequences in one call, interleaved by runs */
    int sq[64], ps[64];
    for (int i = 0; i < 64; i++) sq[i] = (i / 16) % 2, ps[i] = sq[i] ? 250 + i : 630 + i;
    attend(64, sq, ps, 64, 2, "auto", CTX, got);
    for (int i = 0; i < 64; i++)
        if (memcmp(ref + ((size_t)sq[i] * CTX + ps[i]) * per, got + (size_t)i * per, sizeof(float) * per))
            fail_msg("mixed batch: sequence %d position %d differs", sq[i], ps[i]);
    /* the check can fail: a perturbed row is noticed */
    got[5] = nextafterf(ref[5], INFINITY);
    assert_int_not_equal(memcmp(ref, got, sizeof(float) * per), 0);
    free(ref), free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_bit_identical),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
