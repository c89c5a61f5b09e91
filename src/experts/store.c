/*
 * store.c - the expert store (see store.h): slots, reads through io_uring, the
 * per-layer request/hand-out protocol, and eviction.
 *
 * A slot holds one expert record: gate, up and down at fixed offsets. Reading a
 * record is a few operations in flight at once: one per stripe of a pack (each
 * at the same offset in its directory's experts.bin), or one per matrix when
 * streaming from safetensors. Short reads are continued and EINTR/EAGAIN
 * retried; a pack record whose checksum does not match is read once more, then
 * it is an error naming the expert.
 */
#include "experts/store.h"

#include "experts/pack.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <xxhash.h>

#define MAX_OPS DF_PACK_MAX_STRIPES
#define RING_DEPTH 128

enum { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY };

typedef struct slot {
    int key;            /* layer * E + expert, -1 when empty */
    int state;
    int pin;            /* in use by the current layer */
    int ops_left;       /* operations still in flight */
    int retried;
    uint64_t last_use;
    char *mem;
    uint64_t done[MAX_OPS]; /* bytes completed per operation */
} slot;

struct df_store {
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
    uint64_t tick;
    df_store_stats st;
    /* current layer */
    int layer;
    int *want;          /* experts asked for */
    bool *handed;       /* per want index */
    int n_want, n_handed;
    int *queue;         /* want indices without a slot yet */
    int n_queue;
    int last_slot;      /* handed out by the previous df_store_next */
    df_error fail;      /* sticky error from a completion */
    bool failed;
};

/* ---- geometry -------------------------------------------------------------------- */

static size_t round4k(size_t n) { return (n + 4095) & ~(size_t)4095; }

static const df_expert *model_expert(const df_store *s, int layer, int e) {
    return &s->m->layers[layer].experts[e];
}

/* Offsets of gate/up/down inside a slot. */
static void part_offsets(const df_store *s, int layer, int e, size_t off[3]) {
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        for (int i = 0; i < 3; i++) off[i] = r->part[i].offset;
        return;
    }
    const df_expert *x = model_expert(s, layer, e);
    off[0] = 0;
    off[1] = round4k(x->gate.t->nbytes);
    off[2] = off[1] + round4k(x->up.t->nbytes);
}

/* File, offset and length of operation i of a record. */
static void op_geometry(const df_store *s, int layer, int e, int i, int *fd, uint64_t *foff,
                        uint64_t *len, size_t *moff) {
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        size_t sb = df_pack_stripe_bytes(r, s->n_ops);
        *fd = df_pack_fd(s->pack, i);
        *foff = r->offset;
        *len = sb;
        *moff = (size_t)i * sb;
        return;
    }
    const df_expert *x = model_expert(s, layer, e);
    const df_tensor *t = i == 0 ? x->gate.t : i == 1 ? x->up.t : x->down.t;
    size_t off[3];
    part_offsets(s, layer, e, off);
    *fd = df_st_file_fd(s->m->st, t->file);
    *foff = t->file_offset;
    *len = t->nbytes;
    *moff = off[i];
}

/* ---- open / close ------------------------------------------------------------------ */

int df_store_open(df_store **out, const df_model *m, const df_store_opts *o, df_error *err) {
    *out = NULL;
    const df_config *c = &m->cfg;
    if (c->num_experts <= 0)
        return df_fail(err, DF_ERR_ARG, "the model has no routed experts to stream");
    if (o->policy && strcmp(o->policy, "lru") != 0)
        return df_fail(err, DF_ERR_ARG, "unknown cache policy '%s'", o->policy);
    df_store *s = df_xcalloc(1, sizeof *s);
    s->m = m;
    s->L = c->num_hidden_layers;
    s->E = c->num_experts;
    s->last_slot = -1;
    int rc;
    if (o->n_pack_dirs > 0) {
        if ((rc = df_pack_open(&s->pack, o->pack_dirs, o->n_pack_dirs, m, err))) goto fail;
        s->n_ops = df_pack_stripes(s->pack);
        s->slot_bytes = df_pack_max_padded(s->pack);
    } else {
        s->n_ops = 3;
        for (int li = 0; li < s->L; li++) {
            if (!m->layers[li].is_moe) continue;
            for (int e = 0; e < s->E; e++) {
                size_t off[3];
                part_offsets(s, li, e, off);
                size_t need = off[2] + round4k(model_expert(s, li, e)->down.t->nbytes);
                if (need > s->slot_bytes) s->slot_bytes = need;
            }
        }
    }
    s->n_slots = (int)(o->cache_bytes / s->slot_bytes);
    if (s->n_slots < 1) {
        rc = df_fail(err, DF_ERR_ARG,
                     "the RAM budget leaves %.1f MiB for experts, less than one expert (%.1f MiB)",
                     (double)o->cache_bytes / 1048576.0, (double)s->slot_bytes / 1048576.0);
        goto fail;
    }
    /* never more slots than experts */
    int n_moe = 0;
    for (int li = 0; li < s->L; li++) n_moe += m->layers[li].is_moe;
    if (s->n_slots > n_moe * s->E) s->n_slots = n_moe * s->E;
    s->arena_bytes = s->slot_bytes * (size_t)s->n_slots;
    s->arena = mmap(NULL, s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->arena == MAP_FAILED) {
        s->arena = NULL;
        rc = df_fail(err, DF_ERR_NOMEM, "cannot reserve %.1f MiB for the expert cache",
                     (double)s->arena_bytes / 1048576.0);
        goto fail;
    }
    /* Huge pages: experts are streamed through at memory bandwidth, and 4 KiB
     * pages would cost a TLB miss every 4 KiB. */
    madvise(s->arena, s->arena_bytes, MADV_HUGEPAGE);
    s->slots = df_xcalloc((size_t)s->n_slots, sizeof(slot));
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].key = -1;
        s->slots[i].mem = s->arena + (size_t)i * s->slot_bytes;
    }
    s->key_slot = df_xmalloc(sizeof(int) * (size_t)s->L * (size_t)s->E);
    for (size_t i = 0; i < (size_t)s->L * (size_t)s->E; i++) s->key_slot[i] = -1;
    s->want = df_xmalloc(sizeof(int) * (size_t)s->E);
    s->handed = df_xcalloc((size_t)s->E, sizeof(bool));
    s->queue = df_xmalloc(sizeof(int) * (size_t)s->E);
    int r = io_uring_queue_init(RING_DEPTH, &s->ring, 0);
    if (r < 0) {
        rc = df_fail(err, DF_ERR_IO, "io_uring_queue_init: %s", strerror(-r));
        goto fail;
    }
    s->ring_ok = true;
    *out = s;
    return DF_OK;
fail:
    df_store_close(s);
    return rc;
}

void df_store_close(df_store *s) {
    if (!s) return;
    if (s->ring_ok) {
        /* drain reads still in flight into memory we are about to unmap */
        for (int i = 0; i < s->n_slots; i++)
            while (s->slots[i].state == SLOT_LOADING && s->slots[i].ops_left > 0) {
                struct io_uring_cqe *cqe;
                if (io_uring_wait_cqe(&s->ring, &cqe) < 0) break;
                slot *x = &s->slots[io_uring_cqe_get_data64(cqe) / MAX_OPS];
                x->ops_left--;
                io_uring_cqe_seen(&s->ring, cqe);
            }
        io_uring_queue_exit(&s->ring);
    }
    if (s->arena) munmap(s->arena, s->arena_bytes);
    if (s->pack) df_pack_close(s->pack);
    free(s->slots);
    free(s->key_slot);
    free(s->want);
    free(s->handed);
    free(s->queue);
    free(s);
}

int df_store_slots(const df_store *s) { return s->n_slots; }
size_t df_store_slot_bytes(const df_store *s) { return s->slot_bytes; }
bool df_store_direct(const df_store *s) { return s->pack && df_pack_is_direct(s->pack, 0); }
const char *df_store_source(const df_store *s) { return s->pack ? "pack" : "safetensors"; }
df_store_stats df_store_get_stats(const df_store *s) { return s->st; }

/* ---- reads ----------------------------------------------------------------------- */

static void submit_op(df_store *s, int si, int op) {
    slot *x = &s->slots[si];
    int layer = x->key / s->E, e = x->key % s->E;
    int fd;
    uint64_t foff, len;
    size_t moff;
    op_geometry(s, layer, e, op, &fd, &foff, &len, &moff);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) {
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
    }
    uint64_t d = x->done[op];
    io_uring_prep_read(sqe, fd, x->mem + moff + d, (unsigned)(len - d), foff + d);
    io_uring_sqe_set_data64(sqe, (uint64_t)si * MAX_OPS + (uint64_t)op);
}

static void start_read(df_store *s, int si) {
    slot *x = &s->slots[si];
    x->state = SLOT_LOADING;
    x->ops_left = s->n_ops;
    memset(x->done, 0, sizeof x->done);
    for (int op = 0; op < s->n_ops; op++) submit_op(s, si, op);
}

static void fail_slot(df_store *s, int si, const char *what, int errnum) {
    slot *x = &s->slots[si];
    if (s->failed) return;
    s->failed = true;
    const char *src = s->pack ? df_pack_dir(s->pack, 0) : df_st_file_path(s->m->st, 0);
    df_fail(&s->fail, DF_ERR_IO, "%s %s: layer %d expert %d: %s%s%s", s->pack ? "pack" : "checkpoint",
            src, x->key / s->E, x->key % s->E, what, errnum ? ": " : "", errnum ? strerror(errnum) : "");
}

/* Handles one completion; returns the slot that became ready, or -1. */
static int complete(df_store *s, struct io_uring_cqe *cqe) {
    uint64_t d = io_uring_cqe_get_data64(cqe);
    int si = (int)(d / MAX_OPS), op = (int)(d % MAX_OPS);
    int res = cqe->res;
    io_uring_cqe_seen(&s->ring, cqe);
    slot *x = &s->slots[si];
    int layer = x->key / s->E, e = x->key % s->E;
    int fd;
    uint64_t foff, len;
    size_t moff;
    op_geometry(s, layer, e, op, &fd, &foff, &len, &moff);
    if (res == -EINTR || res == -EAGAIN) {
        submit_op(s, si, op);
        return -1;
    }
    if (res < 0) {
        x->ops_left--;
        fail_slot(s, si, "read failed", -res);
        return -1;
    }
    if (res == 0) {
        x->ops_left--;
        fail_slot(s, si, "unexpected end of file (truncated?)", 0);
        return -1;
    }
    x->done[op] += (uint64_t)res;
    s->st.bytes_read += (uint64_t)res;
    if (x->done[op] < len) { /* short read: continue where it stopped */
        submit_op(s, si, op);
        return -1;
    }
    if (--x->ops_left > 0) return -1;
    if (s->failed) return -1;
    s->st.records_read++;
    if (s->pack) {
        const df_pack_record *r = df_pack_find(s->pack, layer, e);
        if (XXH3_64bits(x->mem, r->length) != r->xxh3) {
            if (x->retried) {
                fail_slot(s, si, "checksum mismatch (after re-reading)", 0);
                return -1;
            }
            x->retried = 1;
            s->st.rereads++;
            start_read(s, si);
            return -1;
        }
    }
    x->state = SLOT_READY;
    return si;
}

/* ---- slots and eviction ----------------------------------------------------------- */

static void drop_key(df_store *s, int si) {
    slot *x = &s->slots[si];
    if (x->key >= 0) s->key_slot[x->key] = -1;
    x->key = -1;
    x->state = SLOT_EMPTY;
}

/* A slot for a new record: an empty one, else the least recently used slot
 * that the current layer does not hold. -1 if every slot is pinned. */
static int find_slot(df_store *s) {
    int best = -1;
    for (int i = 0; i < s->n_slots; i++) {
        slot *x = &s->slots[i];
        if (x->pin || x->state == SLOT_LOADING) continue;
        if (x->state == SLOT_EMPTY) return i;
        if (best < 0 || x->last_use < s->slots[best].last_use) best = i;
    }
    return best;
}

/* Gives queued misses the slots that are free now, and submits their reads. */
static void fill_queue(df_store *s) {
    int kept = 0;
    bool any = false;
    for (int q = 0; q < s->n_queue; q++) {
        int wi = s->queue[q];
        int si = find_slot(s);
        if (si < 0) {
            s->queue[kept++] = wi;
            continue;
        }
        drop_key(s, si);
        slot *x = &s->slots[si];
        x->key = s->layer * s->E + s->want[wi];
        x->pin = 1;
        x->retried = 0;
        x->last_use = ++s->tick;
        s->key_slot[x->key] = si;
        start_read(s, si);
        any = true;
    }
    s->n_queue = kept;
    if (any) io_uring_submit(&s->ring);
}

int df_store_begin_layer(df_store *s, int layer, const int *experts, int n, df_error *err) {
    if (s->failed) {
        *err = s->fail;
        return err->code;
    }
    if (!s->m->layers[layer].is_moe || n > s->E)
        return df_fail(err, DF_ERR_ARG, "expert store: bad request for layer %d", layer);
    s->layer = layer;
    s->n_want = n;
    s->n_handed = 0;
    s->n_queue = 0;
    s->last_slot = -1;
    for (int i = 0; i < n; i++) {
        s->want[i] = experts[i];
        s->handed[i] = false;
        int si = s->key_slot[layer * s->E + experts[i]];
        s->st.requests++;
        if (si >= 0) {
            s->st.hits++;
            s->slots[si].pin = 1;
            s->slots[si].last_use = ++s->tick;
        } else {
            s->st.misses++;
            s->queue[s->n_queue++] = i;
        }
    }
    fill_queue(s);
    return DF_OK;
}

static void fill_weights(const df_store *s, int layer, int e, const slot *x, df_expert *w) {
    size_t off[3];
    part_offsets(s, layer, e, off);
    *w = *model_expert(s, layer, e);
    w->gate.data = x->mem + off[0];
    w->up.data = x->mem + off[1];
    w->down.data = x->mem + off[2];
}

int df_store_next(df_store *s, int *expert, df_expert *w, df_error *err) {
    *expert = -1;
    if (s->last_slot >= 0) { /* the caller is done with the previous one */
        s->slots[s->last_slot].pin = 0;
        s->last_slot = -1;
        if (s->n_queue) fill_queue(s);
    }
    while (s->n_handed < s->n_want) {
        if (s->failed) {
            *err = s->fail;
            return err->code;
        }
        /* reap whatever has finished without blocking */
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&s->ring, &cqe) == 0) complete(s, cqe);
        for (int i = 0; i < s->n_want; i++) {
            if (s->handed[i]) continue;
            int si = s->key_slot[s->layer * s->E + s->want[i]];
            if (si < 0 || s->slots[si].state != SLOT_READY) continue;
            s->handed[i] = true;
            s->n_handed++;
            s->last_slot = si;
            *expert = s->want[i];
            fill_weights(s, s->layer, s->want[i], &s->slots[si], w);
            return DF_OK;
        }
        if (s->failed) continue;
        /* nothing ready: block on the disk */
        io_uring_submit(&s->ring);
        double t0 = df_now();
        int r = io_uring_wait_cqe(&s->ring, &cqe);
        s->st.wait_s += df_now() - t0;
        if (r == -EINTR) continue;
        if (r < 0) return df_fail(err, DF_ERR_IO, "io_uring_wait_cqe: %s", strerror(-r));
        complete(s, cqe);
    }
    return DF_OK;
}

void df_store_end_layer(df_store *s) {
    for (int i = 0; i < s->n_want; i++) {
        int si = s->key_slot[s->layer * s->E + s->want[i]];
        if (si >= 0) s->slots[si].pin = 0;
    }
    s->last_slot = -1;
    s->n_want = s->n_handed = s->n_queue = 0;
}
