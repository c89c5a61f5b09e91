/*
 * main.c - the deltafin command line. Parses arguments and drives the public API
 * (deltafin.h) only; no tensor internals here.
 *
 *   deltafin run       generate text from a prompt (or a chat turn)
 *   deltafin inspect   config, tensor inventory, byte counts
 *   deltafin tokenize  text -> ids, or --decode ids -> text
 *   deltafin logits    raw logits of a token sequence (for tests and tools)
 *   deltafin pack      rewrite routed experts into an expert pack, or --verify one
 *   deltafin cache-sim replay a routing trace through the expert cache policies
 *   deltafin bench     one benchmark arm: `run` on a seeded random prompt, teacher-forced,
 *                      one JSON summary on stdout (bench/suite.sh drives it)
 *
 * Exit codes: 0 success, 2 bad input or usage (the message names what is wrong),
 * 1 an unexpected runtime failure.
 */
#include "deltafin.h"
#include "engine/dev.h" /* FIXME(front ends): dev controls move to bench */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int df_cache_sim_main(int argc, char **argv);
int df_pack_main(int argc, char **argv);
int df_serve_main(int argc, char **argv);

/* The public statistics and the benchmark ones, in one record. */
typedef struct cli_stats {
    df_stats s;
    df_dev_stats d;
} cli_stats;

static void cli_get_stats(const df_engine *e, cli_stats *o) {
    df_engine_stats(e, &o->s);
    df_engine_dev_stats(e, &o->d);
}

static void die_err(const df_error *e) {
    fprintf(stderr, "deltafin: %s\n", e->msg);
    exit(e->code == DF_ERR_NOMEM ? 1 : CLI_EXIT_BAD);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- option parsing ------------------------------------------------------------ */

typedef struct opts {
    const char *model, *prompt, *prompt_tokens, *system, *text, *decode, *tokens, *out, *isa;
    const char *experts, *events, *policy, *prefetch, *replay, *draft;
    uint64_t ram_budget, expert_cache, pin;
    double io_bw, prefetch_min_recall, prefetch_min_precision, sim_disk;
    long teacher_seed; /* > 0: feed pseudo-random tokens instead of the sampled ones */
    bool teacher_set;  /* given on the command line (0 turns bench's default off) */
    long prompt_seed;  /* --random-prompt's seed */
    bool chat, think, print_ids, help, stats, draft_rejection;
    int max_new, threads, ctx, batch, chunk, prefetch_depth, random_prompt, draft_k, lookup_n, draft_fixed;
    df_sampler_params sp;
    bool temp_set, top_p_set, top_k_set, max_new_set;
} opts;

/* Comma- or space-separated token ids. */
static int32_t *parse_ids(const char *flag, const char *s, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX)
            cli_die("%s: '%s' is not a list of token ids", flag, s);
        if (k == cap) ids = realloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
        ids[k++] = (int32_t)v;
        p = end;
    }
    if (!k) cli_die("%s: no token ids given", flag);
    *n = k;
    return ids;
}

static void parse(opts *o, int argc, char **argv, const char *allowed) {
    memset(o, 0, sizeof *o);
    df_sampler_params_default(&o->sp);
    o->max_new = 128;
    o->think = true;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { o->help = true; continue; }
        if (strncmp(a, "--", 2) != 0) cli_die("unexpected argument '%s' (see --help)", a);
        /* check the flag is one this command takes */
        char key[64];
        snprintf(key, sizeof key, " %s ", a);
        if (!strstr(allowed, key)) cli_die("unknown option '%s' for this command (see --help)", a);
        bool is_flag = !strcmp(a, "--chat") || !strcmp(a, "--print-ids") ||
                       !strcmp(a, "--no-think") || !strcmp(a, "--think") ||
                       !strcmp(a, "--stats") || !strcmp(a, "--draft-rejection");
        if (is_flag) {
            if (!strcmp(a, "--chat")) o->chat = true;
            else if (!strcmp(a, "--print-ids")) o->print_ids = true;
            else if (!strcmp(a, "--no-think")) o->think = false;
            else if (!strcmp(a, "--stats")) o->stats = true;
            else if (!strcmp(a, "--draft-rejection")) o->draft_rejection = true;
            else o->think = true;
            continue;
        }
        if (i + 1 >= argc) cli_die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-tokens")) o->prompt_tokens = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--decode")) o->decode = v;
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--isa")) o->isa = v;
        else if (!strcmp(a, "--experts")) o->experts = v;
        else if (!strcmp(a, "--events")) o->events = v;
        else if (!strcmp(a, "--ram-budget")) o->ram_budget = cli_size(a, v);
        else if (!strcmp(a, "--teacher-force")) {
            o->teacher_seed = cli_long(a, v, 0, LONG_MAX);
            o->teacher_set = true;
        }
        else if (!strcmp(a, "--expert-cache")) o->expert_cache = cli_size(a, v);
        else if (!strcmp(a, "--pin")) o->pin = cli_size(a, v);
        else if (!strcmp(a, "--policy")) o->policy = v;
        else if (!strcmp(a, "--prefetch")) o->prefetch = v;
        else if (!strcmp(a, "--prefetch-depth")) o->prefetch_depth = (int)cli_long(a, v, 1, 8);
        else if (!strcmp(a, "--prefetch-min-recall")) o->prefetch_min_recall = cli_share(a, v);
        else if (!strcmp(a, "--prefetch-min-precision")) o->prefetch_min_precision = cli_share(a, v);
        else if (!strcmp(a, "--replay-routing")) o->replay = v;
        else if (!strcmp(a, "--random-prompt")) o->random_prompt = (int)cli_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--prompt-seed")) o->prompt_seed = cli_long(a, v, 0, LONG_MAX);
        else if (!strcmp(a, "--draft")) o->draft = v;
        else if (!strcmp(a, "--draft-k")) o->draft_k = (int)cli_long(a, v, 1, 16);
        else if (!strcmp(a, "--draft-fixed")) o->draft_fixed = (int)cli_long(a, v, 1, 16);
        else if (!strcmp(a, "--lookup-n")) o->lookup_n = (int)cli_long(a, v, 1, 16);
        else if (!strcmp(a, "--io-bw")) o->io_bw = cli_float(a, v);
        else if (!strcmp(a, "--sim-disk")) {
            o->sim_disk = cli_float(a, v);
            if (o->sim_disk <= 0) cli_die("--sim-disk expects a bandwidth in GB/s above 0, got '%s'", v);
        }
        else if (!strcmp(a, "--max-new")) { o->max_new = (int)cli_long(a, v, 0, 1 << 24); o->max_new_set = true; }
        else if (!strcmp(a, "--threads")) o->threads = (int)cli_long(a, v, 1, 256);
        else if (!strcmp(a, "--ctx")) o->ctx = (int)cli_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--batch")) o->batch = (int)cli_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--chunk")) o->chunk = (int)cli_long(a, v, 1, 65536);
        else if (!strcmp(a, "--temp")) { o->sp.temperature = cli_float(a, v); o->temp_set = true; }
        else if (!strcmp(a, "--top-p")) { o->sp.top_p = cli_float(a, v); o->top_p_set = true; }
        else if (!strcmp(a, "--top-k")) { o->sp.top_k = (int)cli_long(a, v, 0, INT_MAX); o->top_k_set = true; }
        else if (!strcmp(a, "--min-p")) o->sp.min_p = cli_float(a, v);
        else if (!strcmp(a, "--repeat-penalty")) o->sp.repeat_penalty = cli_float(a, v);
        else if (!strcmp(a, "--repeat-last-n")) o->sp.repeat_last_n = (int)cli_long(a, v, 0, INT_MAX);
        else if (!strcmp(a, "--seed")) o->sp.seed = (uint64_t)cli_long(a, v, 0, LONG_MAX);
        else cli_die("unknown option '%s' (see --help)", a);
    }
}

static df_engine *open_engine(const opts *o) {
    if (!o->model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    df_error err;
    df_engine_opts eo = {.model_dir = o->model, .n_threads = o->threads, .isa = o->isa,
                         .experts = o->experts, .ram_budget = o->ram_budget, .context = o->ctx,
                         .expert_cache = o->expert_cache, .cache_policy = o->policy,
                         .pin_bytes = o->pin, .prefill_chunk = o->chunk, .prefetch = o->prefetch};
    df_engine_dev dev = {.prefetch_depth = o->prefetch_depth, .prefetch_min_recall = o->prefetch_min_recall,
                         .prefetch_min_precision = o->prefetch_min_precision, .replay_routing = o->replay,
                         .sim_disk_bps = o->sim_disk * 1e9};
    char what[600];
    if (cli_reserve_draft(&eo, o->draft, o->draft_k, what, sizeof what, &err)) die_err(&err);
    df_engine *e;
    if (df_engine_open_dev(&e, &eo, &dev, &err)) die_err(&err);
    int max = df_engine_info(e)->max_context;
    if (o->ctx > max) cli_die("--ctx %d exceeds the model's context of %d tokens", o->ctx, max);
    return e;
}

/* ---- run ------------------------------------------------------------------------- */

/* The number a line of a /proc file gives (fmt: the line with one %llu), 0 if none. */
static uint64_t proc_number(const char *path, const char *fmt) {
    FILE *f = fopen(path, "r");
    char line[256];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1) break;
    if (f) fclose(f);
    return (uint64_t)v;
}

static uint64_t peak_rss_bytes(void) { return proc_number("/proc/self/status", "VmHWM: %llu kB") * 1024; }

/* Bytes this process has made the kernel fetch from storage (/proc/self/io
 * read_bytes): page-cache misses and O_DIRECT reads alike, so the page-cache path's
 * real reads can be compared with the pack's. */
static uint64_t storage_read_bytes(void) { return proc_number("/proc/self/io", "read_bytes: %llu"); }

/* JSON string body of s (quotes, backslashes and control characters escaped). */
static void json_str(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

/* Events of replayed routing say so: their output is not the model's own. */
static void json_routing(FILE *f, const cli_stats *b) {
    if (b->d.sim_disk_bps > 0) fprintf(f, "\"sim_disk_gbs\":%.4f,", b->d.sim_disk_bps / 1e9);
    fprintf(f, "\"routing\":\"%s\"", b->d.replay_routing ? "replay" : "model");
    if (b->d.replay_routing) {
        fprintf(f, ",\"replay_trace\":\"");
        json_str(f, b->d.replay_routing);
        fputc('"', f);
    }
}

/* One line (stderr) and/or one JSON object (events) for `rows` rows evaluated
 * between counter snapshots a and b in `secs` of wall time. */
static void report(FILE *ev, bool text, const char *what, int rows, const cli_stats *a,
                   const cli_stats *b, double secs) {
    uint64_t bytes = b->s.expert_bytes_read - a->s.expert_bytes_read;
    uint64_t hits = b->s.expert_hits - a->s.expert_hits, miss = b->s.expert_misses - a->s.expert_misses;
    uint64_t pf_hits = b->s.prefetch_hits - a->s.prefetch_hits;
    uint64_t pf_used = b->s.prefetch_bytes_used - a->s.prefetch_bytes_used;
    uint64_t pf_waste = b->s.prefetch_bytes_wasted - a->s.prefetch_bytes_wasted;
    double wait = b->s.read_wait_s - a->s.read_wait_s, compute = secs - wait;
    if (text && strcmp(what, "token") == 0)
        fprintf(stderr,
                "[%s] %.3f s (%.2f tok/s)  read %.1f MB at %.3f GB/s  hits %llu misses %llu "
                "(prefetched %llu)  wait %.3f s compute %.3f s\n",
                what, secs, secs > 0 ? rows / secs : 0.0, (double)bytes / 1e6,
                secs > 0 ? (double)bytes / secs / 1e9 : 0.0, (unsigned long long)hits,
                (unsigned long long)miss, (unsigned long long)pf_hits, wait, compute);
    if (ev) {
        fprintf(ev,
                "{\"event\":\"%s\",\"rows\":%d,\"seconds\":%.6f,\"expert_bytes_read\":%llu,"
                "\"expert_hits\":%llu,\"expert_misses\":%llu,\"prefetch_hits\":%llu,"
                "\"prefetch_bytes_used\":%llu,\"prefetch_bytes_wasted\":%llu,"
                "\"read_wait_s\":%.6f,\"compute_s\":%.6f,\"read_bandwidth_gbs\":%.4f,",
                what, rows, secs, (unsigned long long)bytes, (unsigned long long)hits,
                (unsigned long long)miss, (unsigned long long)pf_hits, (unsigned long long)pf_used,
                (unsigned long long)pf_waste, wait, compute,
                secs > 0 ? (double)bytes / secs / 1e9 : 0.0);
        json_routing(ev, b);
        fprintf(ev, "}\n");
    }
}

/* Per MoE layer: what the prefetcher uses and how well its predictions did. */
static void prefetch_report(FILE *ev, bool text, df_engine *e, const cli_stats *st) {
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
        json_routing(ev, st);
        fprintf(ev, "}\n");
    }
    free(pl);
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* "512.0 MiB", "400.0 TiB": a budget may be anything from a few MiB up. */
static const char *size_str(char *buf, size_t n, uint64_t bytes) {
    static const char *unit[] = {"MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes / 1048576.0;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

/* --stats: the memory the engine counted next to what the process took, and
 * what set the expert cache's size. */
static void mem_report(const cli_stats *b) {
    char s1[32], s2[32], s3[32];
    double mib = 1048576.0;
    if (!b->s.mem_estimate) return;
    fprintf(stderr, "  memory: ");
    if (b->s.ram_budget) fprintf(stderr, "budget %s, ", size_str(s1, sizeof s1, b->s.ram_budget));
    fprintf(stderr, "estimated %s, peak RSS %s", size_str(s2, sizeof s2, b->s.mem_estimate),
            size_str(s3, sizeof s3, peak_rss_bytes()));
    if (!b->s.cache_sizing) fprintf(stderr, "\n");
    else if (!strcmp(b->s.cache_sizing, "all experts fit")) fprintf(stderr, "; expert cache: all experts fit\n");
    else if (!strcmp(b->s.cache_sizing, "available memory"))
        fprintf(stderr, "; expert cache sized to the available memory (%s)\n",
                size_str(s1, sizeof s1, b->s.mem_available));
    else fprintf(stderr, "; expert cache sized by %s\n", b->s.cache_sizing);
    fprintf(stderr, "    (estimate in MiB: resident at open %.1f, loading peak %.1f, session %.1f at %d tokens, "
            "slack %.1f, reserve %.1f, expert cache %.1f)\n", (double)b->s.mem_resident / mib,
            (double)b->s.mem_load_peak / mib, (double)b->s.mem_session / mib, b->s.mem_context,
            (double)b->s.mem_slack / mib, (double)b->s.mem_reserve / mib, (double)b->s.cache_bytes / mib);
}

static void summary(FILE *ev, bool text, const df_model_info *info, const cli_stats *a,
                    const cli_stats *b, size_t n_prompt, double prefill_s, int n_dec, double dec_s,
                    double io_bw, uint64_t ram_budget, uint64_t storage_bytes) {
    double tps = n_dec && dec_s > 0 ? n_dec / dec_s : 0;
    uint64_t bytes = b->s.expert_bytes_read - a->s.expert_bytes_read;
    uint64_t hits = b->s.expert_hits - a->s.expert_hits, miss = b->s.expert_misses - a->s.expert_misses;
    uint64_t waste = b->s.prefetch_bytes_wasted - a->s.prefetch_bytes_wasted;
    double wait = b->s.read_wait_s - a->s.read_wait_s;
    /* Missed bytes are what the tokens needed and the cache did not hold; a
     * wrong prediction's read is waste, not need. */
    double per_tok = n_dec ? (double)(bytes > waste ? bytes - waste : 0) / n_dec : 0;
    double bw = dec_s > 0 ? (double)bytes / dec_s : 0;
    /* The I/O bound: tokens/s if every missed byte streamed at the measured
     * device bandwidth and nothing else took time. */
    double bound = io_bw > 0 && per_tok > 0 ? io_bw * 1e9 / per_tok : 0;
    if (text) {
        fprintf(stderr,
                "summary: prefill %zu tokens %.3f s (%.2f tok/s) | decode %d tokens %.3f s (%.3f tok/s)\n"
                "  experts: %s, cache %d slots (%.1f MiB, %d pinned); hits %llu misses %llu (hit rate %.1f%%)\n"
                "  read %.1f MB (%.2f MB/token missed, %.1f MB wasted) at %.3f GB/s; waiting on reads "
                "%.3f s (%.4f s/token), computing %.3f s\n",
                n_prompt, prefill_s, prefill_s > 0 ? (double)n_prompt / prefill_s : 0, n_dec, dec_s, tps,
                b->s.expert_source, b->s.cache_slots, (double)b->s.cache_bytes / 1048576.0,
                b->s.pinned_experts, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? 100.0 * (double)hits / (double)(hits + miss) : 0.0, (double)bytes / 1e6,
                per_tok / 1e6, (double)waste / 1e6, bw / 1e9, wait, n_dec ? wait / n_dec : 0.0,
                dec_s - wait);
        if (bound > 0)
            fprintf(stderr, "  I/O bound %.3f tok/s at %.3f GB/s %s: achieved %.2f of it\n", bound, io_bw,
                    b->d.sim_disk_bps > 0 ? "(simulated disk)" : "measured", tps / bound);
        fprintf(stderr, "  active weights %.1f MB/token; peak RSS %.1f MiB; %s, %d threads\n",
                (double)info->bytes_active_per_token / 1e6, (double)peak_rss_bytes() / 1048576.0,
                info->isa, info->n_threads);
        mem_report(b);
        if (b->d.replay_routing)
            fprintf(stderr, "  routing REPLAYED from %s: not the model's own output\n", b->d.replay_routing);
    }
    if (ev)
        fprintf(ev,
                "{\"event\":\"summary\",\"prompt_tokens\":%zu,\"prefill_s\":%.6f,\"decode_tokens\":%d,"
                "\"decode_s\":%.6f,\"tokens_per_s\":%.6f,\"expert_source\":\"%s\",\"cache_slots\":%d,"
                "\"expert_hits\":%llu,\"expert_misses\":%llu,\"expert_bytes_read\":%llu,"
                "\"bytes_missed_per_token\":%.1f,\"prefetch_bytes_wasted\":%llu,"
                "\"read_bandwidth_gbs\":%.4f,\"read_wait_s\":%.6f,\"prefetch\":\"%s\","
                "\"prefetch_recall\":%.4f,\"prefetch_precision\":%.4f,"
                "\"io_bound_tokens_per_s\":%.6f,\"fraction_of_bound\":%.4f,\"peak_rss_bytes\":%llu,"
                "\"active_bytes_per_token\":%llu,\"eval_s\":%.6f,\"ttft_s\":%.6f,\"ram_budget\":%llu,"
                "\"cache_bytes\":%llu,\"expert_bytes\":%llu,\"io_bw_gbs\":%.4f,\"storage_bytes_read\":%llu,"
                "\"mem_estimate_bytes\":%llu,\"mem_resident_bytes\":%llu,\"mem_load_peak_bytes\":%llu,"
                "\"mem_session_bytes\":%llu,\"mem_slack_bytes\":%llu,\"mem_reserve_bytes\":%llu,"
                "\"mem_context\":%d,\"cache_sizing\":\"%s\",\"mem_available_bytes\":%llu,",
                n_prompt, prefill_s, n_dec, dec_s, tps, b->s.expert_source, b->s.cache_slots,
                (unsigned long long)hits, (unsigned long long)miss, (unsigned long long)bytes, per_tok,
                (unsigned long long)waste, bw / 1e9, wait, b->s.prefetch ? b->s.prefetch : "off",
                ratio(b->d.prefetch_correct - a->d.prefetch_correct, b->d.prefetch_actual - a->d.prefetch_actual),
                ratio(b->d.prefetch_correct - a->d.prefetch_correct,
                      b->d.prefetch_predicted - a->d.prefetch_predicted),
                bound,
                bound > 0 ? tps / bound : 0.0,
                (unsigned long long)peak_rss_bytes(), (unsigned long long)info->bytes_active_per_token,
                b->s.eval_s - a->s.eval_s, prefill_s, (unsigned long long)ram_budget,
                (unsigned long long)b->s.cache_bytes, (unsigned long long)info->bytes_experts, io_bw,
                (unsigned long long)storage_bytes, (unsigned long long)b->s.mem_estimate,
                (unsigned long long)b->s.mem_resident, (unsigned long long)b->s.mem_load_peak,
                (unsigned long long)b->s.mem_session, (unsigned long long)b->s.mem_slack,
                (unsigned long long)b->s.mem_reserve, b->s.mem_context,
                b->s.cache_sizing ? b->s.cache_sizing : "", (unsigned long long)b->s.mem_available);
    if (ev) {
        json_routing(ev, b);
        fprintf(ev, "}\n");
    }
}

/* "prefill: layer 12/48, 300/1024 tokens, 85.3 tok/s" redrawn in place on a
 * terminal while a long prompt is evaluated. */
typedef struct {
    double t0, last;
} progress_state;

static void show_progress(void *user, int layer, int n_layers, int rows_done, int rows_total) {
    progress_state *p = user;
    double now = now_s();
    bool end = rows_done == rows_total;
    if (now - p->last < 0.2 && !end) return;
    p->last = now;
    fprintf(stderr, "\rprefill: layer %d/%d, %d/%d tokens, %.1f tok/s   ", layer, n_layers, rows_done,
            rows_total, now > p->t0 ? rows_done / (now - p->t0) : 0.0);
    if (end) fprintf(stderr, "\r%70s\r", "");
}

static const char RUN_HELP[] =
    "usage: deltafin run --model DIR (--prompt TEXT | --prompt-tokens IDS | --random-prompt N)\n"
    "                    [options]\n"
    "       deltafin bench --model DIR [run options]\n"
    "\n"
    "Generates a continuation and streams it to stdout. `bench` is one benchmark arm: the\n"
    "same options, by default a 512-token --random-prompt, --teacher-force 7 and 512 decoded\n"
    "tokens (--max-new 513), no text, and the --events summary as one JSON line on stdout\n"
    "(docs/benchmarks.md).\n"
    "  --model DIR          Hugging Face checkpoint directory (config.json, *.safetensors,\n"
    "                       tokenizer.json)\n"
    "  --prompt TEXT        prompt text (special tokens such as <|im_start|> are recognised)\n"
    "  --prompt-tokens IDS  prompt as comma-separated token ids instead\n"
    "  --chat               wrap the prompt as a user turn in the model's chat template\n"
    "  --system TEXT        system message (with --chat)\n"
    "  --no-think           chat: disable thinking (Qwen3 enable_thinking=false)\n"
    "  --max-new N          at most N new tokens (default 128); 0: no limit. Generation also\n"
    "                       ends at end-of-turn/EOS, or when the context is full (said on\n"
    "                       stderr); each is a normal end, exit status 0\n"
    "  --temp T             temperature; 0 = greedy (default: generation_config.json, else 0)\n"
    "  --top-k K --top-p P --min-p P --repeat-penalty R --repeat-last-n N\n"
    "  --seed S             random seed (same seed, same output)\n"
    "  --threads N          compute threads (1..256, default: all CPUs)\n"
    "  --ctx N              context length to allocate: it holds the prompt and every new\n"
    "                       token, at most the model's maximum (default: min(model max,\n"
    "                       4096), without --ram-budget grown to fit the prompt and --max-new)\n"
    "  --isa PATH           kernel path: auto, avx512, avx2, c\n"
    "  --chunk N            prompt rows evaluated together, layer by layer, so each expert\n"
    "                       is read once per chunk (1..65536, default 512; at most --ctx)\n"
    "  --print-ids          print generated token ids instead of text\n"
    "  --experts DIRS       stream routed experts from an expert pack (deltafin pack);\n"
    "                       comma-separated directories, one per drive, none empty. Without\n"
    "                       a budget the cache holds every expert, or what available memory\n"
    "                       allows\n"
    "  --ram-budget SIZE    keep the whole process within SIZE (e.g. 8G): the expert cache\n"
    "                       gets what the always-active weights, the tokenizer and a --ctx\n"
    "                       session leave; without --experts, experts stream from the\n"
    "                       safetensors (page cache). --stats: the estimate vs the peak\n"
    "  --expert-cache SIZE  size the expert cache directly instead of from --ram-budget\n"
    "  --policy P           expert cache policy: deltafin (default) or lru\n"
    "  --prefetch MODE      read predicted experts ahead of need: on (per layer the better\n"
    "                       of the router lookahead and the previous token's experts while\n"
    "                       its running recall pays), router, prev, off (default: on this\n"
    "                       project's test machine it has not paid yet; docs/prefetch.md)\n"
    "  --prefetch-depth N   MoE layers ahead the router lookahead runs (1..8, default 1)\n"
    "  --prefetch-min-recall R  the gate's recall threshold (default 0.5)\n"
    "  --prefetch-min-precision P  with --prefetch on, read a prediction only if at least\n"
    "                       this share of its rank's earlier uncached ones was used (0.5)\n"
    "  --pin SIZE           pinned tier: the hottest experts by the heat histogram kept next\n"
    "                       to the pack (experts.heat) are read at start-up and never evicted\n"
    "  --stats              per-token and summary statistics on stderr: tokens/s, expert\n"
    "                       bytes read, cache hits/misses, read wait vs compute, bandwidth\n"
    "  --events FILE        the same statistics as JSON lines\n"
    "  --teacher-force SEED benchmarking: feed seeded random tokens instead of the sampled\n"
    "                       ones, so routing cannot settle into a loop (0: off, bench's\n"
    "                       default with --draft, whose drafts need the model's own tokens)\n"
    "  --io-bw GB/S         measured device bandwidth: --stats then reports the I/O bound\n"
    "                       (bandwidth / bytes missed per token) and the fraction reached\n"
    "  --sim-disk GB/S      benchmarking: hand expert reads over no earlier than a disk of\n"
    "                       this bandwidth, serving reads in order with no credit for idle\n"
    "                       time, would (needs --experts and a faster real disk; the bytes\n"
    "                       still come from the pack). Sets --io-bw's default\n"
    "  --random-prompt N    benchmarking: a seeded random prompt of N tokens instead of\n"
    "                       --prompt (--prompt-seed S, default 1)\n"
    "  --replay-routing TRACE  benchmarking and tests only: MoE layers use the expert ids of\n"
    "                       the trace's next token (# moe-routing-trace v1; one trace token\n"
    "                       per evaluated row, wrapping around at the end) instead of the\n"
    "                       router's top-k. The router still runs; the weights are its own\n"
    "                       probabilities of those ids (renormalised like the model's top-k).\n"
    "                       Trace MoE layers/experts/top-k must match the model. The output\n"
    "                       is not the model's: --stats and --events mark it\n"
    "  --draft DIR|lookup   speculative decoding, same output as without: DIR is a draft\n"
    "                       checkpoint sharing the target's tokenizer (run in RAM), lookup\n"
    "                       continues earlier matches of the last tokens (no model). A gate\n"
    "                       measures cost and acceptance, picks the depth and turns drafting\n"
    "                       off when it does not pay; --stats reports it\n"
    "  --draft-k N          most tokens drafted per pass (1..16, default 8)\n"
    "  --lookup-n N         lookup: longest n-gram matched (1..16, default 3)\n"
    "  --draft-fixed N      measurement: always draft N tokens, no gate\n"
    "                       With sampling the output is the same as without --draft for\n"
    "                       the same seed (a draft is accepted when it is the token the\n"
    "                       sampler draws there). Instead:\n"
    "  --draft-rejection    standard rejection sampling: the same distribution, higher\n"
    "                       acceptance for a draft model, but not the same sample\n";

/* `deltafin bench`: run with no text output and one JSON summary on stdout. */
static bool g_bench;

/* One generated token to stdout: its id, or its text (stop tokens print
 * nothing); `deltafin bench` prints no tokens, only its JSON line at the end. */
static void emit_token(const df_engine *e, df_text_stream *ts, int32_t t, bool first, bool print_ids) {
    char buf[4096];
    if (g_bench) return;
    if (print_ids) {
        printf("%s%d", first ? "" : " ", t);
    } else if (!df_is_stop_token(e, t)) {
        size_t w = df_text_stream_push(e, ts, t, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
    }
}

/* The prompt's token ids (*n of them, at least one): --prompt-tokens,
 * --random-prompt or --prompt's text (a chat turn with --chat). */
static int32_t *run_prompt(const opts *o, df_engine *e, size_t *n) {
    int32_t *ids = NULL;
    df_error err;
    *n = 0;
    if (o->prompt_tokens) {
        int k;
        ids = parse_ids("--prompt-tokens", o->prompt_tokens, &k);
        *n = (size_t)k;
    } else if (o->random_prompt) {
        *n = (size_t)o->random_prompt;
        ids = malloc(sizeof(int32_t) * *n);
        uint64_t r = (uint64_t)(o->prompt_seed ? o->prompt_seed : 1) * 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < *n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((r >> 33) % (uint64_t)df_engine_info(e)->vocab_size);
        }
    } else if (o->chat) {
        /* the prompt and system text are message content: special-token text in
         * them stays text */
        df_chat_msg msgs[2];
        int nm = 0;
        if (o->system) msgs[nm++] = (df_chat_msg){"system", o->system};
        msgs[nm++] = (df_chat_msg){"user", o->prompt};
        if (df_chat_tokenize(e, msgs, nm, 1, o->think, &ids, n, &err)) die_err(&err);
    } else {
        if (df_tokenize(e, o->prompt, strlen(o->prompt), &ids, n, &err)) die_err(&err);
    }
    if (*n == 0) cli_die("the prompt is empty");
    return ids;
}

/* The session's context for a prompt of n tokens; it holds the prompt and
 * every new token. --ctx is taken as given (open_engine checked it against the
 * model). Unset, it is min(model maximum, 4096), as a --ram-budget was sized
 * for, and without a budget grows up to the model's maximum to hold --max-new
 * tokens after a long prompt. */
static int run_context(const opts *o, const df_model_info *info, size_t n) {
    int max = info->max_context, ctx = o->ctx ? o->ctx : (max < 4096 ? max : 4096);
    if (!o->ctx && !o->ram_budget) {
        size_t want = n + (o->max_new ? (size_t)o->max_new : 1);
        if (want > (size_t)ctx) ctx = want < (size_t)max ? (int)want : max;
    }
    if (n < (size_t)ctx) return ctx;
    if (ctx < max || o->ctx)
        cli_die("the prompt of %zu tokens leaves no room for a new token in the %d-token context (--ctx)", n,
                ctx);
    cli_die("the prompt of %zu tokens leaves no room for a new token in the model's %d-token context", n, max);
}

/* What run's generation callbacks share: output, statistics, teacher forcing. */
typedef struct run_state {
    const opts *o;
    df_engine *e;
    FILE *ev;
    df_text_stream ts;
    cli_stats st0, prev, after_prefill;
    uint64_t tf;        /* teacher forcing's generator */
    int V;
    int produced;
    uint64_t io0;       /* storage bytes read when decoding began */
} run_state;

/* A pseudo-random token (bench: decode as a long answer would, whatever the
 * model says). */
static int32_t run_force(void *u, int index) {
    (void)index;
    run_state *r = u;
    r->tf = r->tf * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((r->tf >> 33) % (uint64_t)r->V);
}

static int run_token(void *u, int32_t t) {
    run_state *r = u;
    emit_token(r->e, &r->ts, t, r->produced++ == 0, r->o->print_ids);
    fflush(stdout);
    return 0;
}

static void run_prefilled(void *u, int rows, double secs) {
    run_state *r = u;
    cli_stats now;
    cli_get_stats(r->e, &now);
    report(r->ev, r->o->stats, "prefill", rows, &r->st0, &now, secs);
    r->prev = r->after_prefill = now;
    r->io0 = storage_read_bytes();
}

static void run_step(void *u, int tokens, double secs) {
    run_state *r = u;
    cli_stats now;
    cli_get_stats(r->e, &now);
    report(r->ev, r->o->stats, "token", tokens, &r->prev, &now, secs);
    r->prev = now;
}

static int cmd_run(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv,
          " --model --prompt --prompt-tokens --chat --system --no-think --think --max-new --temp"
          " --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed --threads --ctx --isa"
          " --print-ids --stats --experts --ram-budget --expert-cache --events --io-bw --sim-disk --teacher-force --pin --policy --chunk"
          " --prefetch --prefetch-depth --prefetch-min-recall --prefetch-min-precision --replay-routing --random-prompt --prompt-seed"
          " --draft --draft-k --lookup-n --draft-fixed --draft-rejection ");
    if (o.help) { fputs(RUN_HELP, stdout); return 0; }
    if (g_bench) {
        if (!o.random_prompt && !o.prompt && !o.prompt_tokens) o.random_prompt = 512;
        if (!o.teacher_set && !o.draft) o.teacher_seed = 7; /* drafts need the model's own tokens */
        if (!o.max_new_set) o.max_new = 513; /* the first token comes from the prompt */
        o.print_ids = true;
    }
    if (o.sim_disk > 0 && o.io_bw <= 0) o.io_bw = o.sim_disk; /* the bound's bandwidth is known */
    if ((o.prompt != NULL) + (o.prompt_tokens != NULL) + (o.random_prompt > 0) != 1)
        cli_die("give exactly one of --prompt, --prompt-tokens or --random-prompt");
    if (o.chat && !o.prompt) cli_die("--chat needs --prompt");
    if (!o.draft && (o.draft_k || o.lookup_n || o.draft_fixed || o.draft_rejection))
        cli_die("--draft-k, --lookup-n, --draft-fixed and --draft-rejection need --draft");
    if (o.draft && o.teacher_seed) cli_die("--draft cannot be combined with --teacher-force");
    if (o.draft_fixed && o.draft_k && o.draft_fixed > o.draft_k) cli_die("--draft-fixed exceeds --draft-k");
    df_engine *e = open_engine(&o);
    const df_model_info *info = df_engine_info(e);
    df_error err;

    size_t n;
    int32_t *ids = run_prompt(&o, e, &n);
    int ctx = run_context(&o, info, n);
    df_session *s;
    if (df_session_new(&s, e, ctx, &err)) die_err(&err);
    /* The model authors' recommended sampling applies unless overridden. */
    if (!o.temp_set && info->default_temperature >= 0) o.sp.temperature = info->default_temperature;
    if (!o.top_p_set && info->default_top_p > 0) o.sp.top_p = info->default_top_p;
    if (!o.top_k_set && info->default_top_k >= 0) o.sp.top_k = info->default_top_k;
    df_sampler *smp;
    if (df_sampler_new(&smp, &o.sp, &err)) die_err(&err);

    FILE *ev = NULL;
    if (o.events && !(ev = fopen(o.events, "w"))) cli_die("%s: cannot create: %s", o.events, strerror(errno));
    df_spec *sp = NULL;
    if (o.draft) {
        df_spec_opts so = {.draft = o.draft, .k_max = o.draft_k ? o.draft_k : (o.draft_fixed > 8 ? o.draft_fixed : 0),
                           .lookup_n = o.lookup_n, .n_threads = o.threads, .isa = o.isa,
                           .rejection = o.draft_rejection};
        if (df_spec_new(&sp, e, &so, &err)) die_err(&err);
        df_spec_set_fixed_depth(sp, o.draft_fixed);
    }
    run_state rs = {.o = &o, .e = e, .ev = ev, .tf = (uint64_t)o.teacher_seed * 0x9E3779B97F4A7C15ull,
                    .V = info->vocab_size};
    cli_get_stats(e, &rs.st0);
    rs.prev = rs.st0;
    progress_state ps = {now_s(), now_s()};
    df_generate_opts go = {.sampler = smp, .spec = sp, .max_new = o.max_new,
                           .prefill_progress = isatty(2) && n > 64 ? show_progress : NULL, .progress_user = &ps,
                           .force = o.teacher_seed ? run_force : NULL, .on_token = run_token,
                           .on_prefill = run_prefilled, .on_step = run_step, .user = &rs};
    df_generate_result gr;
    if (df_generate(s, ids, (int)n, &go, &gr, &err)) die_err(&err);
    uint64_t io_dec = storage_read_bytes() - rs.io0;
    if (!o.print_ids) {
        char buf[64];
        size_t w = df_text_stream_flush(&rs.ts, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
    }
    if (!g_bench) printf("\n");
    fflush(stdout);
    if (gr.finish == DF_FINISH_CONTEXT)
        fprintf(stderr, "deltafin: %s of %d tokens is full after %d new token%s\n",
                ctx < info->max_context ? "the context (--ctx)" : "the model's context", ctx, gr.produced,
                gr.produced == 1 ? "" : "s");
    const cli_stats *after_prefill = &rs.after_prefill, *last = &rs.prev;
    int n_decoded = gr.decoded;
    double prefill_s = gr.prefill_s, decode_s = gr.decode_s;
    if (o.stats || ev) {
        report(ev, o.stats, "decode", n_decoded, after_prefill, last, decode_s);
        summary(ev, o.stats, info, after_prefill, last, n, prefill_s, n_decoded, decode_s, o.io_bw,
                o.ram_budget, io_dec);
        prefetch_report(ev, o.stats, e, last);
        if (sp && o.stats) df_spec_report(sp, stderr);
        if (sp && ev) {
            df_spec_stats ss;
            df_spec_stats_get(sp, &ss);
            fprintf(ev,
                    "{\"event\":\"speculative\",\"passes\":%llu,\"verify_passes\":%llu,\"drafted\":%llu,"
                    "\"accepted\":%llu,\"switched_off\":%llu,\"depth\":%d,\"mean_depth\":%.4f,"
                    "\"plain_s\":%.6f,\"verify_s\":%.6f,\"plain_bytes\":%.1f,\"verify_bytes\":%.1f,"
                    "\"speedup\":%.4f,\"run_speedup\":%.4f,\"probes_declined\":%llu,"
                    "\"draft_token_s\":%.6f,\"row_cost\":%.4f}\n",
                    (unsigned long long)ss.passes, (unsigned long long)ss.verify_passes,
                    (unsigned long long)ss.drafted, (unsigned long long)ss.accepted,
                    (unsigned long long)ss.switched_off, ss.depth, ss.mean_depth, ss.plain_s, ss.verify_s,
                    ss.plain_bytes, ss.verify_bytes, ss.speedup, ss.run_speedup,
                    (unsigned long long)ss.probes_declined, ss.draft_token_s, ss.row_cost);
        }
    }
    if (g_bench) {
        summary(stdout, false, info, after_prefill, last, n, prefill_s, n_decoded, decode_s, o.io_bw,
                o.ram_budget, io_dec);
        fflush(stdout);
    }
    df_spec_free(sp);
    if (ev) fclose(ev);
    free(ids);
    df_sampler_free(smp);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

/* ---- inspect, tokenize, logits ----------------------------------------------------- */

static int cmd_inspect(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --threads --isa --experts --ram-budget ");
    if (o.help) {
        puts("usage: deltafin inspect --model DIR\n\n"
             "Prints the config, the tensor inventory (routed experts summarised per layer)\n"
             "and byte counts: always-active weights vs routed experts.");
        return 0;
    }
    df_engine *e = open_engine(&o);
    df_engine_inspect(e, stdout);
    df_engine_close(e);
    return 0;
}

static int cmd_tokenize(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --text --decode ");
    if (o.help) {
        puts("usage: deltafin tokenize --model DIR (--text TEXT | --decode IDS)\n\n"
             "--text prints the token ids of TEXT, space-separated; --decode prints the text\n"
             "of comma-separated ids.");
        return 0;
    }
    if (!o.text == !o.decode) cli_die("give exactly one of --text or --decode");
    df_engine *e = open_engine(&o);
    df_error err;
    if (o.text) {
        int32_t *ids;
        size_t n;
        if (df_tokenize(e, o.text, strlen(o.text), &ids, &n, &err)) die_err(&err);
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    } else {
        int n;
        int32_t *ids = parse_ids("--decode", o.decode, &n);
        for (int i = 0; i < n; i++) {
            const char *b;
            size_t l;
            if (df_token_bytes(e, ids[i], &b, &l)) cli_die("--decode: unknown token id %d", ids[i]);
            fwrite(b, 1, l, stdout);
        }
        printf("\n");
        free(ids);
    }
    df_engine_close(e);
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --tokens --out --threads --isa --batch --experts --ram-budget --expert-cache --ctx --pin --policy --chunk --prefetch --prefetch-depth --prefetch-min-recall --prefetch-min-precision --replay-routing ");
    if (o.help) {
        puts("usage: deltafin logits --model DIR --tokens IDS --out FILE [--batch N] [--threads N]\n\n"
             "Evaluates the token sequence from position 0 and writes the logits of every\n"
             "row to FILE as little-endian float32 [T][vocab]. --batch N feeds the tokens N\n"
             "at a time (the results must not depend on it). --experts DIRS and --ram-budget\n"
             "SIZE stream the routed experts as in `deltafin run`; --replay-routing TRACE\n"
             "replays a routing trace as there (tests). --ctx N (at least the number of\n"
             "tokens, at most the model's context) is the context a --ram-budget holds.");
        return 0;
    }
    if (!o.tokens || !o.out) cli_die("--tokens and --out are required");
    int n;
    int32_t *ids = parse_ids("--tokens", o.tokens, &n);
    if (!o.ctx) o.ctx = n;
    else if (o.ctx < n) cli_die("--ctx %d is less than the %d tokens of --tokens", o.ctx, n);
    df_engine *e = open_engine(&o);
    const df_model_info *info = df_engine_info(e);
    if (n > info->max_context) cli_die("%d tokens exceed the model's context of %d", n, info->max_context);
    df_error err;
    df_session *s;
    if (df_session_new(&s, e, n, &err)) die_err(&err);
    size_t V = (size_t)info->vocab_size;
    float *lg = malloc(sizeof(float) * V * (size_t)n);
    int step = o.batch ? o.batch : n;
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        if (df_session_eval(s, ids + i, k, lg + (size_t)i * V, 1, &err)) die_err(&err);
    }
    FILE *f = fopen(o.out, "wb");
    if (!f) cli_die("%s: cannot create: %s", o.out, strerror(errno));
    if (fwrite(lg, sizeof(float), V * (size_t)n, f) != V * (size_t)n || fclose(f) != 0)
        cli_die("%s: write failed", o.out);
    free(lg);
    free(ids);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

/* ---- dispatch ---------------------------------------------------------------------- */

static const char MAIN_HELP[] =
    "usage: deltafin COMMAND [options]    (deltafin COMMAND --help for details)\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  inspect    print a checkpoint's config, tensors and byte counts\n"
    "  tokenize   text to token ids and back\n"
    "  logits     write the logits of a token sequence to a file\n"
    "  pack       rewrite a checkpoint's routed experts into an expert pack (--verify to check)\n"
    "  cache-sim  replay a routing trace through the expert cache policies\n"
    "  bench      one benchmark arm: run's options, a seeded 512-token prompt by default,\n"
    "             teacher-forced decode, one JSON summary line on stdout (make bench)\n"
    "  serve      OpenAI-compatible HTTP server (docs/server.md)\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(MAIN_HELP, stdout);
        return argc < 2 ? CLI_EXIT_BAD : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) {
        g_bench = true;
        return cmd_run(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(cmd, "pack")) return df_pack_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "cache-sim")) return df_cache_sim_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return df_serve_main(argc - 2, argv + 2);
    cli_die("unknown command '%s' (see deltafin --help)", cmd);
}
