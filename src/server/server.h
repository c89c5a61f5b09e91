/*
 * server.h - `deltafin serve`'s server: an OpenAI-compatible HTTP server over
 * an engine the caller opened (src/cli/serve.c with df_engine_open, `deltafin
 * bench serve` with the benchmark controls). Public API (deltafin.h) only.
 * See docs/server.md.
 */
#ifndef DF_SERVER_H
#define DF_SERVER_H

#include "deltafin.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#define SRV_MAX_CONNS 256 /* connections held at once */

typedef struct srv_config {
    const struct sockaddr *addr; /* where to listen */
    socklen_t addr_len;
    const char *host;            /* as given, for messages */
    int port;
    const char *api_key;         /* NULL: none required */
    uint64_t max_body;           /* largest request body */
    int parallel;                /* requests decoded together (1: one at a time) */
    int queue;                   /* requests that may wait behind the running ones */
    int request_timeout;         /* seconds a request has to arrive whole */
    int max_per_ip;              /* connections one address may hold */
    int ctx;                     /* the session's context */
    const char *model_id;        /* what /v1/models names */
    /* A request's defaults, where it gives none: sampling (temperature, top_p
     * and top_k when *_set, else generation_config.json's; min_p and the
     * repeat penalty always), max_tokens (0: what the context holds) and the
     * chat template's thinking switch. */
    df_sampler_params sp;
    bool temp_set, top_p_set, top_k_set;
    int max_new;
    bool think;
} srv_config;

/* Serves eng (and specs: NULL without a drafter, else one per slot, i.e.
 * cfg->parallel of them; none is taken over) until SIGINT or SIGTERM, then
 * stops every request. Returns the exit status. */
int srv_run(const srv_config *cfg, df_engine *eng, df_spec **specs);

#endif
