/*
 * fuzz_head.c - libFuzzer target for the server's request-head framing check
 * (srv_check_head, src/server/listener.c), which reads bytes straight from the
 * network. The input is the head, in a buffer of exactly its size (so ASan
 * sees any read past it). A refusal must be 400 or 501 with a message that
 * names it in printable ASCII (it goes into a JSON error as is).
 */
#include "fuzz.h"
#include "server/listener.h"
#include "server/request.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[600];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "\r\n", "\n", "\r", "\r\n\r\n", ": ", " ", "\t", "Content-Length: ", "content-length:",
    "Transfer-Encoding: ", "chunked", "CHUNKED", "gzip, chunked", " HTTP/1.0", " HTTP/1.1", "-5", "+5",
    "0x10", "18446744073709551616", "99999999999999999999",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *head = malloc(size ? size : 1);
    if (!head) abort();
    if (size) memcpy(head, data, size);
    char msg[256];
    msg[0] = 0;
    int st = srv_check_head(head, size, msg, sizeof msg);
    if (st) {
        if ((st != 400 && st != 501) || !msg[0]) abort();
        for (const char *p = msg; *p; p++)
            if (*p < 0x20 || *p > 0x7e) abort();
        char *j = srv_error_json(msg, "invalid_request_error", NULL);
        if (!j || !strstr(j, "\"message\":\"") || strstr(j, "\"invalid request\"")) abort();
        free(j);
    }
    /* the start of the message says which check refused; quoted values vary */
    df_fuzz_describe(outcome, sizeof outcome, st ? "refused " : "passed", msg, strlen(msg), '\'');
    free(head);
    return 0;
}
