/*
 * cli/args.h - what the command-line front ends (src/main.c's commands and
 * `deltafin serve`) share for reading options: one way to fail (a message
 * prefixed "deltafin: ", exit status 2), the checked number/size parsers
 * whose messages name the flag, and how --ram-budget makes room for a draft.
 * Front-end code only: the engine reports errors through df_error and never
 * exits.
 */
#ifndef DF_CLI_ARGS_H
#define DF_CLI_ARGS_H

#include "deltafin.h"

#include <stddef.h>
#include <stdint.h>

#define CLI_EXIT_BAD 2

void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* an integer in lo..hi */
long cli_long(const char *flag, const char *v, long lo, long hi);
/* 512M, 2G, ... (df_parse_size) */
uint64_t cli_size(const char *flag, const char *v);
/* a finite number */
float cli_float(const char *flag, const char *v);
/* a number in (0, 1] */
float cli_share(const char *flag, const char *v);

/* A RAM budget holds the draft model too: with eo->ram_budget set and a
 * drafter, sets eo->reserve_bytes to the draft's weights, KV cache and
 * buffers (at eo->context, or 4096) and eo->reserve_for to a name for it,
 * written in `what`, so the target's expert cache gets what they leave. */
int cli_reserve_draft(df_engine_opts *eo, const char *draft, int draft_k, char *what, size_t what_size,
                      df_error *err);

#endif
