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
 * The gate (gate.c) decides, from measured costs and acceptance, how many
 * tokens each pass drafts; this file feeds it the passes' wall times.
 *
 * A step is df_spec_begin (depth, drafts, the rows to verify), the target's
 * evaluation, then df_spec_end (ruling, rollback, gate): df_spec_step runs
 * them on its session, df_batchgen evaluates many requests' rows in one
 * df_eval_multi between the two halves (then a pass's wall time is the
 * shared step's).
 */
#include "decode/speculative.h"
#include "engine/dev.h"
#include "decode/gate.h"
#include "decode/sampler.h"
#include "util/util.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define K_MAX_LIMIT GATE_K_MAX
/* The draft's load-time measures are taken alone; in the loop it shares the
 * CPUs with the target's threads and is about this much slower. */
#define WARM_SLOWDOWN 2.0
#define CATCHUP_CHUNK 256

enum { DRAFT_LOOKUP, DRAFT_MODEL, DRAFT_FN };

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
    spec_gate gt;
    df_spec_stats st;
    uint64_t plain_passes, plain_bytes, verify_bytes;
    double draft_s;   /* drafting time of verify passes, the draft model's catch-up aside */
    double catchup_s; /* the draft model's catch-up (its prefill of unseen tokens) */
    /* the pass between df_spec_begin and df_spec_end */
    int n_hist, kd;
    double t0, t_draft_end, catchup;
    df_stats b0;
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
static int measure_draft(df_spec *sp, double *t_draft, double *t_catchup, df_error *err) {
    df_session *w = NULL;
    int32_t t[WARM_PREFILL];
    int V = df_engine_info(sp->deng)->vocab_size;
    for (int i = 0; i < WARM_PREFILL; i++) t[i] = (int32_t)((7 + 131 * i) % V);
    int rc = df_session_new(&w, sp->deng, 2 * WARM_PREFILL + WARM_STEPS + 1, err);
    if (rc == DF_OK) df_session_keep(w, 1);
    if (rc == DF_OK) rc = df_session_eval(w, t, 1, NULL, 0, err);
    double pre = 1e30, step = 1e30;
    for (int r = 0; r < 2 && rc == DF_OK; r++) {
        if (df_session_rollback(w, 1, err) != 1) {
            rc = err->code;
            break;
        }
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
        *t_catchup = pre * WARM_SLOWDOWN;
        *t_draft = step * WARM_SLOWDOWN;
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
    df_spec *sp = df_xcalloc(1, sizeof *sp);
    sp->tgt = target;
    sp->V = df_engine_info(target)->vocab_size;
    sp->k_max = k_max;
    sp->lookup_n = ln;
    sp->rejection = o->rejection != 0;
    sp->kind = DRAFT_LOOKUP;
    double t_draft = -1.0, t_catchup = -1.0; /* unknown unless a draft model is measured */
    if (strcmp(o->draft, "lookup") != 0) {
        sp->kind = DRAFT_MODEL;
        df_engine_opts eo = {.model_dir = o->draft, .n_threads = o->n_threads, .isa = o->isa};
        int rc = df_engine_open(&sp->deng, &eo, err);
        if (rc == DF_OK) rc = check_tokenizer(target, sp->deng, o->draft, err);
        if (rc == DF_OK) rc = measure_draft(sp, &t_draft, &t_catchup, err);
        if (rc) {
            df_spec_free(sp);
            return rc;
        }
        sp->dlog = df_xmalloc(sizeof(float) * (size_t)sp->V);
        sp->qrows = df_xmalloc(sizeof(float) * (size_t)sp->V * (size_t)k_max);
    }
    sp->rows = df_xmalloc(sizeof(float) * (size_t)sp->V * (size_t)(k_max + 1));
    sp->p = df_xmalloc(sizeof(float) * (size_t)sp->V);
    gate_init(&sp->gt, k_max, sp->fixed, sp->kind == DRAFT_MODEL, t_draft, t_catchup);
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

void df_spec_set_fixed_depth(df_spec *sp, int depth) {
    if (!sp || depth < 0) return;
    sp->fixed = sp->gt.fixed = depth < sp->k_max ? depth : sp->k_max;
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
        if ((L = df_session_rollback(sp->dsess, L, err)) < 0) return err->code;
        sp->dn = L;
    }
    int lag = n - 1 - sp->dn;
    while (sp->dn < n - 1) {
        int c = n - 1 - sp->dn < CATCHUP_CHUNK ? n - 1 - sp->dn : CATCHUP_CHUNK;
        if ((rc = df_session_eval(sp->dsess, sp->ctx + sp->dn, c, NULL, 0, err))) {
            df_session_rollback(sp->dsess, 0, err);
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
        gate_catchup(&sp->gt, per);
    }
    bool greedy = df_sampler_is_greedy(smp);
    for (int i = 0; i < k; i++) {
        int32_t t = sp->ctx[n - 1 + i];
        if ((rc = df_session_eval(sp->dsess, &t, 1, sp->dlog, 0, err))) {
            df_session_rollback(sp->dsess, 0, err);
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

/* Begins a pass (df_spec_begin in speculative.h): the gate's depth, the
 * drafts into ctx[n_hist..), the positions a rollback may need kept, and the
 * rows to evaluate. */
int df_spec_begin(df_spec *sp, df_session *s, df_sampler *smp, const int32_t *hist, int n_hist, int max_out,
                  df_eval_item *item, df_error *err) {
    if (!sp || !s || !smp || !hist || n_hist < 1 || max_out < 1 || !item)
        return df_fail(err, DF_ERR_ARG, "speculative: bad arguments to df_spec_step");
    if (df_session_pos(s) != n_hist - 1)
        return df_fail(err, DF_ERR_ARG,
                       "speculative: the session holds %d tokens; the step expects all but the last of "
                       "the %d history tokens",
                       df_session_pos(s), n_hist);
    int cap = df_session_capacity(s);
    if (n_hist > cap)
        return df_fail(err, DF_ERR_CONTEXT, "speculative: the context of %d tokens is full", cap);
    int k = gate_depth(&sp->gt, sp->kind == DRAFT_MODEL ? n_hist - 1 - sp->dn : 0, max_out);
    if (k > max_out - 1) k = max_out - 1;
    if (k > cap - n_hist) k = cap - n_hist;
    if (sp->ctx_cap < n_hist + sp->k_max + 1) {
        sp->ctx_cap = 2 * (n_hist + sp->k_max + 1);
        sp->ctx = df_xrealloc(sp->ctx, sizeof(int32_t) * (size_t)sp->ctx_cap);
    }
    memcpy(sp->ctx, hist, sizeof(int32_t) * (size_t)n_hist);

    df_engine_stats(sp->tgt, &sp->b0);
    sp->t0 = df_now();
    sp->n_hist = n_hist;
    sp->catchup = 0.0;
    int kd = 0, rc;
    if (k > 0) {
        if (sp->kind == DRAFT_MODEL) {
            if ((rc = draft_model(sp, s, smp, n_hist, k, &kd, &sp->catchup, err))) return rc;
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
    sp->kd = kd;
    sp->t_draft_end = df_now();
    /* every drafted row may be the last one kept; a session that keeps few
     * positions (recurrent state) keeps the first ones and recomputes the
     * rest of an accepted run */
    int keep = df_session_keep_limit(s) - 1;
    for (int i = 0; i < kd && i < keep; i++) df_session_keep(s, n_hist + i);
    *item = (df_eval_item){s, sp->ctx + n_hist - 1, kd + 1, sp->rows, 1};
    return DF_OK;
}

/* Ends the pass begun by df_spec_begin once its rows are evaluated: the
 * ruling, the rejected rows dropped (the target's and the draft's), the
 * tokens out, and what the pass cost to the gate. */
int df_spec_end(df_spec *sp, df_session *s, df_sampler *smp, int32_t *out, int *n_out, df_error *err) {
    int n_hist = sp->n_hist, kd = sp->kd, rc;
    int32_t next = 0;
    if ((rc = df_logits_check(sp->rows, sp->V, n_hist, err))) return rc;
    int acc = verify(sp, smp, n_hist, kd, &next);
    if (acc < kd) {
        int at = df_session_rollback(s, n_hist + acc, err);
        if (at < 0) return err->code;
        if (at < n_hist + acc && (rc = df_session_eval(s, sp->ctx + at, n_hist + acc - at, NULL, 0, err)))
            return rc;
    }
    if (sp->dsess && sp->dn > n_hist + acc) {
        if ((sp->dn = df_session_rollback(sp->dsess, n_hist + acc, err)) < 0) {
            sp->dn = 0;
            return err->code;
        }
    }
    memcpy(out, sp->ctx + n_hist, sizeof(int32_t) * (size_t)acc);
    out[acc] = next;
    *n_out = acc + 1;

    df_stats b1;
    double secs = df_now() - sp->t0;
    df_engine_stats(sp->tgt, &b1);
    uint64_t bytes = b1.expert_bytes_read - sp->b0.expert_bytes_read;
    df_spec_stats *st = &sp->st;
    st->passes++;
    st->tokens += (uint64_t)(acc + 1);
    if (kd == 0) {
        sp->plain_passes++;
        sp->plain_bytes += bytes;
        st->plain_time_s += secs;
        gate_plain(&sp->gt, secs);
    } else {
        st->verify_passes++;
        st->drafted += (uint64_t)kd;
        st->accepted += (uint64_t)acc;
        st->spec_tokens += (uint64_t)(acc + 1);
        sp->verify_bytes += bytes;
        st->spec_time_s += secs;
        double draft_s = sp->t_draft_end - sp->t0;
        sp->draft_s += draft_s - sp->catchup;
        sp->catchup_s += sp->catchup;
        /* Bringing the draft up to date after the prompt or a pause is the
         * draft's prefill, not what a pass costs in the steady state. */
        gate_verify(&sp->gt, kd, acc, secs - draft_s, draft_s - sp->catchup, secs);
    }
    return DF_OK;
}

int df_spec_step(df_spec *sp, df_session *s, df_sampler *smp, const int32_t *hist, int n_hist,
                 int32_t *out, int max_out, int *n_out, df_error *err) {
    if (n_out) *n_out = 0;
    if (!out || !n_out) return df_fail(err, DF_ERR_ARG, "speculative: bad arguments to df_spec_step");
    df_eval_item it;
    int rc = df_spec_begin(sp, s, smp, hist, n_hist, max_out, &it, err);
    if (!rc) rc = df_session_eval(s, it.tokens, it.n, it.logits, 1, err);
    if (!rc) rc = df_spec_end(sp, s, smp, out, n_out, err);
    return rc;
}

/* ---- reporting --------------------------------------------------------------------- */

void df_spec_stats_get(const df_spec *sp, df_spec_stats *o) {
    *o = sp->st;
    o->switched_off = sp->gt.switched_off;
    o->probes_declined = sp->gt.probes_declined;
    o->depth = gate_current_depth(&sp->gt);
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
    o->row_cost = gate_row_cost(&sp->gt);
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
