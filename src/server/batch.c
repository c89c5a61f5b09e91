/*
 * server/batch.c - the worker with --parallel N > 1: up to N requests decoded
 * together by one df_batchgen, each in its own slot (a session kept between
 * requests). Between steps, queued requests take free slots (the one whose
 * session shares the longest prefix with the prompt, else the least recently
 * used) and join the batch, their prompts chunked by df_batchgen so that a
 * long prompt holds the others up by one chunk per step; a request leaves as
 * soon as it ends (finished, failed, or cancelled: its client went away).
 * Every request's tokens are those it would get alone (df_batchgen), so its
 * text, stop strings, penalties and seed behave as with --parallel 1.
 * With --draft lookup each slot drafts with its own df_spec, verified in the
 * batch's step (df_batchgen); serve keeps a draft model to --parallel 1.
 */
#include "server/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct batch {
    df_batchgen *bg;
    srv_slot *slots;
    int n;
    uint64_t clock; /* slots' `used` stamps */
} batch;

/* The request leaves the batch (called by df_batchgen; user: its slot). */
static void on_done(void *user, const df_generate_result *res, int status, const df_error *err) {
    srv_slot *s = user;
    job *j = s->j;
    srv_job_end(s, res, status, err);
    pthread_mutex_lock(&g_srv.mu);
    g_srv.active[s->idx] = NULL;
    g_srv.n_active--;
    srv_job_release(j);
    pthread_mutex_unlock(&g_srv.mu);
}

/* Of the free slots, the one whose session holds the most useful prefix of
 * the prompt (df_batchgen evaluates at least its last token): taking a slot
 * reuses the k tokens it shares and throws away the rest it holds, so it
 * scores 4k - held: worth taking when it shares at least a quarter of what it
 * holds (what is kept now counts more than what is lost, as a later turn of
 * that slot's conversation may never come). Without a positive score,
 * an empty slot, else the least recently used, so that other sessions keep
 * their prompts for later. */
static srv_slot *pick_slot(batch *b, const int32_t *ids, size_t n) {
    srv_slot *best = NULL, *spare = NULL;
    long best_score = 0;
    for (int i = 0; i < b->n; i++) {
        srv_slot *s = &b->slots[i];
        if (s->j) continue;
        const int32_t *held = df_session_tokens(s->sess);
        int have = df_session_pos(s->sess), k = 0;
        while (k < have && (size_t)k + 1 < n && held[k] == ids[k]) k++;
        long score = 4L * k - have;
        if (score > best_score || (best && score == best_score && s->used < best->used))
            best = s, best_score = score;
        if (!spare || (have == 0) > (df_session_pos(spare->sess) == 0) ||
            ((have == 0) == (df_session_pos(spare->sess) == 0) && s->used < spare->used))
            spare = s;
    }
    return best ? best : spare;
}

/* Takes j off the queue into a free slot and the batch. Not under mu. */
static void admit(batch *b, job *j) {
    size_t n;
    int max_new;
    int32_t *ids = srv_job_prompt(j, &n, &max_new);
    srv_slot *s = ids ? pick_slot(b, ids, n) : NULL;
    if (s && srv_job_begin(s, j, ids, n, max_new)) {
        s->used = ++b->clock;
        pthread_mutex_lock(&g_srv.mu);
        g_srv.active[s->idx] = j;
        pthread_mutex_unlock(&g_srv.mu);
        df_error err;
        int rc = df_batchgen_add(b->bg, s->sess, s->ids, (int)n, &s->go, on_done, &err);
        if (!rc) return;
        df_generate_result none = {0};
        on_done(s, &none, rc, &err); /* never joined: it leaves as a failure */
        return;
    }
    /* (a job is taken off the queue only when a slot is free) */
    pthread_mutex_lock(&g_srv.mu); /* the job failed before it started */
    g_srv.n_active--;
    srv_job_release(j);
    pthread_mutex_unlock(&g_srv.mu);
}

/* One step of the batch, with the occupancy metrics. */
static void step(batch *b) {
    int k = df_batchgen_active(b->bg);
    df_stats st;
    df_engine_stats(g_srv.eng, &st);
    uint64_t rows0 = st.tokens;
    df_error err;
    df_batchgen_step(b->bg, &err); /* a failure ends that step's requests, each told (on_done) */
    df_engine_stats(g_srv.eng, &st);
    pthread_mutex_lock(&g_srv.mu);
    if (st.tokens > rows0) { /* requests cancelled before it may leave a step without rows */
        g_srv.steps++;
        g_srv.step_rows += st.tokens - rows0;
        g_srv.step_hist[k]++;
        if (k > g_srv.max_active) g_srv.max_active = k;
    }
    pthread_mutex_unlock(&g_srv.mu);
}

void srv_batch_worker(void) {
    batch b = {.n = g_srv.cfg.parallel};
    df_error err;
    if (df_batchgen_new(&b.bg, g_srv.eng, 0, g_srv.cfg.ctx, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    b.slots = calloc((size_t)b.n, sizeof *b.slots);
    if (!b.slots) {
        fprintf(stderr, "deltafin: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < b.n; i++) {
        if (!srv_slot_init(&b.slots[i])) exit(1);
        b.slots[i].idx = i;
    }
    pthread_mutex_lock(&g_srv.mu);
    for (;;) {
        while (!g_srv.head && !g_srv.n_active && !g_srv.stopping) pthread_cond_wait(&g_srv.work_cv, &g_srv.mu);
        if (g_srv.stopping && !g_srv.n_active) break;
        /* new requests join at this step */
        while (!g_srv.stopping && g_srv.head && g_srv.n_active < b.n) {
            job *j = g_srv.head;
            g_srv.head = j->next;
            if (!g_srv.head) g_srv.tail = NULL;
            g_srv.n_waiting--;
            j->state = J_RUNNING;
            g_srv.n_active++;
            pthread_mutex_unlock(&g_srv.mu);
            admit(&b, j);
            pthread_mutex_lock(&g_srv.mu);
        }
        /* a job taken off the queue as the server began to stop was in no
         * slot when srv_stop_requests cancelled the running ones */
        if (g_srv.stopping) srv_cancel_active();
        pthread_mutex_unlock(&g_srv.mu);
        if (df_batchgen_active(b.bg)) step(&b);
        srv_check_ranks();
        pthread_mutex_lock(&g_srv.mu);
    }
    pthread_mutex_unlock(&g_srv.mu);
    df_batchgen_free(b.bg);
    for (int i = 0; i < b.n; i++) srv_slot_free(&b.slots[i]);
    free(b.slots);
}
