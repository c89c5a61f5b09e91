/*
 * batchgen.c - df_batchgen (deltafin.h): several generations advancing in
 * steps, each step one df_eval_multi over every active request's rows.
 *
 * A request walks df_generate's path one step at a time, so its tokens are
 * df_generate's: the prompt's rows the session does not hold (prefix reuse
 * and keep as there), in chunks, with a cancellation check before each; the
 * first token sampled from the prompt's last logits; then one row per step
 * (the last token taken), sampled with the request's own sampler and logits
 * hook, and the same stop conditions (take() mirrors generate.c's). Only the
 * batch a row is evaluated in differs, which changes no logits (forward.h).
 *
 * A request with a drafter (o->spec, its own) goes through df_spec_step's
 * halves: df_spec_begin drafts as its gate decides and gives the rows to
 * verify ([last, d1..dk], all rows' logits; one row when it drafts none), the
 * step evaluates them with every other request's rows, and df_spec_end rules
 * on them and rolls back the rejected ones, as df_spec_step would. Its tokens
 * are therefore df_generate's with the same drafter, which are those of plain
 * decoding (speculative.c). The gate sees the shared pass's wall time.
 *
 * With the engine's prompt cache, a request restores and stores as
 * df_generate does: the longest cached prefix at join, the interval's
 * multiples (a model with recurrent state ends its chunks there), the
 * prompt less its last token, and the end of the generation.
 */
#include "deltafin.h"

#include "decode/gate.h"
#include "decode/sampler.h"
#include "decode/speculative.h"

#include "util/util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct req {
    df_session *s;
    df_generate_opts o;
    df_done_fn on_done;
    df_generate_result r;
    int32_t *hist;       /* prompt + new tokens */
    int n_prompt, nh, limit;
    int next;            /* prefill: the next prompt row to evaluate */
    int from;            /* the first row evaluated (held or restored before) */
    int every;           /* the prompt cache's interval, 0: none */
    bool split;          /* recurrent state: chunks end at the interval's multiples */
    bool decoding, done;
    bool drafting;       /* this step's rows are o.spec's pass */
    float *logits;
    double t_start, t_decode;
    struct req *next_req;
} req;

struct df_batchgen {
    df_engine *eng;
    df_batcher *b;
    int V, max_rows;
    req *head;           /* in the order they joined */
    int n_active;
};

int df_batchgen_new(df_batchgen **out, df_engine *eng, int max_rows, int max_context, df_error *err) {
    *out = NULL;
    df_batcher *b;
    int rc = df_batcher_new(&b, eng, max_rows, max_context, err);
    if (rc) return rc;
    df_batchgen *g = df_xcalloc(1, sizeof *g);
    g->eng = eng;
    g->b = b;
    g->V = df_engine_info(eng)->vocab_size;
    g->max_rows = df_batcher_max_rows(b);
    *out = g;
    return DF_OK;
}

static void req_free(req *q) {
    free(q->hist);
    free(q->logits);
    free(q);
}

void df_batchgen_free(df_batchgen *g) {
    if (!g) return;
    for (req *q = g->head, *nx; q; q = nx) nx = q->next_req, req_free(q);
    df_batcher_free(g->b);
    free(g);
}

int df_batchgen_active(const df_batchgen *g) { return g->n_active; }

int df_batchgen_add(df_batchgen *g, df_session *s, const int32_t *prompt, int n, const df_generate_opts *o,
                    df_done_fn on_done, df_error *err) {
    if (!s || !prompt || n < 1 || !o || !o->sampler || o->max_new < 0 || df_session_engine(s) != g->eng)
        return df_fail(err, DF_ERR_ARG, "df_batchgen_add: bad arguments");
    if (o->prefill_progress)
        return df_fail(err, DF_ERR_UNSUPPORTED, "df_batchgen_add: prefill progress is not supported in a batch");
    if (o->spec && o->force)
        return df_fail(err, DF_ERR_ARG, "df_batchgen_add: teacher forcing and speculative decoding exclude each other");
    for (req *q = g->head; q; q = q->next_req) {
        if (q->done) continue;
        if (q->s == s) return df_fail(err, DF_ERR_ARG, "df_batchgen_add: the session is already in the batch");
        if (o->spec && q->o.spec == o->spec)
            return df_fail(err, DF_ERR_ARG, "df_batchgen_add: the drafter (df_spec) is already another request's: "
                                            "each request needs its own");
    }
    int cap = df_session_capacity(s);
    if (n >= cap)
        return df_fail(err, DF_ERR_CONTEXT, "the prompt of %d tokens leaves no room in the %d-token context", n,
                       cap);
    double t_start = df_now();
    int keep = 0;
    if (o->reuse_prefix) {
        const int32_t *held = df_session_tokens(s);
        int have = df_session_pos(s);
        while (keep < have && keep < n - 1 && held[keep] == prompt[keep]) keep++;
    }
    /* the nearest position at or before that the session can return to */
    if ((keep = df_session_rollback(s, keep, err)) < 0) return err->code;
    int every = df_session_cache_interval(s), cached = 0;
    if (every) {
        int at = df_session_cache_restore(s, prompt, n - 1, err);
        if (at < 0) return err->code;
        cached = at - keep;
        keep = at;
    }
    df_session_keep(s, n); /* a later prompt may share this one */
    if (every) df_session_keep(s, n - 1);
    req *q = df_xcalloc(1, sizeof *q);
    q->every = every;
    q->split = every && df_session_keep_limit(s) != INT_MAX;
    q->from = keep;
    q->r.prompt_cached = cached;
    int room = cap - n;
    q->s = s;
    q->o = *o;
    q->on_done = on_done;
    q->limit = o->max_new && o->max_new < room ? o->max_new : room;
    q->hist = df_xmalloc(sizeof(int32_t) * ((size_t)n + (size_t)q->limit));
    memcpy(q->hist, prompt, sizeof(int32_t) * (size_t)n);
    q->n_prompt = q->nh = n;
    q->next = keep;
    q->r.prompt_reused = keep;
    q->logits = df_xmalloc(sizeof(float) * (size_t)g->V);
    q->t_start = t_start;
    req **pp = &g->head;
    while (*pp) pp = &(*pp)->next_req;
    *pp = q;
    g->n_active++;
    return DF_OK;
}

/* generate.c's take(): the new token; true when generation ends with it. */
static bool take(req *q, int32_t got) {
    const df_generate_opts *o = &q->o;
    int32_t t = o->force ? o->force(o->user, q->r.produced) : got;
    q->hist[q->nh++] = t;
    q->r.produced++;
    int stop = o->on_token ? o->on_token(o->user, t) : 0;
    if (!o->force && df_is_stop_token(df_session_engine(q->s), t)) {
        q->r.finish = DF_FINISH_STOP;
        return true;
    }
    if (stop) {
        q->r.finish = DF_FINISH_CALLER;
        return true;
    }
    if (q->r.produced == q->limit) {
        q->r.finish = o->max_new && o->max_new <= q->limit ? DF_FINISH_LENGTH : DF_FINISH_CONTEXT;
        return true;
    }
    return false;
}

/* generate.c's sample() */
static int sample(df_batchgen *g, req *q, int32_t *tok, df_error *err) {
    const df_generate_opts *o = &q->o;
    int rc = df_logits_check(q->logits, g->V, q->nh, err);
    if (rc) return rc;
    if (o->logits_hook) o->logits_hook(o->hook_user, q->logits, g->V, q->hist, q->nh);
    *tok = df_sampler_sample(o->sampler, q->logits, g->V, q->hist, q->nh);
    return DF_OK;
}

/* generate.c's store_prompt(): the prompt cache's positions of the prompt
 * from q->from up to the session's position. */
static void store_prompt(req *q) {
    int pos = df_session_pos(q->s), n = q->n_prompt;
    for (int m = (q->from / q->every + 1) * q->every; m < n - 1 && m <= pos; m += q->every)
        df_session_cache_store(q->s, m);
    if (pos >= n - 1 && n - 1 > q->from) df_session_cache_store(q->s, n - 1);
}

static void finish(df_batchgen *g, req *q, int status, const df_error *err) {
    if (q->o.spec) df_spec_set_logits_hook(q->o.spec, NULL, NULL);
    if (q->every && !q->decoding) store_prompt(q); /* what a cut-short prompt got to */
    /* the end of the turn: the next one in a conversation starts with it */
    if (q->every && status == DF_OK && q->r.produced > 0) df_session_cache_store(q->s, df_session_pos(q->s));
    double now = df_now();
    if (q->decoding) q->r.decode_s = now - q->t_decode;
    else q->r.prefill_s = now - q->t_start;
    q->done = true;
    g->n_active--;
    if (q->on_done) q->on_done(q->o.user, &q->r, status, err);
}

/* After the rows of q in a successful step. */
static void advance(df_batchgen *g, req *q, int rows, double step_s) {
    if (!q->decoding) {
        q->next += rows;
        if (q->split && q->next % q->every == 0 && q->next < q->n_prompt - 1) df_session_cache_store(q->s, q->next);
        if (q->next < q->n_prompt) return;
        q->r.prefill_s = df_now() - q->t_start;
        if (q->o.on_prefill) q->o.on_prefill(q->o.user, q->n_prompt - q->r.prompt_reused, q->r.prefill_s);
        q->decoding = true;
        df_error err;
        int32_t t;
        int rc = sample(g, q, &t, &err);
        if (rc) {
            finish(g, q, rc, &err);
            return;
        }
        bool end = take(q, t);
        if (q->every) store_prompt(q); /* once the first token is out, as generate.c */
        q->t_decode = df_now();
        if (end) finish(g, q, DF_OK, NULL);
        else if (q->o.spec) df_spec_set_logits_hook(q->o.spec, q->o.logits_hook, q->o.hook_user);
        return;
    }
    int32_t got[GATE_K_MAX + 1];
    int ng = 1;
    df_error err;
    int rc = q->drafting ? df_spec_end(q->o.spec, q->s, q->o.sampler, got, &ng, &err) : sample(g, q, &got[0], &err);
    if (rc) {
        finish(g, q, rc, &err);
        return;
    }
    q->r.decoded += ng;
    if (q->o.on_step) q->o.on_step(q->o.user, ng, step_s);
    for (int i = 0; i < ng; i++)
        if (take(q, got[i])) {
            finish(g, q, DF_OK, NULL);
            return;
        }
}

/* Requests cancelled before their step leave now. */
static void check_cancelled(df_batchgen *g) {
    for (req *q = g->head; q; q = q->next_req)
        if (!q->done && q->o.cancelled && q->o.cancelled(q->o.user)) {
            q->r.finish = DF_FINISH_CANCELLED;
            finish(g, q, DF_OK, NULL);
        }
}

static void drop_done(df_batchgen *g) {
    for (req **pp = &g->head; *pp;) {
        req *q = *pp;
        if (q->done) *pp = q->next_req, req_free(q);
        else pp = &q->next_req;
    }
}

int df_batchgen_step(df_batchgen *g, df_error *err) {
    check_cancelled(g);
    int n = 0;
    for (req *q = g->head; q; q = q->next_req) n += !q->done;
    df_eval_item *it = df_xmalloc(sizeof *it * (size_t)(n ? n : 1));
    req **who = df_xmalloc(sizeof *who * (size_t)(n ? n : 1));
    int k = 0, decode_rows = 0;
    /* decode rows first (one each, or a drafter's rows to verify); prompts
     * share what room is left in join order (at least one row, so a full
     * batch cannot starve a prompt) */
    for (req *q = g->head; q; q = q->next_req) {
        if (q->done || !q->decoding) continue;
        q->drafting = false;
        if (q->o.spec) {
            df_error e1;
            int rc = df_spec_begin(q->o.spec, q->s, q->o.sampler, q->hist, q->nh, q->limit - q->r.produced, &it[k],
                                   &e1);
            if (rc) {
                finish(g, q, rc, &e1);
                continue;
            }
            q->drafting = true;
        } else {
            it[k] = (df_eval_item){q->s, &q->hist[q->nh - 1], 1, q->logits, 0};
        }
        decode_rows += it[k].n;
        who[k++] = q;
    }
    int room = g->max_rows - decode_rows;
    if (room < 1) room = 1;
    for (req *q = g->head; q && room > 0; q = q->next_req) {
        if (q->done || q->decoding) continue;
        int rows = q->n_prompt - q->next, chunk = q->o.prefill_chunk > 0 ? q->o.prefill_chunk : room;
        if (rows > chunk) rows = chunk;
        if (rows > room) rows = room;
        /* a recurrent state exists to be stored only where a chunk ends */
        int m = (q->next / (q->split ? q->every : 1) + 1) * q->every;
        if (q->split && m < q->n_prompt - 1 && q->next + rows > m) rows = m - q->next;
        room -= rows;
        it[k] = (df_eval_item){q->s, q->hist + q->next, rows, q->logits, 0}, who[k++] = q;
    }
    int rc = DF_OK;
    if (k) {
        double t0 = df_now();
        rc = df_eval_multi(g->b, it, k, err);
        double dt = df_now() - t0;
        for (int i = 0; i < k; i++) {
            if (rc) finish(g, who[i], rc, err);
            else advance(g, who[i], it[i].n, dt);
        }
    }
    free(it);
    free(who);
    drop_done(g);
    return rc;
}
