/*
 * engine/replay.c - routing replay for benchmarks and tests (engine/dev.h): a
 * trace's tokens choose the experts of the rows evaluated, one trace token
 * per row, through the forward pass's routing hook.
 */
#include "engine/dev.h"
#include "engine/internal.h"

#include <stdlib.h>


/* Loads the trace and checks it against the model's MoE layers, experts and top-k. */
int df_engine_setup_replay(df_engine *e, const char *path, df_error *err) {
    const df_config *c = &e->model.cfg;
    if (c->num_experts <= 0)
        return df_fail(err, DF_ERR_ARG, "--replay-routing %s: the model has no routed experts", path);
    df_trace *t = df_xcalloc(1, sizeof *t);
    int rc = df_trace_load(t, path, err);
    if (rc) {
        free(t);
        return rc;
    }
    int n_moe = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n_moe += c->layer_is_moe[i];
    const char *field = NULL;
    int have = 0, want = 0;
    if (t->n_layers != n_moe) field = "moe_layers", have = t->n_layers, want = n_moe;
    else if (t->n_experts != c->num_experts)
        field = "experts_per_layer", have = t->n_experts, want = c->num_experts;
    else if (t->top_k != c->num_experts_per_tok)
        field = "top_k", have = t->top_k, want = c->num_experts_per_tok;
    if (field || t->n_tokens == 0) {
        df_trace_free(t);
        free(t);
        if (!field) return df_fail(err, DF_ERR_ARG, "--replay-routing %s: the trace has no tokens", path);
        return df_fail(err, DF_ERR_ARG,
                       "--replay-routing %s: %s is %d but the model has %d (%d MoE layers, %d experts, "
                       "top-%d)", path, field, have, want, n_moe, c->num_experts, c->num_experts_per_tok);
    }
    e->replay = t;
    e->replay_path = df_xstrdup(path);
    e->replay_layer = df_xmalloc(sizeof(int) * (size_t)c->num_hidden_layers);
    for (int i = 0, k = 0; i < c->num_hidden_layers; i++) e->replay_layer[i] = c->layer_is_moe[i] ? k++ : -1;
    return DF_OK;
}

void df_engine_free_replay(df_engine *e) {
    if (e->replay) df_trace_free(e->replay);
    free(e->replay);
    free(e->replay_path);
    free(e->replay_layer);
    e->replay = NULL;
    e->replay_path = NULL;
    e->replay_layer = NULL;
}

/* The forward pass's hook: row `row` of the pass uses trace token replay_base + row
 * (wrapping around: a bench may decode more tokens than the trace holds). */
void df_engine_replay_route(void *user, int layer, int row, int *ids) {
    const df_session *s = user;
    df_engine_replay_ids(s->eng, s->replay_base + (uint64_t)row, layer, ids);
}

void df_engine_replay_ids(const df_engine *e, uint64_t token, int layer, int *ids) {
    const df_trace *t = e->replay;
    int tok = (int)(token % (uint64_t)t->n_tokens);
    const uint16_t *src = df_trace_at(t, tok, e->replay_layer[layer]);
    for (int k = 0; k < t->top_k; k++) ids[k] = src[k];
}

/* An --experts list names every directory: an empty one (or an empty list)
 * would otherwise be skipped, and a list with nothing in it run from the
 * safetensors without a word. */

void df_session_replay_from(df_session *s, uint64_t token) {
    s->replay_own = true;
    s->replay_next = token;
}
