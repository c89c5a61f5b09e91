/*
 * cli/args.h - what the command-line front ends (src/main.c's commands and
 * `deltafin serve`) share for reading options: one way to fail (a message
 * prefixed "deltafin: ", exit status 2) and the checked number/size parsers
 * whose messages name the flag. Front-end code only: the engine reports
 * errors through df_error and never exits.
 */
#ifndef DF_CLI_ARGS_H
#define DF_CLI_ARGS_H

#include <stdint.h>

#define CLI_EXIT_BAD 2

void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* an integer in lo..hi */
long cli_long(const char *flag, const char *v, long lo, long hi);
/* 512M, 2G, ... (df_parse_size) */
uint64_t cli_size(const char *flag, const char *v);
/* a finite number */
float cli_float(const char *flag, const char *v);

#endif
