/*
 * cli/cachesim.c - `deltafin cache-sim`: replays a routing trace through the
 * expert cache policies and prints one line per policy (hit rate, hits,
 * misses, accesses). Options and printing only; the simulation is
 * experts/cachesim.c.
 *
 * Exit codes: 0, 1 (a bad trace, I/O), 2 (usage).
 */
#include "cli/cli.h"
#include "experts/cachesim.h"
#include "experts/policy.h"
#include "experts/trace.h"

#include <stdlib.h>
#include <string.h>

typedef struct sim_args {
    const char *trace, *policies, *heat, *save_heat, *tune;
    long slots, warmup, streams, stream_prompt, stream_decode;
    double fraction, pin, half_life;
    bool verbose;
} sim_args;

#define S(f) CLI_FIELD(sim_args, f)
#define STR_(x) #x
#define STR(x) STR_(x)

/* A number in a range the setter's entry names (lo/hi unused for doubles). */
static int set_num(const cli_opt *o, void *dst, const char *v, double lo, double hi, bool lo_open,
                   const char *what) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi) || (lo_open && x == lo)) { /* NaN fails too */
        cli_error("%s needs %s, got '%s'", o->name, what, v);
        return 1;
    }
    *(double *)((char *)dst + o->off) = x;
    return 0;
}

static int set_fraction(const cli_opt *o, void *dst, const char *v) {
    return set_num(o, dst, v, 0, 1, true, "a number in (0, 1]");
}

static int set_pin(const cli_opt *o, void *dst, const char *v) {
    return set_num(o, dst, v, 0, 1, false, "a fraction in [0, 1]");
}

static int set_half_life(const cli_opt *o, void *dst, const char *v) {
    return set_num(o, dst, v, 0, 1e300, true, "a positive token count");
}

static const cli_opt SIM_OPTS[] = {
    {"--trace", "FILE", "routing trace (# moe-routing-trace v1)", cli_set_str, S(trace), 0, 0},
    {"--slots", "N", "cache capacity in experts", cli_set_long, S(slots), 1, 1L << 40},
    {"--fraction", "F", "capacity as a fraction of all experts (0 < F <= 1)", set_fraction, S(fraction), 0, 0},
    {"--policy", "P[,P...]", "deltafin, lru, belady or all (default all)", cli_set_str, S(policies), 0, 0},
    {"--warmup", "K", "leave the first K tokens out of the statistics", cli_set_long, S(warmup), 0, 1L << 40},
    {"--heat", "FILE", "start from this persisted heat histogram", cli_set_str, S(heat), 0, 0},
    {"--pin", "F", "pin the hottest F of the slots (0 <= F <= 1) from --heat", set_pin, S(pin), 0, 0},
    {"--save-heat", "FILE", "write the heat histogram after the replay", cli_set_str, S(save_heat), 0, 0},
    {"--half-life", "T", "heat half-life in tokens (default " STR(DF_HEAT_DEFAULT_HALF_LIFE) ")", set_half_life,
     S(half_life), 0, 0},
    {"--tune", "K=V[,K=V]", "deltafin tunables: max_missed, relearn, learn_half_life,\n"
     "admit, buckets, prior_tokens", cli_set_str, S(tune), 0, 0},
    {"--verbose", NULL, "also print deltafin's learned hazard table", cli_set_true, S(verbose), 0, 0},
    {"--streams", "N", "N sequences decoded together: the trace in windows of\n"
     "N x (prompt + decode) tokens, a step one row of each,\n"
     "a layer asking for the union of its rows' experts", cli_set_long, S(streams), 1, 1024},
    {"--stream-prompt", "P", "with --streams: each sequence's prompt, one step (default 16)", cli_set_long,
     S(stream_prompt), 0, 1L << 20},
    {"--stream-decode", "T", "with --streams: decoded tokens per sequence (default 128)", cli_set_long,
     S(stream_decode), 1, 1L << 20},
    {0},
};

static const cli_section SIM_SECTIONS[] = {
    {NULL, "--trace --slots --fraction --policy --warmup --heat --pin --save-heat --half-life --tune --verbose"},
    {"Several sequences at once", "--streams --stream-prompt --stream-decode"},
    {0},
};

static const cli_cmd SIM_CMD = {
    .usage = "usage: deltafin cache-sim --trace FILE (--slots N | --fraction F) [options]\n\n"
             "Replays a routing trace through the expert cache policies, as the runtime\n"
             "drives the cache, and prints each policy's hit rate.\n",
    .table = SIM_OPTS, .sections = {SIM_SECTIONS}};

/* The policies to run, in the order given; 0 when the list is bad (said). */
static int policy_list(const char *policies, int *run, int cap) {
    int n = 0;
    char *dup = df_xstrdup(policies), *save = NULL;
    for (char *p = strtok_r(dup, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (!strcmp(p, "all")) {
            int order[] = {DF_POLICY_DELTAFIN, DF_POLICY_LRU, DF_POLICY_BELADY};
            for (int j = 0; j < 3 && n < cap; j++) run[n++] = order[j];
            continue;
        }
        int pol = df_cache_policy_from_name(p);
        if (pol < 0) {
            cli_error("--policy: unknown policy '%s' (deltafin, lru, belady, all)", p);
            free(dup);
            return 0;
        }
        if (n < cap) run[n++] = pol;
    }
    free(dup);
    if (!n) cli_error("--policy lists no policy");
    return n;
}

static int check(const sim_args *a) {
    const char *why = NULL;
    if (!a->trace) why = "--trace is required";
    else if ((a->slots > 0) == (a->fraction > 0)) why = "give exactly one of --slots and --fraction";
    else if (a->pin > 0 && !a->heat) why = "--pin needs --heat (pinning ranks experts by persisted heat)";
    else if (a->streams > 0 && a->warmup > 0) why = "--warmup counts single tokens: with --streams the prompt steps are left out";
    else if (a->streams <= 0 && (a->stream_prompt >= 0 || a->stream_decode > 0))
        why = "--stream-prompt and --stream-decode need --streams";
    if (why) cli_error("cache-sim: %s (see deltafin cache-sim --help)", why);
    return why != NULL;
}

static void print_hazard(df_cache *c) {
    double H[4096];
    int nm, nb;
    if (df_cache_hazard(c, H, 4096, &nm, &nb) <= 0) return;
    if (nm * nb > 4096) nm = 4096 / nb;
    printf("  hazard H[m][b] (rows: missed opportunities m; cols: heat bucket b)\n");
    for (int m = 0; m < nm; m++) {
        printf("  m=%-3d", m);
        for (int b = 0; b < nb; b++) printf(" %.3f", H[m * nb + b]);
        printf("\n");
    }
}

/* One policy over the trace: its line, its hazard table (--verbose), and the
 * heat histogram when save_heat is set. Returns 0 or 1 (said why). */
static int simulate(const sim_args *a, const df_trace *t, df_cache_opts *o, const uint64_t *next,
                    const df_sim_steps *steps, const char *save_heat) {
    df_error err;
    df_cache *c;
    if (df_cache_new(&c, o, &err) != DF_OK) {
        cli_error("cache-sim: %s", err.msg);
        return 1;
    }
    double t0 = df_now();
    df_sim_result r = {0};
    uint64_t rows = 0;
    if (steps) df_cache_sim_replay_steps(steps, c, &r, &rows);
    else df_cache_sim_replay(t, c, next, (int)a->warmup, &r);
    double dt = df_now() - t0;
    const df_cache_stats *st = df_cache_get_stats(c);
    printf("%-9s hit rate %6.2f%%  hits %llu  misses %llu  accesses %llu  bypassed %llu",
           df_cache_policy_name(o->policy), r.accesses ? 100.0 * (double)r.hits / (double)r.accesses : 0.0,
           (unsigned long long)r.hits, (unsigned long long)(r.accesses - r.hits), (unsigned long long)r.accesses,
           (unsigned long long)st->bypassed);
    if (steps) /* the figure that compares across N: the bytes a token costs */
        printf("  misses/token %.2f", rows ? (double)(r.accesses - r.hits) / (double)rows : 0.0);
    printf("  (%.2f s)\n", dt);
    if (a->verbose && o->policy == DF_POLICY_DELTAFIN) print_hazard(c);
    int rc = 0;
    if (save_heat && df_heat_save(df_cache_heat(c), save_heat, &err) != DF_OK) {
        cli_error("cache-sim: %s", err.msg);
        rc = 1;
    }
    df_cache_free(c);
    return rc;
}

static int run_policies(const sim_args *a, const df_trace *t, const df_cache_tuning *tuning, const int *run,
                        int n_run) {
    df_error err;
    int n_keys = t->n_layers * t->n_experts;
    int n_slots = a->slots > 0 ? (a->slots > n_keys ? n_keys : (int)a->slots) : (int)(a->fraction * n_keys + 0.5);
    if (n_slots < 1) n_slots = 1;
    int n_pinned = (int)(a->pin * n_slots + 0.5);
    if (a->warmup >= t->n_tokens && t->n_tokens > 0) {
        cli_error("cache-sim: --warmup %ld leaves none of the %d tokens", a->warmup, t->n_tokens);
        return 2;
    }
    df_heat heat;
    bool have_heat = false;
    if (a->heat) {
        if (df_heat_init(&heat, t->n_layers, t->n_experts, a->half_life, &err) != DF_OK) {
            cli_error("cache-sim: %s", err.msg);
            return 1;
        }
        if (df_heat_load(&heat, a->heat, &err) != DF_HEAT_LOADED) {
            fprintf(stderr, "cache-sim: warning: %s; nothing pinned\n", err.msg);
            n_pinned = 0; /* empty heat ranks no expert above another */
        }
        have_heat = true;
    }
    printf("trace %s: %d tokens in %d sequences, %d layers x %d experts, top-%d\n", a->trace, t->n_tokens,
           t->n_seqs, t->n_layers, t->n_experts, t->top_k);
    printf("cache %d slots (%.1f%% of %d experts)", n_slots, 100.0 * n_slots / n_keys, n_keys);
    if (n_pinned) printf(", %d pinned from %s", n_pinned, a->heat);
    if (a->warmup) printf(", first %ld tokens not counted", a->warmup);
    printf("\n");
    df_sim_steps *steps = NULL;
    uint64_t *next = NULL;
    if (a->streams > 0) {
        df_sim_streams so = {(int)a->streams, a->stream_prompt >= 0 ? (int)a->stream_prompt : 16,
                             a->stream_decode > 0 ? (int)a->stream_decode : 128};
        int windows;
        steps = df_cache_sim_steps(t, &so, &windows);
        if (!steps || !windows) {
            cli_error("cache-sim: the trace's %d tokens hold no window of %d x (%d + %d) tokens", t->n_tokens,
                      so.n_streams, so.prompt, so.decode);
            df_cache_sim_steps_free(steps);
            if (have_heat) df_heat_free(&heat);
            return 2;
        }
        printf("%d sequences at once: %d windows of %d x (%d prompt + %d decoded) tokens; counted: decode steps\n",
               so.n_streams, windows, so.n_streams, so.prompt, so.decode);
    } else {
        next = df_cache_sim_next_uses(t);
    }
    int status = 0;
    for (int i = 0; i < n_run && !status; i++) {
        df_cache_opts o = {.n_layers = t->n_layers, .n_experts = t->n_experts, .top_k = t->top_k,
                           .n_slots = n_slots, .policy = (df_cache_policy)run[i], .heat_half_life = a->half_life,
                           .initial_heat = have_heat ? &heat : NULL, .n_pinned = n_pinned, .tuning = *tuning};
        status = simulate(a, t, &o, next, steps, i == n_run - 1 ? a->save_heat : NULL);
    }
    free(next);
    df_cache_sim_steps_free(steps);
    if (have_heat) df_heat_free(&heat);
    return status;
}

int cli_cache_sim_main(int argc, char **argv) {
    sim_args a = {.policies = "all", .slots = -1, .fraction = -1, .stream_prompt = -1};
    int rc = cli_parse(&SIM_CMD, &a, argc, argv);
    if (rc) return rc == CLI_HELP ? 0 : rc;
    if (check(&a)) return CLI_EXIT_BAD;
    df_cache_tuning tuning;
    memset(&tuning, 0, sizeof tuning);
    df_error err;
    if (a.tune && df_cache_tuning_parse(a.tune, &tuning, &err)) {
        cli_error("cache-sim: %s", err.msg);
        return CLI_EXIT_BAD;
    }
    int run[DF_POLICY_COUNT * 4];
    int n_run = policy_list(a.policies, run, (int)(sizeof run / sizeof *run));
    if (!n_run) return CLI_EXIT_BAD;
    df_trace t;
    if (df_trace_load(&t, a.trace, &err) != DF_OK) {
        cli_error("cache-sim: %s", err.msg);
        return 1;
    }
    rc = run_policies(&a, &t, &tuning, run, n_run);
    df_trace_free(&t);
    return rc;
}
