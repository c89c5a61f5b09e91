/*
 * server/http.c - the server's HTTP side (libmicrohttpd, one thread per
 * connection, handed over by listener.c): routes, API-key and body-size
 * checks, the handlers (JSON in through request.c, JSON or SSE out), waiting
 * on a job while watching the client's socket, and srv_run, which starts the
 * worker (jobs.c) and serves until a signal. See internal.h for the threads.
 */
#include "server/internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

srv_state g_srv;

long long srv_now_unix(void) { return (long long)time(NULL); }

typedef struct conn {
    int ep;
    int status;
    char *body;
    size_t body_len, body_cap;
    bool too_big;
    bool http11; /* an interim 1xx response may be sent (HTTP/1.0 has none) */
    bool probed; /* the client finished sending and was sent one (peer_gone) */
    struct MHD_Connection *mc;
} conn;

static int ep_of(const char *url) {
    for (int i = 0; i < EP_OTHER; i++)
        if (!strcmp(url, SRV_EP_NAME[i])) return i;
    return EP_OTHER;
}

/* Queues (and releases) a response. Connection: close: one request per
 * connection, so that every request passes the listener's checks (listener.h). */
static enum MHD_Result queue(conn *c, int status, struct MHD_Response *r) {
    MHD_add_response_header(r, "Connection", "close");
    c->status = status;
    enum MHD_Result rc = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_buf(conn *c, int status, const char *ctype, const char *body, size_t len,
                                const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return queue(c, status, r);
}

static enum MHD_Result send_json(conn *c, int status, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) return MHD_NO;
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), NULL);
    free(s);
    return rc;
}

static enum MHD_Result send_error(conn *c, int status, const char *type, const char *param, const char *msg,
                                  const char *retry_after) {
    char *s = srv_error_json(msg, type, param);
    if (!s) return MHD_NO;
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), retry_after);
    free(s);
    return rc;
}

/* Whether the client is gone. Its end of sending (FIN) does not say: a client
 * that half-closes after its request (shutdown(SHUT_WR), nc -N) still reads the
 * answer, while one that closed its socket answers the next bytes sent to it
 * with a reset, which poll then reports. A response being sent provides such
 * bytes; before one starts, `probe` (when not NULL) sends an interim
 * "100 Continue" once after the FIN, which HTTP/1.1 clients must accept and
 * skip. An HTTP/1.0 client that half-closed cannot be told from one that left
 * until the response is sent, so it is answered. */
static bool peer_gone(struct MHD_Connection *mc, conn *probe) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    int fd = ci->connect_fd;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    bool fin = (p.revents & POLLRDHUP) || k == 0;
    if (fin && probe && probe->http11 && !probe->probed) {
        /* the connection's thread is here, in the handler: nothing else writes */
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        probe->probed = true;
        if (send(fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) return true;
    }
    return false;
}

/* The streaming response's own context: MHD may destroy the response after the
 * connection's conn is gone, so the reader does not point into it. */
typedef struct sse_ctx {
    job *j;
    struct MHD_Connection *mc;
} sse_ctx;

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_ctx *c = cls;
    job *j = c->j;
    pthread_mutex_lock(&g_srv.mu);
    for (;;) {
        if (j->out_off < j->out_len) {
            size_t k = j->out_len - j->out_off;
            if (k > max) k = max;
            memcpy(buf, j->out + j->out_off, k);
            j->out_off += k;
            pthread_mutex_unlock(&g_srv.mu);
            return (ssize_t)k;
        }
        if (j->state == J_DONE || j->state == J_FAILED) {
            pthread_mutex_unlock(&g_srv.mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (g_srv.stopping) break;
        srv_timed_wait(&j->cv);
        pthread_mutex_unlock(&g_srv.mu);
        bool gone = peer_gone(c->mc, NULL);
        pthread_mutex_lock(&g_srv.mu);
        if (gone) break;
    }
    srv_abandon(j);
    pthread_mutex_unlock(&g_srv.mu);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
    sse_ctx *c = cls;
    pthread_mutex_lock(&g_srv.mu);
    if (c->j->state != J_DONE && c->j->state != J_FAILED) srv_abandon(c->j);
    srv_job_release(c->j);
    pthread_mutex_unlock(&g_srv.mu);
    free(c);
}

static json_t *final_response(const job *j) {
    bool chat = j->req.kind == SRV_CHAT;
    json_t *choice;
    if (chat)
        choice = json_pack("{s:i,s:{s:s,s:s%},s:n,s:s}", "index", 0, "message", "role", "assistant", "content",
                           j->text ? j->text : "", j->text ? j->text_len : 0, "logprobs", "finish_reason",
                           j->finish);
    else
        choice = json_pack("{s:s%,s:i,s:n,s:s}", "text", j->text ? j->text : "", j->text ? j->text_len : 0,
                           "index", 0, "logprobs", "finish_reason", j->finish);
    return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", j->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)j->created, "model", g_srv.cfg.model_id, "choices", choice, "usage",
                     srv_usage_obj(j->prompt_tokens, j->completion_tokens, j->cached_tokens));
}

/* Waits, under mu, until j's response can start (streaming) or is complete;
 * false (j given up, mu released) when the server stops or the client left. */
static bool wait_for(conn *c, job *j) {
    for (;;) {
        enum job_state st = j->state;
        if (st == J_FAILED || st == J_DONE || (st == J_STARTED && j->req.stream)) return true;
        bool gone = g_srv.stopping;
        if (!gone) {
            srv_timed_wait(&j->cv);
            pthread_mutex_unlock(&g_srv.mu);
            gone = peer_gone(c->mc, c);
            pthread_mutex_lock(&g_srv.mu);
        }
        if (gone) {
            srv_abandon(j);
            srv_job_release(j);
            pthread_mutex_unlock(&g_srv.mu);
            return false;
        }
    }
}

static enum MHD_Result handle_generate(conn *c) {
    srv_error e;
    job *j = calloc(1, sizeof *j);
    if (!j) return send_error(c, 500, "server_error", NULL, "out of memory", NULL);
    if (srv_parse_request(c->ep == EP_CHAT ? SRV_CHAT : SRV_COMPLETIONS, c->body ? c->body : "", c->body_len,
                          &j->req, &e)) {
        free(j);
        return send_error(c, 400, "invalid_request_error", e.param, e.message, NULL);
    }
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->created = srv_now_unix();
    static atomic_ullong seq;
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", c->ep == EP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)g_srv.started, (unsigned long long)atomic_fetch_add(&seq, 1));
    pthread_mutex_lock(&g_srv.mu);
    if (!srv_enqueue(j)) {
        g_srv.rejected_full++;
        j->refs = 1;
        srv_job_release(j);
        pthread_mutex_unlock(&g_srv.mu);
        return send_error(c, 429, "rate_limit_error", NULL, "the server is busy: the request queue is full",
                          "1");
    }
    if (!wait_for(c, j)) return MHD_NO;
    if (j->state == J_FAILED) {
        int status = j->status;
        char *body = j->err_body;
        j->err_body = NULL;
        srv_job_release(j);
        pthread_mutex_unlock(&g_srv.mu);
        enum MHD_Result rc = send_buf(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2, NULL);
        free(body);
        return rc;
    }
    if (!j->req.stream) {
        json_t *o = final_response(j);
        srv_job_release(j);
        pthread_mutex_unlock(&g_srv.mu);
        return send_json(c, 200, o);
    }
    pthread_mutex_unlock(&g_srv.mu);
    sse_ctx *sc = malloc(sizeof *sc);
    struct MHD_Response *r = NULL;
    if (sc) {
        *sc = (sse_ctx){j, c->mc}; /* the reader takes over the connection's reference */
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, sc, sse_free);
    }
    if (!r) {
        if (sc) sse_free(sc);
        else {
            pthread_mutex_lock(&g_srv.mu);
            srv_abandon(j);
            srv_job_release(j);
            pthread_mutex_unlock(&g_srv.mu);
        }
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return queue(c, 200, r);
}

static enum MHD_Result handle_models(conn *c) {
    return send_json(c, 200, json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", g_srv.cfg.model_id,
                                       "object", "model", "created", (json_int_t)g_srv.started, "owned_by",
                                       "deltafin"));
}

static enum MHD_Result handle_metrics(conn *c) {
    size_t len = 0;
    char *buf = srv_metrics_text(&len);
    if (!buf) return send_error(c, 500, "server_error", NULL, "out of memory", NULL);
    enum MHD_Result rc = send_buf(c, 200, "text/plain; version=0.0.4", buf, len, NULL);
    free(buf);
    return rc;
}

/* Constant time in the key's content: every byte of the longer is examined.
 * The scheme's name is case-insensitive (RFC 9110 11.1). */
static bool key_ok(const char *auth) {
    static const char pre[] = "Bearer ";
    if (!auth || strncasecmp(auth, pre, sizeof pre - 1)) return false;
    const char *got = auth + sizeof pre - 1, *want = g_srv.cfg.api_key;
    size_t gl = strlen(got), wl = strlen(want), n = gl > wl ? gl : wl;
    unsigned char diff = gl != wl;
    for (size_t i = 0; i < n; i++) {
        unsigned char a = i < gl ? (unsigned char)got[i] : 0, b = i < wl ? (unsigned char)want[i] : 0;
        diff |= a ^ b;
    }
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)cls;
    conn *c = *ctx;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->mc = mc;
        c->ep = ep_of(url);
        c->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        *ctx = c;
        if (g_srv.cfg.api_key && c->ep != EP_HEALTH &&
            !key_ok(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization")))
            return send_error(c, 401, "invalid_request_error", NULL, "invalid or missing API key", NULL);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > g_srv.cfg.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %llu bytes", (unsigned long long)g_srv.cfg.max_body);
            return send_error(c, 413, "invalid_request_error", NULL, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->status) return MHD_YES; /* answered already (401/413): discard */
        if (c->too_big || c->body_len + n > g_srv.cfg.max_body) {
            c->too_big = true;
            free(c->body);
            c->body = NULL;
            c->body_len = c->body_cap = 0;
            return MHD_YES;
        }
        if (!srv_reserve(&c->body, &c->body_cap, c->body_len, n)) return MHD_NO;
        memcpy(c->body + c->body_len, upload, n);
        c->body_len += n;
        return MHD_YES;
    }
    srv_listener_arrived(mc); /* the whole request is in: no deadline while it is answered */
    if (c->status) return MHD_YES; /* answered early (401/413) */
    if (c->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %llu bytes", (unsigned long long)g_srv.cfg.max_body);
        return send_error(c, 413, "invalid_request_error", NULL, msg, NULL);
    }
    /* HEAD answers as GET does: libmicrohttpd leaves the body out */
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    switch (c->ep) {
    case EP_HEALTH:
        if (!get) break;
        return send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    case EP_MODELS:
        if (!get) break;
        return handle_models(c);
    case EP_METRICS:
        if (!get) break;
        return handle_metrics(c);
    case EP_COMPLETIONS:
    case EP_CHAT:
        if (!post) break;
        return handle_generate(c);
    default:
        return send_error(c, 404, "invalid_request_error", NULL, "no such endpoint", NULL);
    }
    return send_error(c, 405, "invalid_request_error", NULL, "method not allowed on this endpoint", NULL);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)mc;
    (void)toe;
    conn *c = *ctx;
    if (!c) return;
    pthread_mutex_lock(&g_srv.mu);
    if (c->status) srv_count_request(c->ep, c->status);
    pthread_mutex_unlock(&g_srv.mu);
    free(c->body);
    free(c);
    *ctx = NULL;
}

/* Listens on the configured address (listener.c) and answers (libmicrohttpd) until SIGINT or
 * SIGTERM (in *set), then stops every request. Returns the exit status. */
static int serve(sigset_t *set) {
    const srv_config *o = &g_srv.cfg;
    srv_listener_opts lo = {.addr = o->addr, .addr_len = o->addr_len, .max_conns = SRV_MAX_CONNS,
                            .max_per_addr = o->max_per_ip, .request_timeout = o->request_timeout};
    if (srv_listener_open(&g_srv.listener, &lo)) {
        fprintf(stderr, "deltafin: cannot listen on %s port %d: %s\n", o->host, o->port, strerror(errno));
        srv_stop_requests();
        return 1;
    }
    /* the listener accepts and hands connections over (MHD_add_connection needs the ITC) */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, &on_request, NULL, MHD_OPTION_NOTIFY_COMPLETED, &on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, &srv_listener_notify, g_srv.listener, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)SRV_MAX_CONNS, MHD_OPTION_END);
    if (!d || srv_listener_start(g_srv.listener, d)) {
        fprintf(stderr, "deltafin: cannot start the HTTP server (libmicrohttpd or a thread)\n");
        if (d) MHD_stop_daemon(d);
        srv_listener_free(g_srv.listener);
        srv_stop_requests();
        return 1;
    }
    bool v6 = strchr(o->host, ':') != NULL; /* an IPv6 address goes in brackets in a URL */
    fprintf(stderr, "deltafin serve: %s on http://%s%s%s:%d (context %d, parallel %d, queue %d%s)\n",
            g_srv.cfg.model_id, v6 ? "[" : "", o->host, v6 ? "]" : "", o->port, g_srv.cfg.ctx, o->parallel, o->queue,
            o->api_key ? ", API key required" : "");

    sigdelset(set, SIGPIPE);
    int sig = 0;
    sigwait(set, &sig);
    if (!g_srv.ranks_failed) fprintf(stderr, "deltafin serve: stopping (signal %d)\n", sig);
    srv_stop_requests();
    srv_listener_stop(g_srv.listener);
    MHD_stop_daemon(d); /* it notifies the listener of each close */
    srv_listener_free(g_srv.listener);
    return g_srv.ranks_failed ? 1 : 0;
}


int srv_run(const srv_config *cfg, df_engine *eng, df_spec **specs) {
    g_srv.cfg = *cfg;
    if (g_srv.cfg.parallel < 1) g_srv.cfg.parallel = 1;
    g_srv.active = calloc((size_t)g_srv.cfg.parallel, sizeof *g_srv.active);
    g_srv.step_hist = calloc((size_t)g_srv.cfg.parallel + 1, sizeof *g_srv.step_hist);
    if (!g_srv.active || !g_srv.step_hist) {
        fprintf(stderr, "deltafin: out of memory\n");
        return 1;
    }
    g_srv.eng = eng;
    g_srv.specs = specs;
    g_srv.info = df_engine_info(eng);
    g_srv.prompt_cache = df_prompt_cache_interval(eng) > 0;
    g_srv.started = srv_now_unix();
    df_engine_stats(eng, &g_srv.stats);
    pthread_mutex_init(&g_srv.mu, NULL);
    pthread_cond_init(&g_srv.work_cv, NULL);

    /* Threads started from here on inherit the mask: only sigwait below sees
     * SIGINT/SIGTERM, and SIGPIPE from a vanished client is never delivered. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    pthread_t wt;
    if (pthread_create(&wt, NULL, srv_worker_main, NULL)) {
        fprintf(stderr, "deltafin: cannot start the worker thread\n");
        return 2;
    }
    int rc = serve(&set);
    pthread_join(wt, NULL);
    /* jobs the worker never took (connections are gone, so only its refs remain) */
    while (g_srv.head) {
        job *j = g_srv.head;
        g_srv.head = j->next;
        srv_job_release(j);
    }
    pthread_cond_destroy(&g_srv.work_cv);
    pthread_mutex_destroy(&g_srv.mu);
    free(g_srv.active);
    free(g_srv.step_hist);
    return rc;
}
