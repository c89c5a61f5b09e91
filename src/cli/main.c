/*
 * cli/main.c - the deltafin command line: which command runs. Each command
 * parses its options with the shared table (opts.h, cli.c) and drives the
 * public API (deltafin.h); `deltafin bench` adds the benchmark and test
 * controls (bench.c).
 *
 * Exit codes: 0 success, 2 bad input or usage (the message names what is wrong),
 * 1 an unexpected runtime failure.
 */
#include "cli/cli.h"
#include "rev.h" /* DF_REV: the build's commit (Makefile) */

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char MAIN_HELP[] =
    "usage: deltafin COMMAND [options]    (deltafin COMMAND --help for details; deltafin --version)\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  inspect    print a checkpoint's config, tensors and byte counts\n"
    "  tokenize   text to token ids and back\n"
    "  logits     write the logits of a token sequence to a file\n"
    "  pack       rewrite a checkpoint's routed experts into an expert pack (--verify to check)\n"
    "  cache-sim  replay a routing trace through the expert cache policies\n"
    "  serve      OpenAI-compatible HTTP server (docs/server.md)\n"
    "  batch      run a file of OpenAI Batch API jobs, several at once; resumable\n"
    "  bench      benchmarks and tests: one benchmark arm (run's options, a seeded\n"
    "             512-token prompt by default, teacher-forced decode, one JSON summary\n"
    "             line on stdout; make bench), or `bench run|logits|serve` with the\n"
    "             benchmark and test controls (routing replay, a simulated disk, ...)\n";

static const struct {
    const char *name;
    int (*main)(int argc, char **argv);
} COMMANDS[] = {
    {"run", cli_run_main},     {"inspect", cli_inspect_main}, {"tokenize", cli_tokenize_main},
    {"logits", cli_logits_main}, {"pack", cli_pack_main},     {"cache-sim", cli_cache_sim_main},
    {"serve", cli_serve_main}, {"bench", cli_bench_main}, {"batch", cli_batch_main},
};

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("deltafin (git %s)\n", DF_REV);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(MAIN_HELP, stdout);
        return argc < 2 ? CLI_EXIT_BAD : 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) {
            int rc = COMMANDS[i].main(argc - 2, argv + 2);
            /* generated text or ids written to a full disk must not end in exit 0 */
            errno = 0;
            if (fflush(stdout) != 0 || ferror(stdout))
                cli_die("writing to standard output failed%s%s", errno ? ": " : "", errno ? strerror(errno) : "");
            return rc;
        }
    cli_die("unknown command '%s' (see deltafin --help)", argv[1]);
}
