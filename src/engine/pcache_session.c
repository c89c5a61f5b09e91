/*
 * engine/pcache_session.c - the prompt cache for sessions (deltafin.h,
 * "prompt cache"): restoring the longest cached
 * prefix of a prompt into a session (the chain of segments from the root up)
 * and storing a session's state at a position as the segment after the
 * longest cached prefix of its tokens. The files and the RAM tier are
 * pcache.c's; the model's fingerprint is model/fingerprint.c's.
 */
#include "engine/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <time.h>
#include <xxhash.h>

int df_engine_setup_pcache(df_engine *e, const df_engine_opts *o, df_error *err) {
    if (!o->prompt_cache || !*o->prompt_cache) return DF_OK;
    if (o->prompt_cache_every < 0)
        return df_fail(err, DF_ERR_ARG, "prompt cache: interval %d is negative", o->prompt_cache_every);
    uint8_t fp[16];
    int rc = df_model_fingerprint(&e->model, o->model_dir, fp, err);
    if (rc) return rc;
    e->pc_every = o->prompt_cache_every ? o->prompt_cache_every : DF_PC_DEFAULT_EVERY;
    return df_pcache_open(&e->pcache, o->prompt_cache, o->prompt_cache_size, o->prompt_cache_ram, fp, err);
}

int df_prompt_cache_interval(const df_engine *e) { return e->pcache ? e->pc_every : 0; }

int df_session_cache_interval(const df_session *s) {
    if (!s->eng->pcache) return 0;
    /* Every segment carries a recurrent state whole: at least as many rows as
     * that takes, so that a long prompt writes at most about twice its state. */
    uint64_t fixed = df_seq_seg_bytes(s->seq, 0, 0), row = df_seq_seg_bytes(s->seq, 0, 1) - fixed;
    uint64_t rows = row ? (fixed + row - 1) / row : 0;
    return rows > (uint64_t)s->eng->pc_every ? (rows > INT32_MAX ? INT32_MAX : (int)rows) : s->eng->pc_every;
}

void df_engine_pcache_stats(const df_engine *e, df_stats *o) {
    if (!e->pcache) return;
    const df_pc_stats *s = df_pcache_stats(e->pcache);
    o->pcache_hits = s->hits;
    o->pcache_misses = s->misses;
    o->pcache_tokens = s->tokens;
    o->pcache_bytes_read = s->bytes_read;
    o->pcache_bytes_written = s->bytes_written;
    o->pcache_evicted = s->evicted;
    o->pcache_ram_hits = s->ram_hits;
    o->pcache_ram_bytes = s->ram_bytes;
    o->pcache_writes_off = s->writes_off;
    o->pcache_restore_s = s->restore_s;
    o->pcache_store_s = s->store_s;
}

/* ---- restoring ------------------------------------------------------------------------------ */

#define MAX_CHAIN 4096

typedef struct chain {
    int q[MAX_CHAIN], from[MAX_CHAIN];
    df_pc_key key[MAX_CHAIN];
    int n;
} chain;

/* The links from the segment of q (under key) down to one that starts at or
 * below `at`; false when one is missing. */
static bool find_chain(df_pcache *pc, const int32_t *ids, int q, df_pc_key key, int at, chain *c) {
    c->n = 0;
    for (;;) {
        df_pc_head h;
        if (c->n == MAX_CHAIN || !df_pcache_head(pc, q, &key, &h)) return false;
        c->q[c->n] = q, c->from[c->n] = (int)h.from, c->key[c->n++] = key;
        if ((int)h.from <= at) return true;
        q = (int)h.from;
        key = df_pcache_key(pc, ids, q);
    }
}

/* Marks a chain used from its leaf to its root: the root, which every later
 * link needs, is then the most recent and goes last. */
static void touch_chain(df_pcache *pc, const chain *c, int from) {
    for (int i = from; i < c->n; i++) df_pcache_touch(pc, c->q[i], &c->key[i]);
}

/* Loads the chain's segments from the root up; stops at one that cannot be
 * had (the session is then at the last one loaded). */
static void load_chain(df_session *s, const chain *c, const int32_t *ids) {
    df_pcache *pc = s->eng->pcache;
    df_seq *seq = s->seq;
    df_seq_layer_desc layout[seq->n_layers];
    df_seq_layout(seq, layout);
    for (int i = c->n - 1; i >= 0; i--) {
        int q = c->q[i], from = c->from[i];
        const df_pc_blob *b = df_pcache_get(pc, q, &c->key[i], ids, layout, seq->n_layers,
                                            df_seq_seg_bytes(seq, from, q));
        if (!b) {
            touch_chain(pc, c, i + 1);
            return;
        }
        df_seq_load(seq, from, q, b->payload);
        memcpy(s->tokens, ids, sizeof(int32_t) * (size_t)q);
        df_pcache_release(pc, b);
    }
    touch_chain(pc, c, 0);
}

int df_session_cache_restore(df_session *s, const int32_t *prompt, int lim, df_error *err) {
    df_pcache *pc = s->eng->pcache;
    int at = s->seq->pos;
    if (lim > s->max_ctx) lim = s->max_ctx;
    if (!pc || lim <= at) return at;
    if (memcmp(s->tokens, prompt, sizeof(int32_t) * (size_t)at)) {
        df_fail(err, DF_ERR_ARG, "restoring a prompt: the session holds other tokens than its start");
        return -1;
    }
    int *qs, n;
    df_pc_key *keys;
    double t0 = df_now();
    df_pcache_list(pc, at, lim, &qs, &keys, &n);
    chain *c = df_xmalloc(sizeof *c);
    int lastq = -1;
    df_pc_key want;
    for (int i = 0; i < n && s->seq->pos == at; i++) {
        if (qs[i] != lastq) want = df_pcache_key(pc, prompt, lastq = qs[i]);
        if (memcmp(want.b, keys[i].b, 16) || !find_chain(pc, prompt, qs[i], want, at, c)) continue;
        load_chain(s, c, prompt);
    }
    free(c), free(qs), free(keys);
    df_pc_stats *st = df_pcache_stats(pc);
    st->restore_s += df_now() - t0;
    if (s->seq->pos > at) {
        st->hits++;
        st->tokens += (uint64_t)(s->seq->pos - at);
    } else {
        st->misses++;
    }
    return s->seq->pos;
}

/* ---- storing ------------------------------------------------------------------------------- */

/* The longest cached prefix of ids[0..q) shorter than q, or 0. */
static int cached_below(df_pcache *pc, const int32_t *ids, int q) {
    int *qs, n, found = 0, lastq = -1;
    df_pc_key *keys, k;
    df_pcache_list(pc, 0, q - 1, &qs, &keys, &n);
    for (int i = 0; i < n && !found; i++) { /* highest first: one key per position */
        if (qs[i] != lastq) k = df_pcache_key(pc, ids, lastq = qs[i]);
        if (!memcmp(k.b, keys[i].b, 16)) found = qs[i];
    }
    free(qs), free(keys);
    return found;
}

int df_session_cache_store(df_session *s, int q) {
    df_pcache *pc = s->eng->pcache;
    df_seq *seq = s->seq;
    if (!pc || q <= 0 || !df_seq_can_save(seq, q)) return 0;
    df_pc_key key = df_pcache_key(pc, s->tokens, q);
    if (df_pcache_has(pc, q, &key)) return 1;
    double t0 = df_now();
    int from = cached_below(pc, s->tokens, q);
    df_seq_layer_desc layout[seq->n_layers];
    df_seq_layout(seq, layout);
    df_pc_blob *b = df_pcache_blob_new(pc, s->tokens, q, from, layout, seq->n_layers, df_seq_seg_bytes(seq, from, q));
    df_error err;
    if (df_seq_save(seq, from, q, b->payload, &err)) { /* cannot happen: checked above */
        df_pcache_blob_free(b);
        return 0;
    }
    df_pcache_put(pc, b);
    chain *c = df_xmalloc(sizeof *c); /* the new file's ancestors: used now */
    if (from && find_chain(pc, s->tokens, from, df_pcache_key(pc, s->tokens, from), 0, c)) touch_chain(pc, c, 0);
    free(c);
    df_pcache_stats(pc)->store_s += df_now() - t0;
    return 1;
}
