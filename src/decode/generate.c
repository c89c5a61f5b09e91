/*
 * generate.c - df_generate (deltafin.h): the generation loop `deltafin run`,
 * `deltafin bench` and the server share, over the public session, sampler and
 * speculative API only.
 *
 * One prefill for plain and speculative decoding alike: the prompt's rows the
 * session does not hold, with the last row's logits, and the first token
 * sampled from them as plain decoding does, so a run with a drafter pays
 * nothing extra for it. Steps then start with the session holding all of the
 * history but the token just drawn (df_spec_step's convention); a plain step
 * evaluates that token and samples the next.
 *
 * With the engine's prompt cache, the prefill first restores the longest
 * cached prefix of the prompt beyond what the session holds, and stores the
 * state at the prompt's end less its last token (so that the same prompt
 * again evaluates one row) and at the interval's multiples once the first
 * token is out (the write is no part of the time to the first token), and at
 * the end of the generation (the next turn of a conversation starts with it).
 */
#include "deltafin.h"

#include "decode/sampler.h"
#include "util/util.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct loop {
    df_session *s;
    const df_generate_opts *o;
    df_generate_result *r;
    int V, limit;        /* most new tokens */
    int32_t *hist;       /* prompt + new tokens */
    int nh;
    float *logits;
    int every;           /* the prompt cache's interval, 0: none */
    int from;            /* where the prefill started (the prompt's stores are from there) */
} loop;

/* The session's rows of the prompt, and what the prompt cache has beyond
 * them; returns the position the prefill starts from, or -1 with err. */
static int prefill_start(loop *L, const int32_t *prompt, int n, df_error *err) {
    int keep = 0;
    if (L->o->reuse_prefix) {
        const int32_t *held = df_session_tokens(L->s);
        int have = df_session_pos(L->s);
        while (keep < have && keep < n - 1 && held[keep] == prompt[keep]) keep++;
    }
    /* the nearest position at or before that the session can return to */
    if ((keep = df_session_rollback(L->s, keep, err)) < 0) return -1;
    if (L->every) {
        int at = df_session_cache_restore(L->s, prompt, n - 1, err);
        if (at < 0) return -1;
        L->r->prompt_cached = at - keep;
        keep = at;
    }
    L->r->prompt_reused = keep;
    return keep;
}

/* The prompt cache's positions of the prompt from `from` up to the session's
 * position: the multiples of the interval, and n - 1 (the prompt less its
 * last token, whose logits the first token needs) once passed. */
static void store_prompt(loop *L, int from, int n) {
    int pos = df_session_pos(L->s);
    for (int m = (from / L->every + 1) * L->every; m < n - 1 && m <= pos; m += L->every)
        df_session_cache_store(L->s, m);
    if (pos >= n - 1 && n - 1 > from) df_session_cache_store(L->s, n - 1);
}

/* The prompt's rows the session does not hold; the last row's logits. With
 * a prompt cache, a model with recurrent state splits its chunks at the
 * interval's multiples and stores each there (the state exists only then);
 * n - 1 comes from the snapshot kept for it. Others store after. */
static int prefill(loop *L, const int32_t *prompt, int n, df_error *err) {
    const df_generate_opts *o = L->o;
    double t0 = df_now();
    int keep = prefill_start(L, prompt, n, err);
    if (keep < 0) return err->code;
    df_session_keep(L->s, n); /* a later prompt may share this one */
    if (L->every) df_session_keep(L->s, n - 1);
    bool split = L->every && df_session_keep_limit(L->s) != INT_MAX;
    df_session_set_progress(L->s, o->prefill_progress, o->progress_user);
    int rc = DF_OK, chunk = o->prefill_chunk > 0 ? o->prefill_chunk : n;
    for (int i = keep, k; i < n && !rc; i += k) {
        if (o->cancelled && o->cancelled(o->user)) {
            L->r->finish = DF_FINISH_CANCELLED;
            break;
        }
        k = n - i < chunk ? n - i : chunk;
        int m = (i / (split ? L->every : 1) + 1) * L->every;
        if (split && m < n - 1 && i + k > m) k = m - i;
        rc = df_session_eval(L->s, prompt + i, k, L->logits, 0, err);
        if (!rc && split && i + k == m) df_session_cache_store(L->s, m);
    }
    df_session_set_progress(L->s, NULL, NULL);
    L->from = keep; /* the prompt's states are stored once its first token is out (decode) */
    L->r->prefill_s = df_now() - t0;
    if (!rc && o->on_prefill) o->on_prefill(o->user, n - keep, L->r->prefill_s);
    return rc;
}

/* Takes the new tokens of one step; true when generation ends with them. */
static bool take(loop *L, const int32_t *got, int ng) {
    const df_generate_opts *o = L->o;
    for (int i = 0; i < ng; i++) {
        int32_t t = o->force ? o->force(o->user, L->r->produced) : got[i];
        L->hist[L->nh++] = t;
        L->r->produced++;
        int stop = o->on_token ? o->on_token(o->user, t) : 0;
        if (!o->force && df_is_stop_token(df_session_engine(L->s), t)) {
            L->r->finish = DF_FINISH_STOP;
            return true;
        }
        if (stop) {
            L->r->finish = DF_FINISH_CALLER;
            return true;
        }
        if (L->r->produced == L->limit) {
            L->r->finish = o->max_new && o->max_new <= L->limit ? DF_FINISH_LENGTH : DF_FINISH_CONTEXT;
            return true;
        }
    }
    return false;
}

/* *tok: the next token from the model's logits row, which must have a finite
 * value (df_logits_check). */
static int sample(loop *L, int32_t *tok, df_error *err) {
    const df_generate_opts *o = L->o;
    int rc = df_logits_check(L->logits, L->V, L->nh, err);
    if (rc) return rc;
    if (o->logits_hook) o->logits_hook(o->hook_user, L->logits, L->V, L->hist, L->nh);
    *tok = df_sampler_sample(o->sampler, L->logits, L->V, L->hist, L->nh);
    return DF_OK;
}

/* One step: the history's last token evaluated (with any drafts). */
static int step(loop *L, int32_t *got, int *ng, df_error *err) {
    const df_generate_opts *o = L->o;
    if (o->spec)
        return df_spec_step(o->spec, L->s, o->sampler, L->hist, L->nh, got, L->limit - L->r->produced, ng, err);
    int rc = df_session_eval(L->s, &L->hist[L->nh - 1], 1, L->logits, 0, err);
    if (rc) return rc;
    *ng = 1;
    return sample(L, &got[0], err);
}

/* The first token is sampled and handed to the caller before the prompt's
 * states are written to the prompt cache (a write, fsynced, is not part of
 * the time to the first token); the session is still at the prompt's end. */
static int decode(loop *L, int n, df_error *err) {
    const df_generate_opts *o = L->o;
    int32_t got[17];
    int ng = 1, rc = sample(L, &got[0], err);
    if (rc) return rc;
    bool done = take(L, got, ng);
    if (L->every) store_prompt(L, L->from, n);
    double t0 = df_now();
    if (o->spec) df_spec_set_logits_hook(o->spec, o->logits_hook, o->hook_user);
    while (!done) {
        if (o->cancelled && o->cancelled(o->user)) {
            L->r->finish = DF_FINISH_CANCELLED;
            break;
        }
        double ts = df_now();
        if ((rc = step(L, got, &ng, err))) break;
        L->r->decoded += ng;
        if (o->on_step) o->on_step(o->user, ng, df_now() - ts);
        done = take(L, got, ng);
    }
    if (o->spec) df_spec_set_logits_hook(o->spec, NULL, NULL);
    L->r->decode_s = df_now() - t0;
    return rc;
}

int df_generate(df_session *s, const int32_t *prompt, int n, const df_generate_opts *o,
                df_generate_result *res, df_error *err) {
    df_generate_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    if (!s || !prompt || n < 1 || !o || !o->sampler || o->max_new < 0)
        return df_fail(err, DF_ERR_ARG, "df_generate: bad arguments");
    if (o->spec && o->force)
        return df_fail(err, DF_ERR_ARG, "df_generate: teacher forcing and speculative decoding exclude each other");
    int cap = df_session_capacity(s);
    if (n >= cap)
        return df_fail(err, DF_ERR_CONTEXT, "the prompt of %d tokens leaves no room in the %d-token context", n,
                       cap);
    /* the context holds the prompt and every new token */
    int room = cap - n;
    loop L = {s, o, res, df_engine_info(df_session_engine(s))->vocab_size,
              o->max_new && o->max_new < room ? o->max_new : room, NULL, n, NULL,
              df_session_cache_interval(s), -1};
    L.hist = df_xmalloc(sizeof(int32_t) * ((size_t)n + (size_t)L.limit));
    memcpy(L.hist, prompt, sizeof(int32_t) * (size_t)n);
    L.logits = df_xmalloc(sizeof(float) * (size_t)L.V);
    int rc = prefill(&L, prompt, n, err);
    if (!rc && res->finish != DF_FINISH_CANCELLED) rc = decode(&L, n, err);
    else if (L.every && L.from >= 0) store_prompt(&L, L.from, n);
    /* the end of the turn: the next one in a conversation starts with it */
    if (!rc && L.every && res->produced > 0) df_session_cache_store(s, df_session_pos(s));
    free(L.hist);
    free(L.logits);
    return rc;
}
