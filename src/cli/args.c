/*
 * cli/args.c - the front ends' option parsers and their one way to fail;
 * see args.h.
 */
#include "cli/args.h"

#include "deltafin.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deltafin: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(CLI_EXIT_BAD);
}

long cli_long(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        cli_die("%s expects an integer in %ld..%ld, got '%s'", flag, lo, hi, v);
    return x;
}

uint64_t cli_size(const char *flag, const char *v) {
    uint64_t b;
    df_error err;
    if (df_parse_size(v, flag, &b, &err)) cli_die("%s", err.msg);
    return b;
}

float cli_float(const char *flag, const char *v) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || *end || end == v || !isfinite(x)) cli_die("%s expects a number, got '%s'", flag, v);
    return x;
}

float cli_share(const char *flag, const char *v) {
    float x = cli_float(flag, v);
    if (x <= 0 || x > 1) cli_die("%s expects a number in (0, 1], got '%s'", flag, v);
    return x;
}

int cli_reserve_draft(df_engine_opts *eo, const char *draft, int draft_k, char *what, size_t what_size,
                      df_error *err) {
    if (!draft || !eo->ram_budget) return DF_OK;
    df_spec_opts so = {.draft = draft, .k_max = draft_k, .isa = eo->isa};
    int rc = df_spec_draft_bytes(&so, 0, eo->context ? eo->context : 4096, &eo->reserve_bytes, err);
    if (rc) return rc;
    snprintf(what, what_size, "the draft %s", strcmp(draft, "lookup") ? draft : "(lookup)");
    eo->reserve_for = what;
    return DF_OK;
}
