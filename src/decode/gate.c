/*
 * gate.c - the economics gate of speculative decoding: how many tokens to draft.
 *
 * Costs are measured in wall time (which covers the expert bytes read, the
 * draft's own work and compute alike), in units of t_plain, a running mean of
 * plain steps. A pass that drafts k tokens costs
 *
 *     C(k) = 1 + f + (g + d) k   plain steps,
 *
 * d the drafter's cost per drafted token (learned from the drafting; for a
 * draft model first measured when it is loaded), and 1 + f + g k the target's
 * verify pass, fitted by least squares through the running mean cost of the
 * passes measured at each depth. The intercept f is what a verify pass costs
 * beyond a plain step whatever its depth, and the reason the fit is not a line
 * through one point: with experts streamed, rows of one sequence share many
 * experts, so the union a pass reads grows slower than its rows (demo model,
 * 6 MiB cache: passes of depth 1, 3 and 8 cost about 1.7, 2.9 and 5.2 plain
 * steps, i.e. f ~ 0.2, g ~ 0.5). A line through the depth-1 cost alone (1 +
 * 0.7 k) says deep passes never pay, and the gate never finds the depth that
 * does; so after EXPLORE_AFTER passes at its best depth the gate tries the next
 * deeper one once, when even the least cost for the extra row (G_MIN + d) would
 * make it the better depth, and the fit learns f from the two.
 *
 * With a per-token acceptance estimate a, a pass of depth k yields E(k) = 1 + a
 * + ... + a^k tokens, so it pays by S(k) = E(k) / C(k). The gate drafts at the
 * k that maximises S. A probe runs at least PROBE_MIN passes (one rejection
 * says little) unless even a hopeful acceptance (A_OPTIMISTIC) could not pay
 * for the measured cost, and up to PROBE_MAX while the acceptance its tokens
 * allow could (a draft model's probe whose drafts keep being accepted, up to
 * PROBE_LONG at depth 1 while it has lost little: its first passes read what
 * the expert cache does not hold yet); then drafting stops when no k gives
 * S >= 1 (a < g + d is enough to stop), and probes again after a back-off
 * that grows 4x each time a probe fails, and is at least PROBE_AMORTIZE times
 * what the failed probe wasted. g never falls below G_MIN (a verification row
 * is never free), so a drafter that is always wrong is switched off within a
 * bounded number of passes whatever the timings say. A draft model must first
 * catch up on the tokens it has not seen (its own prefill, batched); a probe
 * starts only when what it could win over the tokens still to come (at an optimistic
 * acceptance) is PROBE_GAIN times that catch-up, so a short generation never
 * pays for a draft that cannot earn it back. While drafting, one plain step in
 * every CALIBRATE passes keeps t_plain current.
 */
#include "decode/gate.h"

#include <math.h>
#include <string.h>

#define A_PRIOR 0.5     /* acceptance assumed when (re)starting to draft */
/* The acceptance estimate is a decayed count: each ruled token weighs A_DECAY
 * times the one after it, and the prior (A_PRIOR) one token's worth. It
 * follows a change within ~10 tokens, but unlike a plain running mean it does
 * not drop from 0.9 to 0.66 on the first miss of a deep pass. */
#define A_DECAY 0.97
#define G_PRIOR 0.25    /* cost of one drafted row, in plain steps, before measuring */
#define V_ALPHA 0.25    /* weight of one pass in its depth's running cost ... */
#define V_ALPHA_DOWN 0.5 /* ... when it is below: wall-time noise on a shared
                           machine only ever adds, so a fast pass is the better evidence */
#define G_MIN 0.05
#define G_MAX 8.0
#define F_MAX 8.0
#define FIT_W_MAX 8     /* a depth's weight in the fit: its passes, at most this many */
#define EXPLORE_AFTER 2 /* measured passes at the best depth before the next deeper one is tried */
#define D_ALPHA 0.2
/* On a shared machine a step now and then takes several times its usual time
 * (the thread was descheduled; 4-5x seen on the 2-core VM). An observation over
 * OUTLIER_SKIP times what is expected of it (the plain mean, the fit at that
 * depth, the drafting mean) is left out, unless the one before it of the same
 * kind was too (then the cost has really changed), and one that is counted
 * counts as at most OUTLIER times it: so one such step can neither switch off
 * a drafter that pays, by spoiling the first measure at a depth, nor make
 * plain steps look slow. */
#define OUTLIER_SKIP 1.6
#define OUTLIER 2.0
#define T_ALPHA 0.2
#define PROBE_MIN 3     /* verify passes before a probe may be judged a failure ... */
#define PROBE_MAX 9     /* ... and after which it is, if it does not pay */
#define A_OPTIMISTIC 0.8 /* acceptance a probe's admission hopes for */
#define PROBE_GAIN 2.0  /* a probe must hope to win this many times its catch-up */
/* ... and what it costs if it fails may be at most this share of the plain
 * steps still to come: the bound is 5 % slower than plain decoding at
 * worst. On the demo passage (plain steps of 0.3 ms from the cache, 107
 * tokens to catch up at 0.045 ms, every draft wrong) one failed probe cost
 * 8-10 % of a 400-token run, and its optimistic gain said nothing of that. */
#define PROBE_SHARE 0.04
#define PLAIN_FIRST 3   /* plain steps before the first draft; the first is not
                           measured (a cold expert cache would flatter drafting) */
#define PLAIN_FIRST_MODEL 16 /* ... before a draft model's first probe, whose
                           catch-up is judged against settled plain steps (the
                           first ones after a prompt, still filling the expert
                           cache, can be several times slower) */
#define CALIBRATE 32    /* verify passes between plain measurements */
/* Plain steps before probing again; x4 after each failed probe. A failed probe
 * costs more than its pass: a wrong row's experts are read and evict useful
 * ones, so probes must be rare for a drafter that keeps failing. */
#define BACKOFF_MIN 16
#define BACKOFF_MUL 4
#define BACKOFF_MAX 1024
/* ... and at least this many times the plain steps a failed probe wasted
 * (including bringing the draft model up to date), so probing costs at most
 * ~1/PROBE_AMORTIZE of the run. */
#define PROBE_AMORTIZE 40
#define OFF_MAX 8192
#define PROBE_OK 16     /* verify passes after which a probe counts as a success */
/* A draft model's probe whose drafts keep being accepted (estimate at least
 * A_OPTIMISTIC) is not judged before PROBE_LONG passes, as long as what it has
 * lost so far is at most PATIENCE_LOST plain steps and within PROBE_SHARE of
 * the plain steps still to come (a drafter whose passes never get cheaper and
 * never pay, 97 % accepted, then costs a run of 1000 passes 2.7-3.4 %:
 * test_gate.c test_model_never_settles). On the
 * demo list (draft model, 96 % of drafts accepted) a pass of the first ~20 of
 * drafting reads 4.7 MB (2.7 plain steps for 2 tokens), and 2.9 MB (1.5 plain
 * steps) once the expert cache has settled to what passes read: the first
 * measured pass judged every probe a failure, and a 400-token run drafted 6
 * tokens where drafting at depth 1 throughout decodes 1.29x faster. */
#define PROBE_LONG 24
#define PATIENCE_LOST 8.0

void gate_init(spec_gate *g, int k_max, int fixed, bool model, double t_draft, double t_catchup) {
    memset(g, 0, sizeof *g);
    g->k_max = k_max < 1 ? 1 : k_max > GATE_K_MAX ? GATE_K_MAX : k_max;
    g->fixed = fixed;
    g->model = model;
    g->a = g->a_num = A_PRIOR;
    g->a_den = 1.0;
    g->g = G_PRIOR;
    g->backoff = BACKOFF_MIN;
    g->probing = true;
    g->t_draft = t_draft;
    g->t_catchup = t_catchup;
}

static double expected_tokens(double a, int k) {
    double e = 1.0, x = 1.0;
    for (int i = 0; i < k; i++) e += (x *= a);
    return e;
}

/* f and g of 1 + f + g k through the measured depths' mean costs, weighted by
 * their passes (capped, so the depth drafted most does not drown the others).
 * One depth alone gives a line through the origin (f = 0): the cautious guess,
 * deep passes cost in proportion. */
static void fit(spec_gate *g) {
    double sw = 0, sk = 0, sy = 0, skk = 0, sky = 0;
    int depths = 0;
    for (int k = 1; k <= g->k_max; k++) {
        if (!g->vn[k]) continue;
        double w = g->vn[k] < FIT_W_MAX ? g->vn[k] : FIT_W_MAX, y = g->vc[k] - 1.0;
        sw += w;
        sk += w * k;
        sy += w * y;
        skk += w * k * k;
        sky += w * k * y;
        depths++;
    }
    if (!depths) return;
    double var = skk * sw - sk * sk, gg = 0.0, ff = 0.0;
    if (depths >= 2 && var > 0) {
        gg = (sky * sw - sk * sy) / var;
        ff = (sy - gg * sk) / sw;
    }
    if (depths < 2 || !(var > 0) || ff < 0) { /* through the origin */
        ff = 0.0;
        gg = sky / skk;
    }
    if (gg < G_MIN) { /* a row is never free: refit f at the least slope */
        gg = G_MIN;
        ff = (sy - gg * sk) / sw;
        if (ff < 0) ff = 0.0;
    }
    g->g = gg > G_MAX ? G_MAX : gg;
    g->f = ff > F_MAX ? F_MAX : ff;
}

/* Drafting one token, in plain steps of t seconds (0 while unknown). */
static double draft_cost(const spec_gate *g, double t) { return g->t_draft > 0 && t > 0 ? g->t_draft / t : 0.0; }

/* Cost of a pass drafting k tokens, in plain steps of t seconds. */
static double pass_cost(const spec_gate *g, int k, double t) {
    return k > 0 ? 1.0 + g->f + (g->g + draft_cost(g, t)) * k : 1.0;
}

/* The depth with the best S(k) at acceptance a, plain steps of t seconds. */
static int best_depth(const spec_gate *g, double a, double t, double *s_best) {
    int best = 1;
    double sb = 0.0;
    for (int k = 1; k <= g->k_max; k++) {
        double s = expected_tokens(a, k) / pass_cost(g, k, t);
        if (s > sb) {
            sb = s;
            best = k;
        }
    }
    *s_best = sb;
    return best;
}

/* Whether a probe of the draft model may start with `lag` tokens to catch up
 * and `left` tokens still wanted: what it could win (at an optimistic
 * acceptance) must be PROBE_GAIN times its cost: the catch-up and the drafted
 * rows of PROBE_MIN failing passes, and that cost must be a small share of
 * the plain steps left (PROBE_SHARE). The catch-up is counted in the fastest
 * plain step seen (the first steps after a prompt, still filling the expert
 * cache, would make it look cheap); what a pass wins, in the running mean,
 * like every other pass (the fastest step, often 0.6x of the mean on a shared
 * machine, made the drafting look so dear that the demo draft was never
 * probed in half the runs). */
static bool probe_pays(const spec_gate *g, int lag, int left) {
    if (!g->model || g->t_catchup <= 0 || g->t_plain <= 0) return true;
    double t = g->t_plain_min > 0 ? g->t_plain_min : g->t_plain;
    if (lag < 0) lag = 0;
    double cost = (double)lag * g->t_catchup / t + PROBE_MIN * (pass_cost(g, 1, g->t_plain) - 1.0), s;
    best_depth(g, A_OPTIMISTIC, g->t_plain, &s);
    double gain = s > 1.0 ? (double)(left - 1) * (1.0 - 1.0 / s) : 0.0;
    return gain >= PROBE_GAIN * cost && cost <= PROBE_SHARE * (double)(left - 1);
}

/* The next deeper depth to try once, or 0: when the best depth k has been
 * measured a few times, k + 1 never, and even the least cost for its extra
 * row would make it the better depth, and one that pays. Only a measure at a
 * second depth tells the fixed part of a pass (f) from the per-row part, so
 * this is also tried before a probe is judged a failure. */
static int explore_depth(const spec_gate *g, int k, double s) {
    if (k >= g->k_max || g->vn[k] < EXPLORE_AFTER || g->vn[k + 1]) return 0;
    double least = pass_cost(g, k, g->t_plain) + G_MIN + draft_cost(g, g->t_plain);
    double hope = expected_tokens(g->a, k + 1) / least;
    return hope > s && hope >= 1.0 ? k + 1 : 0;
}

/* What the passes of a failed probe cost is forgotten when the next probe
 * starts: they measured the first passes after a stretch of plain steps,
 * which on the demo list cost 1.8-2.2 plain steps at depth 1 against 1.1-1.5
 * once drafting runs on (the expert cache has not yet settled to what the
 * passes read), and kept as they were they said no probe could pay: every
 * later probe was declined and a 400-token run drafted 7 tokens. The back-off
 * already bounds what re-measuring costs. */
static void forget_costs(spec_gate *g) {
    memset(g->vc, 0, sizeof g->vc);
    memset(g->vn, 0, sizeof g->vn);
    memset(g->suspect, 0, sizeof g->suspect);
    g->f = 0.0;
    g->g = G_PRIOR;
}

/* Plain steps the current probe has cost beyond the tokens it produced. */
static double probe_lost(const spec_gate *g) {
    return g->t_plain > 0 ? g->probe_s / g->t_plain - g->probe_tokens : 0.0;
}

/* Whether the current probe is still given time (PROBE_LONG). */
static bool patient(const spec_gate *g) {
    if (!g->model || g->a < A_OPTIMISTIC || g->probe_passes >= PROBE_LONG) return false;
    double lost = probe_lost(g);
    return lost <= PATIENCE_LOST && lost <= PROBE_SHARE * (double)g->left;
}

int gate_depth(spec_gate *g, int lag, int left) {
    g->left = left;
    if (g->fixed) return g->fixed;
    if (g->n_plain < (g->model ? PLAIN_FIRST_MODEL : PLAIN_FIRST)) return 0;
    if (g->off_left > 0) {
        g->off_left--;
        if (g->off_left == 0) { /* probe again from the prior */
            g->a = g->a_num = A_PRIOR;
            g->a_den = 1.0;
            g->on_passes = 0;
            g->probing = true;
            forget_costs(g);
        }
        return 0;
    }
    if (g->since_plain >= CALIBRATE) return 0;
    if (g->probing && !probe_pays(g, lag, left)) {
        /* not now: look again later (the draft costs nothing meanwhile) */
        g->off_left = BACKOFF_MIN;
        g->probes_declined++;
        return 0;
    }
    /* A draft model's probe drafts one token until that depth is measured:
     * its first measured pass at depth 2 (3.1-3.4 plain steps on the demo
     * list, where depth 1 pays and 2 does not) fitted through the origin made
     * depth 1 look as dear, and ended every probe there. Deeper depths are
     * then tried one at a time (explore_depth). A lookup drafter, whose rows
     * cost little, keeps its fast ramp. */
    if (g->model && g->vn[1] < EXPLORE_AFTER) return 1;
    /* ... and while a patient probe waits for depth 1 to pay: a deeper pass
     * then costs more and is rejected more often, and one rejection ends the
     * patience. (Not after it: where only deeper passes pay, depth 1 held for
     * good drafted at 0.89x of plain.) */
    if (patient(g) && expected_tokens(g->a, 1) < pass_cost(g, 1, g->t_plain)) return 1;
    double s;
    int k = best_depth(g, g->a, g->t_plain, &s), x = explore_depth(g, k, s);
    if (x) {
        g->explored++;
        return x;
    }
    return k;
}

static double clip(double obs, double est) { return est > 0 && obs > OUTLIER * est ? OUTLIER * est : obs; }

/* Whether obs may be counted against expectation est (see OUTLIER_SKIP). */
static bool screen(double obs, double est, bool *suspect) {
    if (est > 0 && obs > OUTLIER_SKIP * est && !*suspect) {
        *suspect = true;
        return false;
    }
    *suspect = false;
    return true;
}

void gate_plain(spec_gate *g, double secs) {
    if (g->n_plain > 1 && !screen(secs, g->t_plain, &g->suspect_plain)) {
        g->since_plain = 0; /* a step was taken all the same */
        return;
    }
    if (g->n_plain > 1) secs = clip(secs, g->t_plain);
    if (g->n_plain == 1) g->t_plain = secs;
    else if (g->n_plain > 1) g->t_plain += T_ALPHA * (secs - g->t_plain);
    if (g->n_plain >= 1 && (g->t_plain_min <= 0 || secs < g->t_plain_min)) g->t_plain_min = secs;
    g->n_plain++;
    g->since_plain = 0;
}

void gate_catchup(spec_gate *g, double per) {
    g->t_catchup = g->t_catchup < 0 ? per : g->t_catchup + D_ALPHA * (per - g->t_catchup);
}

void gate_verify(spec_gate *g, int drafted, int accepted, double verify_s, double draft_s, double total_s) {
    if (drafted < 1 || drafted > g->k_max) return;
    g->since_plain++;
    if (g->probing) {
        g->probing = false;
        g->probe_passes = 0;
        g->probe_s = 0.0;
        g->probe_tokens = 0;
    }
    g->probe_passes++;
    /* (what a descheduled pass wasted is not the drafter's doing: it would
     * stretch the back-off for nothing) */
    g->probe_s += g->t_plain > 0 ? clip(total_s, pass_cost(g, drafted, g->t_plain) * g->t_plain) : total_s;
    g->probe_tokens += accepted + 1;
    int seen = accepted < drafted ? accepted + 1 : drafted; /* tokens the target ruled on */
    for (int i = 0; i < seen; i++) {
        g->a_num = A_DECAY * g->a_num + (i < accepted ? 1.0 : 0.0);
        g->a_den = A_DECAY * g->a_den + 1.0;
    }
    g->a = g->a_num / g->a_den;
    /* A probe's first pass wakes the drafter's threads and reads experts the
     * plain steps had not needed yet: like the first plain step, its costs say
     * little of the steady state (measured up to 3x), so it measures only
     * acceptance. At a fixed depth costs are measured for --stats only. */
    bool measure = g->probe_passes > 1 || g->fixed;
    if (measure && g->t_plain > 0) {
        bool any = false;
        for (int k = 1; k <= g->k_max; k++) any |= g->vn[k] > 0;
        double obs = verify_s / g->t_plain, pred = 1.0 + g->f + g->g * drafted;
        if (!any || screen(obs, pred, &g->suspect[drafted])) {
            if (any) obs = clip(obs, pred);
            double al = obs < g->vc[drafted] ? V_ALPHA_DOWN : V_ALPHA;
            g->vc[drafted] = g->vn[drafted] ? g->vc[drafted] + al * (obs - g->vc[drafted]) : obs;
            g->vn[drafted]++;
            fit(g);
        }
    }
    if (measure) {
        double per = draft_s / drafted;
        if (!g->n_draft_obs) {
            g->t_draft = per;
            g->n_draft_obs++;
        } else if (screen(per, g->t_draft, &g->suspect_draft)) {
            g->t_draft += D_ALPHA * (clip(per, g->t_draft) - g->t_draft);
            g->n_draft_obs++;
        }
    }
    if (g->fixed) return;
    double s, s_hopeful;
    int k = best_depth(g, g->a, g->t_plain, &s);
    best_depth(g, A_OPTIMISTIC, g->t_plain, &s_hopeful);
    /* A probe is judged when even the acceptance its few tokens allow (the
     * estimate plus one standard error, roughly: a probe whose first four
     * tokens saw one miss may still be a 90 % drafter) would not pay, or
     * after PROBE_MAX passes. A measured pass is enough to judge when even a
     * hopeful acceptance would not pay for what a drafted token was measured
     * to cost. */
    double s_likely, a_hi = g->a + 1.0 / sqrt(g->a_den);
    best_depth(g, a_hi < 1.0 ? a_hi : 1.0, g->t_plain, &s_likely);
    bool judged = !patient(g) && (g->probe_passes >= PROBE_MAX ||
                                  (g->probe_passes >= PROBE_MIN && s_likely < 1.0) ||
                                  (g->probe_passes >= 2 && s_hopeful < 1.0));
    if (s < 1.0 && judged && !explore_depth(g, k, s)) {
        double off = probe_lost(g) * PROBE_AMORTIZE;
        g->off_left = off > g->backoff ? (off < OFF_MAX ? (int)off : OFF_MAX) : g->backoff;
        g->backoff = g->backoff * BACKOFF_MUL > BACKOFF_MAX ? BACKOFF_MAX : g->backoff * BACKOFF_MUL;
        g->switched_off++;
    } else if (s >= 1.0 && ++g->on_passes == PROBE_OK) {
        g->backoff = BACKOFF_MIN;
    }
}

int gate_current_depth(const spec_gate *g) {
    if (g->fixed) return g->fixed;
    double s;
    int k = best_depth(g, g->a, g->t_plain, &s);
    return g->off_left > 0 || s < 1.0 ? 0 : k;
}

double gate_row_cost(const spec_gate *g) {
    double s;
    int k = g->fixed ? g->fixed : best_depth(g, g->a, g->t_plain, &s);
    return (pass_cost(g, k, g->t_plain) - 1.0) / k;
}
