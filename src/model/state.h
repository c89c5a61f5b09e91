/*
 * state.h - what a sequence keeps between forward passes, layer by layer.
 *
 * Each layer that remembers anything has one df_lstate, an object with a small
 * interface: the bytes it holds, appending rows, a snapshot at a position, and
 * rolling back. A grouped-query key/value cache (here), a latent cache and a
 * recurrent state are implementations of it. A cache with one entry per
 * position ("positional") can roll back to any earlier position by forgetting
 * the entries after it; a recurrent state can only return to a position it
 * kept a snapshot of. So a sequence's callers say which positions they may
 * want to return to (df_seq_keep) before the rows that pass them are
 * evaluated, and roll back with df_seq_rollback; df_seq_restorable tells the
 * nearest position at or before a wanted one that can be had.
 *
 * A df_seq is one sequence: its position and every layer's state. The
 * architecture creates it (arch.h state_new); the forward pass appends to it.
 */
#ifndef DF_STATE_H
#define DF_STATE_H

#include "util/util.h"

typedef struct df_lstate df_lstate;

typedef struct df_lstate_ops {
    const char *kind;           /* "kv", "latent", "recurrent", ... */
    bool positional;            /* one entry per position: any earlier position restores */
    uint64_t (*bytes)(const df_lstate *s);
    /* Stores row `pos`'s values (layout defined by the implementation; for
     * the KV cache: the keys, then the values). NULL for a recurrent state,
     * whose update is its layer's own computation. */
    void (*append)(df_lstate *s, int pos, const float *row);
    /* Keeps what rolling back to `pos` needs; the state has just absorbed
     * the rows before pos. Positional states keep nothing. */
    int (*snapshot)(df_lstate *s, int pos, df_error *err);
    /* Back to the state after the first `pos` rows. Positional: any pos up
     * to the current one; otherwise a snapshot's position or 0. */
    int (*rollback)(df_lstate *s, int pos, df_error *err);
    void (*free)(df_lstate *s);
} df_lstate_ops;

struct df_lstate {
    const df_lstate_ops *ops;
};

/* ---- grouped-query key/value cache ------------------------------------------ */

/* [position][kv_dim] keys and values, F32. */
typedef struct df_kv_state {
    df_lstate base;
    int max_ctx, kv_dim;
    float *k, *v;
} df_kv_state;

uint64_t df_kv_state_bytes(int max_ctx, int kv_dim);
int df_kv_state_new(df_lstate **out, int max_ctx, int kv_dim, df_error *err);
static inline const df_kv_state *df_kv_of(const df_lstate *s) { return (const df_kv_state *)s; }

/* ---- latent cache (multi-head latent attention) ------------------------------ */

/* [position][dim] F32: per position, what the attention layer derives every
 * head's keys and values from (MLA: the normalised latent, then the rotated
 * shared rope key). */
typedef struct df_latent_state {
    df_lstate base;
    int max_ctx, dim;
    float *row;
} df_latent_state;

uint64_t df_latent_state_bytes(int max_ctx, int dim);
int df_latent_state_new(df_lstate **out, int max_ctx, int dim, df_error *err);
static inline const df_latent_state *df_latent_of(const df_lstate *s) { return (const df_latent_state *)s; }

/* ---- one sequence -------------------------------------------------------------- */

#define DF_SEQ_MAX_KEEP 64

typedef struct df_seq {
    int n_layers;
    df_lstate **layer;          /* [n_layers]; NULL for a layer without state */
    int pos;                    /* rows absorbed so far */
    int max_ctx;
    bool positional;            /* every layer's state is positional */
    /* positions a rollback may return to (beyond 0), for non-positional states */
    int keep[DF_SEQ_MAX_KEEP];
    int n_keep;
} df_seq;

/* An empty sequence of n_layers layers (states added by the architecture). */
df_seq *df_seq_new(int n_layers, int max_ctx);
/* Takes ownership of st as layer li's state. */
void df_seq_set(df_seq *s, int li, df_lstate *st);
void df_seq_free(df_seq *s);
uint64_t df_seq_bytes(const df_seq *s);
/* Asks to be able to roll back to pos (> the current position). Positional
 * sequences need nothing; others keep at most DF_SEQ_MAX_KEEP positions (the
 * oldest dropped). */
void df_seq_keep(df_seq *s, int pos);
/* Whether the forward pass must snapshot the non-positional states when they
 * have absorbed the rows before pos. */
bool df_seq_wants_snapshot(const df_seq *s, int pos);
/* The largest position <= pos that df_seq_rollback can return to. */
int df_seq_restorable(const df_seq *s, int pos);
/* Back to the state after the first pos rows (pos must be restorable). */
int df_seq_rollback(df_seq *s, int pos, df_error *err);

#endif
