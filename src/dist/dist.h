/*
 * dist/dist.h - routed experts spread over the ranks of an MPI run (Open
 * MPI, `mpirun`): what the engine asks of this room. Start-up (MPI, what
 * every rank says of itself, the fingerprint check, the ownership plan),
 * rank 0's expert source that sends each owner its slots of a MoE layer
 * (one message per owner and layer) around its own local source, a worker
 * rank's loop, statistics and the end. The only room that includes mpi.h.
 *
 * Exactness: an owner computes a slot's expert output with the same
 * df_moe_compute as a single process, on the same input row; rank 0 files
 * it into the row's slot, and the MoE block combines in slot order as ever.
 */
#ifndef DF_DIST_H
#define DF_DIST_H

#include "kernels/kernels.h"
#include "model/experts.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct df_dist df_dist;

/* MPI_Init_thread (once per process); this rank and the ranks' count. */
int df_dist_init(df_dist **out, df_error *err);
int df_dist_rank(const df_dist *d);
int df_dist_size(const df_dist *d);
/* This rank's host (MPI_Get_processor_name). */
const char *df_dist_host(const df_dist *d);

/* What this rank brings to the plan. */
typedef struct df_dist_local {
    uint8_t fingerprint[16];  /* df_model_fingerprint */
    uint64_t cache_bytes;     /* its expert cache; all experts' bytes when resident */
    double bandwidth;         /* bytes/s its misses read at (resident: RAM) */
    bool can_predict;         /* its source takes read-ahead hints */
    bool no_experts;          /* rank 0 with --rank0-experts no */
} df_dist_local;

/* Every rank: exchanges df_dist_local (and the host names), refuses a rank
 * whose fingerprint differs from rank 0's (every rank fails, naming that
 * rank and its host), and plans who owns each (layer, expert); rank 0
 * prints the plan on stderr. The local source and the pool are this rank's
 * own. On rank 0, *src becomes the source the forward pass uses (it wraps
 * local, and closes it). timeout_s: rank 0's wait for an answer. */
int df_dist_start(df_dist *d, const df_model *m, const df_dist_local *me, df_xsource *local, df_pool *pool,
                  double timeout_s, df_xsource **src, df_error *err);

/* A worker rank's loop (not rank 0): computes the slots rank 0 sends until it
 * says quit. */
int df_dist_work(df_dist *d, df_error *err);

/* Bytes per second read from the first pack file in dir with O_DIRECT
 * (about 0.1 s or 64 MiB), 0 if it cannot tell. */
double df_dist_measure_bandwidth(const char *dir);

/* A rank's expert storage counters so far (a worker sends them with each
 * answer; rank 0 keeps each rank's latest). */
typedef struct df_dist_storage {
    uint64_t bytes_read, hits, misses;
} df_dist_storage;
typedef void (*df_dist_storage_fn)(void *ctx, df_dist_storage *o);
/* Before df_dist_start: where this rank's counters come from (none: zero). */
void df_dist_set_storage(df_dist *d, df_dist_storage_fn fn, void *ctx);

typedef struct df_dist_stats {
    int ranks;
    uint64_t bytes_sent, bytes_received, messages;
    double wait_s;
    df_dist_storage workers; /* rank 0: the other ranks' storage, summed */
} df_dist_stats;
void df_dist_get_stats(const df_dist *d, df_dist_stats *o);
/* Why a rank failed to answer (or an MPI call about it failed), NULL while
 * none has: the run is over. */
const char *df_dist_failed(const df_dist *d);

/* Rank 0 tells the workers to stop; every rank then finalizes MPI. */
void df_dist_close(df_dist *d);

/* ---- between the room's files (dist_internal) ---- */

/* (layer, expert) -> rank by weighted rendezvous hashing: rank r's score is
 * -w[r] / ln(u), u = hash(layer, expert, r) in (0, 1); ranks with w[r] <= 0
 * own nothing. owner [layers][E] (-1 on layers without experts). */
void df_dist_plan_owners(const df_config *c, const double *w, int n_ranks, int *owner);
/* Each rank's weight: w_r = C_r + t * bw_r, t = max(0, (all - sum C) / sum bw):
 * every rank's expected miss time is then the same. */
void df_dist_plan_weights(const uint64_t *cache, const double *bw, const bool *excluded, int n, uint64_t all,
                          double *w);

#endif
