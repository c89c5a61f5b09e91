/*
 * engine/session.c - sessions: one sequence's state (the architecture's per-layer
 * states), its work buffers and its tokens. A session feeds the forward pass
 * in chunks of rows, which does not change any result (a row's logits do not
 * depend on the batch it is in).
 */
#include "engine/internal.h"

#include <limits.h>
#include <stdlib.h>

/* ---- sessions ------------------------------------------------------------------ */

int df_session_new(df_session **out, df_engine *e, int max_ctx, df_error *err) {
    *out = NULL;
    const df_config *c = &e->model.cfg;
    if (max_ctx <= 0 || max_ctx > c->max_position_embeddings) max_ctx = c->max_position_embeddings;
    if (e->ram_budget && max_ctx > e->budget_ctx)
        return df_fail(err, DF_ERR_ARG,
                       "a %d-token session does not fit the RAM budget, which was sized for %d tokens "
                       "(set the engine's context)", max_ctx, e->budget_ctx);
    df_session *s = df_xcalloc(1, sizeof *s);
    s->eng = e;
    s->max_ctx = max_ctx;
    const df_model *m = &e->model;
    int rc = c->arch->seq_new(m, max_ctx, &s->seq, err);
    if (rc) {
        free(s);
        return rc;
    }
    /* no pass evaluates more rows than the context holds: a larger chunk's
     * buffers would never be used */
    int rows = e->chunk < max_ctx ? e->chunk : max_ctx;
    s->tokens = df_xmalloc(sizeof(int32_t) * (size_t)max_ctx);
    /* work buffers at the first df_session_eval: a session evaluated only
     * through a batcher (df_eval_multi) never needs its own */
    s->fwd = (df_fwd){.m = m, .pool = e->pool, .experts = e->experts, .max_rows = rows, .max_ctx = max_ctx};
    if (e->replay) s->fwd.route = df_engine_replay_route, s->fwd.route_user = s;
    *out = s;
    return DF_OK;
}

void df_session_free(df_session *s) {
    if (!s) return;
    df_seq_free(s->seq);
    s->eng->model.cfg.arch->work_free(s->fwd.work);
    free(s->tokens);
    free(s);
}

int df_session_pos(const df_session *s) { return s->seq->pos; }
df_engine *df_session_engine(const df_session *s) { return s->eng; }
const int32_t *df_session_tokens(const df_session *s) { return s->tokens; }
int df_session_capacity(const df_session *s) { return s->max_ctx; }

void df_session_set_progress(df_session *s, df_progress_fn fn, void *user) {
    s->progress = fn;
    s->progress_user = user;
}

typedef struct {
    df_session *s;
    int done, total;
} progress_ctx;

static void on_layer(void *user, int layer, int n_layers, int rows) {
    progress_ctx *p = user;
    /* rows of this chunk count in proportion to the layers they have passed */
    p->s->progress(p->s->progress_user, layer, n_layers,
                   p->done + (int)((int64_t)rows * layer / n_layers), p->total);
}

void df_session_keep(df_session *s, int pos) { df_seq_keep(s->seq, pos); }
int df_session_keep_limit(const df_session *s) { return s->seq->positional ? INT_MAX : s->seq->max_keep; }

int df_session_rollback(df_session *s, int pos, df_error *err) {
    if (pos < 0 || pos > s->seq->pos) {
        df_fail(err, DF_ERR_ARG, "cannot roll a session at %d back to %d", s->seq->pos, pos);
        return -1;
    }
    int at = df_seq_restorable(s->seq, pos);
    return df_seq_rollback(s->seq, at, err) ? -1 : at;
}

int df_session_eval(df_session *s, const int32_t *tokens, int n, float *logits, int all_rows,
                    df_error *err) {
    const df_model *m = &s->eng->model;
    int V = m->cfg.vocab_size;
    if (n <= 0) return df_fail(err, DF_ERR_ARG, "nothing to evaluate");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return df_fail(err, DF_ERR_ARG, "token id %d at index %d is outside the vocabulary of the model "
                           "(0..%d, config.json's vocab_size)",
                           tokens[i], i, V - 1);
    if (s->seq->pos + n > s->max_ctx)
        return df_fail(err, DF_ERR_CONTEXT, "context full: %d + %d tokens exceed the %d-token context",
                       s->seq->pos, n, s->max_ctx);
    if (!s->fwd.work) s->fwd.work = m->cfg.arch->work_new(m, s->fwd.max_rows, s->max_ctx);
    int R = s->fwd.max_rows;
    int pos[R];
    df_seq *seq[R];
    double t0 = df_now();
    for (int done = 0; done < n;) {
        int T = n - done < R ? n - done : R;
        bool last = done + T == n;
        float *lg = NULL;
        if (logits && all_rows) lg = logits + (size_t)done * V;
        else if (logits && last) lg = logits;
        progress_ctx pc = {s, done, n};
        s->replay_base = s->replay_own ? s->replay_next : s->eng->replay_next;
        for (int t = 0; t < T; t++) pos[t] = s->seq->pos + t, seq[t] = s->seq;
        df_batch b = {T, tokens + done, pos, seq};
        s->fwd.on_layer = s->progress ? on_layer : NULL;
        s->fwd.layer_user = &pc;
        int rc = df_forward(&s->fwd, &b, lg, all_rows != 0, err);
        for (int k = 0; k < DF_BLK_N; k++) s->eng->block_s[k] += s->fwd.block_s[k], s->fwd.block_s[k] = 0;
        /* the position stays (a recurrent state goes back to a kept one):
         * the chunk can be evaluated again */
        if (rc) return rc;
        memcpy(s->tokens + pos[0], tokens + done, sizeof(int32_t) * (size_t)T);
        done += T;
        /* only once the rows are in: a retry replays the same */
        if (s->replay_own) s->replay_next += (uint64_t)T;
        else s->eng->replay_next += (uint64_t)T;
        s->eng->tokens += (uint64_t)T;
    }
    s->eng->eval_s += df_now() - t0;
    return DF_OK;
}

