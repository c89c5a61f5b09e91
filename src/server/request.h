/*
 * request.h - the OpenAI request bodies the server accepts, parsed and validated
 * without an engine (so the fuzz target can drive it alone).
 *
 * Owns: srv_request (what a /v1/completions or /v1/chat/completions body asks
 * for), its parser/validator and the OpenAI-shaped error it reports. Anything the
 * server cannot honour exactly is refused here, naming the field.
 */
#ifndef DF_SERVER_REQUEST_H
#define DF_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { SRV_COMPLETIONS = 0, SRV_CHAT = 1 };
#define SRV_MAX_STOP 4

typedef struct srv_msg {
    char *role; /* "system", "user" or "assistant" ("developer" maps to "system") */
    char *content;
} srv_msg;

typedef struct srv_request {
    int kind;
    char *prompt;          /* completions with a text prompt */
    int32_t *prompt_ids;   /* completions with a token-id prompt */
    size_t n_prompt_ids;
    srv_msg *msgs;         /* chat */
    int n_msgs;
    int max_tokens;        /* -1 = unset */
    bool temperature_set, top_p_set, seed_set;
    double temperature, top_p;
    double presence_penalty, frequency_penalty;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    bool stream, include_usage;
    int enable_thinking;   /* -1 = unset (template default) */
} srv_request;

typedef struct srv_error {
    char message[512];
    char param[64]; /* "" = null */
} srv_error;

/* Parses and validates one request body. On failure fills err and returns -1
 * (out is then empty; srv_request_free on it is harmless). */
int srv_parse_request(int kind, const char *body, size_t len, srv_request *out, srv_error *err);
void srv_request_free(srv_request *r);

/* The OpenAI error object {"error":{message,type,param,code}}; malloc'ed. */
char *srv_error_json(const char *message, const char *type, const char *param);

#endif
