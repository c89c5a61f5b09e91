/*
 * listener.c - the server's front door (see listener.h): accepting, connection limits,
 * the request-head framing check and the request deadline.
 *
 * One thread runs an epoll loop over the listening socket and the connections
 * whose head has not arrived yet. It peeks at their bytes (MSG_PEEK, so that
 * libmicrohttpd later reads the request from its start) and is woken by each new
 * piece of data (edge-triggered). A connection waiting for its head costs no
 * thread; libmicrohttpd gives one to each connection handed to it.
 *
 * lis->mu guards every slot's state and the counters: the listener thread changes
 * slots, libmicrohttpd's threads free them (srv_listener_notify) and mark requests
 * arrived. A handed-over socket is only shut down (never closed) here, and only
 * while its slot is held: libmicrohttpd notifies the close before closing it.
 */
#include "server/listener.h"

#include "server/request.h"
#include "util/util.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 100   /* how often deadlines are looked at while connections are held */
#define EV_WAKE 0     /* epoll data: the stop signal */
#define EV_LISTEN 1   /* epoll data: the listening socket; slot k is k + 2 */

enum slot_state { SLOT_FREE, SLOT_PENDING, SLOT_HANDED };

typedef struct slot {
    srv_listener *lis;
    enum slot_state state;
    int fd;
    bool arrived; /* handed over: the request came whole, the deadline is off */
    bool cut;     /* handed over: shut down at the deadline */
    double deadline;
    struct sockaddr_storage addr;
    socklen_t addr_len;
} slot;

struct srv_listener {
    srv_listener_opts o;
    int listen_fd, ep, wake_fd;
    bool listen_paused; /* accept failed for want of resources: retried at the next tick */
    pthread_t thread;
    bool started;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    slot *slots; /* o.max_conns of them */
    srv_listener_stats st;
    char buf[SRV_HEAD_MAX];
};

/* ---- the framing check ------------------------------------------------------------ */

static int refuse(char *msg, size_t cap, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int refuse(char *msg, size_t cap, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return status;
}

/* A header value for a message: printable ASCII only (the error is JSON, and
 * the value may be anything), at most 40 bytes. */
static const char *quoted(char *dst, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < 40; i++) dst[k++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    if (n > 40 && k + 4 < cap) k += (size_t)snprintf(dst + k, cap - k, "...");
    dst[k] = 0;
    return dst;
}

/* The line at *pos without its line end (CR LF or LF); advances *pos past it. */
static bool next_line(const char *h, size_t n, size_t *pos, const char **s, size_t *len) {
    if (*pos >= n) return false;
    const char *nl = memchr(h + *pos, '\n', n - *pos);
    size_t end = nl ? (size_t)(nl - h) : n;
    *s = h + *pos;
    *len = end - *pos;
    if (*len && (*s)[*len - 1] == '\r') (*len)--;
    *pos = nl ? end + 1 : n;
    return true;
}

static bool is_tchar(char c) { /* RFC 9110 token characters */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool name_is(const char *s, size_t n, const char *name) {
    return n == strlen(name) && !strncasecmp(s, name, n);
}

/* One header line; counts the framing headers it names. */
static int check_header(const char *s, size_t n, int *n_cl, int *n_te, char *msg, size_t cap) {
    char q[64];
    /* a continuation line (obsolete folding) would be joined to the header
     * before it by some parsers and not by others */
    if (s[0] == ' ' || s[0] == '\t')
        return refuse(msg, cap, 400, "header line '%s' starts with white space (line folding is not accepted)",
                      quoted(q, sizeof q, s, n));
    const char *colon = memchr(s, ':', n);
    if (!colon) return refuse(msg, cap, 400, "header line '%s' has no ':'", quoted(q, sizeof q, s, n));
    size_t nl = (size_t)(colon - s);
    bool token = nl > 0; /* "Content-Length :" must not pass as some other header */
    for (size_t i = 0; token && i < nl; i++) token = is_tchar(s[i]);
    if (!token) return refuse(msg, cap, 400, "header name '%s' is not a token", quoted(q, sizeof q, s, nl));
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    size_t vl = (size_t)(end - v);
    if (name_is(s, nl, "Content-Length")) {
        if (++*n_cl > 1) return refuse(msg, cap, 400, "more than one Content-Length header");
        bool digits = vl > 0 && vl <= 19; /* 19 digits fit in 64 bits */
        for (size_t i = 0; digits && i < vl; i++) digits = v[i] >= '0' && v[i] <= '9';
        if (!digits)
            return refuse(msg, cap, 400, "Content-Length '%s' is not a decimal number of bytes",
                          quoted(q, sizeof q, v, vl));
    } else if (name_is(s, nl, "Transfer-Encoding")) {
        if (++*n_te > 1) return refuse(msg, cap, 400, "more than one Transfer-Encoding header");
        if (!name_is(v, vl, "chunked"))
            return refuse(msg, cap, 501, "Transfer-Encoding '%s' is not supported: only chunked is",
                          quoted(q, sizeof q, v, vl));
    }
    return 0;
}

int srv_check_head(const char *h, size_t n, char *msg, size_t cap) {
    /* a line end the checks below and libmicrohttpd could read differently */
    for (size_t i = 0; i < n; i++) {
        if (!h[i]) return refuse(msg, cap, 400, "the request head holds a NUL byte");
        if (h[i] == '\r' && (i + 1 >= n || h[i + 1] != '\n'))
            return refuse(msg, cap, 400, "the request head holds a CR not followed by LF");
    }
    size_t pos = 0, len;
    const char *s;
    while (pos < n && (h[pos] == '\r' || h[pos] == '\n')) pos++; /* blank lines before the request */
    if (!next_line(h, n, &pos, &s, &len)) return refuse(msg, cap, 400, "the request line is missing");
    const char *sp = len ? memrchr(s, ' ', len) : NULL;
    bool http10 = sp && name_is(sp + 1, (size_t)(s + len - sp - 1), "HTTP/1.0");
    int n_cl = 0, n_te = 0;
    while (next_line(h, n, &pos, &s, &len) && len) {
        int st = check_header(s, len, &n_cl, &n_te, msg, cap);
        if (st) return st;
    }
    if (n_cl && n_te)
        return refuse(msg, cap, 400, "the request has both Content-Length and Transfer-Encoding "
                                     "(a proxy and the server could disagree on where it ends)");
    if (n_te && http10) return refuse(msg, cap, 400, "Transfer-Encoding in an HTTP/1.0 request");
    return 0;
}

/* Length of the head at the start of b[0..n) through its empty line; 0 while
 * it has not all arrived. */
static size_t head_length(const char *b, size_t n) {
    size_t i = 0;
    while (i < n && (b[i] == '\r' || b[i] == '\n')) i++;
    for (; i < n; i++) {
        if (b[i] != '\n') continue;
        if (i + 1 < n && b[i + 1] == '\n') return i + 2;
        if (i + 2 < n && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* ---- connections ---------------------------------------------------------------- */

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return false;
}

/* Closes a connection the listener still owns, after taking in what the client
 * already sent (closing with unread bytes resets the connection, and the reset
 * can destroy an answer before the client reads it). Under mu. */
static void drop(srv_listener *lis, slot *s) {
    shutdown(s->fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(s->fd, lis->buf, sizeof lis->buf, MSG_DONTWAIT) > 0; i++) {}
    close(s->fd); /* also leaves the epoll set */
    s->state = SLOT_FREE;
}

static const char *reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    default: return "Not Implemented";
    }
}

/* Answers status with an OpenAI error holding msg, and closes. Under mu. */
static void answer(srv_listener *lis, slot *s, int status, const char *msg) {
    char *body = srv_error_json(msg, "invalid_request_error", NULL);
    char head[256];
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      status, reason(status), bl);
    /* a fresh socket's send buffer takes this at once; if not, the close says enough */
    if (send(s->fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && body)
        (void)!send(s->fd, body, bl, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
    drop(lis, s);
}

/* A new connection: held until its head arrives, or closed over a limit. */
static void admit(srv_listener *lis, int fd, const struct sockaddr_storage *a, socklen_t al) {
    pthread_mutex_lock(&lis->mu);
    slot *free_slot = NULL;
    int same = 0;
    for (int k = 0; k < lis->o.max_conns; k++) {
        slot *s = &lis->slots[k];
        if (s->state == SLOT_FREE) {
            if (!free_slot) free_slot = s;
        } else if (same_addr(&s->addr, a)) {
            same++;
        }
    }
    /* closed without an answer, as libmicrohttpd does: answering is what an
     * attacker holding the slots would want the server to spend time on */
    if (same >= lis->o.max_per_addr || !free_slot) {
        if (free_slot) lis->st.per_addr++;
        else lis->st.full++;
        pthread_mutex_unlock(&lis->mu);
        close(fd);
        return;
    }
    slot *s = free_slot;
    *s = (slot){.lis = lis, .state = SLOT_PENDING, .fd = fd, .deadline = df_now() + lis->o.request_timeout,
                .addr = *a, .addr_len = al};
    /* edge-triggered: woken by each new piece of the head, not by the bytes
     * already peeked at (the socket stays readable until libmicrohttpd reads) */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = (uint64_t)(s - lis->slots) + 2};
    if (epoll_ctl(lis->ep, EPOLL_CTL_ADD, fd, &ev)) {
        close(fd);
        s->state = SLOT_FREE;
    }
    pthread_mutex_unlock(&lis->mu);
}

static void accept_all(srv_listener *lis) {
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(lis->listen_fd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            admit(lis, fd, &a, al);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            /* out of descriptors or memory: the socket stays readable, so stop
             * listening to it until the next tick rather than spin */
            struct epoll_event ev = {.events = 0, .data.u64 = EV_LISTEN};
            epoll_ctl(lis->ep, EPOLL_CTL_MOD, lis->listen_fd, &ev);
            lis->listen_paused = true;
        }
        return;
    }
}

/* The head has passed: the connection becomes libmicrohttpd's. Under mu
 * (released while libmicrohttpd takes it, as it calls srv_listener_notify). */
static void hand_over(srv_listener *lis, slot *s) {
    epoll_ctl(lis->ep, EPOLL_CTL_DEL, s->fd, NULL);
    s->state = SLOT_HANDED;
    int fd = s->fd;
    struct sockaddr_storage a = s->addr;
    socklen_t al = s->addr_len;
    pthread_mutex_unlock(&lis->mu);
    enum MHD_Result ok = MHD_add_connection(lis->d, fd, (struct sockaddr *)&a, al);
    pthread_mutex_lock(&lis->mu);
    /* refused (it closed the socket): the slot is free unless its close was notified */
    if (ok != MHD_YES && s->state == SLOT_HANDED && s->fd == fd) s->state = SLOT_FREE;
}

/* New bytes (or the end) on a connection whose head has not arrived. Under mu. */
static void on_readable(srv_listener *lis, slot *s, uint32_t events) {
    if (s->state != SLOT_PENDING) return;
    ssize_t n = recv(s->fd, lis->buf, sizeof lis->buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) { /* gone before its request */
        drop(lis, s);
        return;
    }
    size_t hl = head_length(lis->buf, (size_t)n);
    char msg[256];
    int status = 0;
    if (hl) {
        status = srv_check_head(lis->buf, hl, msg, sizeof msg);
    } else if ((size_t)n == sizeof lis->buf) {
        status = 431;
        snprintf(msg, sizeof msg, "the request head is larger than %d bytes", SRV_HEAD_MAX);
    } else {
        /* a client that finished sending without completing its head never will */
        if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) drop(lis, s);
        return;
    }
    if (status) {
        lis->st.bad_head++;
        answer(lis, s, status, msg);
    } else {
        hand_over(lis, s);
    }
}

/* Enforces the request deadline; returns how many slots are in use. Under mu. */
static int expire(srv_listener *lis) {
    double now = df_now();
    int used = 0;
    for (int k = 0; k < lis->o.max_conns; k++) {
        slot *s = &lis->slots[k];
        if (s->state == SLOT_FREE) continue;
        used++;
        if (now < s->deadline) continue;
        if (s->state == SLOT_PENDING) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request did not arrive within %d s", lis->o.request_timeout);
            lis->st.deadline++;
            answer(lis, s, 408, msg);
        } else if (!s->arrived && !s->cut) {
            /* libmicrohttpd is reading the body: the shutdown ends its read */
            shutdown(s->fd, SHUT_RDWR);
            s->cut = true;
            lis->st.deadline++;
        }
    }
    return used;
}

static void *listener_main(void *arg) {
    srv_listener *lis = arg;
    struct epoll_event ev[64];
    int timeout = -1;
    for (;;) {
        int n = epoll_wait(lis->ep, ev, 64, timeout);
        if (n < 0 && errno != EINTR) break;
        pthread_mutex_lock(&lis->mu);
        for (int i = 0; i < n; i++) {
            uint64_t id = ev[i].data.u64;
            if (id == EV_WAKE) {
                pthread_mutex_unlock(&lis->mu);
                return NULL;
            }
            if (id == EV_LISTEN) {
                pthread_mutex_unlock(&lis->mu); /* admit takes it */
                accept_all(lis);
                pthread_mutex_lock(&lis->mu);
            } else {
                on_readable(lis, &lis->slots[id - 2], ev[i].events);
            }
        }
        if (lis->listen_paused) {
            struct epoll_event le = {.events = EPOLLIN, .data.u64 = EV_LISTEN};
            lis->listen_paused = epoll_ctl(lis->ep, EPOLL_CTL_MOD, lis->listen_fd, &le) != 0;
        }
        /* no connection held: nothing to time out, sleep until one comes */
        timeout = expire(lis) || lis->listen_paused ? TICK_MS : -1;
        pthread_mutex_unlock(&lis->mu);
    }
    return NULL;
}

/* ---- the interface ------------------------------------------------------------- */

int srv_listener_open(srv_listener **out, const srv_listener_opts *o) {
    *out = NULL;
    srv_listener *lis = calloc(1, sizeof *lis);
    if (!lis || !(lis->slots = calloc((size_t)o->max_conns, sizeof *lis->slots))) {
        free(lis);
        errno = ENOMEM;
        return -1;
    }
    lis->o = *o;
    lis->o.addr = NULL; /* the caller's; not needed after bind */
    lis->ep = lis->wake_fd = -1;
    pthread_mutex_init(&lis->mu, NULL);
    int one = 1;
    lis->listen_fd = socket(o->addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    bool ok = lis->listen_fd >= 0 && !setsockopt(lis->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) &&
              (o->addr->sa_family != AF_INET6 ||
               !setsockopt(lis->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) &&
              !bind(lis->listen_fd, o->addr, o->addr_len) && !listen(lis->listen_fd, SOMAXCONN) &&
              (lis->ep = epoll_create1(EPOLL_CLOEXEC)) >= 0 &&
              (lis->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) >= 0;
    if (ok) {
        struct epoll_event lev = {.events = EPOLLIN, .data.u64 = EV_LISTEN};
        struct epoll_event wev = {.events = EPOLLIN, .data.u64 = EV_WAKE};
        ok = !epoll_ctl(lis->ep, EPOLL_CTL_ADD, lis->listen_fd, &lev) &&
             !epoll_ctl(lis->ep, EPOLL_CTL_ADD, lis->wake_fd, &wev);
    }
    if (!ok) {
        int e = errno;
        srv_listener_free(lis); /* closes what was opened */
        errno = e;
        return -1;
    }
    *out = lis;
    return 0;
}

int srv_listener_start(srv_listener *lis, struct MHD_Daemon *d) {
    lis->d = d;
    if (pthread_create(&lis->thread, NULL, listener_main, lis)) return -1;
    lis->started = true;
    return 0;
}

void srv_listener_stop(srv_listener *lis) {
    if (!lis) return;
    if (lis->started) {
        uint64_t one = 1;
        (void)!write(lis->wake_fd, &one, sizeof one);
        pthread_join(lis->thread, NULL);
        lis->started = false;
    }
    if (lis->listen_fd >= 0) close(lis->listen_fd);
    lis->listen_fd = -1;
    pthread_mutex_lock(&lis->mu);
    for (int k = 0; k < lis->o.max_conns; k++)
        if (lis->slots[k].state == SLOT_PENDING) drop(lis, &lis->slots[k]);
    pthread_mutex_unlock(&lis->mu);
}

void srv_listener_free(srv_listener *lis) {
    if (!lis) return;
    srv_listener_stop(lis);
    if (lis->ep >= 0) close(lis->ep);
    if (lis->wake_fd >= 0) close(lis->wake_fd);
    pthread_mutex_destroy(&lis->mu);
    free(lis->slots);
    free(lis);
}

void srv_listener_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe) {
    srv_listener *lis = cls;
    pthread_mutex_lock(&lis->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        for (int k = 0; ci && k < lis->o.max_conns; k++)
            if (lis->slots[k].state == SLOT_HANDED && lis->slots[k].fd == ci->connect_fd)
                *socket_context = &lis->slots[k];
    } else if (*socket_context) {
        ((slot *)*socket_context)->state = SLOT_FREE; /* before libmicrohttpd closes the socket */
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&lis->mu);
}

void srv_listener_arrived(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    slot *s = ci ? ci->socket_context : NULL;
    if (!s) return;
    pthread_mutex_lock(&s->lis->mu);
    s->arrived = true;
    pthread_mutex_unlock(&s->lis->mu);
}

void srv_listener_stats_get(srv_listener *lis, srv_listener_stats *st) {
    pthread_mutex_lock(&lis->mu);
    *st = lis->st;
    pthread_mutex_unlock(&lis->mu);
}
