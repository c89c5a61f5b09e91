/*
 * dist/worker.c - a worker rank's loop: polls for rank 0's messages
 * (MPI_Iprobe, and a short sleep while there are none: ranks may share
 * cores), computes a LAYER's slots with its own expert source and thread
 * pool through df_moe_compute (the single-process MoE block's own code, at
 * the width and activation the model's experts use) and answers with one
 * REPLY; passes HINTs and STEPs to its source; returns on QUIT.
 */
#include "dist/internal.h"

#include "model/blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct worker {
    df_dist *d;
    df_moe_work *mw;
    uint8_t *buf;       /* the message received */
    size_t cap;
    uint8_t *reply;
    size_t rcap;
} worker;

/* A LAYER message's header and entries, checked against the model. */
static int check_layer(const worker *w, const int32_t *m, size_t bytes, df_error *err) {
    const df_config *c = &w->d->m->cfg;
    if (bytes < sizeof(int32_t) * DF_LAYER_HDR) return df_fail(err, DF_ERR_FORMAT, "a short layer message");
    int li = m[0], rows = m[1], n = m[2], H = m[3];
    if (li < 0 || li >= c->num_hidden_layers || !c->layer_is_moe[li])
        return df_fail(err, DF_ERR_FORMAT, "layer %d is not a MoE layer of this model", li);
    if (H != df_moe_width(c))
        return df_fail(err, DF_ERR_FORMAT, "rows of width %d, the experts compute at %d", H, df_moe_width(c));
    if (rows <= 0 || n <= 0 || n > rows * c->num_experts_per_tok ||
        bytes != sizeof(int32_t) * (DF_LAYER_HDR + 3 * (size_t)n) + sizeof(float) * (size_t)rows * (size_t)H)
        return df_fail(err, DF_ERR_FORMAT, "a layer message of %zu bytes for %d rows and %d entries", bytes, rows, n);
    const int32_t *en = m + DF_LAYER_HDR;
    for (int i = 0; i < n; i++)
        if (en[3 * i] < 0 || en[3 * i] >= rows || en[3 * i + 1] < 0 || en[3 * i + 1] >= c->num_experts_per_tok ||
            en[3 * i + 2] < 0 || en[3 * i + 2] >= c->num_experts)
            return df_fail(err, DF_ERR_FORMAT, "entry %d (row %d, slot %d, expert %d) is out of range", i, en[3 * i],
                           en[3 * i + 1], en[3 * i + 2]);
    return DF_OK;
}

/* Work buffers for `rows` rows at the experts' width and activation. */
static void ensure_work(worker *w, int rows) {
    const df_config *c = &w->d->m->cfg;
    if (w->mw && w->mw->rows >= rows) return;
    df_moe_work_free(w->mw);
    w->mw = df_moe_work_new(rows, df_moe_width(c), c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size);
    w->mw->act = df_act_of(c);
}

/* Computes a LAYER message's entries into the reply's outputs. */
static int compute_layer(worker *w, const int32_t *m, size_t bytes, float *out, df_error *err) {
    int rc = check_layer(w, m, bytes, err);
    if (rc) return rc;
    int li = m[0], rows = m[1], n = m[2], H = m[3], K = w->d->m->cfg.num_experts_per_tok;
    ensure_work(w, rows);
    df_moe_work *mw = w->mw;
    for (int i = 0; i < rows * K; i++) mw->lsel[i] = -1;
    const int32_t *en = m + DF_LAYER_HDR;
    for (int i = 0; i < n; i++) mw->lsel[en[3 * i] * K + en[3 * i + 1]] = en[3 * i + 2];
    const float *xin = (const float *)(en + 3 * n);
    rc = df_moe_compute(w->d->pool, w->d->local, mw, li, mw->lsel, xin, rows, NULL, NULL, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)H, mw->yslot + ((size_t)en[3 * i] * (size_t)K + (size_t)en[3 * i + 1]) * (size_t)H,
               sizeof(float) * (size_t)H);
    return DF_OK;
}

static void answer_layer(worker *w, size_t bytes) {
    const int32_t *m = (const int32_t *)w->buf;
    int n = bytes >= sizeof(int32_t) * DF_LAYER_HDR && m[2] > 0 ? m[2] : 0;
    int H = bytes >= sizeof(int32_t) * DF_LAYER_HDR && m[3] > 0 ? m[3] : 0;
    size_t need = DF_REPLY_HDR + sizeof(float) * (size_t)n * (size_t)H;
    if (need > w->rcap) w->reply = df_xrealloc(w->reply, w->rcap = need);
    df_error err = {0};
    int rc = compute_layer(w, m, bytes, (float *)(w->reply + DF_REPLY_HDR), &err);
    int32_t hdr[2] = {rc, rc ? 0 : n};
    memcpy(w->reply, hdr, sizeof hdr);
    df_dist_storage io = {0, 0, 0};
    if (w->d->storage) w->d->storage(w->d->storage_ctx, &io);
    uint64_t v[3] = {io.bytes_read, io.hits, io.misses};
    memcpy(w->reply + DF_REPLY_STORAGE, v, sizeof v);
    memset(w->reply + DF_REPLY_TEXT, 0, DF_REPLY_MSG);
    if (rc) snprintf((char *)w->reply + DF_REPLY_TEXT, DF_REPLY_MSG, "%.255s", err.msg);
    size_t len = rc ? DF_REPLY_HDR : need;
    /* rank 0 posted the receive with the LAYER message: this completes */
    MPI_Send(w->reply, (int)len, MPI_BYTE, 0, DF_TAG_REPLY, MPI_COMM_WORLD);
    w->d->st.bytes_sent += len;
    w->d->st.bytes_received += bytes;
    w->d->st.messages += 2;
}

static void take_hint(worker *w, size_t bytes) {
    const int32_t *m = (const int32_t *)w->buf;
    df_xsource *src = w->d->local;
    const df_config *c = &w->d->m->cfg;
    if (bytes < 2 * sizeof(int32_t) || !src->ops->predict) return;
    int li = m[0], n = m[1];
    if (li < 0 || li >= c->num_hidden_layers || !c->layer_is_moe[li] || n <= 0 ||
        bytes != sizeof(int32_t) * (2 + (size_t)n))
        return;
    for (int i = 0; i < n; i++)
        if (m[2 + i] < 0 || m[2 + i] >= c->num_experts) return;
    src->ops->predict(src, li, m + 2, n);
}

int df_dist_work(df_dist *d, df_error *err) {
    if (d->rank == 0) return df_fail(err, DF_ERR_ARG, "rank 0 runs the model: it is not a worker");
    worker w = {.d = d};
    /* Short naps while rank 0 is evaluating (its next layer comes within
     * milliseconds), long ones once it has been quiet for a while (a server
     * between requests). */
    double idle_since = df_now();
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (!flag) {
            df_dist_nap(df_now() - idle_since < 0.2 ? 20 : 1000);
            continue;
        }
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if ((size_t)count + 4 > w.cap) w.buf = df_xrealloc(w.buf, w.cap = (size_t)count + 4);
        MPI_Recv(w.buf, count, MPI_BYTE, 0, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (st.MPI_TAG == DF_TAG_QUIT) break;
        if (st.MPI_TAG == DF_TAG_LAYER) answer_layer(&w, (size_t)count);
        else if (st.MPI_TAG == DF_TAG_HINT) take_hint(&w, (size_t)count);
        else if (st.MPI_TAG == DF_TAG_STEP && count == (int)sizeof(int32_t))
            d->local->ops->end_step(d->local, ((const int32_t *)w.buf)[0]);
        idle_since = df_now();
    }
    df_moe_work_free(w.mw);
    free(w.buf);
    free(w.reply);
    return DF_OK;
}
