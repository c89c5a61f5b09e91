/*
 * test_dist_plan.c - experts by rank's ownership plan (src/dist/plan.c), no
 * MPI needed: the weights equalise each rank's expected miss time (caches
 * first, the rest by bandwidth); rendezvous hashing gives each rank about
 * its weight's share of the (layer, expert)s, none to a rank of weight 0,
 * nothing on dense layers, the same answer every time, and moves only the
 * experts of a rank that leaves. Exactness over ranks is tests/test_mpi.sh's.
 */
#include "testutil.h"

#include "dist/dist.h"

#include <string.h>

#define LAYERS 40
#define EXPERTS 256

static void config(df_config *c) {
    memset(c, 0, sizeof *c);
    c->num_hidden_layers = LAYERS;
    c->num_experts = EXPERTS;
    for (int l = 1; l < LAYERS; l++) c->layer_is_moe[l] = true; /* layer 0 dense */
}

static void shares(const int *owner, int n_ranks, double *out) {
    int count[8] = {0}, total = 0;
    for (int i = 0; i < LAYERS * EXPERTS; i++)
        if (owner[i] >= 0) count[owner[i]]++, total++;
    for (int r = 0; r < n_ranks; r++) out[r] = (double)count[r] / total;
}

static void test_weights(void **state) {
    (void)state;
    /* everything fits in the caches: weights are the caches (capped at all) */
    uint64_t cache[3] = {100, 300, 1000};
    double bw[3] = {1, 1, 1}, w[3];
    bool excl[3] = {false, false, false};
    df_dist_plan_weights(cache, bw, excl, 3, 400, w);
    assert_true(w[0] == 100 && w[1] == 300 && w[2] == 400);
    /* no caches: shares by bandwidth; an excluded rank gets 0 */
    uint64_t none[3] = {0, 0, 0};
    double bw2[3] = {1e9, 3e9, 5e9};
    bool ex0[3] = {false, false, true};
    df_dist_plan_weights(none, bw2, ex0, 3, 1000, w);
    assert_true(w[2] == 0);
    assert_true(w[1] > 2.99 * w[0] && w[1] < 3.01 * w[0]);
    /* equal miss time: (w_r - C_r) / bw_r is the same for every rank */
    uint64_t c3[2] = {200, 0};
    double b3[2] = {1e9, 1e9};
    bool e3[2] = {false, false};
    df_dist_plan_weights(c3, b3, e3, 2, 1000, w);
    assert_true(w[0] + w[1] > 999 && w[0] + w[1] < 1001);
    assert_true((w[0] - 200) / 1e9 - w[1] / 1e9 < 1e-12 && w[1] / 1e9 - (w[0] - 200) / 1e9 < 1e-12);
}

static void test_owners(void **state) {
    (void)state;
    static df_config c;
    config(&c);
    static int a[LAYERS * EXPERTS], b[LAYERS * EXPERTS];
    double w[3] = {1, 1, 2}, s[3];
    df_dist_plan_owners(&c, w, 3, a);
    df_dist_plan_owners(&c, w, 3, b);
    assert_memory_equal(a, b, sizeof a); /* the same plan every time */
    for (int e = 0; e < EXPERTS; e++) assert_int_equal(a[e], -1); /* dense layer 0 */
    shares(a, 3, s);
    assert_true(s[0] > 0.22 && s[0] < 0.28 && s[1] > 0.22 && s[1] < 0.28 && s[2] > 0.47 && s[2] < 0.53);
    /* rank 0 owning nothing */
    double w0[3] = {0, 1, 1};
    df_dist_plan_owners(&c, w0, 3, b);
    shares(b, 3, s);
    assert_true(s[0] == 0 && s[1] > 0.45 && s[2] > 0.45);
    /* a rank leaving moves only its own experts */
    double w2[3] = {1, 1, 0};
    df_dist_plan_owners(&c, w2, 3, b);
    for (int i = 0; i < LAYERS * EXPERTS; i++)
        if (a[i] != 2) assert_int_equal(a[i], b[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_weights), cmocka_unit_test(test_owners)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
