/*
 * engine/multi.c - evaluating several sessions together (deltafin.h,
 * df_eval_multi): a batcher owns the work buffers of one forward pass over
 * rows of many sequences, and df_eval_multi packs the items' rows into passes
 * of at most max_rows rows. A MoE layer then runs each expert its rows need
 * once for all of them (the union across sequences), so streamed experts are
 * read once per pass rather than once per sequence; a row's logits are those
 * of its sequence run alone (forward.h).
 */
#include "engine/internal.h"

#include <stdlib.h>
#include <string.h>

struct df_batcher {
    df_engine *eng;
    df_fwd fwd;
    int max_rows, max_ctx;
    float *scratch;      /* logits of the pass's chosen rows */
    size_t scratch_rows;
    uint64_t *replay_tok; /* routing replay: [max_rows] trace token of each row of the pass */
};

/* Routing replay in a multi-sequence pass: row r uses the engine's next
 * trace token + r, as a session's pass does, or its session's own next one
 * (df_session_replay_from). */
static void replay_route(void *user, int layer, int row, int *ids) {
    const df_batcher *b = user;
    df_engine_replay_ids(b->eng, b->replay_tok[row], layer, ids);
}

static void limits(const df_engine *e, int *rows, int *ctx) {
    int cap = e->model.cfg.max_position_embeddings;
    if (*ctx <= 0 || *ctx > cap) *ctx = e->budget_ctx > 0 && e->budget_ctx < cap ? e->budget_ctx : cap;
    if (*rows <= 0) *rows = e->chunk;
}

uint64_t df_batcher_bytes(const df_engine *e, int max_rows, int max_context) {
    limits(e, &max_rows, &max_context);
    return e->model.cfg.arch->work_bytes(&e->model, max_rows, max_context);
}

int df_batcher_new(df_batcher **out, df_engine *e, int max_rows, int max_context, df_error *err) {
    *out = NULL;
    if (max_rows < 0 || max_rows > 65536)
        return df_fail(err, DF_ERR_ARG, "a batcher of %d rows (1..65536, 0: the prefill chunk)", max_rows);
    if (max_context < 0) return df_fail(err, DF_ERR_ARG, "a batcher for a %d-token context", max_context);
    limits(e, &max_rows, &max_context);
    df_batcher *b = df_xcalloc(1, sizeof *b);
    const df_model *m = &e->model;
    b->eng = e;
    b->max_rows = max_rows;
    b->max_ctx = max_context;
    b->fwd = (df_fwd){.m = m, .pool = e->pool, .experts = e->experts, .max_rows = max_rows,
                      .max_ctx = max_context, .work = m->cfg.arch->work_new(m, max_rows, max_context)};
    if (e->replay) {
        b->fwd.route = replay_route, b->fwd.route_user = b;
        b->replay_tok = df_xmalloc(sizeof *b->replay_tok * (size_t)max_rows);
    }
    *out = b;
    return DF_OK;
}

void df_batcher_free(df_batcher *b) {
    if (!b) return;
    b->eng->model.cfg.arch->work_free(b->fwd.work);
    free(b->scratch);
    free(b->replay_tok);
    free(b);
}

int df_batcher_max_rows(const df_batcher *b) { return b->max_rows; }

/* The items are well formed: distinct sessions of this engine, tokens in the
 * vocabulary, room in each context and within the batcher's. */
static int check_items(const df_batcher *b, const df_eval_item *it, int n_items, df_error *err) {
    int V = b->eng->model.cfg.vocab_size;
    if (n_items <= 0 || !it) return df_fail(err, DF_ERR_ARG, "df_eval_multi: no items");
    for (int i = 0; i < n_items; i++) {
        const df_session *s = it[i].session;
        if (!s || s->eng != b->eng || !it[i].tokens || it[i].n <= 0)
            return df_fail(err, DF_ERR_ARG, "df_eval_multi: item %d has no session of this engine or no tokens", i);
        for (int j = 0; j < i; j++)
            if (it[j].session == s) return df_fail(err, DF_ERR_ARG, "df_eval_multi: items %d and %d share a session", j, i);
        if (s->max_ctx > b->max_ctx)
            return df_fail(err, DF_ERR_ARG, "df_eval_multi: item %d's session holds %d positions, the batcher %d", i,
                           s->max_ctx, b->max_ctx);
        if (s->seq->pos + it[i].n > s->max_ctx)
            return df_fail(err, DF_ERR_CONTEXT, "context full: item %d: %d + %d tokens exceed the %d-token context", i,
                           s->seq->pos, it[i].n, s->max_ctx);
        for (int t = 0; t < it[i].n; t++)
            if (it[i].tokens[t] < 0 || it[i].tokens[t] >= V)
                return df_fail(err, DF_ERR_ARG, "item %d: token id %d at index %d is outside the vocabulary (0..%d)", i,
                               it[i].tokens[t], t, V - 1);
    }
    return DF_OK;
}

/* One pass: rows [from[i], from[i] + take[i]) of each item, in item order. */
static int pass(df_batcher *b, const df_eval_item *it, int n_items, const int *from, const int *take, df_error *err) {
    df_engine *e = b->eng;
    int V = e->model.cfg.vocab_size, R = b->max_rows, T = 0, n_out = 0;
    int32_t tok[R];
    int pos[R], out_rows[R];
    df_seq *seq[R];
    df_session *ses[R];
    float *dst[R];
    for (int i = 0; i < n_items; i++) {
        df_session *s = it[i].session;
        for (int t = 0; t < take[i]; t++, T++) {
            int k = from[i] + t;
            tok[T] = it[i].tokens[k], pos[T] = s->seq->pos + t, seq[T] = s->seq, ses[T] = s;
            float *d = NULL;
            if (it[i].logits && it[i].all_rows) d = it[i].logits + (size_t)k * (size_t)V;
            else if (it[i].logits && k == it[i].n - 1) d = it[i].logits;
            if (d) out_rows[n_out] = T, dst[n_out++] = d;
        }
    }
    if (n_out > 0 && (size_t)n_out > b->scratch_rows) {
        free(b->scratch);
        b->scratch = df_xmalloc(sizeof(float) * (size_t)n_out * (size_t)V);
        b->scratch_rows = (size_t)n_out;
    }
    b->fwd.out_rows = out_rows;
    b->fwd.n_out = n_out;
    if (b->replay_tok)
        for (int r = 0, shared = 0; r < T; r++) /* shared rows: the engine's counter, in row order */
            b->replay_tok[r] = ses[r]->replay_own ? ses[r]->replay_next + (uint64_t)(pos[r] - ses[r]->seq->pos)
                                                  : e->replay_next + (uint64_t)shared++;
    df_batch bt = {T, tok, pos, seq};
    int rc = df_forward(&b->fwd, &bt, n_out ? b->scratch : NULL, false, err);
    b->fwd.out_rows = NULL;
    b->fwd.n_out = 0;
    for (int k = 0; k < DF_BLK_N; k++) e->block_s[k] += b->fwd.block_s[k], b->fwd.block_s[k] = 0;
    if (rc) return rc;
    for (int i = 0; i < n_out; i++) memcpy(dst[i], b->scratch + (size_t)i * (size_t)V, sizeof(float) * (size_t)V);
    for (int r = 0; r < T; r++) ses[r]->tokens[pos[r]] = tok[r];
    for (int r = 0; r < T; r++) {
        if (ses[r]->replay_own) ses[r]->replay_next++;
        else e->replay_next++;
    }
    e->tokens += (uint64_t)T;
    return DF_OK;
}

int df_eval_multi(df_batcher *b, const df_eval_item *it, int n_items, df_error *err) {
    int rc = check_items(b, it, n_items, err);
    if (rc) return rc;
    int from[n_items], take[n_items];
    memset(from, 0, sizeof from);
    double t0 = df_now();
    for (;;) {
        /* fill a pass with the items' next rows, in item order */
        int room = b->max_rows, any = 0;
        for (int i = 0; i < n_items; i++) {
            int left = it[i].n - from[i];
            take[i] = left < room ? left : room;
            room -= take[i];
            any |= take[i] > 0;
        }
        if (!any) break;
        if ((rc = pass(b, it, n_items, from, take, err))) break;
        for (int i = 0; i < n_items; i++) from[i] += take[i];
    }
    b->eng->eval_s += df_now() - t0;
    return rc;
}
