/*
 * cli/bench.c - `deltafin bench`: the benchmark and test controls of the
 * engine (engine/dev.h: routing replay, a simulated disk, prefetch tuning, a
 * fixed draft depth, prediction quality) on top of run, logits and serve.
 * The only front end that includes engine/dev.h.
 *
 *   deltafin bench [run options]   one benchmark arm (bench/suite.sh): by
 *                                  default a seeded 512-token random prompt,
 *                                  teacher-forced decode, no text, the
 *                                  summary as one JSON line on stdout;
 *                                  --parallel N: N sequences together
 *                                  (bench_multi.c)
 *   deltafin bench run|logits|serve [options]   the command, plus the controls
 */
#include "cli/cli.h"
#include "engine/dev.h"

#include <stdlib.h>
#include <string.h>

/* ---- the hooks ------------------------------------------------------------------ */

static int dev_open(df_engine **out, const df_engine_opts *eo, const cli_args *a, df_error *err) {
    df_engine_dev dev = {.prefetch_depth = a->prefetch_depth, .prefetch_min_recall = a->prefetch_min_recall,
                         .prefetch_min_precision = a->prefetch_min_precision, .replay_routing = a->replay,
                         .sim_disk_bps = a->sim_disk * 1e9};
    return df_engine_open_dev(out, eo, &dev, err);
}

static void dev_spec_ready(df_spec *sp, const cli_args *a) { df_spec_set_fixed_depth(sp, a->draft_fixed); }

static void dev_stats(const df_engine *e, cli_dev_stats *o) {
    df_dev_stats d;
    df_engine_dev_stats(e, &d);
    *o = (cli_dev_stats){.on = true, .prefetch_depth = d.prefetch_depth,
                         .prefetch_predicted = d.prefetch_predicted, .prefetch_correct = d.prefetch_correct,
                         .prefetch_actual = d.prefetch_actual, .prefetch_gate = d.prefetch_gate,
                         .prefetch_speedup = d.prefetch_speedup, .replay_routing = d.replay_routing,
                         .sim_disk_bps = d.sim_disk_bps};
}

/* Per MoE layer: what the prefetcher uses and how well its predictions did. */
static void dev_prefetch_report(FILE *ev, bool text, df_engine *e, const cli_stats *st) {
    int n = df_engine_prefetch_layers(e, NULL, 0);
    if (!n) return;
    df_prefetch_layer *pl = malloc(sizeof *pl * (size_t)n);
    df_engine_prefetch_layers(e, pl, n);
    uint64_t P = 0, C = 0, A = 0;
    for (int i = 0; i < n; i++) P += pl[i].predicted, C += pl[i].correct, A += pl[i].actual;
    if (text && strcmp(st->s.prefetch, "off") != 0) { /* off: nothing to say per layer */
        fprintf(stderr,
                "prefetch: %s, depth %d, time gate %s (last probe: %.2fx); read ahead %llu experts, "
                "%.1f MB used, %.1f MB wasted, %llu not read (no free slot); recall %.3f precision %.3f\n",
                st->s.prefetch, st->d.prefetch_depth, st->d.prefetch_gate, st->d.prefetch_speedup,
                (unsigned long long)st->s.prefetch_reads,
                (double)st->s.prefetch_bytes_used / 1e6, (double)st->s.prefetch_bytes_wasted / 1e6,
                (unsigned long long)st->s.prefetch_no_room, A ? (double)C / (double)A : 0.0,
                P ? (double)C / (double)P : 0.0);
        fprintf(stderr, "  layer  using   recall  precision  running recall: router  prev"
                        "  read precision: first  prev  ranks read\n");
        for (int i = 0; i < n; i++)
            fprintf(stderr, "  %5d  %-6s  %6.3f  %9.3f  %22.3f  %5.3f  %21.3f  %4.3f  %10d\n", pl[i].layer,
                    pl[i].using, pl[i].actual ? (double)pl[i].correct / (double)pl[i].actual : 0.0,
                    pl[i].predicted ? (double)pl[i].correct / (double)pl[i].predicted : 0.0,
                    pl[i].recall_router, pl[i].recall_prev, pl[i].precision_first, pl[i].precision_prev,
                    pl[i].ranks_read);
    }
    if (ev) {
        fprintf(ev,
                "{\"event\":\"prefetch\",\"mode\":\"%s\",\"depth\":%d,\"gate\":\"%s\","
                "\"gate_speedup\":%.4f,\"reads\":%llu,\"hits\":%llu,"
                "\"bytes_used\":%llu,\"bytes_wasted\":%llu,\"no_room\":%llu,\"recall\":%.4f,"
                "\"precision\":%.4f,\"layers\":[",
                st->s.prefetch, st->d.prefetch_depth, st->d.prefetch_gate, st->d.prefetch_speedup,
                (unsigned long long)st->s.prefetch_reads, (unsigned long long)st->s.prefetch_hits, (unsigned long long)st->s.prefetch_bytes_used,
                (unsigned long long)st->s.prefetch_bytes_wasted, (unsigned long long)st->s.prefetch_no_room,
                A ? (double)C / (double)A : 0.0, P ? (double)C / (double)P : 0.0);
        for (int i = 0; i < n; i++)
            fprintf(ev,
                    "%s{\"layer\":%d,\"using\":\"%s\",\"predicted\":%llu,\"correct\":%llu,"
                    "\"actual\":%llu,\"recall_router\":%.4f,\"recall_prev\":%.4f,"
                    "\"read_precision_first\":%.4f,\"read_precision_prev\":%.4f,\"ranks_read\":%d}",
                    i ? "," : "", pl[i].layer, pl[i].using, (unsigned long long)pl[i].predicted,
                    (unsigned long long)pl[i].correct, (unsigned long long)pl[i].actual,
                    pl[i].recall_router, pl[i].recall_prev, pl[i].precision_first, pl[i].precision_prev,
                    pl[i].ranks_read);
        fprintf(ev, "],");
        cli_json_routing(ev, st);
        fprintf(ev, "}\n");
    }
    free(pl);
}

static const cli_dev DEV = {.open = dev_open, .spec_ready = dev_spec_ready, .stats = dev_stats,
                            .prefetch_report = dev_prefetch_report};
static const cli_dev ARM = {.open = dev_open, .spec_ready = dev_spec_ready, .stats = dev_stats,
                            .prefetch_report = dev_prefetch_report, .replay_from = df_session_replay_from,
                            .arm = true};

/* ---- the commands ---------------------------------------------------------------- */

#define ENGINE_CONTROLS "--replay-routing --sim-disk --prefetch-depth --prefetch-min-recall --prefetch-min-precision"

static const cli_section RUN_CONTROLS[] = {
    {"benchmark and test controls", ENGINE_CONTROLS " --draft-fixed --teacher-force --random-prompt --prompt-seed"},
    {0},
};
/* the arm alone: several sequences at once (bench_multi.c) */
static const cli_section ARM_CONTROLS[] = {
    {"benchmark and test controls", ENGINE_CONTROLS " --teacher-force --random-prompt --prompt-seed --parallel"},
    {0},
};
static const cli_section LOGITS_CONTROLS[] = {{"benchmark and test controls", ENGINE_CONTROLS}, {0}};
static const cli_section SERVE_CONTROLS[] = {
    {"benchmark and test controls",
     "--sim-disk --prefetch-depth --prefetch-min-recall --prefetch-min-precision --draft-fixed"},
    {0},
};

static const cli_cmd ARM_CMD = {
    .usage = "usage: deltafin bench --model DIR [run options] [benchmark options]\n"
             "       deltafin bench run|logits|serve [that command's options] [benchmark options]\n"
             "\n"
             "Benchmarks and tests. Without a command, one benchmark arm (bench/suite.sh;\n"
             "docs/benchmarks.md): `run` on, by default, a seeded 512-token --random-prompt,\n"
             "--teacher-force 7 and 512 decoded tokens (--max-new 513), no text, and the\n"
             "--events summary as one JSON line on stdout. `bench run`, `bench logits` and\n"
             "`bench serve` are those commands with the benchmark and test controls below\n"
             "(their output is the command's own; replayed routing is marked in --stats and\n"
             "--events, and the server refuses it). With --parallel N the arm decodes N\n"
             "sequences together (each its own random prompt and teacher-forced tokens, one\n"
             "row each per forward pass); its summary's tokens_per_s is their aggregate.\n",
    .table = CLI_OPTS, .sections = {CLI_RUN_SECTIONS, ARM_CONTROLS}};

static const cli_cmd RUN_CMD = {
    .usage = "usage: deltafin bench run --model DIR (--prompt TEXT | --prompt-tokens IDS |\n"
             "                          --random-prompt N) [run options] [benchmark options]\n"
             "\n"
             "`deltafin run` with the benchmark and test controls.\n",
    .table = CLI_OPTS, .sections = {CLI_RUN_SECTIONS, RUN_CONTROLS}};

static const cli_cmd LOGITS_CMD = {
    .usage = "usage: deltafin bench logits --model DIR --tokens IDS --out FILE [options]\n"
             "\n"
             "`deltafin logits` with the benchmark and test controls (e.g. the logits of\n"
             "replayed routing, against a reference that routes the same way).\n",
    .table = CLI_OPTS, .sections = {CLI_LOGITS_SECTIONS, LOGITS_CONTROLS}};

static const cli_cmd SERVE_CMD = {
    .usage = "usage: deltafin bench serve --model DIR [serve options] [benchmark options]\n"
             "\n"
             "`deltafin serve` with the benchmark and test controls that keep the output the\n"
             "model's own.\n",
    .table = CLI_OPTS, .sections = {CLI_SERVE_SECTIONS, SERVE_CONTROLS}, .refused = "--replay-routing",
    .refused_why = "is for benchmarks and tests only: the server refuses it (its output would not be the "
                   "model's own)"};

static int bench(const cli_cmd *cmd, int (*fn)(cli_args *, const cli_dev *), const cli_dev *dev, int argc,
                 char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(cmd, &a, argc, argv);
    return rc ? (rc == CLI_HELP ? 0 : rc) : fn(&a, dev);
}

static int arm(cli_args *a, const cli_dev *dev) {
    return a->parallel ? cli_bench_parallel(a, dev) : cli_run(a, dev);
}

int cli_bench_main(int argc, char **argv) {
    const char *sub = argc > 0 ? argv[0] : "";
    if (!strcmp(sub, "run")) return bench(&RUN_CMD, cli_run, &DEV, argc - 1, argv + 1);
    if (!strcmp(sub, "logits")) return bench(&LOGITS_CMD, cli_logits, &DEV, argc - 1, argv + 1);
    if (!strcmp(sub, "serve")) return bench(&SERVE_CMD, cli_serve, &DEV, argc - 1, argv + 1);
    return bench(&ARM_CMD, arm, &ARM, argc, argv);
}
