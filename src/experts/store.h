/*
 * store.h - the expert store: routed experts read on demand into a fixed set of
 * RAM slots, from an expert pack (io_uring, O_DIRECT, every stripe of a record
 * in flight at once, checksums verified) or straight from the checkpoint's
 * safetensors files (buffered reads through the page cache).
 *
 * A MoE layer asks for all the experts its rows need at once (queue depth); the
 * store hands them back resident-first, then in completion order, so the
 * experts already present are computed while the others load. Slots in use by
 * the current layer are pinned; the rest are evicted by the cache policy.
 * How it works and why: docs/expert-store.md.
 */
#ifndef DF_EXPERTS_STORE_H
#define DF_EXPERTS_STORE_H

#include "model/model.h"

typedef struct df_store df_store;

typedef struct df_store_opts {
    const char *const *pack_dirs; /* NULL/0: stream from the safetensors files */
    int n_pack_dirs;
    uint64_t cache_bytes;         /* RAM for expert slots (more than every expert
                                     needs is fine: the slots stop there) */
    const char *cache_what;       /* where cache_bytes came from, for the error when
                                     it is less than one expert ("--expert-cache
                                     sets"; NULL: a plain wording) */
    const char *policy;           /* "deltafin" (default) or "lru" */
    uint64_t pin_bytes;           /* pinned tier, filled from the persisted heat */
    const char *heat_path;        /* NULL: experts.heat in the first pack directory
                                     (no persistence when streaming from safetensors) */
    const char *prefetch;         /* "on": gated; NULL/"off", "router", "prev" (prefetch.h) */
    int prefetch_depth;           /* MoE layers ahead of the router lookahead; 0 = 1 */
    double prefetch_min_recall;   /* the gate's threshold; < 0 = default 0.5 */
    double prefetch_min_precision; /* read precision a rank needs; < 0 = default 0.5 */
    double sim_disk_bps;          /* benchmarks: hand reads over no earlier than a disk
                                     of this many bytes/s would (store_simdisk.c); 0: off. Only
                                     with pack_dirs (df_engine_open refuses it otherwise:
                                     page-cache hits would be paced as disk reads) */
} df_store_opts;

typedef struct df_store_stats {
    uint64_t requests;    /* (layer, expert) uses */
    uint64_t hits;        /* already resident (or in flight) when asked for */
    uint64_t misses;
    uint64_t bytes_read;  /* from disk, padding included */
    uint64_t records_read;
    uint64_t rereads;     /* checksum mismatches that were read again */
    double wait_s;        /* time the caller spent blocked on reads */
    /* read ahead of need */
    uint64_t prefetch_reads;        /* records read on a prediction */
    uint64_t prefetch_hits;         /* misses a prefetch had already started */
    uint64_t prefetch_bytes_used;
    uint64_t prefetch_bytes_wasted; /* predicted, read, and not used by that layer */
    uint64_t prefetch_no_room;      /* predictions not read: no free slot */
} df_store_stats;

int df_store_open(df_store **out, const df_model *m, const df_store_opts *o, df_error *err);
/* The store as the model layer's expert source (model/experts.h); closing the
 * source closes the store. */
df_xsource *df_store_xsource(df_store *s);
void df_store_close(df_store *s);
int df_store_slots(const df_store *s);
bool df_store_holds_all(const df_store *s); /* every expert has a cache slot */
size_t df_store_slot_bytes(const df_store *s);
bool df_store_direct(const df_store *s); /* reads bypass the page cache */
const char *df_store_source(const df_store *s); /* "pack" or "safetensors" */
df_store_stats df_store_get_stats(const df_store *s);

/* Starts a layer: `experts` are the distinct experts its rows need. */
int df_store_begin_layer(df_store *s, int layer, const int *experts, int n, df_error *err);
/* Hands out up to cap ready experts of the layer (blocking until one is): their
 * ids and views of their weights, valid until the next call; *n_out = 0 when all
 * were handed out. While misses wait for a transient slot, one at a time. */
int df_store_next(df_store *s, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err);
void df_store_end_layer(df_store *s);
/* A forward step (one token, or one batch of `rows` rows) is complete. */
void df_store_end_step(df_store *s, int rows);
int df_store_pinned(const df_store *s); /* experts read in at start-up */

/* Read-ahead. The forward pass asks how far ahead to look (0: prefetch is off)
 * and, for a later MoE layer, hands in the top-k its router gives on the
 * current residual stream; the store's prefetcher decides what that layer
 * will read early (the router's set, the previous step's, or nothing), and the
 * reads go behind every demand read already queued, into free transient slots
 * only: a prediction never evicts a cached expert. */
int df_store_prefetch_depth(const df_store *s);
/* ... and how far the forward pass is to look this step: 0 while the time gate
 * holds prefetch off (nothing would be read, and the lookahead has a cost). */
int df_store_lookahead_depth(const df_store *s);
double df_store_sim_disk(const df_store *s); /* bytes/s, 0: the real disk */
void df_store_predict(df_store *s, int layer, const int *sel, int n_sel);
const char *df_store_prefetch_mode(const df_store *s);
/* The time gate (prefetch.h): "probing", "on", "off" or "forced", and the last
 * probe's speed-up. */
const char *df_store_prefetch_gate(const df_store *s, double *speedup);
int df_store_moe_layers(const df_store *s);
/* MoE layer index (0 .. df_store_moe_layers-1) -> its prefetch statistics. */
struct df_pf_layer_stats;
void df_store_prefetch_layer(const df_store *s, int moe_layer, struct df_pf_layer_stats *out);

#endif
