/*
 * test_prefetch.c - the prefetch gate (src/experts/prefetch.c): what each mode
 * predicts, how running recall moves, and that a gated layer switches between
 * the router lookahead, the previous step's experts and nothing as their
 * recall changes, and comes back when a predictor recovers; that gated mode
 * reads only uncached predictions of the ranks whose earlier reads were used;
 * and the time gate.
 */
#include "testutil.h"

#include "experts/prefetch.h"

#include <string.h>

#define E 16
#define K 4

/* One step of layer 0: the router lookahead says `router`, the layer uses
 * `actual`; returns what was handed out to read. */
static int step(df_prefetcher *p, const int *router, const int *actual, int *out) {
    int n = df_pf_predict(p, 0, router, K, NULL, out);
    df_pf_observe(p, 0, actual, K);
    return n;
}

static df_pf_choice choice(const df_prefetcher *p) {
    df_pf_layer_stats st;
    df_pf_layer(p, 0, &st);
    return st.choice;
}

static void test_names(void **state) {
    (void)state;
    assert_int_equal(df_pf_mode_from_name("on"), DF_PF_GATED);
    assert_int_equal(df_pf_mode_from_name("off"), DF_PF_OFF);
    assert_int_equal(df_pf_mode_from_name("router"), DF_PF_ROUTER);
    assert_int_equal(df_pf_mode_from_name("prev"), DF_PF_PREV);
    assert_int_equal(df_pf_mode_from_name("maybe"), -1);
    assert_string_equal(df_pf_mode_name(DF_PF_GATED), "on");
    assert_string_equal(df_pf_choice_name(DF_PF_USE_PREV), "prev");
}

static void test_forced_modes(void **state) {
    (void)state;
    int a[K] = {1, 2, 3, 4}, b[K] = {5, 6, 7, 8}, out[E];
    df_prefetcher *p = df_pf_new(2, E, K, DF_PF_ROUTER, 1, 0.5, 0.5);
    for (int i = 0; i < 30; i++) { /* always wrong, always used */
        assert_int_equal(step(p, a, b, out), K);
        assert_memory_equal(out, a, sizeof a);
    }
    assert_int_equal(choice(p), DF_PF_USE_ROUTER);
    df_pf_layer_stats st;
    df_pf_layer(p, 0, &st);
    assert_int_equal(st.predicted, 30 * K);
    assert_int_equal(st.correct, 0);
    assert_int_equal(st.actual, 30 * K);
    assert_true(st.recall_router < 0.1);
    df_pf_free(p);

    p = df_pf_new(2, E, K, DF_PF_PREV, 1, 0.5, 0.5);
    assert_int_equal(step(p, a, a, out), 0); /* no previous step yet */
    assert_int_equal(step(p, a, b, out), K);
    assert_memory_equal(out, a, sizeof a); /* the previous step's set */
    df_pf_free(p);

    p = df_pf_new(2, E, K, DF_PF_OFF, 1, 0.5, 0.5);
    for (int i = 0; i < 5; i++) assert_int_equal(step(p, a, a, out), 0);
    assert_int_equal(choice(p), DF_PF_NONE);
    df_pf_free(p);
}

/* Duplicate and out-of-range ids in the router's rows collapse to a set. */
static void test_union_of_rows(void **state) {
    (void)state;
    int rows[3 * K] = {1, 2, 3, 4, 4, 3, 9, 1, 15, 2, 99, -1}, out[E];
    df_prefetcher *p = df_pf_new(1, E, K, DF_PF_ROUTER, 2, 0.5, 0.5);
    assert_int_equal(df_pf_depth(p), 2);
    int n = df_pf_predict(p, 0, rows, 3 * K, NULL, out);
    int want[] = {1, 2, 3, 4, 9, 15};
    assert_int_equal(n, 6);
    assert_memory_equal(out, want, sizeof want);
    df_pf_free(p);
}

static void test_gate_switches(void **state) {
    (void)state;
    int a[K] = {1, 2, 3, 4}, b[K] = {5, 6, 7, 8}, c[K] = {9, 10, 11, 12}, out[E];
    df_prefetcher *p = df_pf_new(1, E, K, DF_PF_GATED, 1, 0.5, 0.5);
    assert_int_equal(choice(p), DF_PF_USE_ROUTER);
    for (int i = 0; i < 20; i++) step(p, a, a, out); /* router right */
    assert_int_equal(choice(p), DF_PF_USE_ROUTER);
    /* The layer settles on b and the router keeps saying a: the previous
     * step's experts take over, within a bounded number of steps. */
    int switched = -1;
    for (int i = 0; i < 40 && switched < 0; i++) {
        step(p, a, b, out);
        if (choice(p) == DF_PF_USE_PREV) switched = i;
    }
    assert_true(switched >= 0 && switched < 15);
    /* Nothing predicts: a changing set that the router also misses. */
    switched = -1;
    for (int i = 0; i < 60 && switched < 0; i++) {
        int x[K] = {(i * 4) % E, (i * 4 + 1) % E, (i * 4 + 2) % E, (i * 4 + 3) % E};
        assert_true(step(p, c, x, out) >= 0);
        if (choice(p) == DF_PF_NONE) switched = i;
    }
    assert_true(switched >= 0 && switched < 20);
    assert_int_equal(step(p, c, c, out), 0); /* off: nothing read */
    /* Shadow scoring continues while off: the router recovers and is used. */
    switched = -1;
    for (int i = 0; i < 40 && switched < 0; i++) {
        int x[K] = {(i * 4) % E, (i * 4 + 1) % E, (i * 4 + 2) % E, (i * 4 + 3) % E};
        step(p, x, x, out);
        if (choice(p) == DF_PF_USE_ROUTER) switched = i;
    }
    assert_true(switched >= 0 && switched < 15);
    df_pf_free(p);
}

/* Gated mode reads only the uncached predictions, and of those only the
 * router ranks whose uncached predictions the layer went on to use. Here the
 * router's first choice is always right, its others always wrong; expert 1 is
 * cached, so only its uncached companions are ever candidates. */
static void test_read_precision(void **state) {
    (void)state;
    uint8_t cached[E] = {0};
    cached[1] = 1;
    df_prefetcher *p = df_pf_new(1, E, K, DF_PF_GATED, 1, 0.5, 0.5);
    int out[E], n = 0;
    bool rank0_read = true;
    for (int i = 0; i < 200; i++) {
        /* the router's rank order: first choice e0, then three it gets wrong */
        int e0 = 2 + i % 4, router[K] = {e0, 8 + i % 3, 12 + i % 2, 1};
        int actual[K] = {e0, 6 + i % 2, 14 + i % 2, 1}; /* the previous step predicts little */
        n = df_pf_predict(p, 0, router, K, cached, out);
        for (int j = 0; j < n; j++) assert_int_not_equal(out[j], 1); /* cached: never read */
        if (i >= 100) {                                             /* settled */
            bool has0 = false;
            for (int j = 0; j < n; j++) has0 |= out[j] == e0;
            rank0_read &= has0;
            assert_int_equal(n, 1); /* the wrong ranks are no longer read */
        }
        df_pf_observe(p, 0, actual, K);
    }
    assert_true(rank0_read);
    df_pf_layer_stats st;
    df_pf_layer(p, 0, &st);
    assert_true(st.precision_first > 0.95);
    assert_int_equal(st.ranks_read, 1); /* rank 3, only ever cached, is unscored: not read */
    assert_true(st.precision_prev < 0.5);
    /* The first choice stops being right: it stops being read, within a
     * bounded number of its samples; recall alone (3 of 4 right) would keep it. */
    int stopped = -1;
    for (int i = 0; i < 100 && stopped < 0; i++) {
        int router[K] = {2, 3, 1, 4}, actual[K] = {1, 3, 4, 9};
        n = df_pf_predict(p, 0, router, K, cached, out);
        bool has2 = false;
        for (int j = 0; j < n; j++) has2 |= out[j] == 2;
        if (!has2) stopped = i;
        df_pf_observe(p, 0, actual, K);
    }
    assert_true(stopped >= 1 && stopped <= 20);
    df_pf_free(p);

    /* forced modes read the whole set, whatever its precision */
    p = df_pf_new(1, E, K, DF_PF_ROUTER, 1, 0.5, 0.5);
    for (int i = 0; i < 50; i++) {
        int router[K] = {2, 3, 4, 5}, actual[K] = {6, 7, 8, 9};
        assert_int_equal(df_pf_predict(p, 0, router, K, cached, out), K);
        df_pf_observe(p, 0, actual, K);
    }
    df_pf_free(p);
}

/* The time gate: prefetch that makes steps slower is switched off after one
 * probe, prefetch that makes them faster is held, and the gate probes again
 * after its hold; batched steps are not timed; forced modes are never gated. */
static void test_time_gate(void **state) {
    (void)state;
    df_prefetcher *p = df_pf_new(1, E, K, DF_PF_GATED, 1, 0.5, 0.5);
    assert_string_equal(df_pf_gate_state(p), "probing");
    int steps = 0;
    while (strcmp(df_pf_gate_state(p), "probing") == 0 && steps < 100) {
        df_pf_step(p, df_pf_active(p) ? 0.012 : 0.010, 1, 0); /* prefetch slower */
        df_pf_step(p, 5.0, 64, 9);                        /* a prefill chunk: ignored */
        steps++;
    }
    assert_true(steps <= 40);
    assert_string_equal(df_pf_gate_state(p), "off");
    assert_false(df_pf_active(p));
    assert_false(df_pf_wanted(p)); /* no lookahead computed while held off */
    assert_true(df_pf_gate_speedup(p) < 0.9);
    /* after the hold it probes again; now prefetch is faster and is kept */
    for (int i = 0; i < 200 && strcmp(df_pf_gate_state(p), "off") == 0; i++) df_pf_step(p, 0.010, 1, 0);
    assert_string_equal(df_pf_gate_state(p), "probing");
    assert_true(df_pf_wanted(p));
    for (int i = 0; i < 100 && strcmp(df_pf_gate_state(p), "probing") == 0; i++)
        df_pf_step(p, df_pf_active(p) ? 0.008 : 0.010, 1, 0);
    assert_string_equal(df_pf_gate_state(p), "on");
    assert_true(df_pf_active(p));
    assert_true(df_pf_gate_speedup(p) > 1.2);
    df_pf_free(p);

    /* A cache still warming: every step faster than the one before, prefetch
     * changing nothing. A probe of 8 steps on, then 8 off, judged it a 1.5-1.8x
     * speed-up on the demo model; timed in the order on off off on, the trend
     * falls on both arms and prefetch is not held on. */
    p = df_pf_new(1, E, K, DF_PF_GATED, 1, 0.5, 0.5);
    double t = 0.030;
    for (int i = 0; i < 100 && strcmp(df_pf_gate_state(p), "probing") == 0; i++, t *= 0.95)
        df_pf_step(p, t, 1, 0);
    assert_string_equal(df_pf_gate_state(p), "off");
    assert_true(df_pf_gate_speedup(p) > 0.9 && df_pf_gate_speedup(p) < 1.03);
    df_pf_free(p);

    /* Step time set by the step's misses (0.3 ms + 0.3 ms per miss, misses
     * 0-15 at random, as teacher-forced random tokens give on the demo model):
     * the arms are compared at equal misses, so prefetch that changes nothing
     * is measured as ~1.00x and not held, and prefetch that hides a third of
     * each miss is found and held. */
    for (int effect = 0; effect < 2; effect++) {
        p = df_pf_new(1, E, K, DF_PF_GATED, 1, 0.5, 0.5);
        uint32_t x = 12345;
        for (int i = 0; i < 100 && strcmp(df_pf_gate_state(p), "probing") == 0; i++) {
            x = x * 1664525u + 1013904223u;
            int m = (int)(x >> 28);
            double per_miss = effect && df_pf_active(p) ? 0.0002 : 0.0003;
            df_pf_step(p, 0.0003 + per_miss * m, 1, m);
        }
        double sp = df_pf_gate_speedup(p);
        if (effect) {
            assert_string_equal(df_pf_gate_state(p), "on");
            assert_true(sp > 1.2);
        } else {
            assert_string_equal(df_pf_gate_state(p), "off");
            assert_true(sp > 0.999 && sp < 1.001);
        }
        df_pf_free(p);
    }

    p = df_pf_new(1, E, K, DF_PF_ROUTER, 1, 0.5, 0.5);
    for (int i = 0; i < 100; i++) df_pf_step(p, 1.0, 1, 0);
    assert_string_equal(df_pf_gate_state(p), "forced");
    assert_true(df_pf_active(p));
    df_pf_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_forced_modes),
        cmocka_unit_test(test_union_of_rows),
        cmocka_unit_test(test_gate_switches),
        cmocka_unit_test(test_read_precision),
        cmocka_unit_test(test_time_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
