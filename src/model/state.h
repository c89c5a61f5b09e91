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
 *
 * Serialization (the prompt cache, engine/pcache.c): a state writes what
 * the sequence holds after a position as a segment: a positional state its
 * rows [from, to), a recurrent one its whole value at `to` (the current one
 * when the sequence is at `to`, else the snapshot of `to`). Segments loaded
 * in order from 0 rebuild the sequence bit for bit; a layout descriptor
 * (each layer's kind and width) lets a loader check that they fit.
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
    /* Serialization: the layout code (DF_LSTATE_*) and width (floats per
     * position, or in all for a recurrent state) of the descriptor; the
     * bytes of the segment [from, to); writing it (fails when a recurrent
     * state cannot give its value at `to`: at is the sequence's position);
     * loading it (the state then holds the rows, or the value, it gave). */
    uint32_t code;
    uint64_t (*width)(const df_lstate *s);
    uint64_t (*seg_bytes)(const df_lstate *s, int from, int to);
    int (*save)(const df_lstate *s, int at, int from, int to, void *dst);
    void (*load)(df_lstate *s, int from, int to, const void *src);
} df_lstate_ops;

enum { DF_LSTATE_NONE = 0, DF_LSTATE_KV = 1, DF_LSTATE_LATENT = 2, DF_LSTATE_REC = 3 };

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

/* ---- recurrent state (linear attention) --------------------------------------- */

/* A fixed block of F32 values that a layer rewrites every row (Kimi Delta
 * Attention: per head a key x value matrix, then the short convolutions'
 * windows), and copies of it at kept positions. Snapshot slots are taken
 * for the positions the sequence keeps (df_seq_keep), at most max_snap;
 * the layer fills a slot when the state has absorbed the rows before its
 * position, possibly part by part (one head at a time). bytes() counts
 * every slot, filled or not, so the RAM budget holds the worst case. */
typedef struct df_rec_state {
    df_lstate base;
    size_t n;               /* floats in the state */
    float *data;            /* [n]; zero: the state before the first row */
    int max_snap, n_snap;
    int *snap_pos;          /* [max_snap] */
    float **snap;           /* [max_snap][n], allocated on first use */
} df_rec_state;

uint64_t df_rec_state_bytes(size_t n, int max_snap);
int df_rec_state_new(df_lstate **out, size_t n, int max_snap, df_error *err);
static inline df_rec_state *df_rec_of(df_lstate *s) { return (df_rec_state *)s; }

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
    int max_keep;               /* <= DF_SEQ_MAX_KEEP: a recurrent state's snapshot slots */
} df_seq;

/* An empty sequence of n_layers layers (states added by the architecture). */
df_seq *df_seq_new(int n_layers, int max_ctx);
/* Takes ownership of st as layer li's state. */
void df_seq_set(df_seq *s, int li, df_lstate *st);
void df_seq_free(df_seq *s);
uint64_t df_seq_bytes(const df_seq *s);
/* Asks to be able to roll back to pos (>= the current position: the current
 * one is snapshotted at once; an earlier one is ignored, its state is gone).
 * Positional sequences need nothing; others keep at most max_keep positions
 * (beyond, the oldest request is dropped, but not the earliest position while
 * another can go: a shared prompt prefix outlives speculative decoding's keeps). */
void df_seq_keep(df_seq *s, int pos);
/* Whether the forward pass must snapshot the non-positional states when they
 * have absorbed the rows before pos. */
bool df_seq_wants_snapshot(const df_seq *s, int pos);
/* The largest position <= pos that df_seq_rollback can return to. */
int df_seq_restorable(const df_seq *s, int pos);
/* ---- serialization (the prompt cache) ------------------------------------------ */

/* One layer of the layout descriptor. */
typedef struct df_seq_layer_desc {
    uint32_t code;   /* DF_LSTATE_*, NONE for a layer without state */
    uint64_t width;
} df_seq_layer_desc;

/* The descriptor: n_layers entries into out. */
void df_seq_layout(const df_seq *s, df_seq_layer_desc *out);
/* Bytes of the segment [from, to) over every layer. */
uint64_t df_seq_seg_bytes(const df_seq *s, int from, int to);
/* Whether the segment ending at `to` can be written now: to <= pos, and
 * every recurrent state is at `to` or holds a snapshot of it. */
bool df_seq_can_save(const df_seq *s, int to);
/* Writes the segment [from, to) (df_seq_seg_bytes of them) to dst. */
int df_seq_save(const df_seq *s, int from, int to, void *dst, df_error *err);
/* Loads a segment written by df_seq_save for a sequence of the same layout
 * (checked by the caller) into s, at a position in [from, to) (its rows
 * from `from` on are overwritten with the same values); s is then at `to`. */
void df_seq_load(df_seq *s, int from, int to, const void *src);

/* Back to the state after the first pos rows (pos must be restorable). */
int df_seq_rollback(df_seq *s, int pos, df_error *err);
/* After a forward pass failed part way: a recurrent state may have absorbed
 * some of its rows, so the sequence goes back to the nearest restorable
 * position at or before its own (positional states stay where they are).
 * Returns the position it is at. */
int df_seq_recover(df_seq *s);
/* The slot of recurrent state st for position pos, prepared (taken, or
 * reused) when the sequence keeps pos; NULL when it does not. Called before
 * the rows that pass pos are evaluated; slots of positions the sequence no
 * longer keeps are released first. */
float *df_rec_prepare(df_lstate *st, const df_seq *s, int pos);
/* The prepared slot of pos, or NULL. */
float *df_rec_slot(df_lstate *st, int pos);

#endif
