/*
 * listener.h - the server's front door: it owns the listening socket and holds each
 * new connection until its request head (request line and headers) has arrived,
 * before libmicrohttpd reads a byte of it (docs/server.md, "Connections").
 *
 * Owns: accepting; the connection limits (in all, and per client address); the
 * framing check of the request head (srv_check_head), made here because
 * libmicrohttpd 0.9.75 acts on some framing headers itself before the server's
 * handler could look; the deadline by which a request must have arrived whole:
 * a connection still sending its head then is answered 408 and closed, one still
 * sending its body (libmicrohttpd reads it) is shut down.
 *
 * Every connection carries one request (server.c answers with Connection:
 * close), so every request passes through here. Connections that passed are
 * libmicrohttpd's; the listener still counts them (limits) until it is told they
 * closed (srv_listener_notify).
 */
#ifndef DF_SERVER_LISTENER_H
#define DF_SERVER_LISTENER_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define SRV_HEAD_MAX 16384 /* largest request head; larger gets 431 */

typedef struct srv_listener srv_listener;

typedef struct srv_listener_opts {
    const struct sockaddr *addr; /* where to listen */
    socklen_t addr_len;
    int max_conns;       /* connections held at once, in all */
    int max_per_addr;    /* ... from one client address */
    int request_timeout; /* seconds from accept until the request has arrived whole */
} srv_listener_opts;

/* Connections the listener closed, by reason (for /metrics). */
typedef struct srv_listener_stats {
    uint64_t bad_head;   /* refused for their head: 400, 431 or 501 */
    uint64_t deadline;   /* not arrived whole within the request timeout */
    uint64_t per_addr;   /* over the per-address limit */
    uint64_t full;       /* over the limit in all */
} srv_listener_stats;

/* Binds and listens. Returns -1 with errno set on failure. */
int srv_listener_open(srv_listener **out, const srv_listener_opts *o);
/* Starts accepting; connections whose head passed go to d (which was started
 * with MHD_USE_NO_LISTEN_SOCKET and srv_listener_notify). Returns -1 on failure. */
int srv_listener_start(srv_listener *lis, struct MHD_Daemon *d);
/* Stops accepting and closes the connections not handed over. */
void srv_listener_stop(srv_listener *lis);
/* Frees the listener; after MHD_stop_daemon (which still notifies it). */
void srv_listener_free(srv_listener *lis);

/* MHD_OPTION_NOTIFY_CONNECTION callback; cls is the listener. */
void srv_listener_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe);
/* The request on c has arrived whole: the deadline no longer applies to it. */
void srv_listener_arrived(struct MHD_Connection *c);
void srv_listener_stats_get(srv_listener *lis, srv_listener_stats *st);

/* Checks the framing headers of a request head (head[0..len), ending with its
 * empty line) so that the server and any proxy in front agree on where the
 * request ends. Returns 0 if it passes, else the status to answer (400, or 501
 * for a transfer coding other than chunked) with a message naming the header
 * in msg. */
int srv_check_head(const char *head, size_t len, char *msg, size_t msg_size);

#endif
