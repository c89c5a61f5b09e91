/*
 * cli/opts.h - the one option parser and help format of every `deltafin`
 * command. A command is a table of options (name, argument, help text, a
 * setter and where it writes) and the sections its --help lists; parsing
 * reads "--name VALUE" or "--name=VALUE", and every error names the option.
 * Also the front ends' one way to fail (cli_die: "deltafin: ...", exit 2)
 * and the checked number parsers the setters use. Front-end code only: the
 * library reports errors through df_error and never exits.
 */
#ifndef DF_CLI_OPTS_H
#define DF_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CLI_EXIT_BAD 2 /* bad input or usage */
#define CLI_HELP (-1)  /* cli_parse printed --help: the command exits 0 */

typedef struct cli_opt cli_opt;
/* Stores v (NULL for a flag) at dst + o->off; prints "deltafin: ..." naming
 * o->name and returns nonzero when v is not acceptable. */
typedef int (*cli_setter)(const cli_opt *o, void *dst, const char *v);

struct cli_opt {
    const char *name; /* "--threads" */
    const char *arg;  /* "N"; NULL: a flag that takes no value */
    const char *help; /* lines separated by '\n'; NULL: accepted, not listed */
    cli_setter set;
    size_t off;       /* field of the command's option struct */
    long lo, hi;      /* cli_set_int's and cli_set_long's range */
};

/* The setters of the table entries (see each for the field's type). */
int cli_set_str(const cli_opt *o, void *dst, const char *v);    /* const char * */
int cli_set_true(const cli_opt *o, void *dst, const char *v);   /* bool */
int cli_set_false(const cli_opt *o, void *dst, const char *v);  /* bool */
int cli_set_int(const cli_opt *o, void *dst, const char *v);    /* int in lo..hi */
int cli_set_long(const cli_opt *o, void *dst, const char *v);   /* long in lo..hi */
int cli_set_size(const cli_opt *o, void *dst, const char *v);   /* uint64_t, 512M, 2G, ... */
int cli_set_float(const cli_opt *o, void *dst, const char *v);  /* float, finite */
int cli_set_share(const cli_opt *o, void *dst, const char *v);  /* double, in (0, 1] (parsed as float) */
int cli_set_positive(const cli_opt *o, void *dst, const char *v); /* float, finite, > 0 */
int cli_set_nonneg(const cli_opt *o, void *dst, const char *v);   /* float, finite, >= 0 (0: the default) */
/* float, finite, and ok(x); else an error saying the value must be `what`
 * ("a number in (0, 1]"): the setters of ranged float options are made of it */
int cli_set_float_if(const cli_opt *o, void *dst, const char *v, bool (*ok)(float), const char *what);

#define CLI_FIELD(type, f) offsetof(type, f)

/* A titled group of options in --help: names separated by spaces, in order. */
typedef struct cli_section {
    const char *title; /* NULL: no title line */
    const char *names;
} cli_section;

typedef struct cli_cmd {
    const char *usage;  /* "usage: ..." and what the command does, printed first */
    const cli_opt *table; /* every option the struct takes, ended by {0} */
    const cli_section *sections[4]; /* what this command accepts, each list ended by {0} */
    const char *footer; /* printed after the options, or NULL */
    /* Options that exist under `deltafin bench` only: named in the error. */
    const char *bench_only;
    const char *bench_where; /* e.g. "deltafin bench run" */
    /* Options refused outright, and why (the server and replayed routing). */
    const char *refused, *refused_why;
    /* Arguments that are not options; NULL: refused. Nonzero: an error was said. */
    int (*positional)(void *dst, const char *arg);
} cli_cmd;

/* Parses argv[0..argc) into dst. Returns 0, CLI_HELP (--help or -h: the help
 * was printed to stdout) or CLI_EXIT_BAD (the error was printed to stderr). */
int cli_parse(const cli_cmd *cmd, void *dst, int argc, char **argv);
void cli_help(const cli_cmd *cmd, FILE *f);

void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
