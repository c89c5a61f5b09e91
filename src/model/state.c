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

static uint64_t kv_width(const df_lstate *s) { return (uint64_t)df_kv_of(s)->kv_dim; }

static uint64_t kv_seg_bytes(const df_lstate *s, int from, int to) {
    return 2 * sizeof(float) * (uint64_t)(to - from) * kv_width(s);
}

/* Keys [from, to), then values. */
static int kv_save(const df_lstate *s, int at, int from, int to, void *dst) {
    (void)at;
    const df_kv_state *kv = df_kv_of(s);
    size_t o = (size_t)from * (size_t)kv->kv_dim, n = sizeof(float) * (size_t)(to - from) * (size_t)kv->kv_dim;
    memcpy(dst, kv->k + o, n);
    memcpy((char *)dst + n, kv->v + o, n);
    return DF_OK;
}

static void kv_load(df_lstate *s, int from, int to, const void *src) {
    df_kv_state *kv = (df_kv_state *)s;
    size_t o = (size_t)from * (size_t)kv->kv_dim, n = sizeof(float) * (size_t)(to - from) * (size_t)kv->kv_dim;
    df_prefault_overwrite(kv->k + o, n); /* rows never written yet: fresh pages */
    df_prefault_overwrite(kv->v + o, n);
    memcpy(kv->k + o, src, n);
    memcpy(kv->v + o, (const char *)src + n, n);
}

static const df_lstate_ops KV_OPS = {.kind = "kv", .positional = true, .bytes = kv_bytes, .append = kv_append,
                                     .snapshot = kv_snapshot, .rollback = kv_rollback, .free = kv_free,
                                     .code = DF_LSTATE_KV, .width = kv_width, .seg_bytes = kv_seg_bytes,
                                     .save = kv_save, .load = kv_load};

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

static uint64_t latent_width(const df_lstate *s) { return (uint64_t)df_latent_of(s)->dim; }

static uint64_t latent_seg_bytes(const df_lstate *s, int from, int to) {
    return sizeof(float) * (uint64_t)(to - from) * latent_width(s);
}

static int latent_save(const df_lstate *s, int at, int from, int to, void *dst) {
    (void)at;
    const df_latent_state *l = df_latent_of(s);
    memcpy(dst, l->row + (size_t)from * (size_t)l->dim, sizeof(float) * (size_t)(to - from) * (size_t)l->dim);
    return DF_OK;
}

static void latent_load(df_lstate *s, int from, int to, const void *src) {
    df_latent_state *l = (df_latent_state *)s;
    size_t n = sizeof(float) * (size_t)(to - from) * (size_t)l->dim;
    df_prefault_overwrite(l->row + (size_t)from * (size_t)l->dim, n); /* as kv_load */
    memcpy(l->row + (size_t)from * (size_t)l->dim, src, n);
}

/* Positional like the KV cache: snapshot and rollback have nothing to do. */
static const df_lstate_ops LATENT_OPS = {.kind = "latent", .positional = true, .bytes = latent_bytes,
                                         .append = latent_append, .snapshot = kv_snapshot,
                                         .rollback = kv_rollback, .free = latent_free, .code = DF_LSTATE_LATENT,
                                         .width = latent_width, .seg_bytes = latent_seg_bytes,
                                         .save = latent_save, .load = latent_load};

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

/* ---- recurrent state ---------------------------------------------------------- */

static uint64_t rec_bytes(const df_lstate *s) {
    const df_rec_state *r = (const df_rec_state *)s;
    return df_rec_state_bytes(r->n, r->max_snap);
}

static int rec_find(const df_rec_state *r, int pos) {
    for (int i = 0; i < r->n_snap; i++)
        if (r->snap_pos[i] == pos) return i;
    return -1;
}

static void rec_drop(df_rec_state *r, int i) {
    float *buf = r->snap[i];
    /* keep the buffer for reuse at the end of the array */
    memmove(r->snap_pos + i, r->snap_pos + i + 1, sizeof(int) * (size_t)(r->n_snap - i - 1));
    memmove(r->snap + i, r->snap + i + 1, sizeof(float *) * (size_t)(r->n_snap - i - 1));
    r->n_snap--;
    r->snap[r->n_snap] = buf;
}

static bool seq_keeps(const df_seq *s, int pos) {
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] == pos) return true;
    return false;
}

float *df_rec_prepare(df_lstate *st, const df_seq *s, int pos) {
    df_rec_state *r = df_rec_of(st);
    if (!seq_keeps(s, pos)) return NULL;
    for (int i = r->n_snap - 1; i >= 0; i--)
        if (r->snap_pos[i] != pos && !seq_keeps(s, r->snap_pos[i])) rec_drop(r, i);
    int i = rec_find(r, pos);
    if (i < 0) {
        if (r->n_snap == r->max_snap) rec_drop(r, 0); /* the sequence keeps at most max_snap */
        i = r->n_snap++;
        r->snap_pos[i] = pos;
        if (!r->snap[i]) r->snap[i] = df_aligned_alloc(sizeof(float) * r->n);
    }
    return r->snap[i];
}

float *df_rec_slot(df_lstate *st, int pos) {
    df_rec_state *r = df_rec_of(st);
    int i = rec_find(r, pos);
    return i < 0 ? NULL : r->snap[i];
}

/* The whole state at once (a layer that fills slots part by part uses
 * df_rec_prepare and df_rec_slot instead). */
static int rec_snapshot(df_lstate *s, int pos, df_error *err) {
    df_rec_state *r = df_rec_of(s);
    int i = rec_find(r, pos);
    if (i < 0) {
        if (r->n_snap == r->max_snap) return df_fail(err, DF_ERR_ARG, "recurrent state: no snapshot slot left");
        i = r->n_snap++;
        r->snap_pos[i] = pos;
        if (!r->snap[i]) r->snap[i] = df_aligned_alloc(sizeof(float) * r->n);
    }
    memcpy(r->snap[i], r->data, sizeof(float) * r->n);
    return DF_OK;
}

static int rec_rollback(df_lstate *s, int pos, df_error *err) {
    df_rec_state *r = df_rec_of(s);
    for (int i = r->n_snap - 1; i >= 0; i--)
        if (r->snap_pos[i] > pos) rec_drop(r, i);
    if (pos == 0) {
        memset(r->data, 0, sizeof(float) * r->n);
        return DF_OK;
    }
    int i = rec_find(r, pos);
    if (i < 0) return df_fail(err, DF_ERR_ARG, "recurrent state: no snapshot at position %d", pos);
    memcpy(r->data, r->snap[i], sizeof(float) * r->n);
    return DF_OK;
}

static void rec_free(df_lstate *s) {
    df_rec_state *r = df_rec_of(s);
    for (int i = 0; i < r->max_snap; i++) free(r->snap[i]);
    free(r->snap), free(r->snap_pos), free(r->data), free(r);
}

static uint64_t rec_width(const df_lstate *s) { return (uint64_t)((const df_rec_state *)s)->n; }

static uint64_t rec_seg_bytes(const df_lstate *s, int from, int to) {
    (void)from, (void)to;
    return sizeof(float) * rec_width(s);
}

/* The value at `to`: the state itself when the sequence is there, else a
 * snapshot of it. */
static const float *rec_value(const df_lstate *s, int at, int to) {
    const df_rec_state *r = (const df_rec_state *)s;
    if (at == to) return r->data;
    int i = rec_find(r, to);
    return i < 0 ? NULL : r->snap[i];
}

static int rec_save(const df_lstate *s, int at, int from, int to, void *dst) {
    (void)from;
    const float *v = rec_value(s, at, to);
    if (!v) return DF_ERR_ARG;
    memcpy(dst, v, sizeof(float) * ((const df_rec_state *)s)->n);
    return DF_OK;
}

/* The sequence is now at `to`: snapshots past it describe rows that are gone. */
static void rec_load(df_lstate *s, int from, int to, const void *src) {
    (void)from;
    df_rec_state *r = df_rec_of(s);
    for (int i = r->n_snap - 1; i >= 0; i--)
        if (r->snap_pos[i] > to) rec_drop(r, i);
    memcpy(r->data, src, sizeof(float) * r->n);
}

static const df_lstate_ops REC_OPS = {.kind = "recurrent", .positional = false, .bytes = rec_bytes,
                                      .snapshot = rec_snapshot, .rollback = rec_rollback, .free = rec_free,
                                      .code = DF_LSTATE_REC, .width = rec_width, .seg_bytes = rec_seg_bytes,
                                      .save = rec_save, .load = rec_load};

uint64_t df_rec_state_bytes(size_t n, int max_snap) {
    return sizeof(float) * (uint64_t)n * (1 + (uint64_t)(max_snap > 0 ? max_snap : 0));
}

int df_rec_state_new(df_lstate **out, size_t n, int max_snap, df_error *err) {
    (void)err;
    df_rec_state *r = df_xcalloc(1, sizeof *r);
    r->base.ops = &REC_OPS;
    r->n = n;
    r->data = df_aligned_alloc(sizeof(float) * (n ? n : 1));
    memset(r->data, 0, sizeof(float) * n);
    r->max_snap = max_snap;
    r->snap_pos = df_xcalloc((size_t)(max_snap > 0 ? max_snap : 1), sizeof(int));
    r->snap = df_xcalloc((size_t)(max_snap > 0 ? max_snap : 1), sizeof(float *));
    *out = &r->base;
    return DF_OK;
}

/* ---- one sequence -------------------------------------------------------------- */

df_seq *df_seq_new(int n_layers, int max_ctx) {
    df_seq *s = df_xcalloc(1, sizeof *s);
    s->n_layers = n_layers;
    s->layer = df_xcalloc((size_t)(n_layers > 0 ? n_layers : 1), sizeof(df_lstate *));
    s->max_ctx = max_ctx;
    s->positional = true;
    s->max_keep = DF_SEQ_MAX_KEEP;
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
    /* a position already passed has no snapshot to return to: kept, it would
     * look restorable and make every rollback to it fail */
    if (s->positional || pos <= 0 || pos < s->pos) return;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] == pos) return;
    if (s->n_keep >= s->max_keep) {
        if (s->max_keep <= 0) return;
        /* forget the oldest request, but not the earliest position (a prompt
         * prefix later requests may share) while another can go */
        int first = 0, drop = 0;
        for (int i = 1; i < s->n_keep; i++)
            if (s->keep[i] < s->keep[first]) first = i;
        if (first == 0 && s->n_keep > 1) drop = 1;
        memmove(s->keep + drop, s->keep + drop + 1, sizeof(int) * (size_t)(s->n_keep - drop - 1));
        s->n_keep--;
    }
    s->keep[s->n_keep++] = pos;
    if (pos == s->pos) /* the states are there now: snapshot them */
        for (int i = 0; i < s->n_layers; i++) {
            df_lstate *st = s->layer[i];
            if (!st || st->ops->positional) continue;
            float *slot = df_rec_prepare(st, s, pos);
            memcpy(slot, df_rec_of(st)->data, sizeof(float) * df_rec_of(st)->n);
        }
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

/* Whether every recurrent layer holds a snapshot of pos. */
static bool seq_has_snapshots(const df_seq *s, int pos) {
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i] && !s->layer[i]->ops->positional && !df_rec_slot(s->layer[i], pos)) return false;
    return true;
}

int df_seq_recover(df_seq *s) {
    if (s->positional) return s->pos;
    /* the state itself is not trusted: the latest kept position with a
     * snapshot in every layer, else the start */
    int at = 0;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] <= s->pos && s->keep[i] > at && seq_has_snapshots(s, s->keep[i])) at = s->keep[i];
    for (int i = 0; i < s->n_layers; i++) {
        df_error e;
        if (s->layer[i]) s->layer[i]->ops->rollback(s->layer[i], at, &e);
    }
    s->pos = at;
    int k = 0;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] <= at) s->keep[k++] = s->keep[i];
    s->n_keep = k;
    return at;
}

/* ---- serialization ------------------------------------------------------------- */

void df_seq_layout(const df_seq *s, df_seq_layer_desc *out) {
    for (int i = 0; i < s->n_layers; i++) {
        const df_lstate *l = s->layer[i];
        out[i] = l ? (df_seq_layer_desc){l->ops->code, l->ops->width(l)} : (df_seq_layer_desc){DF_LSTATE_NONE, 0};
    }
}

uint64_t df_seq_seg_bytes(const df_seq *s, int from, int to) {
    uint64_t b = 0;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i]) b += s->layer[i]->ops->seg_bytes(s->layer[i], from, to);
    return b;
}

bool df_seq_can_save(const df_seq *s, int to) {
    if (to < 0 || to > s->pos) return false;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layer[i] && !s->layer[i]->ops->positional && !rec_value(s->layer[i], s->pos, to)) return false;
    return true;
}

int df_seq_save(const df_seq *s, int from, int to, void *dst, df_error *err) {
    if (from < 0 || from > to || !df_seq_can_save(s, to))
        return df_fail(err, DF_ERR_ARG, "a sequence at %d cannot give its state at %d (from %d)", s->pos, to, from);
    char *p = dst;
    for (int i = 0; i < s->n_layers; i++) {
        const df_lstate *l = s->layer[i];
        if (!l) continue;
        l->ops->save(l, s->pos, from, to, p);
        p += l->ops->seg_bytes(l, from, to);
    }
    return DF_OK;
}

void df_seq_load(df_seq *s, int from, int to, const void *src) {
    /* kept positions past the old end have no snapshots: the rows came from here */
    int k = 0, old = s->pos;
    for (int i = 0; i < s->n_keep; i++)
        if (s->keep[i] <= old) s->keep[k++] = s->keep[i];
    s->n_keep = k;
    const char *p = src;
    for (int i = 0; i < s->n_layers; i++) {
        df_lstate *l = s->layer[i];
        if (!l) continue;
        l->ops->load(l, from, to, p);
        p += l->ops->seg_bytes(l, from, to);
    }
    s->pos = to;
}
