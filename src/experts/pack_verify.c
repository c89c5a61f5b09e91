/*
 * pack_verify.c - `deltafin pack --verify`: re-reads every record of a set and
 * checks every record and stripe checksum (so damage in the padding is found
 * too), naming the first bad expert and its directory and counting the rest.
 *
 * The stripes of a record are read in parallel, one thread per drive. Records
 * are megabytes, so starting threads per record costs nothing measurable, and
 * a thread that cannot start just means that stripe is read inline.
 */
#include "experts/pack_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct vjob {
    const df_pack *p;
    const df_pack_record *r;
    int stripe;
    uint8_t *buf;
    df_error err;
    int rc;
} vjob;

static void *vworker(void *arg) {
    vjob *j = arg;
    size_t sb = df_pack_stripe_bytes(j->r, j->p->S);
    j->rc = pk_read_stripe(j->p, j->r, j->stripe, j->buf + (size_t)j->stripe * sb, &j->err);
    return NULL;
}

static int read_parallel(const df_pack *p, const df_pack_record *r, uint8_t *buf, vjob *jobs,
                         pthread_t *th, df_error *err) {
    bool started[DF_PACK_MAX_STRIPES] = {0};
    for (int s = 0; s < p->S; s++) {
        jobs[s] = (vjob){.p = p, .r = r, .stripe = s, .buf = buf};
        if (s > 0) started[s] = pthread_create(&th[s], NULL, vworker, &jobs[s]) == 0;
    }
    for (int s = 0; s < p->S; s++)
        if (!started[s]) vworker(&jobs[s]);
    for (int s = 1; s < p->S; s++)
        if (started[s]) pthread_join(th[s], NULL);
    for (int s = 0; s < p->S; s++)
        if (jobs[s].rc) {
            *err = jobs[s].err;
            return jobs[s].rc;
        }
    return DF_OK;
}

int df_pack_verify(const char *const *dirs, int n_dirs, df_error *err) {
    df_pack *p;
    int rc = df_pack_open(&p, dirs, n_dirs, NULL, err);
    if (rc) return rc;
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, pk_round_up(p->max_padded, DF_PACK_ALIGN));
    if (!buf) {
        df_pack_close(p);
        return df_fail(err, DF_ERR_NOMEM, "pack: out of memory");
    }
    uint64_t total = 0;
    for (int i = 0; i < p->n; i++) total += p->rec[i].padded;
    pk_bar bar;
    pk_bar_init(&bar, isatty(2), "verifying", total, 0);
    vjob *jobs = df_xcalloc((size_t)p->S, sizeof *jobs);
    pthread_t *th = df_xcalloc((size_t)p->S, sizeof *th);
    int n_bad = 0;
    df_error first = {0};
    for (int i = 0; i < p->n && !rc; i++) {
        const df_pack_record *r = &p->rec[i];
        if ((rc = read_parallel(p, r, buf, jobs, th, err))) break;
        df_error e;
        bool bad;
        int c = pk_check_record(p, r, buf, true, true, &bad, &e);
        if (c && bad) {
            if (!n_bad++) first = e;
        } else if (c) {
            rc = c;
            *err = e;
        }
        bar.done += r->padded;
        pk_bar_draw(&bar, false);
    }
    if (bar.on) pk_bar_draw(&bar, true);
    free(jobs);
    free(th);
    free(buf);
    if (!rc && n_bad) {
        if (n_bad > 1)
            rc = df_fail(err, DF_ERR_IO, "%s (%d of %d records bad)", first.msg, n_bad, p->n);
        else
            rc = df_fail(err, DF_ERR_IO, "%s", first.msg);
    }
    df_pack_close(p);
    return rc;
}
