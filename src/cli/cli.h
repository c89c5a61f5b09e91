/*
 * cli/cli.h - what the `deltafin` commands share: the options of run, logits,
 * inspect, tokenize, serve and bench in one struct and one table (cli.c),
 * the sections each command lists, opening the engine from them, and the
 * hooks through which `deltafin bench` (bench.c, the only front end that
 * sees engine/dev.h) adds the benchmark and test controls to run, logits
 * and serve. Also each command's entry point, for main.c and the tests.
 */
#ifndef DF_CLI_H
#define DF_CLI_H

#include "cli/opts.h"
#include "deltafin.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct cli_args {
    /* model and engine */
    const char *model, *isa, *experts, *policy, *prefetch;
    uint64_t ram_budget, expert_cache, pin;
    int threads, ctx, chunk;
    /* the prompt cache; prompt_cache_ram: serve's RAM tier (-1: its default) */
    const char *prompt_cache;
    uint64_t prompt_cache_size;
    int64_t prompt_cache_ram;
    int prompt_cache_every;
    /* experts by rank (mpirun) */
    bool experts_by_rank;
    float rank_timeout, rank_bw;
    int rank0_no_experts;
    bool describe_only; /* inspect: open without reading weights ahead */
    bool config_only;   /* inspect: config.json alone */
    uint64_t ram;       /* inspect --config-only: the machine's RAM */
    float drive_bw;     /* inspect --config-only: GB/s */
    /* run: prompt, chat, output */
    const char *prompt, *prompt_tokens, *system, *events;
    bool chat, think, print_ids, stats;
    float io_bw;    /* GB/s */
    /* tokenize and logits */
    const char *text, *decode, *tokens, *out;
    int batch;
    /* sampling; *_set: given on the command line */
    df_sampler_params sp;
    int max_new;
    bool temp_set, top_p_set, top_k_set, max_new_set;
    /* speculative decoding */
    const char *draft;
    int draft_k, lookup_n;
    bool draft_rejection;
    /* serve */
    const char *host, *api_key, *api_key_file;
    uint64_t max_body;
    int port, queue, request_timeout, max_per_ip;
    bool insecure_bind;
    /* batch */
    const char *input, *output;
    int parallel; /* serve, batch: requests decoded together; 0: the default (4; serve: 1 with --draft) */
    /* benchmark and test controls (`deltafin bench` only; engine/dev.h) */
    const char *replay;
    float sim_disk; /* GB/s */
    double prefetch_min_recall, prefetch_min_precision;
    int prefetch_depth, draft_fixed, random_prompt;
    long teacher_seed, prompt_seed;
    bool teacher_set;
} cli_args;

extern const cli_opt CLI_OPTS[];
/* What run, logits, inspect and serve list in --help and accept. */
extern const cli_section CLI_RUN_SECTIONS[], CLI_LOGITS_SECTIONS[], CLI_SERVE_SECTIONS[], CLI_BATCH_SECTIONS[];
/* The options only `deltafin bench` takes, named when a product command is given one. */
extern const char CLI_BENCH_ONLY[];

/* Defaults before parsing (run's and serve's). */
void cli_args_init(cli_args *a);
/* The engine options the arguments give (without the draft's reserve). */
df_engine_opts cli_engine_opts(const cli_args *a);
/* Comma- or space-separated token ids; dies naming flag on bad input. */
int32_t *cli_parse_ids(const char *flag, const char *s, int *n);
/* On a worker rank of --experts-by-rank: serves rank 0 until it closes,
 * then exits (0, or 2 after an error); otherwise returns. */
void cli_serve_rank(df_engine *e);
/* "deltafin: MSG", exit 1 out of memory, else 2. */
void cli_die_err(const df_error *e) __attribute__((noreturn));

/* A RAM budget holds the draft model too: with eo->ram_budget set and a
 * drafter, sets eo->reserve_bytes to the draft's weights, KV cache and
 * buffers (at eo->context, or 4096) and eo->reserve_for to a name for it,
 * written in `what`, so the target's expert cache gets what they leave. */
int cli_reserve_draft(df_engine_opts *eo, const char *draft, int draft_k, char *what, size_t what_size,
                      df_error *err);
/* The engine options of n sequences decoded at once (serve, batch): n
 * sessions' state and one set of work buffers in --ram-budget
 * (df_engine_opts.sessions), and a drafter per slot (cli_reserve_draft). */
int cli_parallel_opts(const cli_args *a, int n, df_engine_opts *eo, char *what, size_t what_size, df_error *err);

/* ---- statistics, as run's --stats and --events print them (report.c) ---- */

/* What `deltafin bench` adds to df_stats (a copy of engine/dev.h's record;
 * all zero for the product commands). */
typedef struct cli_dev_stats {
    bool on;
    int prefetch_depth;
    uint64_t prefetch_predicted, prefetch_correct, prefetch_actual;
    const char *prefetch_gate;
    double prefetch_speedup;
    const char *replay_routing;
    double sim_disk_bps;
} cli_dev_stats;

typedef struct cli_stats {
    df_stats s;
    cli_dev_stats d;
} cli_stats;

/* ---- the benchmark hooks (bench.c fills them; NULL for the product) ---- */

typedef struct cli_dev {
    /* df_engine_open with the benchmark controls of a */
    int (*open)(df_engine **out, const df_engine_opts *eo, const cli_args *a, df_error *err);
    /* a drafter was made: the controls that apply to it */
    void (*spec_ready)(df_spec *sp, const cli_args *a);
    void (*stats)(const df_engine *e, cli_dev_stats *out);
    /* the per-layer prefetch report, in place of the product's */
    void (*prefetch_report)(FILE *ev, bool text, df_engine *e, const cli_stats *st);
    /* routing replay: the session's rows replay the trace from this token on */
    void (*replay_from)(df_session *s, uint64_t token);
    bool arm; /* the benchmark arm: no text, one JSON summary on stdout */
} cli_dev;

void cli_get_stats(const df_engine *e, const cli_dev *dev, cli_stats *out);
df_engine *cli_open_engine(const cli_args *a, const cli_dev *dev);

/* report.c */
void cli_json_str(FILE *f, const char *s);
void cli_json_routing(FILE *f, const cli_stats *b);
void cli_report(FILE *ev, bool text, const char *what, int rows, const cli_stats *a, const cli_stats *b,
                double secs);
/* st0: before the prompt, a: after it, b: at the end (decode is a..b) */
void cli_summary(FILE *ev, bool text, const df_model_info *info, const cli_stats *st0, const cli_stats *a,
                 const cli_stats *b, size_t n_prompt, double prefill_s, int n_dec, double dec_s, double io_bw,
                 uint64_t ram_budget, uint64_t storage_bytes);
void cli_prefetch_report(FILE *ev, bool text, const cli_stats *st);
/* The prompt cache's counters (nothing without one). */
void cli_pcache_report(FILE *ev, bool text, const cli_stats *st);
void cli_spec_events(FILE *ev, const df_spec *sp);
uint64_t cli_storage_read_bytes(void);

/* ---- the commands: argv holds what follows the command's name ---- */

int cli_run_main(int argc, char **argv);
int cli_inspect_main(int argc, char **argv);
int cli_tokenize_main(int argc, char **argv);
int cli_logits_main(int argc, char **argv);
int cli_serve_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_pack_main(int argc, char **argv);
int cli_cache_sim_main(int argc, char **argv);
int cli_batch_main(int argc, char **argv);

/* run, logits and serve after parsing, with bench's hooks (dev NULL: none) */
int cli_run(cli_args *a, const cli_dev *dev);
int cli_logits(cli_args *a, const cli_dev *dev);
int cli_serve(cli_args *a, const cli_dev *dev);
/* bench's arm with --parallel N (bench_multi.c) */
int cli_bench_parallel(cli_args *a, const cli_dev *dev);

#endif
