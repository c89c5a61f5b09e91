/*
 * dist/internal.h - what the files of src/dist/ share: the run's state
 * (struct df_dist), the message tags and layouts, rank 0's source
 * (xsource.c) and the worker's loop (worker.c). Not seen outside src/dist/.
 *
 * Messages, all MPI_BYTE on MPI_COMM_WORLD between rank 0 and one owner:
 *   LAYER  0 -> owner: int32 {layer, rows, entries, H, 0, 0}, then int32
 *          {row, slot, expert} per entry (row: index among the rows sent),
 *          then the rows' input vectors, float [rows][H].
 *   REPLY  owner -> 0, one per LAYER: int32 {status, entries}, uint64
 *          {bytes read, hits, misses} (the owner's expert storage so far),
 *          char [256] the error message (status != 0), then float
 *          [entries][H]: each entry's unweighted expert output, in the
 *          LAYER's entry order.
 *   HINT   0 -> owner: int32 {layer, n, expert ids...}: a read-ahead
 *          prediction of the owner's experts of a later layer.
 *   STEP   0 -> owner: int32 {rows}: a forward pass ended (cache policy).
 *   QUIT   0 -> owner: int32 {0}: rank 0 closed its engine.
 */
#ifndef DF_DIST_INTERNAL_H
#define DF_DIST_INTERNAL_H

#include "dist/dist.h"

#include <mpi.h>

enum { DF_TAG_LAYER = 101, DF_TAG_REPLY, DF_TAG_HINT, DF_TAG_STEP, DF_TAG_QUIT };

#define DF_LAYER_HDR 6
#define DF_REPLY_MSG 256
#define DF_REPLY_STORAGE (2 * sizeof(int32_t))
#define DF_REPLY_TEXT (DF_REPLY_STORAGE + 3 * sizeof(uint64_t))
#define DF_REPLY_HDR (DF_REPLY_TEXT + DF_REPLY_MSG)
#define DF_HOST_MAX 256

typedef struct df_dist_peer {
    df_dist_local l;
    char host[DF_HOST_MAX];
} df_dist_peer;

struct df_dist {
    int rank, size;
    char host[DF_HOST_MAX]; /* this rank's */
    bool agreed;           /* every rank passed the start-up exchange: finalize at close */
    bool started;          /* ... and planned: rank 0 sends quit at close */
    bool failed;           /* a rank failed to answer: nothing more is sent */
    char why[1024];        /* ... the error that said so */
    df_dist_peer *ranks;   /* [size] */
    const df_model *m;
    int *owner;            /* [layers][E] */
    df_xsource *local;     /* this rank's own source */
    df_pool *pool;
    double timeout_s;
    df_dist_stats st;
    df_dist_storage_fn storage;  /* this rank's storage counters */
    void *storage_ctx;
    df_dist_storage *peer_storage; /* rank 0: [size] each rank's latest */
    struct df_dist_out {
        MPI_Request req;
        int32_t *buf;
    } *out;                /* small sends still out */
    int n_out, cap_out;
};

/* Rank 0's source around its own (xsource.c). */
df_xsource *df_dist_xsource(df_dist *d);
/* Sends len bytes to rank `to` and keeps the buffer until it has gone
 * (small messages: hints, steps, quit); xsource.c reaps them. */
void df_dist_send_small(df_dist *d, int to, int tag, const int32_t *v, int n);
/* Waits (polling, at most timeout_s) for the small sends still out. */
void df_dist_flush_small(df_dist *d);
/* Sleeps a little between polls (never spins a core). */
void df_dist_nap(int us);

#endif
