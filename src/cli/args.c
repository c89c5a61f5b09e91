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
