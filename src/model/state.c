/*
 * state.c - sequences of per-layer states (state.h) and the grouped-query
 * key/value cache and the latent cache, the positional states of attention
 * layers.
 */
#include "model/state.h"

#include <stdlib.h>

/* ---- grouped-query key/value cache ------------------------------------------ */

static uint64_t kv_bytes(const df_lstate *s) {
    const df_kv_state *kv = df_kv_of(s);
    return df_kv_state_bytes(kv->max_ctx, kv->kv_dim);
}

static void kv_append(df_lstate *s, int pos, const float *row) {
    df_kv_state *kv = (df_kv_state *)s;
    size_t at = (size_t)pos * (size_t)kv->kv_dim;
    memcpy(kv->k + at, row, sizeof(float) * (size_t)kv->kv_dim);
    memcpy(kv->v + at, row + kv->kv_dim, sizeof(float) * (size_t)kv->kv_dim);
}

/* Entries past pos are simply overwritten by the next rows. */
static int kv_snapshot(df_lstate *s, int pos, df_error *err) {
    (void)s, (void)pos, (void)err;
    return DF_OK;
}

static int kv_rollback(df_lstate *s, int pos, df_error *err) {
    (void)s, (void)pos, (void)err;
    return DF_OK;
}

static void kv_free(df_lstate *s) {
    df_kv_state *kv = (df_kv_state *)s;
    free(kv->k);
    free(kv->v);
    free(kv);
}

static const df_lstate_ops KV_OPS = {"kv", true, kv_bytes, kv_append, kv_snapshot, kv_rollback, kv_free};

uint64_t df_kv_state_bytes(int max_ctx, int kv_dim) {
    return 2 * sizeof(float) * (uint64_t)(max_ctx > 0 ? max_ctx : 0) * (uint64_t)(kv_dim > 0 ? kv_dim : 0);
}

int df_kv_state_new(df_lstate **out, int max_ctx, int kv_dim, df_error *err) {
    *out = NULL;
    size_t n = (size_t)max_ctx * (size_t)kv_dim;
    df_kv_state *kv = calloc(1, sizeof *kv);
    if (kv) {
        kv->k = malloc(sizeof(float) * n);
        kv->v = malloc(sizeof(float) * n);
    }
    if (!kv || !kv->k || !kv->v) {
        if (kv) free(kv->k), free(kv->v);
        free(kv);
        return df_fail(err, DF_ERR_NOMEM, "KV cache of %d positions (%.1f MiB) does not fit in memory",
                       max_ctx, 2.0 * sizeof(float) * (double)n / 1048576.0);
    }
    kv->base.ops = &KV_OPS;
    kv->max_ctx = max_ctx;
    kv->kv_dim = kv_dim;
    *out = &kv->base;
    return DF_OK;
}

/* ---- latent cache ------------------------------------------------------------ */

static uint64_t latent_bytes(const df_lstate *s) {
    const df_latent_state *l = df_latent_of(s);
    return df_latent_state_bytes(l->max_ctx, l->dim);
}

static void latent_append(df_lstate *s, int pos, const float *row) {
    df_latent_state *l = (df_latent_state *)s;
    memcpy(l->row + (size_t)pos * (size_t)l->dim, row, sizeof(float) * (size_t)l->dim);
}

static void latent_free(df_lstate *s) {
    df_latent_state *l = (df_latent_state *)s;
    free(l->row);
    free(l);
}

/* Positional like the KV cache: snapshot and rollback have nothing to do. */
static const df_lstate_ops LATENT_OPS = {"latent", true, latent_bytes, latent_append, kv_snapshot, kv_rollback,
                                         latent_free};

uint64_t df_latent_state_bytes(int max_ctx, int dim) {
    return sizeof(float) * (uint64_t)(max_ctx > 0 ? max_ctx : 0) * (uint64_t)(dim > 0 ? dim : 0);
}

int df_latent_state_new(df_lstate **out, int max_ctx, int dim, df_error *err) {
    *out = NULL;
    df_latent_state *l = calloc(1, sizeof *l);
    if (l) l->row = malloc(sizeof(float) * (size_t)max_ctx * (size_t)dim);
    if (!l || !l->row) {
        free(l);
        return df_fail(err, DF_ERR_NOMEM, "latent cache of %d positions (%.1f MiB) does not fit in memory",
                       max_ctx, (double)df_latent_state_bytes(max_ctx, dim) / 1048576.0);
    }
    l->base.ops = &LATENT_OPS;
    l->max_ctx = max_ctx;
    l->dim = dim;
    *out = &l->base;
    return DF_OK;
}

/* ---- one sequence -------------------------------------------------------------- */

df_seq *df_seq_new(int n_layers, int max_ctx) {
    df_seq *s = df_xcalloc(1, sizeof *s);
    s->n_layers = n_layers;
    s->layer = df_xcalloc((size_t)(n_layers > 0 ? n_layers : 1), sizeof(df_lstate *));
    s->max_ctx = max_ctx;
    s->positional = true;
    return s;
}

void df_seq_set(df_seq *s, int li, df_lstate *st) {
    if (s->layer[li]) s->layer[li]->ops->free(s->layer[li]);
    s->layer[li] = st;
    s->positional = true;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i] && !s->layer[i]->ops->positional) s->positional = false;
}

void df_seq_free(df_seq *s) {
    if (!s) return;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i]) s->layer[i]->ops->free(s->layer[i]);
    free(s->layer);
    free(s);
}

uint64_t df_seq_bytes(const df_seq *s) {
    uint64_t b = 0;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i]) b += s->layer[i]->ops->bytes(s->layer[i]);
    return b;
}

void df_seq_keep(df_seq *s, int pos) {
    if (s->positional || pos <= 0) return;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] == pos) return;
    if (s->n_keep == DF_SEQ_MAX_KEEP) {
        memmove(s->keep, s->keep + 1, sizeof(int) * (DF_SEQ_MAX_KEEP - 1));
        s->n_keep--;
    }
    s->keep[s->n_keep++] = pos;
}

bool df_seq_wants_snapshot(const df_seq *s, int pos) {
    for (int i = 0; !s->positional && i < s->n_keep; i++)
        if (s->keep[i] == pos) return true;
    return false;
}

int df_seq_restorable(const df_seq *s, int pos) {
    if (pos > s->pos) pos = s->pos;
    if (pos < 0) return 0;
    if (s->positional || pos == s->pos) return pos;
    int best = 0;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] <= pos && s->keep[i] > best) best = s->keep[i];
    return best;
}

int df_seq_rollback(df_seq *s, int pos, df_error *err) {
    if (pos < 0 || pos > s->pos || df_seq_restorable(s, pos) != pos)
        return df_fail(err, DF_ERR_ARG, "cannot roll a sequence at %d back to %d", s->pos, pos);
    if (pos == s->pos) return DF_OK;
    for (int i = 0; i < s->n_layers; i++) {
        if (!s->layer[i]) continue;
        int rc = s->layer[i]->ops->rollback(s->layer[i], pos, err);
        if (rc) return rc;
    }
    s->pos = pos;
    /* snapshots past the new end describe rows that are gone */
    int k = 0;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] <= pos) s->keep[k++] = s->keep[i];
    s->n_keep = k;
    return DF_OK;
}
