/*
 * cachesim.c - `deltafin cache-sim`: replays a routing trace through the expert
 * cache policies and prints one line per policy (hit rate, hits, misses,
 * accesses). The replay drives the cache exactly as the runtime will (all of a
 * layer's lookups, then its admissions, then the next layer; df_cache_token_end
 * after each token) so the figures carry over. The cache lives on across the
 * trace's sequences, as it does across requests in a server.
 */
#include "experts/policy.h"
#include "experts/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin cache-sim --trace FILE (--slots N | --fraction F) [options]\n"
            "  --trace FILE        routing trace (# moe-routing-trace v1)\n"
            "  --slots N           cache capacity in experts\n"
            "  --fraction F        capacity as a fraction of all experts (0 < F <= 1)\n"
            "  --policy P[,P...]   deltafin, lru, belady or all (default all)\n"
            "  --warmup K          leave the first K tokens out of the statistics\n"
            "  --heat FILE         start from this persisted heat histogram\n"
            "  --pin F             pin the hottest F of the slots (0 <= F <= 1) from --heat\n"
            "  --save-heat FILE    write the heat histogram after the replay\n"
            "  --half-life T       heat half-life in tokens (default %.0f)\n"
            "  --tune K=V[,K=V]    deltafin tunables: max_missed, relearn, learn_half_life,\n"
            "                      admit, buckets, prior_tokens\n"
            "  --verbose           also print deltafin's learned hazard table\n",
            DF_HEAT_DEFAULT_HALF_LIFE);
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_long(const char *s, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_tuning(const char *spec, df_cache_tuning *t) {
    char *dup = df_xstrdup(spec), *save = NULL;
    int rc = 0;
    for (char *kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        double v;
        if (!eq || parse_double(eq + 1, &v) != 0) {
            fprintf(stderr, "cache-sim: --tune: bad entry '%s' (want key=value)\n", kv);
            rc = -1;
            break;
        }
        *eq = 0;
        if (!strcmp(kv, "max_missed")) t->max_missed = (int)v;
        else if (!strcmp(kv, "relearn")) t->relearn_tokens = (int)v;
        else if (!strcmp(kv, "learn_half_life")) t->learn_half_life = v;
        else if (!strcmp(kv, "admit")) t->admit_factor = v;
        else if (!strcmp(kv, "buckets")) t->n_buckets = (int)v;
        else if (!strcmp(kv, "prior_tokens")) t->prior_tokens = v;
        else {
            fprintf(stderr, "cache-sim: --tune: unknown key '%s'\n", kv);
            rc = -1;
            break;
        }
    }
    free(dup);
    return rc;
}

typedef struct {
    uint64_t accesses, hits;
} sim_result;

/* next_step[i] for access i (token-major, layer, k): the layer step of the same
 * key's next use, UINT64_MAX if none. */
static uint64_t *next_uses(const df_trace *t) {
    size_t per = (size_t)t->n_layers * (size_t)t->top_k;
    size_t n = (size_t)t->n_tokens * per;
    uint64_t *next = df_xmalloc((n ? n : 1) * sizeof *next);
    uint64_t *seen = df_xmalloc((size_t)t->n_layers * (size_t)t->n_experts * sizeof *seen);
    for (size_t i = 0; i < (size_t)t->n_layers * (size_t)t->n_experts; i++) seen[i] = UINT64_MAX;
    for (int tok = t->n_tokens - 1; tok >= 0; tok--) {
        for (int l = t->n_layers - 1; l >= 0; l--) {
            const uint16_t *ids = df_trace_at(t, tok, l);
            size_t base = ((size_t)tok * (size_t)t->n_layers + (size_t)l) * (size_t)t->top_k;
            for (int k = 0; k < t->top_k; k++) {
                size_t key = (size_t)l * (size_t)t->n_experts + ids[k];
                next[base + (size_t)k] = seen[key];
            }
            for (int k = 0; k < t->top_k; k++)
                seen[(size_t)l * (size_t)t->n_experts + ids[k]] =
                    (uint64_t)tok * (uint64_t)t->n_layers + (uint64_t)l;
        }
    }
    free(seen);
    return next;
}

static int replay(const df_trace *t, df_cache *c, const uint64_t *next, int warmup,
                  sim_result *r) {
    int32_t ex[DF_TRACE_MAX_TOPK], slots[DF_TRACE_MAX_TOPK];
    uint8_t hit[DF_TRACE_MAX_TOPK];
    memset(r, 0, sizeof *r);
    for (int tok = 0; tok < t->n_tokens; tok++) {
        for (int l = 0; l < t->n_layers; l++) {
            const uint16_t *ids = df_trace_at(t, tok, l);
            size_t base = ((size_t)tok * (size_t)t->n_layers + (size_t)l) * (size_t)t->top_k;
            for (int k = 0; k < t->top_k; k++) {
                ex[k] = ids[k];
                df_cache_set_next_use(c, l, ids[k], next[base + (size_t)k]);
            }
            int h = df_cache_access_layer(c, l, ex, t->top_k, slots, hit);
            if (tok >= warmup) {
                r->accesses += (uint64_t)t->top_k;
                r->hits += (uint64_t)h;
            }
        }
        df_cache_token_end(c);
    }
    return 0;
}

/* The command line. */
typedef struct sim_args {
    const char *trace_path, *policies, *heat_path, *save_heat;
    long slots, warmup;
    double fraction, pin, half_life;
    int verbose;
    df_cache_tuning tuning;
} sim_args;

/* An option with a value; 0, or the exit status of a bad value. */
static int parse_value(sim_args *a, const char *o, const char *v) {
    if (!strcmp(o, "--trace")) {
        a->trace_path = v;
    } else if (!strcmp(o, "--policy")) {
        a->policies = v;
    } else if (!strcmp(o, "--heat")) {
        a->heat_path = v;
    } else if (!strcmp(o, "--save-heat")) {
        a->save_heat = v;
    } else if (!strcmp(o, "--slots")) {
        if (parse_long(v, &a->slots) || a->slots < 1) {
            fprintf(stderr, "cache-sim: --slots needs a positive integer, got '%s'\n", v);
            return 2;
        }
    } else if (!strcmp(o, "--fraction")) {
        if (parse_double(v, &a->fraction) || !(a->fraction > 0 && a->fraction <= 1)) {
            fprintf(stderr, "cache-sim: --fraction needs a number in (0, 1], got '%s'\n", v);
            return 2;
        }
    } else if (!strcmp(o, "--warmup")) {
        if (parse_long(v, &a->warmup) || a->warmup < 0) {
            fprintf(stderr, "cache-sim: --warmup needs a token count >= 0, got '%s'\n", v);
            return 2;
        }
    } else if (!strcmp(o, "--pin")) {
        if (parse_double(v, &a->pin) || !(a->pin >= 0 && a->pin <= 1)) {
            fprintf(stderr, "cache-sim: --pin needs a fraction in [0, 1], got '%s'\n", v);
            return 2;
        }
    } else if (!strcmp(o, "--half-life")) {
        if (parse_double(v, &a->half_life) || !(a->half_life > 0)) {
            fprintf(stderr, "cache-sim: --half-life needs a positive token count, got '%s'\n", v);
            return 2;
        }
    } else if (!strcmp(o, "--tune")) {
        if (parse_tuning(v, &a->tuning)) return 2;
    } else {
        fprintf(stderr, "cache-sim: unknown option '%s'\n", o);
        usage(stderr);
        return 2;
    }
    return 0;
}

/* 0, -1 after --help (exit 0), or the exit status of a bad command line. */
static int parse_args(int argc, char **argv, sim_args *a) {
    memset(a, 0, sizeof *a);
    a->policies = "all";
    a->slots = -1;
    a->fraction = -1;
    for (int i = 0; i < argc; i++) { /* argv[0] is the first option, as main.c passes it */
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(o, "--verbose")) {
            a->verbose = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "cache-sim: %s needs a value (or is unknown)\n", o);
            usage(stderr);
            return 2;
        }
        int rc = parse_value(a, o, v);
        if (rc) return rc;
        i++;
    }
    if (!a->trace_path) {
        fprintf(stderr, "cache-sim: --trace is required\n");
        usage(stderr);
        return 2;
    }
    if ((a->slots > 0) == (a->fraction > 0)) {
        fprintf(stderr, "cache-sim: give exactly one of --slots and --fraction\n");
        return 2;
    }
    if (a->pin > 0 && !a->heat_path) {
        fprintf(stderr, "cache-sim: --pin needs --heat (pinning ranks experts by persisted heat)\n");
        return 2;
    }
    return 0;
}

/* The policies to run, in the order given; their count, or 0 after an error. */
static int parse_policies(const char *policies, int *run, int cap) {
    int n_run = 0;
    char *dup = df_xstrdup(policies), *save = NULL;
    for (char *p = strtok_r(dup, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (!strcmp(p, "all")) {
            int order[] = {DF_POLICY_DELTAFIN, DF_POLICY_LRU, DF_POLICY_BELADY};
            for (int j = 0; j < 3 && n_run < cap; j++) run[n_run++] = order[j];
            continue;
        }
        int pol = df_cache_policy_from_name(p);
        if (pol < 0) {
            fprintf(stderr, "cache-sim: unknown policy '%s' (deltafin, lru, belady, all)\n", p);
            free(dup);
            return 0;
        }
        if (n_run < cap) run[n_run++] = pol;
    }
    free(dup);
    if (!n_run) fprintf(stderr, "cache-sim: --policy lists no policy\n");
    return n_run;
}

static void print_hazard(const df_cache *c) {
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

/* One policy over the whole trace, and its line; save: write the heat after. */
static int run_policy(const sim_args *a, const df_trace *t, const uint64_t *next, df_cache_opts *o,
                      bool save) {
    df_error err;
    df_cache *c;
    if (df_cache_new(&c, o, &err) != DF_OK) {
        fprintf(stderr, "cache-sim: %s\n", err.msg);
        return -1;
    }
    double t0 = df_now();
    sim_result r;
    replay(t, c, next, (int)a->warmup, &r);
    double dt = df_now() - t0;
    const df_cache_stats *st = df_cache_get_stats(c);
    printf("%-9s hit rate %6.2f%%  hits %llu  misses %llu  accesses %llu  bypassed %llu  "
           "(%.2f s)\n",
           df_cache_policy_name(o->policy),
           r.accesses ? 100.0 * (double)r.hits / (double)r.accesses : 0.0,
           (unsigned long long)r.hits, (unsigned long long)(r.accesses - r.hits),
           (unsigned long long)r.accesses, (unsigned long long)st->bypassed, dt);
    if (a->verbose && o->policy == DF_POLICY_DELTAFIN) print_hazard(c);
    int rc = 0;
    if (save && df_heat_save(df_cache_heat(c), a->save_heat, &err) != DF_OK) {
        fprintf(stderr, "cache-sim: %s\n", err.msg);
        rc = 1;
    }
    df_cache_free(c);
    return rc;
}

int df_cache_sim_main(int argc, char **argv) {
    sim_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    int run[DF_POLICY_COUNT * 4];
    int n_run = parse_policies(a.policies, run, (int)(sizeof run / sizeof *run));
    if (!n_run) return 2;

    df_error err;
    df_trace t;
    if (df_trace_load(&t, a.trace_path, &err) != DF_OK) {
        fprintf(stderr, "cache-sim: %s\n", err.msg);
        return 1;
    }
    int n_keys = t.n_layers * t.n_experts;
    int n_slots = a.slots > 0 ? (a.slots > n_keys ? n_keys : (int)a.slots)
                              : (int)(a.fraction * n_keys + 0.5);
    if (n_slots < 1) n_slots = 1;
    int n_pinned = (int)(a.pin * n_slots + 0.5);
    if (a.warmup >= t.n_tokens && t.n_tokens > 0) {
        fprintf(stderr, "cache-sim: --warmup %ld leaves none of the %d tokens\n", a.warmup,
                t.n_tokens);
        df_trace_free(&t);
        return 2;
    }

    df_heat heat;
    int have_heat = 0, status = 0;
    if (a.heat_path) {
        if (df_heat_init(&heat, t.n_layers, t.n_experts, a.half_life, &err) != DF_OK) {
            fprintf(stderr, "cache-sim: %s\n", err.msg);
            df_trace_free(&t);
            return 1;
        }
        df_heat_load_result hr = df_heat_load(&heat, a.heat_path, &err);
        if (hr != DF_HEAT_LOADED) fprintf(stderr, "cache-sim: warning: %s\n", err.msg);
        have_heat = 1;
    }

    printf("trace %s: %d tokens in %d sequences, %d layers x %d experts, top-%d\n",
           a.trace_path, t.n_tokens, t.n_seqs, t.n_layers, t.n_experts, t.top_k);
    printf("cache %d slots (%.1f%% of %d experts)", n_slots, 100.0 * n_slots / n_keys, n_keys);
    if (n_pinned) printf(", %d pinned from %s", n_pinned, a.heat_path);
    if (a.warmup) printf(", first %ld tokens not counted", a.warmup);
    printf("\n");

    uint64_t *next = next_uses(&t);
    for (int i = 0; i < n_run; i++) {
        df_cache_opts o = {.n_layers = t.n_layers, .n_experts = t.n_experts, .top_k = t.top_k,
                           .n_slots = n_slots, .policy = (df_cache_policy)run[i],
                           .heat_half_life = a.half_life, .initial_heat = have_heat ? &heat : NULL,
                           .n_pinned = n_pinned, .tuning = a.tuning};
        int r = run_policy(&a, &t, next, &o, a.save_heat && i == n_run - 1);
        if (r) status = 1;
        if (r < 0) break;
    }
    free(next);
    if (have_heat) df_heat_free(&heat);
    df_trace_free(&t);
    return status;
}
