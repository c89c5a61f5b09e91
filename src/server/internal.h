/*
 * server/internal.h - what the server's files share: the job (one request
 * from queueing to its last byte), the server's state under one mutex, and
 * the calls between http.c (routes, handlers, JSON in and out), jobs.c (the
 * queue, a request slot, one generation at a time and streaming), batch.c
 * (--parallel N > 1: up to N requests decoded together) and metrics.c
 * (counters and the /metrics text).
 *
 * Threads: connection threads parse, enqueue and then block on their job's
 * condition variable, polling their socket between waits so that a client that
 * goes away cancels its job (queued: removed; running: the worker sees the flag
 * between tokens). The one worker thread owns the engine, the slots (a
 * session each) and the samplers; the only state shared with connection
 * threads is under g_srv.mu.
 */
#ifndef DF_SERVER_INTERNAL_H
#define DF_SERVER_INTERNAL_H

#include "deltafin.h"
#include "server/listener.h"
#include "server/request.h"
#include "server/server.h"
#include "util/util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum job_state { J_QUEUED, J_RUNNING, J_STARTED, J_DONE, J_FAILED, J_DROPPED };

typedef struct job {
    srv_request req;
    pthread_cond_t cv;
    enum job_state state;
    atomic_bool cancel;
    int refs; /* connection + worker */
    struct job *next;
    char id[48];
    long long created;
    /* failure before the response started */
    int status;
    char *err_body;
    /* SSE bytes not yet sent */
    char *out;
    size_t out_len, out_cap, out_off;
    /* the final result (non-streaming) */
    char *text;
    size_t text_len;
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of the prompt's: held by the session or restored from the prompt cache */
    const char *finish;
} job;

enum { EP_MODELS, EP_COMPLETIONS, EP_CHAT, EP_HEALTH, EP_METRICS, EP_OTHER, N_EP };
extern const char *const SRV_EP_NAME[N_EP];
extern const int SRV_STATUSES[];
#define N_STATUS 9

typedef struct srv_state {
    srv_config cfg;
    df_engine *eng;
    df_spec **specs; /* NULL without --draft, else one per slot (cfg.parallel); the worker's only */
    srv_listener *listener;
    const df_model_info *info;
    bool prompt_cache; /* the engine has one (--prompt-cache) */
    long long started;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    job *head, *tail;
    int n_waiting;
    bool stopping;
    bool ranks_failed; /* a rank of --experts-by-rank failed: the server stopped itself (exit status 1) */
    job **active; /* per slot (cfg.parallel): the job it runs, or NULL */
    int n_active; /* jobs taken off the queue and not yet done */

    /* metrics (under mu) */
    uint64_t requests[N_EP][N_STATUS + 1];
    uint64_t gen_tokens, prompt_tokens, reused_tokens, cancelled, rejected_full;
    uint64_t cached_tokens; /* reused_tokens and those restored from the prompt cache */
    double last_tps;
    df_stats stats;
    df_spec_stats spec_stats;
    /* the batch: steps, rows they evaluated, steps by requests in them
     * (step_hist[k], k = 1..parallel) */
    uint64_t steps, step_rows, *step_hist;
    int max_active;
} srv_state;

extern srv_state g_srv;

/* A request's text, stop strings and streaming state. */
typedef struct srv_gen {
    df_text_stream ts;
    size_t emitted;
    int produced;
    bool stopped, failed;
    const char *finish;
} srv_gen;

/* One request slot of the worker: its session (kept between requests for
 * prefix reuse) and scratch, and the request it runs now. */
typedef struct srv_slot {
    df_session *sess;
    int32_t *counts; /* per-token count among generated tokens (penalties) */
    char *text;      /* generated text of the request */
    size_t text_len, text_cap;
    int idx;         /* in g_srv.active */
    uint64_t used;   /* when it last took a request: the least recent goes first */
    job *j;          /* NULL: free */
    int32_t *ids;
    size_t n;
    df_sampler *smp;
    srv_gen g;
    df_generate_opts go; /* user: the slot */
} srv_slot;

long long srv_now_unix(void);
/* Grows *buf to hold len + add + 1 bytes. */
bool srv_reserve(char **buf, size_t *cap, size_t len, size_t add);

/* jobs.c */
void srv_job_release(job *j);           /* under mu */
void *srv_worker_main(void *arg);
bool srv_slot_init(srv_slot *s);        /* false: out of memory (said) */
void srv_slot_free(srv_slot *s);
/* The request's prompt ids and max_new, checked against the context; NULL
 * when the job failed. */
int32_t *srv_job_prompt(job *j, size_t *n_out, int *max_new_out);
/* The slot takes j with its prompt ids (taken over): its sampler, the job
 * started (a chat stream's role chunk), s->go for its generation. false: the
 * job failed (ids freed). */
bool srv_job_begin(srv_slot *s, job *j, int32_t *ids, size_t n, int max_new);
/* After the generation (status DF_OK, or the error that ended it): the rest
 * of the text, the counters, the final chunk or response; the slot is free
 * (the job's reference is the caller's to release). */
void srv_job_end(srv_slot *s, const df_generate_result *gr, int status, const df_error *err);
/* Cancels every running job (under mu). */
void srv_cancel_active(void);

/* batch.c: the worker for --parallel N > 1 */
void srv_batch_worker(void);
/* Queues j for the worker; false when the queue is full (j untouched). Under mu. */
bool srv_enqueue(job *j);
/* Gives up a job from the connection side. Under mu. */
void srv_abandon(job *j);
/* Waits on cv (under mu) for at most one polling slice. */
void srv_timed_wait(pthread_cond_t *cv);
/* Stops the server when a rank of --experts-by-rank failed (jobs.c). Not under mu. */
void srv_check_ranks(void);
/* Tells the worker to stop, cancelling queued and running requests. */
void srv_stop_requests(void);
/* The OpenAI usage object; cached: prompt_tokens_details.cached_tokens. */
json_t *srv_usage_obj(int prompt_tokens, int completion_tokens, int cached);

/* metrics.c */
/* Counts an answered request by endpoint and status. Under mu. */
void srv_count_request(int ep, int status);
/* The Prometheus text of /metrics (malloc'd), NULL out of memory. */
char *srv_metrics_text(size_t *len);

#endif
