/*
 * store_io.c - how the expert store reads a record: the two read sources and
 * the io_uring path.
 *
 * A record is a few operations in flight at once: one per stripe of a pack
 * (each at the same offset in its directory's experts.bin, opened O_DIRECT:
 * records, stripes and their offsets are 4 KiB multiples, and so are the slot
 * frames) or one per matrix when streaming from safetensors (buffered reads,
 * each matrix at a 4 KiB-rounded offset in the slot). Short reads are
 * continued and EINTR/EAGAIN retried; a pack record whose checksum does not
 * match is read once more, then it is an error naming the expert.
 *
 * Demand reads are submitted at once; prefetch reads are parked and go in
 * small pieces only while no demand read is in flight (store_pump), so a
 * demand read never queues behind a whole predicted record.
 */
#include "experts/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>

#define RING_DEPTH 128
/* Prefetch pieces: a demand read waits behind at most PF_INFLIGHT of them
 * (the sizes were measured: docs/expert-store.md, "The read path"). */
#define PF_CHUNK ((uint64_t)1 << 18)
#define PF_INFLIGHT 2
/* A blocking wait polls this long before it sleeps: a sleeping thread woke
 * late when its read landed (docs/expert-store.md, "The read path"). */
#define IO_SPIN_S 0.010

/* ---- the read sources ------------------------------------------------------------ */
/* Everything that looks inside a pack record or at the safetensors matrices of
 * an expert is in this section. */

static size_t round4k(size_t n) { return (n + 4095) & ~(size_t)4095; }

void store_part_offsets(const df_store *s, int layer, int e, size_t *off) {
    int np = store_inv(s)->layout->n_parts;
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        for (int i = 0; i < np; i++) off[i] = r->part[i].offset;
        return;
    }
    off[0] = 0;
    for (int i = 1; i < np; i++) off[i] = off[i - 1] + round4k(df_expert_part(store_inv(s), layer, e, i - 1)->nbytes);
}

void store_op_geometry(const df_store *s, int layer, int e, int i, int *fd, uint64_t *foff, uint64_t *len,
                       size_t *moff) {
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        size_t sb = df_pack_stripe_bytes(r, s->n_ops);
        *fd = df_pack_fd(s->pack, i);
        *foff = r->offset;
        *len = sb;
        *moff = (size_t)i * sb;
        return;
    }
    const df_tensor *t = df_expert_part(store_inv(s), layer, e, i);
    size_t off[DF_EXPERT_MAX_PARTS];
    store_part_offsets(s, layer, e, off);
    *fd = df_st_file_fd(s->m->st, t->file);
    *foff = t->file_offset;
    *len = t->nbytes;
    *moff = off[i];
}

/* A pack record's checksum against what was read; safetensors have none. */
static bool record_intact(const df_store *s, int layer, int e, const char *mem) {
    if (!s->pack) return true;
    const df_pack_record *r = df_pack_find(s->pack, layer, e);
    return XXH3_64bits(mem, r->length) == r->xxh3;
}

int store_source_open(df_store *s, const df_store_opts *o, df_error *err) {
    if (o->n_pack_dirs > 0) {
        df_pack_ckpt ck = {NULL, &s->m->cfg, s->m->st, &s->m->experts};
        int rc = df_pack_open(&s->pack, o->pack_dirs, o->n_pack_dirs, &ck, err);
        if (rc) return rc;
        s->n_ops = df_pack_stripes(s->pack);
        s->slot_bytes = df_pack_max_padded(s->pack);
        return DF_OK;
    }
    int np = store_inv(s)->layout->n_parts;
    s->n_ops = np;
    for (int li = 0; li < s->L; li++) {
        if (!s->m->cfg.layer_is_moe[li]) continue;
        for (int e = 0; e < s->E; e++) {
            size_t off[DF_EXPERT_MAX_PARTS];
            store_part_offsets(s, li, e, off);
            size_t need = off[np - 1] + round4k(df_expert_part(store_inv(s), li, e, np - 1)->nbytes);
            if (need > s->slot_bytes) s->slot_bytes = need;
        }
    }
    return DF_OK;
}

static void fail_slot(df_store *s, int si, const char *what, int errnum) {
    slot *x = &s->slots[si];
    if (s->failed) return;
    s->failed = true;
    const char *src = s->pack ? df_pack_dir(s->pack, 0) : df_st_file_path(s->m->st, 0);
    df_fail(&s->fail, DF_ERR_IO, "%s %s: layer %d expert %d: %s%s%s", s->pack ? "pack" : "checkpoint",
            src, x->key / s->E, x->key % s->E, what, errnum ? ": " : "", errnum ? strerror(errnum) : "");
}

/* ---- submission ------------------------------------------------------------------ */

int store_io_open(df_store *s, df_error *err) {
    int r = io_uring_queue_init(RING_DEPTH, &s->ring, 0);
    if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_queue_init: %s", strerror(-r));
    s->ring_ok = true;
    return DF_OK;
}

void store_io_close(df_store *s) {
    if (!s->ring_ok) return;
    /* drain reads still in flight into memory we are about to unmap
     * (the simulated disk's held ones have landed already) */
    io_uring_submit(&s->ring);
    store_sim_drop_held(s);
    while (s->demand_inflight + s->pf_inflight > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&s->ring, &cqe) < 0) break;
        store_uncount(s, io_uring_cqe_get_data64(cqe));
        io_uring_cqe_seen(&s->ring, cqe);
    }
    io_uring_queue_exit(&s->ring);
}

void store_io_submit(df_store *s) { io_uring_submit(&s->ring); }

/* Submits (the rest of) operation op of slot si; a prefetch only one piece. */
void store_submit_op(df_store *s, int si, int op, bool demand) {
    slot *x = &s->slots[si];
    int layer = x->key / s->E, e = x->key % s->E;
    int fd;
    uint64_t foff, len;
    size_t moff;
    store_op_geometry(s, layer, e, op, &fd, &foff, &len, &moff);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) {
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
    }
    uint64_t d = x->done[op];
    x->len[op] = len;
    uint64_t n = len - d;
    if (!demand && n > PF_CHUNK) n = PF_CHUNK;
    io_uring_prep_read(sqe, fd, x->mem + moff + d, (unsigned)n, foff + d);
    io_uring_sqe_set_data64(sqe, (uint64_t)si * MAX_OPS + (uint64_t)op);
    if (s->sim_bps > 0) store_sim_submitted(s, x, op, n);
    x->parked[op] = false;
    x->op_demand[op] = demand;
    x->n_inflight++;
    if (demand) s->demand_inflight++;
    else s->pf_inflight++;
}

/* A demand read is submitted now; a prefetch is parked until store_pump()
 * finds the disk free of demand reads. */
void store_start_read(df_store *s, int si, bool demand) {
    slot *x = &s->slots[si];
    x->state = SLOT_LOADING;
    x->ops_left = s->n_ops;
    memset(x->done, 0, sizeof x->done);
    for (int op = 0; op < s->n_ops; op++) {
        if (demand) store_submit_op(s, si, op, true);
        else x->parked[op] = true;
    }
}

/* Low-priority reads: while no demand read is in flight, keep up to
 * PF_INFLIGHT prefetch pieces going, nearest layer first. */
void store_pump(df_store *s) {
    bool any = false;
    while (s->demand_inflight == 0 && s->pf_inflight < PF_INFLIGHT) {
        int best = -1, best_op = -1;
        for (int p = 0; p < s->n_pool; p++) { /* predictions are in the pool */
            int i = s->pool[p];
            const slot *x = &s->slots[i];
            if (x->pf_layer < 0 || x->orphan || x->state != SLOT_LOADING) continue;
            if (best >= 0 && x->pf_layer >= s->slots[best].pf_layer) continue;
            for (int op = 0; op < s->n_ops; op++)
                if (x->parked[op]) {
                    best = i;
                    best_op = op;
                    break;
                }
        }
        if (best < 0) break;
        store_submit_op(s, best, best_op, false);
        any = true;
    }
    if (any) io_uring_submit(&s->ring);
}

/* ---- completion ------------------------------------------------------------------ */

void store_uncount(df_store *s, uint64_t d) {
    if (s->slots[d / MAX_OPS].op_demand[d % MAX_OPS]) s->demand_inflight--;
    else s->pf_inflight--;
}

/* A completion for a dropped prediction: its bytes are waste, and the frame
 * is free once its last piece has landed. */
static void complete_orphan(df_store *s, slot *x, int res) {
    if (res > 0) {
        s->st.bytes_read += (uint64_t)res;
        s->st.prefetch_bytes_wasted += (uint64_t)res;
    }
    if (x->n_inflight == 0) {
        x->orphan = false;
        x->state = SLOT_EMPTY;
    }
}

/* The whole record has arrived: ready, or (a bad checksum) read once more. */
static int complete_record(df_store *s, int si, bool demand) {
    slot *x = &s->slots[si];
    s->st.records_read++;
    if (!record_intact(s, x->key / s->E, x->key % s->E, x->mem)) {
        if (x->retried) {
            fail_slot(s, si, "checksum mismatch (after re-reading)", 0);
            return -1;
        }
        x->retried = 1;
        s->st.rereads++;
        store_start_read(s, si, demand);
        return -1;
    }
    x->state = SLOT_READY;
    return si;
}

int store_complete(df_store *s, uint64_t d, int res) {
    int si = (int)(d / MAX_OPS), op = (int)(d % MAX_OPS);
    slot *x = &s->slots[si];
#ifdef DF_TEST_HOOKS
    res = store_fault(s, si, op, res); /* injected short reads and EINTR */
#endif
    x->n_inflight--;
    if (x->op_demand[op]) s->demand_inflight--;
    else s->pf_inflight--;
    if (x->orphan) { /* nobody wants this record any more: let the frame go */
        complete_orphan(s, x, res);
        return -1;
    }
    bool demand = x->pf_layer < 0;
    if (res == -EINTR || res == -EAGAIN) {
        if (demand) store_submit_op(s, si, op, true);
        else x->parked[op] = true;
        return -1;
    }
    if (res <= 0) {
        x->ops_left--;
        if (res < 0) fail_slot(s, si, "read failed", -res);
        else fail_slot(s, si, "unexpected end of file (truncated?)", 0);
        return -1;
    }
    x->done[op] += (uint64_t)res;
    s->st.bytes_read += (uint64_t)res;
    if (!x->op_demand[op] && demand) s->st.prefetch_bytes_used += (uint64_t)res; /* claimed since */
    if (x->done[op] < x->len[op]) { /* short read or a prefetch piece: continue */
        if (demand) store_submit_op(s, si, op, true);
        else x->parked[op] = true;
        return -1;
    }
    if (--x->ops_left > 0) return -1;
    if (s->failed) return -1;
    return complete_record(s, si, demand);
}

int store_next_cqe(df_store *s, bool block, uint64_t *d, int *res) {
    double spin_until = block ? df_now() + IO_SPIN_S : 0;
    for (;;) {
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            int r = cqe->res;
            io_uring_cqe_seen(&s->ring, cqe);
            if (s->sim_bps <= 0) {
                *d = data;
                *res = r;
                return 1;
            }
            store_sim_hold(s, data, r); /* handed over when the simulated disk is done */
        }
        double wait = 0;
        if (s->n_held && store_sim_take(s, d, res, &wait)) return 1;
        if (!block) return 0;
        if (df_now() < spin_until) continue; /* poll a while before sleeping */
        int r;
        if (s->n_held) { /* sleep until it is due, or until the real disk delivers another */
            struct __kernel_timespec ts = {.tv_sec = (long long)wait,
                                           .tv_nsec = (long long)((wait - (double)(long long)wait) * 1e9)};
            r = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
            if (r == -ETIME) continue;
        } else {
            r = io_uring_wait_cqe(&s->ring, &cqe);
        }
        if (r < 0 && r != -EINTR) return r;
    }
}

int store_wait_ready(df_store *s, int si, df_error *err) {
    io_uring_submit(&s->ring);
    while (s->slots[si].state != SLOT_READY) {
        if (s->failed) {
            *err = s->fail;
            return err->code;
        }
        uint64_t d;
        int res, r = store_next_cqe(s, true, &d, &res);
        if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_wait_cqe: %s", strerror(-r));
        store_complete(s, d, res);
    }
    return DF_OK;
}
