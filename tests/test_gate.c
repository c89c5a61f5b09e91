/*
 * test_gate.c - the speculative gate (src/decode/gate.c) on synthetic costs:
 * passes whose wall time follows a known curve C(k) and drafts accepted with a
 * known probability, so the depth it should settle on is known. Covers: a
 * drafter that is always wrong is switched off within a bounded number of
 * passes; with verify costs that grow slower than the rows (a fixed part per
 * pass, as when rows share streamed experts) the gate finds the deep depth a
 * line through the depth-1 cost would miss; one descheduled pass (a 5x spike)
 * does not switch off a drafter that pays; a drafter that cannot pay stays off
 * most of the time; a draft model whose first passes cost more than the
 * steady state (and whose first probe therefore fails) is probed again and
 * drafts once they do not; one whose passes are dear for the first ~16 after
 * every stretch of plain steps (the expert cache settling) is given the time
 * to get past them, and the patience costs little when they never get cheaper;
 * a draft model is not probed when a failed probe would cost more than a few
 * percent of the tokens left.
 */
#include "testutil.h"

#include "decode/gate.h"

#include <math.h>
#include <string.h>

typedef struct sim {
    double f, g;     /* verify pass = (1 + f + g k) plain steps */
    double d;        /* drafting, plain steps per drafted token */
    double a;        /* chance each drafted token is right */
    uint64_t rng;
    double cost;     /* plain steps spent */
    long tokens;     /* tokens produced */
    int passes, verify_passes, depth_hist[GATE_K_MAX + 1];
    int spike_at;    /* verify pass that takes 5x (0: none) */
    int transient;   /* the first this many verify passes cost transient_x times more */
    double transient_x;
    bool restart;    /* ... counted again after every stretch of 4 or more plain steps */
    int plain_run;   /* plain steps in a row */
} sim;

static double uniform(sim *s) {
    s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(s->rng >> 11) / 9007199254740992.0;
}

/* One pass as speculative.c reports it; plain step = 1 ms. */
static void step(spec_gate *gt, sim *s) {
    const double t = 1e-3;
    int k = gate_depth(gt, 0, 1 << 20);
    s->passes++;
    if (k == 0) {
        gate_plain(gt, t);
        s->cost += 1.0;
        s->tokens += 1;
        if (s->restart && ++s->plain_run >= 4) s->verify_passes = 0;
        return;
    }
    s->plain_run = 0;
    int acc = 0;
    while (acc < k && uniform(s) < s->a) acc++;
    double verify = (1.0 + s->f + s->g * k) * t, draft = s->d * k * t;
    if (++s->verify_passes == s->spike_at) verify *= 5.0;
    if (s->verify_passes <= s->transient) verify *= s->transient_x;
    gate_verify(gt, k, acc, verify, draft, verify + draft);
    s->cost += (verify + draft) / t;
    s->tokens += acc + 1;
    s->depth_hist[k]++;
}

static double expected(double a, int k) {
    double e = 1.0, x = 1.0;
    for (int i = 0; i < k; i++) e += (x *= a);
    return e;
}

/* The best speed-up any fixed depth gives, and that depth. */
static double best_fixed(const sim *s, int k_max, int *kbest) {
    double best = 0.0;
    for (int k = 1; k <= k_max; k++) {
        double v = expected(s->a, k) / (1.0 + s->f + (s->g + s->d) * k);
        if (v > best) {
            best = v;
            *kbest = k;
        }
    }
    return best;
}

static void test_wrong_drafter_off(void **st) {
    (void)st;
    spec_gate gt;
    gate_init(&gt, 8, 0, false, -1.0, -1.0);
    sim s = {.f = 0.0, .g = 0.3, .a = 0.0, .rng = 1};
    int first_off = -1;
    for (int i = 0; i < 600; i++) {
        step(&gt, &s);
        if (first_off < 0 && gt.switched_off) first_off = s.passes;
    }
    /* 3 plain steps, then the acceptance estimate 0.5 * 0.75^m falls below the
     * least cost per row by m = 9 */
    assert_true(first_off > 0 && first_off <= 12);
    /* back-offs of 16, 64, 256, 1024 plain steps between probes of <= 9 passes */
    assert_true(s.verify_passes <= 9 * 4);
    assert_true(s.tokens == s.passes);
}

static void run_for(spec_gate *gt, sim *s, int passes) {
    for (int i = 0; i < passes; i++) step(gt, s);
}

static void test_finds_deep_depth(void **st) {
    (void)st;
    /* 1 + 0.5 + 0.2 k: depth 1 costs 1.75 with drafting, so a line through
     * it (1 + 0.75 k) would settle at depth 1 or 2 for 1.09x, the best is 1.75x */
    sim s = {.f = 0.5, .g = 0.2, .d = 0.05, .a = 0.9, .rng = 7};
    int kbest = 0;
    double sbest = best_fixed(&s, 8, &kbest);
    assert_true(kbest >= 5 && sbest > 1.6);
    spec_gate gt;
    gate_init(&gt, 8, 0, false, -1.0, -1.0);
    run_for(&gt, &s, 200); /* learning */
    sim late = s;
    late.cost = 0;
    late.tokens = 0;
    memset(late.depth_hist, 0, sizeof late.depth_hist);
    run_for(&gt, &late, 400);
    int mode = 0;
    for (int k = 1; k <= 8; k++)
        if (late.depth_hist[k] > late.depth_hist[mode]) mode = k;
    double speed = (double)late.tokens / late.cost;
    print_message("fixed-cost curve: best depth %d (%.2fx); gate settles at %d, %.2fx, fit f %.2f g %.2f, "
                  "explored %llu\n",
                  kbest, sbest, mode, speed, gt.f, gt.g, (unsigned long long)gt.explored);
    assert_true(abs(mode - kbest) <= 2);
    assert_true(speed >= 0.85 * sbest);
    assert_true(late.verify_passes >= 350); /* drafting all along once learnt */
}

static void test_linear_costs(void **st) {
    (void)st;
    /* rows that cost in proportion: the gate should find a shallow depth and
     * come within 15% of the best fixed depth's speed-up */
    sim s = {.f = 0.0, .g = 0.3, .d = 0.02, .a = 0.8, .rng = 11};
    int kbest = 0;
    double sbest = best_fixed(&s, 8, &kbest);
    spec_gate gt;
    gate_init(&gt, 8, 0, false, -1.0, -1.0);
    run_for(&gt, &s, 600);
    double speed = (double)s.tokens / s.cost;
    print_message("linear curve: best depth %d (%.2fx); gate %.2fx, fit f %.2f g %.2f\n", kbest, sbest, speed, gt.f,
                  gt.g);
    assert_true(speed >= 0.85 * sbest);
}

/* A 5x pass once the gate drafts steadily (verify pass 60) must not switch a
 * paying drafter off; early on (verify pass 3, when the probe is judged on
 * three passes and the depth's cost has one measure) it may, but the gate must
 * be drafting again after one ordinary back-off (~65 steps here), not one
 * stretched by the spike. The
 * same seed without the spike is the reference. */
static void test_spike_keeps_paying_drafter(void **st) {
    (void)st;
    int early_lost = 0;
    for (int seed = 1; seed <= 12; seed++) {
        for (int at = 3; at <= 60; at += 57) {
            sim s0 = {.f = 0.2, .g = 0.3, .d = 0.05, .a = 0.9, .rng = (uint64_t)seed}, s1 = s0;
            s1.spike_at = at;
            spec_gate g0, g1;
            gate_init(&g0, 8, 0, false, -1.0, -1.0);
            gate_init(&g1, 8, 0, false, -1.0, -1.0);
            run_for(&g0, &s0, 150);
            run_for(&g1, &s1, 150);
            if (at == 3) {
                early_lost += s1.verify_passes < s0.verify_passes / 2;
                continue;
            }
            if (g1.switched_off > g0.switched_off || s1.verify_passes < s0.verify_passes - 4)
                fail_msg("seed %d, spike at verify pass %d: switched off %llu times (%llu without), %d verify "
                         "passes (%d)",
                         seed, at, (unsigned long long)g1.switched_off, (unsigned long long)g0.switched_off,
                         s1.verify_passes, s0.verify_passes);
        }
    }
    print_message("spike at the third verify pass: drafting halved or worse in %d of 12 runs\n", early_lost);
    assert_true(early_lost <= 2);
}

static void test_losing_drafter_mostly_off(void **st) {
    (void)st;
    /* a = 0.4 against rows costing 0.6 plain steps each: no depth pays */
    sim s = {.f = 0.1, .g = 0.6, .d = 0.0, .a = 0.4, .rng = 5};
    int kbest = 0;
    assert_true(best_fixed(&s, 8, &kbest) < 1.0);
    spec_gate gt;
    gate_init(&gt, 8, 0, false, -1.0, -1.0);
    run_for(&gt, &s, 2000);
    double speed = (double)s.tokens / s.cost;
    print_message("losing drafter: %.3fx of plain over 2000 passes, %d verifying\n", speed, s.verify_passes);
    assert_true(speed >= 0.95); /* the bound: never more than 5% slower */
}

/* The demo list: a draft model's first verify passes cost 1.8-2.2 plain steps
 * at depth 1, later ones 1.1-1.5. The first probe fails on them; what it
 * measured must not veto the probes after it (they were all declined, and a
 * 400-token run drafted 7 tokens), and a probe must not be judged on a deeper
 * depth before depth 1 is measured. */
static void test_model_costly_start(void **st) {
    (void)st;
    int ok = 0;
    for (int seed = 1; seed <= 8; seed++) {
        sim s = {.f = 0.1, .g = 0.35, .d = 0.06, .a = 0.95, .rng = (uint64_t)seed, .transient = 6,
                 .transient_x = 1.7};
        int kbest = 0;
        double sbest = best_fixed(&s, 8, &kbest);
        spec_gate gt;
        gate_init(&gt, 8, 0, true, 0.06e-3, 0.01e-3);
        run_for(&gt, &s, 300);
        sim late = s;
        late.cost = 0;
        late.tokens = 0;
        late.verify_passes = 0;
        late.transient = 0;
        run_for(&gt, &late, 400);
        double speed = (double)late.tokens / late.cost;
        print_message("seed %d: first probe %s; after it %.2fx (best fixed depth %d: %.2fx), %d of 400 passes "
                      "verifying, switched off %llu times, probes declined %llu\n",
                      seed, gt.switched_off ? "failed" : "held", speed, kbest, sbest, late.verify_passes,
                      (unsigned long long)gt.switched_off, (unsigned long long)gt.probes_declined);
        ok += speed >= 0.8 * sbest && late.verify_passes >= 200;
    }
    assert_true(ok >= 7);
}

/* The demo list as measured in session 7: a draft model accepted 96 % of the
 * time, whose verify passes cost 2.7 plain steps at depth 1 for the first ~20
 * passes after any stretch of plain steps and 1.5 once drafting runs on (the
 * expert cache settling to what passes read each time). The first measured
 * pass judged every probe a failure (a 400-token run drafted 6 tokens); a
 * probe whose drafts keep being accepted must be given the time to get past
 * the dear passes, and then draft: over the whole run at least 0.8 of what the
 * best fixed depth gets in the steady state, in 7 of 8 seeds. Session 6's gate
 * gets 0.98-0.99x in all 8. */
static void test_model_settling_cache(void **st) {
    (void)st;
    int ok = 0;
    for (int seed = 1; seed <= 8; seed++) {
        sim s = {.f = 0.1, .g = 0.35, .d = 0.06, .a = 0.96, .rng = (uint64_t)seed, .transient = 16,
                 .transient_x = 1.5, .restart = true};
        int kbest = 0;
        double sbest = best_fixed(&s, 8, &kbest);
        spec_gate gt;
        gate_init(&gt, 8, 0, true, 0.06e-3, 0.01e-3);
        run_for(&gt, &s, 400);
        double speed = (double)s.tokens / s.cost;
        int verifying = 0;
        for (int k = 1; k <= GATE_K_MAX; k++) verifying += s.depth_hist[k];
        print_message("seed %d: %.2fx over the run (best fixed depth %d: %.2fx steady), %d of %d passes "
                      "verifying, switched off %llu times\n",
                      seed, speed, kbest, sbest, verifying, s.passes, (unsigned long long)gt.switched_off);
        ok += speed >= 0.8 * sbest;
    }
    assert_true(ok >= 7);
}

/* ... but the patience is bounded: when the passes never get cheaper (2.2x
 * the steady cost, so that no depth pays, with 97 % accepted all the same) the
 * run stays within 5 % of plain decoding (2-3 % lost). And patience does not
 * hold depth 1 for good: with passes at 1.5x, where only deep passes pay, the
 * gate finds them (1.19-1.26x; holding depth 1, 0.89x). */
static void test_model_never_settles(void **st) {
    (void)st;
    for (int x = 0; x < 2; x++)
        for (int seed = 1; seed <= 8; seed++) {
            sim s = {.f = 0.1, .g = 0.35, .d = 0.06, .a = 0.97, .rng = (uint64_t)seed,
                     .transient = 1 << 30, .transient_x = x ? 1.5 : 2.2};
            spec_gate gt;
            gate_init(&gt, 8, 0, true, 0.06e-3, 0.01e-3);
            run_for(&gt, &s, 1000);
            double speed = (double)s.tokens / s.cost;
            print_message("never settling at %.1fx, seed %d: %.3fx, switched off %llu times\n", s.transient_x,
                          seed, speed, (unsigned long long)gt.switched_off);
            assert_true(x ? speed >= 1.1 : speed >= 0.95);
        }
}

/* A draft model's probe costs its catch-up whatever the drafts are worth: it
 * must not start when that would be more than a few percent of the plain steps
 * still to come (the demo passage: 107 tokens to catch up at 0.15 plain steps
 * each, 290 tokens left, every draft wrong: one probe cost 8-10 %), and may
 * when the run is long enough to absorb it. */
static void test_probe_share(void **st) {
    (void)st;
    const double t = 0.3e-3;
    for (int left = 300; left <= 3000; left += 2700) {
        spec_gate gt;
        gate_init(&gt, 8, 0, true, 0.05e-3, 0.045e-3);
        for (int i = 0; i < 20; i++) gate_plain(&gt, t); /* past PLAIN_FIRST_MODEL */
        int k = gate_depth(&gt, 107, left);
        print_message("107 tokens to catch up, %d left: depth %d, probes declined %llu\n", left, k,
                      (unsigned long long)gt.probes_declined);
        if (left == 300) {
            assert_int_equal(k, 0);
            assert_int_equal(gt.probes_declined, 1);
        } else {
            assert_true(k >= 1);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_drafter_off),
        cmocka_unit_test(test_finds_deep_depth),
        cmocka_unit_test(test_linear_costs),
        cmocka_unit_test(test_spike_keeps_paying_drafter),
        cmocka_unit_test(test_losing_drafter_mostly_off),
        cmocka_unit_test(test_model_costly_start),
        cmocka_unit_test(test_model_settling_cache),
        cmocka_unit_test(test_model_never_settles),
        cmocka_unit_test(test_probe_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
