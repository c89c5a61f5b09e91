/*
 * dist/xsource.c - rank 0's expert source in an MPI run: around rank 0's own
 * source (which it passes begin_layer, next, end_layer through to, for the
 * experts rank 0 owns), remote_begin sends each other owner one message for
 * the MoE layer (its (row, slot, expert) entries and the distinct rows'
 * inputs, MPI_Isend) and posts the receive of its answer; remote_end waits
 * for the answers (MPI_Test polling, at most the rank timeout) and files
 * each entry's output into its slot. Read-ahead predictions go to the
 * expert's owner as a hint; the end of a forward pass goes to every owner.
 */
#include "dist/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct peer {
    int32_t *sbuf;      /* the LAYER message */
    size_t scap;        /* in int32 */
    uint8_t *rbuf;      /* the REPLY */
    size_t rcap;
    int *ent;           /* [entries] row * K + slot in the layer's slots */
    int n_ent, cap_ent;
    MPI_Request sreq, rreq;
    bool active, sent_done, recv_done;
} peer;

typedef struct dsrc {
    df_xsource base;
    df_dist *d;
    peer *peers;        /* [size]; [0] unused */
    int layer, H;
    int *row_of;        /* [T] a row's index in a peer's message, -1: none */
    int cap_rows;
    int *hint;          /* [2 + E] */
} dsrc;

static df_xsource *inner(df_xsource *s) { return ((dsrc *)s)->d->local; }

static int ds_begin(df_xsource *s, int layer, const int *experts, int n, df_error *err) {
    return inner(s)->ops->begin_layer(inner(s), layer, experts, n, err);
}
static int ds_next(df_xsource *s, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err) {
    return inner(s)->ops->next(inner(s), cap, ids, w, n_out, err);
}
static void ds_end_layer(df_xsource *s) { inner(s)->ops->end_layer(inner(s)); }

static void ds_end_step(df_xsource *s, int rows) {
    dsrc *x = (dsrc *)s;
    inner(s)->ops->end_step(inner(s), rows);
    int32_t v = rows;
    for (int r = 1; r < x->d->size; r++) df_dist_send_small(x->d, r, DF_TAG_STEP, &v, 1);
}

static bool any_remote_predicts(const df_dist *d) {
    for (int r = 1; r < d->size; r++)
        if (d->ranks[r].l.can_predict) return true;
    return false;
}

static int ds_depth(df_xsource *s) {
    df_xsource *in = inner(s);
    int depth = in->ops->lookahead_depth ? in->ops->lookahead_depth(in) : 0;
    return depth > 0 ? depth : any_remote_predicts(((dsrc *)s)->d) ? 1 : 0;
}

/* Rank 0's own experts of the prediction to its source, each other owner's
 * to that owner (a HINT), when it reads ahead. */
static void ds_predict(df_xsource *s, int layer, const int *sel, int n) {
    dsrc *x = (dsrc *)s;
    df_dist *d = x->d;
    int E = d->m->cfg.num_experts;
    const int *own = d->owner + (size_t)layer * (size_t)E;
    for (int r = 0; r < d->size; r++) {
        if (r > 0 && !d->ranks[r].l.can_predict) continue;
        int k = 0;
        int32_t *h = x->hint;
        bool seen[E];
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < n; i++)
            if (sel[i] >= 0 && sel[i] < E && own[sel[i]] == r && !seen[sel[i]]) h[2 + k++] = sel[i], seen[sel[i]] = true;
        if (!k) continue;
        if (r == 0) {
            df_xsource *in = inner(s);
            if (in->ops->predict) in->ops->predict(in, layer, h + 2, k);
            continue;
        }
        h[0] = layer, h[1] = k;
        df_dist_send_small(d, r, DF_TAG_HINT, h, 2 + k);
    }
}

static void ds_close(df_xsource *s) {
    dsrc *x = (dsrc *)s;
    inner(s)->ops->close(inner(s));
    for (int r = 0; r < x->d->size; r++) free(x->peers[r].sbuf), free(x->peers[r].rbuf), free(x->peers[r].ent);
    free(x->peers);
    free(x->row_of);
    free(x->hint);
    free(x);
}

/* Peer r's entries of the layer (rows numbered in the order they appear)
 * into its LAYER message; its slots set to -1 in sel. */
static void build_message(dsrc *x, peer *p, int r, int layer, const float *xin, int *sel, int T, int K, int H) {
    const df_dist *d = x->d;
    int E = d->m->cfg.num_experts;
    const int *own = d->owner + (size_t)layer * (size_t)E;
    int n_rows = 0;
    p->n_ent = 0;
    for (int t = 0; t < T; t++) {
        x->row_of[t] = -1;
        for (int k = 0; k < K; k++) {
            int e = sel[t * K + k];
            if (e < 0 || own[e] != r) continue;
            if (x->row_of[t] < 0) x->row_of[t] = n_rows++;
            if (p->n_ent == p->cap_ent) {
                p->cap_ent = p->cap_ent ? 2 * p->cap_ent : 64;
                p->ent = df_xrealloc(p->ent, sizeof(int) * (size_t)p->cap_ent);
            }
            p->ent[p->n_ent++] = t * K + k;
        }
    }
    if (!p->n_ent) return;
    size_t words = DF_LAYER_HDR + 3 * (size_t)p->n_ent + (size_t)n_rows * (size_t)H;
    if (words > p->scap) p->sbuf = df_xrealloc(p->sbuf, sizeof(int32_t) * (p->scap = words));
    int32_t *m = p->sbuf;
    m[0] = layer, m[1] = n_rows, m[2] = p->n_ent, m[3] = H, m[4] = m[5] = 0;
    int32_t *en = m + DF_LAYER_HDR;
    for (int i = 0; i < p->n_ent; i++) {
        int t = p->ent[i] / K, k = p->ent[i] % K;
        en[3 * i] = x->row_of[t], en[3 * i + 1] = k, en[3 * i + 2] = sel[p->ent[i]];
        sel[p->ent[i]] = -1;
    }
    float *rows = (float *)(en + 3 * p->n_ent);
    for (int t = 0; t < T; t++)
        if (x->row_of[t] >= 0)
            memcpy(rows + (size_t)x->row_of[t] * (size_t)H, xin + (size_t)t * (size_t)H, sizeof(float) * (size_t)H);
}

/* An MPI call about rank r failed: the run ends, naming it. */
static int mpi_failed(df_dist *d, int r, int layer, int mrc, df_error *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", mrc);
    d->failed = true;
    int rc = df_fail(err, DF_ERR_IO, "rank %d on %s, MoE layer %d: MPI: %s", r, d->ranks[r].host, layer, msg);
    snprintf(d->why, sizeof d->why, "%s", err->msg);
    return rc;
}

static int ds_remote_begin(df_xsource *s, int layer, const float *xin, int *sel, int T, int K, int H,
                           df_error *err) {
    dsrc *x = (dsrc *)s;
    df_dist *d = x->d;
    if (d->failed) return df_fail(err, DF_ERR_IO, "experts by rank: a rank failed earlier in this run");
    if (T > x->cap_rows) x->row_of = df_xrealloc(x->row_of, sizeof(int) * (size_t)(x->cap_rows = T));
    x->layer = layer, x->H = H;
    for (int r = 1; r < d->size; r++) {
        peer *p = &x->peers[r];
        build_message(x, p, r, layer, xin, sel, T, K, H);
        p->active = p->n_ent > 0;
        if (!p->active) continue;
        size_t sbytes = sizeof(int32_t) * (DF_LAYER_HDR + 3 * (size_t)p->n_ent) +
                        sizeof(float) * (size_t)p->sbuf[1] * (size_t)H;
        size_t rbytes = DF_REPLY_HDR + sizeof(float) * (size_t)p->n_ent * (size_t)H;
        if (rbytes > p->rcap) p->rbuf = df_xrealloc(p->rbuf, p->rcap = rbytes);
        int mrc = MPI_Irecv(p->rbuf, (int)rbytes, MPI_BYTE, r, DF_TAG_REPLY, MPI_COMM_WORLD, &p->rreq);
        if (mrc == MPI_SUCCESS)
            mrc = MPI_Isend(p->sbuf, (int)sbytes, MPI_BYTE, r, DF_TAG_LAYER, MPI_COMM_WORLD, &p->sreq);
        if (mrc != MPI_SUCCESS) return mpi_failed(d, r, layer, mrc, err);
        p->sent_done = p->recv_done = false;
        d->st.bytes_sent += sbytes;
        d->st.messages++;
    }
    return DF_OK;
}

/* Files peer r's answer into yslot, or fails naming the rank. */
static int take_reply(dsrc *x, int r, float *yslot, df_error *err) {
    peer *p = &x->peers[r];
    int32_t hdr[2];
    memcpy(hdr, p->rbuf, sizeof hdr);
    const char *host = x->d->ranks[r].host;
    uint64_t v[3];
    memcpy(v, p->rbuf + DF_REPLY_STORAGE, sizeof v);
    x->d->peer_storage[r] = (df_dist_storage){v[0], v[1], v[2]};
    if (hdr[0]) {
        char msg[DF_REPLY_MSG];
        memcpy(msg, p->rbuf + DF_REPLY_TEXT, sizeof msg);
        msg[sizeof msg - 1] = 0;
        return df_fail(err, hdr[0], "rank %d on %s, MoE layer %d: %s", r, host, x->layer, msg);
    }
    if (hdr[1] != p->n_ent)
        return df_fail(err, DF_ERR_FORMAT, "rank %d on %s answered MoE layer %d with %d outputs, not %d", r, host,
                       x->layer, hdr[1], p->n_ent);
    const float *out = (const float *)(p->rbuf + DF_REPLY_HDR);
    size_t H = (size_t)x->H;
    for (int i = 0; i < p->n_ent; i++) memcpy(yslot + (size_t)p->ent[i] * H, out + (size_t)i * H, sizeof(float) * H);
    x->d->st.bytes_received += DF_REPLY_HDR + sizeof(float) * (size_t)p->n_ent * H;
    x->d->st.messages++;
    return DF_OK;
}

static int ds_remote_end(df_xsource *s, float *yslot, df_error *err) {
    dsrc *x = (dsrc *)s;
    df_dist *d = x->d;
    double t0 = df_now(), end = t0 + d->timeout_s;
    int rc = DF_OK;
    for (;;) {
        bool pending = false, progress = false;
        for (int r = 1; r < d->size; r++) {
            peer *p = &x->peers[r];
            if (!p->active) continue;
            int flag = 0, mrc = MPI_SUCCESS;
            if (!p->sent_done && (mrc = MPI_Test(&p->sreq, &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && flag)
                p->sent_done = progress = true;
            flag = 0;
            if (mrc == MPI_SUCCESS && !p->recv_done)
                mrc = MPI_Test(&p->rreq, &flag, MPI_STATUS_IGNORE);
            if (mrc != MPI_SUCCESS) {
                rc = mpi_failed(d, r, x->layer, mrc, err);
                break;
            }
            if (!p->recv_done && flag) {
                p->recv_done = progress = true;
                int rrc = take_reply(x, r, yslot, err);
                if (rrc && !rc) rc = rrc;
            }
            pending |= !(p->sent_done && p->recv_done);
        }
        if (!pending || d->failed) break;
        if (df_now() > end) {
            for (int r = 1; r < d->size; r++)
                if (x->peers[r].active && !(x->peers[r].sent_done && x->peers[r].recv_done)) {
                    d->failed = true;
                    rc = df_fail(err, DF_ERR_IO, "rank %d on %s did not answer MoE layer %d within %g s", r,
                                 d->ranks[r].host, x->layer, d->timeout_s);
                    snprintf(d->why, sizeof d->why, "%s", err->msg);
                    break;
                }
            break;
        }
        if (!progress) df_dist_nap(20);
    }
    d->st.wait_s += df_now() - t0;
    return rc;
}

static const df_xsource_ops DIST_OPS = {ds_begin, ds_next, ds_end_layer, ds_end_step, ds_depth, ds_predict,
                                        ds_close, ds_remote_begin, ds_remote_end};

df_xsource *df_dist_xsource(df_dist *d) {
    dsrc *x = df_xcalloc(1, sizeof *x);
    x->base.ops = &DIST_OPS;
    x->d = d;
    x->peers = df_xcalloc((size_t)d->size, sizeof *x->peers);
    x->hint = df_xmalloc(sizeof(int32_t) * (size_t)(2 + d->m->cfg.num_experts));
    return &x->base;
}
