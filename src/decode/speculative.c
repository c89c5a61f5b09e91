/*
 * speculative.c - speculative decoding: the df_spec API (deltafin.h).
 *
 * Owns the drafters (prompt lookup; a draft model with its own engine, session
 * and KV; a caller-supplied function for tests), verification against the
 * target, and the economics gate that decides how many tokens to draft.
 *
 * Verification. The session holds every history token but the last. One pass
 * evaluates [last, d1..dk] with all rows' logits; row i is the target's view of
 * the position after d_i (row 0: after last). Because the engine's rows are
 * bit-identical alone or in a batch, row i is exactly the logits plain decoding
 * would have had there once d1..d_i were accepted.
 *
 * Exact mode (the default, greedy or sampling): the target's token at row i is
 * what the plain sampler picks there (same history, and the next uniform of
 * its stream, one per token as in plain decoding); d_{i+1} is accepted if it
 * is that token. The first disagreement ends the pass with the target's token;
 * if all agree, row k gives a bonus token. Rows after a disagreement are never
 * sampled, so the stream advances exactly as in plain decoding and the output
 * is token for token the plain output for the same seed, whatever the drafter
 * or the gate did. A draft model guesses with the uniform the target will use
 * at that position (df_sampler_sample_at), so where its distribution is close
 * to the target's it lands on the same token (the target as its own draft is
 * always right). For a one-hot drafter (lookup) acceptance is p(d), as with
 * rejection sampling.
 *
 * Rejection mode (opts.rejection): the standard scheme. d_{i+1} is accepted
 * with probability min(1, p(d)/q(d)), p being the sampler's own final
 * distribution (df_sampler_probs: penalty, temperature, top-k/p, min-p) and q
 * the drafter's (one-hot for lookup); on rejection the token is drawn from
 * normalize(max(0, p - q)); the bonus is a plain df_sampler_sample. The output
 * distribution is exactly p's, and a draft model's acceptance is the largest
 * possible (sum of min(p, q)), but which sample a seed gives depends on where
 * the gate drafted, so a seed reproduces only at a fixed depth.
 *
 * Rejected rows' keys/values are dropped by truncating the session (and the
 * draft's).
 *
 * The gate. Costs are measured in wall time (which covers the expert bytes
 * read, the draft's own work and compute alike), in units of t_plain, a running
 * mean of plain steps: a pass that drafts k tokens costs 1 + (g + d) k plain
 * steps, g the extra cost of one verified row (learned from the target's
 * verify evaluations) and d the drafter's cost per drafted token (learned from
 * the drafting; for a draft model first measured when it is loaded). With a
 * per-token acceptance estimate a, a pass of depth k yields
 * E(k) = 1 + a + ... + a^k tokens, so it pays by S(k) = E(k) / (1 + (g + d) k).
 * The gate drafts at the k that maximises S. A probe runs at least PROBE_MIN
 * passes (one rejection says little) unless even a hopeful acceptance
 * (A_OPTIMISTIC) could not pay for the measured cost; then drafting stops when no k gives S >= 1 (a < g + d is enough to
 * stop), and probes again after a back-off that grows 4x each time a probe
 * fails, and is at least PROBE_AMORTIZE times what the failed probe wasted.
 * g never falls below G_MIN (a verification row is never free), so a drafter
 * that is always wrong is switched off within a bounded number of passes
 * whatever the timings say. A draft model must first catch up on the tokens it
 * has not seen (its own prefill, batched); a probe starts only when what it
 * could win over the tokens still to come (at an optimistic acceptance) is
 * PROBE_GAIN times that catch-up, so a short generation never pays for a
 * draft that cannot earn it back. While drafting is off the draft model does
 * nothing at all. While drafting, one plain step in every CALIBRATE passes
 * keeps t_plain current.
 */
#include "decode/speculative.h"
#include "decode/sampler.h"
#include "util/util.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define K_MAX_LIMIT 16
#define A_PRIOR 0.5     /* acceptance assumed when (re)starting to draft */
#define A_ALPHA 0.25    /* weight of one drafted token in the acceptance estimate */
#define G_PRIOR 0.25    /* cost of one drafted row, in plain steps, before measuring */
#define G_ALPHA 0.2
#define G_MIN 0.05
#define G_MAX 8.0
#define D_ALPHA 0.2
#define T_ALPHA 0.2
#define PROBE_MIN 3     /* verify passes before a probe may be judged a failure */
#define G_ALPHA_PROBE 0.5 /* weight of a probe's first pass in g: the prior is a guess */
#define A_OPTIMISTIC 0.8 /* acceptance a probe's admission hopes for */
#define PROBE_GAIN 2.0  /* a probe must hope to win this many times its catch-up */
#define PLAIN_FIRST 3   /* plain steps before the first draft; the first is not
                           measured (a cold expert cache would flatter drafting) */
#define PLAIN_FIRST_MODEL 16 /* ... before a draft model's first probe, whose
                           catch-up is judged against settled plain steps (the
                           first ones after a prompt, still filling the expert
                           cache, can be several times slower) */
/* The draft's load-time measures are taken alone; in the loop it shares the
 * CPUs with the target's threads and is about this much slower. */
#define WARM_SLOWDOWN 2.0
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
#define CATCHUP_CHUNK 256

enum { DRAFT_LOOKUP, DRAFT_MODEL, DRAFT_FN };

typedef struct gate {
    double a, g, t_plain;
    double t_plain_min; /* the fastest plain step seen (0: none yet) */
    double t_draft;    /* drafter seconds per drafted token (running mean; < 0: unknown) */
    double t_catchup;  /* draft model seconds per caught-up token (< 0: unknown) */
    int n_draft_obs;   /* drafting measured in passes (the load-time measure is a guess:
                          in the loop the draft shares the CPUs with the target's threads) */
    int n_plain;
    int off_left, backoff, on_passes, since_plain;
    bool probing;      /* the next verify pass starts a probe */
    int probe_passes;  /* verify passes in the current probe */
    double probe_s;    /* their wall time, catch-up included */
    int probe_tokens;  /* tokens they produced */
} gate;

struct df_spec {
    df_engine *tgt;
    int V, k_max, lookup_n, fixed;
    bool rejection;
    int kind;
    /* draft model: its session holds the keys/values of dtok[0..dn) */
    df_engine *deng;
    df_session *dsess;
    int32_t *dtok;
    int dn, dcap;
    float *dlog;
    /* caller-supplied drafter */
    df_spec_draft_fn fn;
    void *fn_user;
    df_logits_fn hook;
    void *hook_user;
    float *rows;  /* (k_max + 1) x V target logits */
    float *qrows; /* k_max x V draft distributions (sampling with a draft model) */
    float *p;     /* V */
    int32_t *ctx; /* history + drafts */
    int ctx_cap;
    gate gt;
    df_spec_stats st;
    uint64_t plain_passes, plain_bytes, verify_bytes;
    double draft_s;   /* drafting time of verify passes, the draft model's catch-up aside */
    double catchup_s; /* the draft model's catch-up (its prefill of unseen tokens) */
};

/* ---- setup ------------------------------------------------------------------------ */

/* The draft's ids must mean the same bytes as the target's, or its guesses are
 * guesses about different text. */
static int check_tokenizer(const df_engine *t, const df_engine *d, const char *dir, df_error *err) {
    int vt = df_engine_info(t)->vocab_size, vd = df_engine_info(d)->vocab_size;
    if (vt != vd)
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "draft model %s: vocabulary of %d tokens, the target's has %d: a draft must "
                       "share the target's tokenizer",
                       dir, vd, vt);
    for (int32_t id = 0; id < vt; id++) {
        const char *bt = NULL, *bd = NULL;
        size_t lt = 0, ld = 0;
        int rt = df_token_bytes(t, id, &bt, &lt), rd = df_token_bytes(d, id, &bd, &ld);
        if ((rt == 0) != (rd == 0) || (rt == 0 && (lt != ld || memcmp(bt, bd, lt) != 0)))
            return df_fail(err, DF_ERR_UNSUPPORTED,
                           "draft model %s: token id %d differs from the target's tokenizer.json: a "
                           "draft must share the target's tokenizer",
                           dir, id);
    }
    return DF_OK;
}

/* Tokens through the draft while loading: its weights are faulted in and its
 * threads started here, not in the first probe, and the gate gets its first
 * measure of what the draft costs per drafted token and per caught-up token
 * (the fastest of a few tries: the first ones pay for cold caches). */
#define WARM_PREFILL 16
#define WARM_STEPS 4
static int measure_draft(df_spec *sp, df_error *err) {
    df_session *w = NULL;
    int32_t t[WARM_PREFILL];
    int V = df_engine_info(sp->deng)->vocab_size;
    for (int i = 0; i < WARM_PREFILL; i++) t[i] = (int32_t)((7 + 131 * i) % V);
    int rc = df_session_new(&w, sp->deng, 2 * WARM_PREFILL + WARM_STEPS + 1, err);
    if (rc == DF_OK) rc = df_session_eval(w, t, 1, NULL, 0, err);
    double pre = 1e30, step = 1e30;
    for (int r = 0; r < 2 && rc == DF_OK; r++) {
        if ((rc = df_session_truncate(w, 1, err))) break;
        double t0 = df_now();
        if ((rc = df_session_eval(w, t, WARM_PREFILL, NULL, 0, err))) break;
        double dt = (df_now() - t0) / WARM_PREFILL;
        if (dt < pre) pre = dt;
    }
    float *lg = rc == DF_OK ? df_xmalloc(sizeof(float) * (size_t)V) : NULL;
    for (int i = 0; i < WARM_STEPS && rc == DF_OK; i++) {
        double t0 = df_now();
        if ((rc = df_session_eval(w, &t[i], 1, lg, 0, err))) break;
        double dt = df_now() - t0;
        if (dt < step) step = dt;
    }
    free(lg);
    df_session_free(w);
    if (rc == DF_OK) {
        sp->gt.t_catchup = pre * WARM_SLOWDOWN;
        sp->gt.t_draft = step * WARM_SLOWDOWN;
    }
    return rc;
}

int df_spec_new(df_spec **out, df_engine *target, const df_spec_opts *o, df_error *err) {
    if (!out || !target || !o || !o->draft || !*o->draft)
        return df_fail(err, DF_ERR_ARG, "speculative: a draft (\"lookup\" or a model directory) is required");
    *out = NULL;
    int k_max = o->k_max ? o->k_max : 8, ln = o->lookup_n ? o->lookup_n : 3;
    if (k_max < 1 || k_max > K_MAX_LIMIT)
        return df_fail(err, DF_ERR_ARG, "speculative: draft depth must be in 1..%d (got %d)", K_MAX_LIMIT, k_max);
    if (ln < 1 || ln > 16)
        return df_fail(err, DF_ERR_ARG, "speculative: lookup n-gram length must be in 1..16 (got %d)", ln);
    if (o->fixed_depth < 0 || o->fixed_depth > k_max)
        return df_fail(err, DF_ERR_ARG, "speculative: fixed depth must be in 0..%d (got %d)", k_max,
                       o->fixed_depth);
    df_spec *sp = df_xcalloc(1, sizeof *sp);
    sp->tgt = target;
    sp->V = df_engine_info(target)->vocab_size;
    sp->k_max = k_max;
    sp->lookup_n = ln;
    sp->fixed = o->fixed_depth;
    sp->rejection = o->rejection != 0;
    sp->kind = DRAFT_LOOKUP;
    if (strcmp(o->draft, "lookup") != 0) {
        sp->kind = DRAFT_MODEL;
        df_engine_opts eo = {.model_dir = o->draft, .n_threads = o->n_threads, .isa = o->isa};
        int rc = df_engine_open(&sp->deng, &eo, err);
        if (rc == DF_OK) rc = check_tokenizer(target, sp->deng, o->draft, err);
        if (rc == DF_OK) rc = measure_draft(sp, err);
        if (rc) {
            df_spec_free(sp);
            return rc;
        }
        sp->dlog = df_xmalloc(sizeof(float) * (size_t)sp->V);
        sp->qrows = df_xmalloc(sizeof(float) * (size_t)sp->V * (size_t)k_max);
    }
    sp->rows = df_xmalloc(sizeof(float) * (size_t)sp->V * (size_t)(k_max + 1));
    sp->p = df_xmalloc(sizeof(float) * (size_t)sp->V);
    double td = sp->kind == DRAFT_MODEL ? sp->gt.t_draft : -1.0;
    double tc = sp->kind == DRAFT_MODEL ? sp->gt.t_catchup : -1.0;
    sp->gt = (gate){.a = A_PRIOR, .g = G_PRIOR, .backoff = BACKOFF_MIN, .probing = true, .t_draft = td,
                    .t_catchup = tc};
    *out = sp;
    return DF_OK;
}

int df_spec_draft_bytes(const df_spec_opts *o, int vocab, int context, uint64_t *bytes, df_error *err) {
    *bytes = 0;
    if (!o || !o->draft || !*o->draft || vocab < 0)
        return df_fail(err, DF_ERR_ARG, "speculative: bad arguments to df_spec_draft_bytes");
    int k = o->k_max ? o->k_max : 8;
    /* the context copy */
    uint64_t b = sizeof(int32_t) * 2 * (uint64_t)(context + k + 1);
    if (strcmp(o->draft, "lookup") != 0) {
        df_engine *d;
        df_engine_opts eo = {.model_dir = o->draft, .n_threads = 1, .isa = o->isa};
        int rc = df_engine_open(&d, &eo, err);
        if (rc) return rc;
        const df_model_info *in = df_engine_info(d);
        int dctx = context < in->max_context ? context : in->max_context;
        if (!vocab) vocab = in->vocab_size;
        /* its weights stay resident (dense, in RAM), one session, its token copy */
        b += in->bytes_total + df_engine_session_bytes(d, dctx) + sizeof(int32_t) * (uint64_t)dctx;
        df_engine_close(d);
    }
    b += sizeof(float) * (uint64_t)vocab * (uint64_t)(2 * k + 3); /* rows, qrows, p, dlog */
    *bytes = b;
    return DF_OK;
}

void df_spec_free(df_spec *sp) {
    if (!sp) return;
    df_session_free(sp->dsess);
    df_engine_close(sp->deng);
    free(sp->dtok);
    free(sp->dlog);
    free(sp->qrows);
    free(sp->rows);
    free(sp->p);
    free(sp->ctx);
    free(sp);
}

void df_spec_set_logits_hook(df_spec *sp, df_logits_fn fn, void *user) {
    sp->hook = fn;
    sp->hook_user = user;
}

void df_spec_set_drafter(df_spec *sp, df_spec_draft_fn fn, void *user) {
    sp->kind = fn ? DRAFT_FN : DRAFT_LOOKUP;
    sp->fn = fn;
    sp->fn_user = user;
}

/* ---- the gate ---------------------------------------------------------------------- */

static double expected_tokens(double a, int k) {
    double e = 1.0, x = 1.0;
    for (int i = 0; i < k; i++) e += (x *= a);
    return e;
}

/* Cost of one drafted token, in plain steps of t seconds: its verify row and
 * its drafting. */
static double row_cost_at(const gate *g, double t) {
    double d = g->t_draft > 0 && t > 0 ? g->t_draft / t : 0.0;
    return g->g + d;
}

static double row_cost(const gate *g) { return row_cost_at(g, g->t_plain); }

/* The depth with the best S(k) at acceptance a and cost c per drafted token,
 * and S there. */
static int best_depth_ac(const df_spec *sp, double a, double c, double *s_best) {
    int best = 1;
    double sb = 0.0;
    for (int k = 1; k <= sp->k_max; k++) {
        double s = expected_tokens(a, k) / (1.0 + c * k);
        if (s > sb) {
            sb = s;
            best = k;
        }
    }
    *s_best = sb;
    return best;
}

static int best_depth_at(const df_spec *sp, double a, double *s_best) {
    return best_depth_ac(sp, a, row_cost(&sp->gt), s_best);
}

static int best_depth(const df_spec *sp, double *s_best) { return best_depth_at(sp, sp->gt.a, s_best); }

/* Whether a probe of the draft model may start at history length n_hist with
 * `left` tokens still wanted: what it could win (at an optimistic acceptance)
 * must be PROBE_GAIN times its cost: the catch-up (the tokens the draft has
 * not seen) and the drafted rows of PROBE_MIN failing passes. Costs are in the
 * fastest plain step seen: the first steps after a prompt, still filling the
 * expert cache, would make the draft look cheap. */
static bool probe_pays(const df_spec *sp, int n_hist, int left) {
    const gate *g = &sp->gt;
    if (sp->kind != DRAFT_MODEL || g->t_catchup <= 0 || g->t_plain <= 0) return true;
    double t = g->t_plain_min > 0 ? g->t_plain_min : g->t_plain;
    int lag = n_hist - 1 - sp->dn;
    if (lag < 0) lag = 0;
    double c = row_cost_at(g, t), cost = (double)lag * g->t_catchup / t + PROBE_MIN * c, s;
    best_depth_ac(sp, A_OPTIMISTIC, c, &s);
    double gain = s > 1.0 ? (double)(left - 1) * (1.0 - 1.0 / s) : 0.0;
    return gain >= PROBE_GAIN * cost;
}

/* Depth for the next pass: 0 = a plain step. left: tokens still wanted. */
static int gate_depth(df_spec *sp, int n_hist, int left) {
    gate *g = &sp->gt;
    if (sp->fixed) return sp->fixed;
    if (g->n_plain < (sp->kind == DRAFT_MODEL ? PLAIN_FIRST_MODEL : PLAIN_FIRST)) return 0;
    if (g->off_left > 0) {
        g->off_left--;
        if (g->off_left == 0) { /* probe again from the prior */
            g->a = A_PRIOR;
            g->on_passes = 0;
            g->probing = true;
        }
        return 0;
    }
    if (g->since_plain >= CALIBRATE) return 0;
    if (g->probing && !probe_pays(sp, n_hist, left)) {
        /* not now: look again later (the draft costs nothing meanwhile) */
        g->off_left = BACKOFF_MIN;
        sp->st.probes_declined++;
        return 0;
    }
    double s;
    return best_depth(sp, &s);
}

static void gate_plain(df_spec *sp, double secs) {
    gate *g = &sp->gt;
    if (g->n_plain == 1) g->t_plain = secs;
    else if (g->n_plain > 1) g->t_plain += T_ALPHA * (secs - g->t_plain);
    if (g->n_plain >= 1 && (g->t_plain_min <= 0 || secs < g->t_plain_min)) g->t_plain_min = secs;
    g->n_plain++;
    g->since_plain = 0;
}

/* verify_s: the target's evaluation and the ruling; draft_s: the drafting
 * without the draft model's catch-up (what drafting costs in the steady
 * state); total_s: the whole pass (what it cost). */
static void gate_verify(df_spec *sp, int drafted, int accepted, double verify_s, double draft_s,
                        double total_s) {
    gate *g = &sp->gt;
    g->since_plain++;
    if (g->probing) {
        g->probing = false;
        g->probe_passes = 0;
        g->probe_s = 0.0;
        g->probe_tokens = 0;
    }
    g->probe_passes++;
    g->probe_s += total_s;
    g->probe_tokens += accepted + 1;
    int seen = accepted < drafted ? accepted + 1 : drafted; /* tokens the target ruled on */
    for (int i = 0; i < seen; i++) g->a += A_ALPHA * ((i < accepted ? 1.0 : 0.0) - g->a);
    /* A probe's first pass wakes the drafter's threads and reads experts the
     * plain steps had not needed yet: like the first plain step, its costs say
     * little of the steady state (measured up to 3x), so it measures only
     * acceptance. At a fixed depth costs are measured for --stats only. */
    bool measure = g->probe_passes > 1 || sp->fixed;
    if (measure && g->t_plain > 0) {
        double obs = (verify_s / g->t_plain - 1.0) / drafted;
        g->g += (g->probe_passes == 2 ? G_ALPHA_PROBE : G_ALPHA) * (obs - g->g);
        if (g->g < G_MIN) g->g = G_MIN;
        if (g->g > G_MAX) g->g = G_MAX;
    }
    if (measure) {
        double per = draft_s / drafted;
        g->t_draft = g->n_draft_obs++ == 0 ? per : g->t_draft + D_ALPHA * (per - g->t_draft);
    }
    if (sp->fixed) return;
    double s, s_hopeful;
    best_depth(sp, &s);
    best_depth_at(sp, A_OPTIMISTIC, &s_hopeful);
    /* A measured pass is enough to judge when even a hopeful acceptance would
     * not pay for what a drafted token was measured to cost. */
    bool judged = g->probe_passes >= PROBE_MIN || (g->probe_passes >= 2 && s_hopeful < 1.0);
    if (s < 1.0 && judged) {
        double wasted = g->t_plain > 0 ? g->probe_s / g->t_plain - g->probe_tokens : 0.0;
        double off = wasted * PROBE_AMORTIZE;
        g->off_left = off > g->backoff ? (off < OFF_MAX ? (int)off : OFF_MAX) : g->backoff;
        g->backoff = g->backoff * BACKOFF_MUL > BACKOFF_MAX ? BACKOFF_MAX : g->backoff * BACKOFF_MUL;
        sp->st.switched_off++;
    } else if (s >= 1.0 && ++g->on_passes == PROBE_OK) {
        g->backoff = BACKOFF_MIN;
    }
}

/* ---- drafters ---------------------------------------------------------------------- */

/* The continuation of the latest earlier occurrence of the longest suffix of
 * c[0..L) of n tokens, n from nmax down to 2 (1 only when nmax is 1: a single
 * token repeats too often to predict much). A continuation that reaches the end
 * of the context goes on with the tokens it proposed, so a loop of period p is
 * predicted to full depth rather than p tokens at a time. */
static int lookup_draft(const int32_t *c, int L, int nmax, int k, int32_t *out) {
    int nmin = nmax >= 2 ? 2 : 1;
    for (int n = nmax < L - 1 ? nmax : L - 1; n >= nmin; n--) {
        const int32_t *suf = c + L - n;
        for (int i = L - n - 1; i >= 0; i--) {
            if (memcmp(c + i, suf, (size_t)n * sizeof *c) != 0) continue;
            int m = 0;
            for (int j = i + n; m < k; j++) out[m++] = j < L ? c[j] : out[j - L];
            return m;
        }
    }
    return 0;
}

static int32_t draw(const float *p, int V, double u) {
    double tot = 0.0;
    for (int i = 0; i < V; i++) tot += p[i];
    double r = u * tot, c = 0.0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0.0f) continue;
        c += p[i];
        last = i;
        if (r < c) return i;
    }
    return last;
}

/* Drafts up to k tokens after ctx[0..n) with the draft model into ctx[n..),
 * after bringing its session up to ctx[0..n-1). */
static int draft_model(df_spec *sp, df_session *s, df_sampler *smp, int n, int k, int *kd,
                       double *catchup_s, df_error *err) {
    *kd = 0;
    double t0 = df_now();
    if (!sp->dsess) {
        int cap = df_session_capacity(s), dmax = df_engine_info(sp->deng)->max_context;
        sp->dcap = cap < dmax ? cap : dmax;
        int rc = df_session_new(&sp->dsess, sp->deng, sp->dcap, err);
        if (rc) return rc;
        sp->dtok = df_xmalloc(sizeof(int32_t) * (size_t)sp->dcap);
        sp->dn = 0;
    }
    if (k > sp->dcap - n + 1) k = sp->dcap - n + 1; /* it evaluates positions n-1 .. n+k-2 */
    if (k <= 0) return DF_OK;
    int L = 0;
    while (L < sp->dn && L < n - 1 && sp->dtok[L] == sp->ctx[L]) L++;
    int rc;
    if (L < sp->dn) {
        if ((rc = df_session_truncate(sp->dsess, L, err))) return rc;
        sp->dn = L;
    }
    int lag = n - 1 - sp->dn;
    while (sp->dn < n - 1) {
        int c = n - 1 - sp->dn < CATCHUP_CHUNK ? n - 1 - sp->dn : CATCHUP_CHUNK;
        if ((rc = df_session_eval(sp->dsess, sp->ctx + sp->dn, c, NULL, 0, err))) {
            df_session_truncate(sp->dsess, 0, err);
            sp->dn = 0;
            return rc;
        }
        memcpy(sp->dtok + sp->dn, sp->ctx + sp->dn, (size_t)c * sizeof(int32_t));
        sp->dn += c;
    }
    /* the token or two every pass brings (the target's own last tokens) are
     * drafting in the steady state, not a catch-up */
    *catchup_s = lag > 2 ? df_now() - t0 : 0.0;
    if (lag >= 8) { /* a few tokens say more about the call than the tokens */
        double per = *catchup_s / lag;
        sp->gt.t_catchup = sp->gt.t_catchup < 0 ? per : sp->gt.t_catchup + D_ALPHA * (per - sp->gt.t_catchup);
    }
    bool greedy = df_sampler_is_greedy(smp);
    for (int i = 0; i < k; i++) {
        int32_t t = sp->ctx[n - 1 + i];
        if ((rc = df_session_eval(sp->dsess, &t, 1, sp->dlog, 0, err))) {
            df_session_truncate(sp->dsess, 0, err);
            sp->dn = 0;
            return rc;
        }
        sp->dtok[sp->dn++] = t;
        if (sp->hook) sp->hook(sp->hook_user, sp->dlog, sp->V, sp->ctx, n + i);
        int32_t d;
        if (greedy || !sp->rejection) {
            /* the token at n + i is the target's i-th draw from here on */
            d = df_sampler_sample_at(smp, sp->dlog, sp->V, sp->ctx, n + i, i);
        } else {
            float *q = sp->qrows + (size_t)i * (size_t)sp->V;
            if (df_sampler_probs(smp, sp->dlog, sp->V, sp->ctx, n + i, q))
                return df_fail(err, DF_ERR_NOMEM, "speculative: out of memory");
            d = draw(q, sp->V, df_sampler_uniform(smp));
        }
        if (d < 0 || d >= sp->V) break;
        sp->ctx[n + i] = d;
        (*kd)++;
    }
    return DF_OK;
}

/* ---- one step ---------------------------------------------------------------------- */

/* Rules on the drafted tokens ctx[n..n+kd) against the target rows; returns how
 * many were accepted and sets *next to the target's own token after them. */
static int verify(df_spec *sp, df_sampler *smp, int n, int kd, int32_t *next) {
    int V = sp->V;
    bool greedy = df_sampler_is_greedy(smp);
    for (int i = 0; i <= kd; i++) {
        float *row = sp->rows + (size_t)i * (size_t)V;
        if (sp->hook) sp->hook(sp->hook_user, row, V, sp->ctx, n + i);
        if (greedy || !sp->rejection || i == kd) {
            int32_t t = df_sampler_sample(smp, row, V, sp->ctx, n + i);
            if (i < kd && t == sp->ctx[n + i]) continue;
            *next = t;
            return i;
        }
        int32_t d = sp->ctx[n + i];
        const float *q = sp->kind == DRAFT_MODEL ? sp->qrows + (size_t)i * (size_t)V : NULL;
        if (df_sampler_probs(smp, row, V, sp->ctx, n + i, sp->p)) {
            /* no scratch memory: the plain sampler's own fallback, no speculation */
            *next = df_sampler_sample(smp, row, V, sp->ctx, n + i);
            return i;
        }
        double qd = q ? (double)q[d] : 1.0, u = df_sampler_uniform(smp);
        if (u * qd < (double)sp->p[d]) continue;
        /* rejected: the residual max(0, p - q) */
        double mass = 0.0;
        for (int j = 0; j < V; j++) {
            float r = sp->p[j] - (q ? q[j] : (j == d ? 1.0f : 0.0f));
            sp->p[j] = r > 0.0f ? r : 0.0f;
            mass += sp->p[j];
        }
        double u2 = df_sampler_uniform(smp);
        if (!(mass > 0.0)) { /* p == q up to rounding: rejection had probability ~0 */
            *next = df_sampler_sample(smp, row, V, sp->ctx, n + i);
            return i;
        }
        *next = draw(sp->p, V, u2);
        return i;
    }
    return kd; /* not reached */
}

int df_spec_step(df_spec *sp, df_session *s, df_sampler *smp, const int32_t *hist, int n_hist,
                 int32_t *out, int max_out, int *n_out, df_error *err) {
    if (n_out) *n_out = 0;
    if (!sp || !s || !smp || !hist || n_hist < 1 || !out || max_out < 1 || !n_out)
        return df_fail(err, DF_ERR_ARG, "speculative: bad arguments to df_spec_step");
    if (df_session_pos(s) != n_hist - 1)
        return df_fail(err, DF_ERR_ARG,
                       "speculative: the session holds %d tokens; the step expects all but the last of "
                       "the %d history tokens",
                       df_session_pos(s), n_hist);
    int cap = df_session_capacity(s);
    if (n_hist > cap)
        return df_fail(err, DF_ERR_CONTEXT, "speculative: the context of %d tokens is full", cap);
    int k = gate_depth(sp, n_hist, max_out);
    if (k > max_out - 1) k = max_out - 1;
    if (k > cap - n_hist) k = cap - n_hist;
    if (sp->ctx_cap < n_hist + sp->k_max + 1) {
        sp->ctx_cap = 2 * (n_hist + sp->k_max + 1);
        sp->ctx = df_xrealloc(sp->ctx, sizeof(int32_t) * (size_t)sp->ctx_cap);
    }
    memcpy(sp->ctx, hist, sizeof(int32_t) * (size_t)n_hist);

    df_stats b0, b1;
    df_engine_stats(sp->tgt, &b0);
    double t0 = df_now();
    int kd = 0, rc;
    double catchup = 0.0, t_draft_end;
    if (k > 0) {
        if (sp->kind == DRAFT_MODEL) {
            if ((rc = draft_model(sp, s, smp, n_hist, k, &kd, &catchup, err))) return rc;
        } else if (sp->kind == DRAFT_FN) {
            kd = sp->fn(sp->fn_user, sp->ctx, n_hist, sp->ctx + n_hist, k);
        } else {
            kd = lookup_draft(sp->ctx, n_hist, sp->lookup_n, k, sp->ctx + n_hist);
        }
        if (kd < 0) kd = 0;
        if (kd > k) kd = k;
        for (int i = 0; i < kd; i++)
            if (sp->ctx[n_hist + i] < 0 || sp->ctx[n_hist + i] >= sp->V) kd = i;
    }
    t_draft_end = df_now();
    if ((rc = df_session_eval(s, sp->ctx + n_hist - 1, kd + 1, sp->rows, 1, err))) return rc;
    int32_t next = 0;
    int acc = verify(sp, smp, n_hist, kd, &next);
    if (acc < kd && (rc = df_session_truncate(s, n_hist + acc, err))) return rc;
    if (sp->dsess && sp->dn > n_hist + acc) {
        if ((rc = df_session_truncate(sp->dsess, n_hist + acc, err))) return rc;
        sp->dn = n_hist + acc;
    }
    memcpy(out, sp->ctx + n_hist, sizeof(int32_t) * (size_t)acc);
    out[acc] = next;
    *n_out = acc + 1;

    double secs = df_now() - t0;
    df_engine_stats(sp->tgt, &b1);
    uint64_t bytes = b1.expert_bytes_read - b0.expert_bytes_read;
    df_spec_stats *st = &sp->st;
    st->passes++;
    st->tokens += (uint64_t)(acc + 1);
    if (kd == 0) {
        sp->plain_passes++;
        sp->plain_bytes += bytes;
        st->plain_time_s += secs;
        gate_plain(sp, secs);
    } else {
        st->verify_passes++;
        st->drafted += (uint64_t)kd;
        st->accepted += (uint64_t)acc;
        st->spec_tokens += (uint64_t)(acc + 1);
        sp->verify_bytes += bytes;
        st->spec_time_s += secs;
        double draft_s = t_draft_end - t0;
        sp->draft_s += draft_s - catchup;
        sp->catchup_s += catchup;
        /* Bringing the draft up to date after the prompt or a pause is the
         * draft's prefill, not what a pass costs in the steady state. */
        gate_verify(sp, kd, acc, secs - draft_s, draft_s - catchup, secs);
    }
    return DF_OK;
}

/* ---- reporting --------------------------------------------------------------------- */

void df_spec_stats_get(const df_spec *sp, df_spec_stats *o) {
    *o = sp->st;
    double s;
    int d = best_depth(sp, &s);
    o->depth = sp->fixed ? sp->fixed : sp->gt.off_left > 0 || s < 1.0 ? 0 : d;
    o->acceptance = sp->gt.a;
    o->mean_depth = o->verify_passes ? (double)o->drafted / (double)o->verify_passes : 0.0;
    o->plain_s = sp->plain_passes ? o->plain_time_s / (double)sp->plain_passes : 0.0;
    o->verify_s = o->verify_passes ? o->spec_time_s / (double)o->verify_passes : 0.0;
    o->plain_bytes = sp->plain_passes ? (double)sp->plain_bytes / (double)sp->plain_passes : 0.0;
    o->verify_bytes = o->verify_passes ? (double)sp->verify_bytes / (double)o->verify_passes : 0.0;
    double per_plain = o->plain_s, per_spec = o->spec_tokens ? o->spec_time_s / (double)o->spec_tokens : 0.0;
    o->speedup = per_plain > 0 && per_spec > 0 ? per_plain / per_spec : 0.0;
    double all = o->plain_time_s + o->spec_time_s;
    o->run_speedup = per_plain > 0 && all > 0 ? (double)o->tokens * per_plain / all : 0.0;
    o->draft_token_s = o->drafted ? sp->draft_s / (double)o->drafted : 0.0;
    o->row_cost = row_cost(&sp->gt);
}

void df_spec_report(const df_spec *sp, FILE *f) {
    df_spec_stats s;
    df_spec_stats_get(sp, &s);
    const char *kind = sp->kind == DRAFT_MODEL ? "draft model" : sp->kind == DRAFT_FN ? "custom" : "lookup";
    fprintf(f,
            "speculative (%s): %llu passes, %llu verifying; drafted %llu, accepted %llu (%.1f%%); "
            "mean depth %.2f, depth now %d%s; switched off %llu times, probes declined %llu\n"
            "  plain step %.4f s, %.2f MB read; verify pass %.4f s, %.2f MB read; "
            "%.2f tokens/pass; drafting %.5f s/token (+ %.4f s catching up); a drafted token "
            "costs %.3f plain steps\n"
            "  measured speed-up: verify passes %.2fx, whole decode %.2fx (against its own plain steps)\n",
            kind, (unsigned long long)s.passes, (unsigned long long)s.verify_passes,
            (unsigned long long)s.drafted, (unsigned long long)s.accepted,
            s.drafted ? 100.0 * (double)s.accepted / (double)s.drafted : 0.0, s.mean_depth, s.depth,
            sp->fixed ? " (fixed)" : "", (unsigned long long)s.switched_off,
            (unsigned long long)s.probes_declined, s.plain_s, s.plain_bytes / 1e6, s.verify_s,
            s.verify_bytes / 1e6, s.verify_passes ? (double)s.spec_tokens / (double)s.verify_passes : 0.0,
            s.draft_token_s, sp->catchup_s, s.row_cost, s.speedup, s.run_speedup);
}
