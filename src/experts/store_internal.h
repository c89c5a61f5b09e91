/*
 * store_internal.h - the expert store's private state, shared by its files and
 * by nothing else:
 *   store.c          slots, lookup, the policy glue, the expert source, open/close
 *   store_io.c       the read sources (pack stripes or safetensors matrices) and
 *                    the io_uring submission/completion path
 *   store_simdisk.c  the simulated disk (benchmarks)
 *   store_faults.c   injected I/O faults (the test build only: DF_TEST_HOOKS)
 * How the parts fit: docs/expert-store.md.
 */
#ifndef DF_EXPERTS_STORE_INTERNAL_H
#define DF_EXPERTS_STORE_INTERNAL_H

#include "experts/pack.h"
#include "experts/policy.h"
#include "experts/prefetch.h"
#include "experts/store.h"

#include <liburing.h>

#define MAX_OPS DF_PACK_MAX_STRIPES /* operations per record: stripes, or matrices */

enum { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY };

/* A frame of memory for one expert record ("slot" for short). */
typedef struct slot {
    int key;            /* layer * E + expert, -1 when empty */
    int state;
    int pin;            /* in use by the current layer */
    int ops_left;       /* operations not finished (in flight or parked) */
    int n_inflight;     /* operations submitted and not completed */
    bool parked[MAX_OPS];   /* a prefetch operation waiting for an idle disk */
    bool op_demand[MAX_OPS];/* the class an in-flight operation was submitted as */
    int retried;
    bool cached;        /* mapped from a policy slot (else: transient pool) */
    bool orphan;        /* a dropped prediction whose read is still in flight */
    int pf_layer;       /* read on a prediction for this model layer, not yet
                           claimed; -1 otherwise */
    char *mem;
    uint64_t done[MAX_OPS]; /* bytes completed per operation */
    uint64_t len[MAX_OPS];  /* bytes each operation reads */
    double due[MAX_OPS];    /* simulated disk: when the operation in flight finishes */
} slot;

/* A completion taken off the ring before the simulated disk would deliver it. */
typedef struct held_cqe {
    uint64_t data;
    int res;
} held_cqe;

struct df_store {
    df_xsource base;    /* the model layer's view: an expert source */
    const df_model *m;
    df_pack *pack;
    int n_ops;          /* operations per record */
    struct io_uring ring;
    bool ring_ok;
    size_t slot_bytes;
    int n_slots;
    char *arena;
    size_t arena_bytes;
    slot *slots;
    int *key_slot;      /* [L * E] -> slot or -1 */
    int L, E;
    df_cache *cache;    /* the policy, over n_cache slot numbers */
    int n_cache;
    int *cframe;        /* [n_cache] policy slot -> frame */
    /* The transient pool: the frames no policy slot maps (cached false), in
     * ascending order. They are n_slots - n_cache of them, at most top-k,
     * and they hold every frame find_slot may hand out and every prediction
     * (pf_layer >= 0: read only into frames find_slot gave, and cached only
     * after claim_prefetched cleared it), so those scans look here instead of
     * at all n_slots frames (thousands on a large model, scanned hundreds of
     * times a token). Frame order keeps the choice of a scan of every frame. */
    int *pool;
    int n_pool;
    df_prefetcher *pf;  /* NULL: prefetch off */
    int *moe_index;     /* model layer -> MoE layer index, -1 for dense */
    int *moe_layer;     /* MoE layer index -> model layer */
    char *heat_path;    /* where the heat histogram persists, or NULL */
    int32_t *slotv;     /* per request: the policy's answer */
    int32_t *ids32;
    uint8_t *hitv;
    df_store_stats st;
    /* current layer */
    int layer;
    int *want;          /* experts asked for */
    bool *handed;       /* per want index */
    int n_want, n_handed;
    int *queue;         /* want indices without a slot yet */
    int n_queue;
    int *pred;          /* scratch: a layer's predicted experts */
    uint8_t *pred_cached; /* scratch: [E] which of a layer's experts need no read */
    double last_step_t; /* when the previous forward step ended (the time gate) */
    uint64_t last_step_misses; /* st.misses then */
    int *last;          /* slots handed out by the previous df_store_next */
    int n_last;
    int st_pinned;      /* experts read in at start-up (pinned tier) */
#ifdef DF_TEST_HOOKS
    /* Fault injection for tests (DF_TEST_IO_FAULTS=short,eintr): completions
     * are reported as short reads or EINTR, as a kernel may report them. */
    bool fault_short, fault_eintr;
    uint64_t n_completions;
#endif
    int demand_inflight, pf_inflight; /* operations in flight, per class */
    df_error fail;      /* sticky error from a completion */
    bool failed;
    double sim_bps;     /* simulated disk bandwidth, bytes/s; 0: the real one */
    double sim_free;    /* when the simulated disk has served what it was given */
    held_cqe *held;     /* completions not yet due, at most one per operation */
    int n_held;
};

static inline const df_expert_inventory *store_inv(const df_store *s) { return &s->m->experts; }

/* ---- store_io.c: the read sources ---- */

/* Opens the source (the pack, or the checkpoint's safetensors files) and sets
 * n_ops and slot_bytes. */
int store_source_open(df_store *s, const df_store_opts *o, df_error *err);
/* Offsets of an expert's parts inside a slot. */
void store_part_offsets(const df_store *s, int layer, int e, size_t *off);
/* File, offset and length of operation i of a record, and where it lands in the slot. */
void store_op_geometry(const df_store *s, int layer, int e, int i, int *fd, uint64_t *foff, uint64_t *len,
                       size_t *moff);

/* ---- store_io.c: io_uring ---- */

int store_io_open(df_store *s, df_error *err);
void store_io_close(df_store *s); /* drains reads still in flight */
void store_io_submit(df_store *s); /* hands the queued reads to the kernel */
void store_submit_op(df_store *s, int si, int op, bool demand);
void store_start_read(df_store *s, int si, bool demand);
void store_pump(df_store *s);
/* Handles one completion; returns the slot that became ready, or -1. */
int store_complete(df_store *s, uint64_t d, int res);
/* The next completion to hand over: 1 with *d and *res filled, 0 when none is
 * ready (block false), or a negative errno. */
int store_next_cqe(df_store *s, bool block, uint64_t *d, int *res);
int store_wait_ready(df_store *s, int si, df_error *err);
void store_uncount(df_store *s, uint64_t d); /* the in-flight count of d's class */

/* ---- store_simdisk.c ---- */

void store_sim_open(df_store *s, double bps);
/* A read of n bytes was submitted as operation op of slot x: when it is due. */
void store_sim_submitted(df_store *s, slot *x, int op, uint64_t n);
void store_sim_hold(df_store *s, uint64_t data, int res);
/* The earliest held completion if it is due (1), else 0 and *wait: seconds until it is. */
int store_sim_take(df_store *s, uint64_t *d, int *res, double *wait);
void store_sim_drop_held(df_store *s); /* close: they have landed already */

/* ---- store_faults.c (DF_TEST_HOOKS only) ---- */

#ifdef DF_TEST_HOOKS
void store_faults_init(df_store *s);
/* The completion res of operation op of slot si as a fault would report it. */
int store_fault(df_store *s, int si, int op, int res);
#endif

#endif
