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

int df_cache_sim_main(int argc, char **argv) {
    const char *trace_path = NULL, *policies = "all", *heat_path = NULL, *save_heat = NULL;
    long slots = -1, warmup = 0;
    double fraction = -1, pin = 0, half_life = 0;
    int verbose = 0;
    df_cache_tuning tuning;
    memset(&tuning, 0, sizeof tuning);

    for (int i = 0; i < argc; i++) { /* argv[0] is the first option, as main.c passes it */
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--verbose")) {
            verbose = 1;
            takes = 0;
        } else if (!v) {
            fprintf(stderr, "cache-sim: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--trace")) {
            trace_path = v;
        } else if (!strcmp(a, "--policy")) {
            policies = v;
        } else if (!strcmp(a, "--heat")) {
            heat_path = v;
        } else if (!strcmp(a, "--save-heat")) {
            save_heat = v;
        } else if (!strcmp(a, "--slots")) {
            if (parse_long(v, &slots) || slots < 1) {
                fprintf(stderr, "cache-sim: --slots needs a positive integer, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--fraction")) {
            if (parse_double(v, &fraction) || !(fraction > 0 && fraction <= 1)) {
                fprintf(stderr, "cache-sim: --fraction needs a number in (0, 1], got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--warmup")) {
            if (parse_long(v, &warmup) || warmup < 0) {
                fprintf(stderr, "cache-sim: --warmup needs a token count >= 0, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--pin")) {
            if (parse_double(v, &pin) || !(pin >= 0 && pin <= 1)) {
                fprintf(stderr, "cache-sim: --pin needs a fraction in [0, 1], got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--half-life")) {
            if (parse_double(v, &half_life) || !(half_life > 0)) {
                fprintf(stderr, "cache-sim: --half-life needs a positive token count, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--tune")) {
            if (parse_tuning(v, &tuning)) return 2;
        } else {
            fprintf(stderr, "cache-sim: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i += takes;
    }
    if (!trace_path) {
        fprintf(stderr, "cache-sim: --trace is required\n");
        usage(stderr);
        return 2;
    }
    if ((slots > 0) == (fraction > 0)) {
        fprintf(stderr, "cache-sim: give exactly one of --slots and --fraction\n");
        return 2;
    }
    if (pin > 0 && !heat_path) {
        fprintf(stderr, "cache-sim: --pin needs --heat (pinning ranks experts by persisted heat)\n");
        return 2;
    }

    /* policies to run, in the order given */
    int run[DF_POLICY_COUNT * 4], n_run = 0;
    {
        char *dup = df_xstrdup(policies), *save = NULL;
        for (char *p = strtok_r(dup, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
            if (!strcmp(p, "all")) {
                int order[] = {DF_POLICY_DELTAFIN, DF_POLICY_LRU, DF_POLICY_BELADY};
                for (int j = 0; j < 3 && n_run < (int)(sizeof run / sizeof *run); j++)
                    run[n_run++] = order[j];
                continue;
            }
            int pol = df_cache_policy_from_name(p);
            if (pol < 0) {
                fprintf(stderr, "cache-sim: unknown policy '%s' (deltafin, lru, belady, all)\n", p);
                free(dup);
                return 2;
            }
            if (n_run < (int)(sizeof run / sizeof *run)) run[n_run++] = pol;
        }
        free(dup);
        if (!n_run) {
            fprintf(stderr, "cache-sim: --policy lists no policy\n");
            return 2;
        }
    }

    df_error err;
    df_trace t;
    if (df_trace_load(&t, trace_path, &err) != DF_OK) {
        fprintf(stderr, "cache-sim: %s\n", err.msg);
        return 1;
    }
    int n_keys = t.n_layers * t.n_experts;
    int n_slots = slots > 0 ? (slots > n_keys ? n_keys : (int)slots)
                            : (int)(fraction * n_keys + 0.5);
    if (n_slots < 1) n_slots = 1;
    int n_pinned = (int)(pin * n_slots + 0.5);
    if (warmup >= t.n_tokens && t.n_tokens > 0) {
        fprintf(stderr, "cache-sim: --warmup %ld leaves none of the %d tokens\n", warmup,
                t.n_tokens);
        df_trace_free(&t);
        return 2;
    }

    df_heat heat;
    int have_heat = 0, status = 0;
    if (heat_path) {
        if (df_heat_init(&heat, t.n_layers, t.n_experts, half_life, &err) != DF_OK) {
            fprintf(stderr, "cache-sim: %s\n", err.msg);
            df_trace_free(&t);
            return 1;
        }
        df_heat_load_result hr = df_heat_load(&heat, heat_path, &err);
        if (hr != DF_HEAT_LOADED) fprintf(stderr, "cache-sim: warning: %s\n", err.msg);
        have_heat = 1;
    }

    printf("trace %s: %d tokens in %d sequences, %d layers x %d experts, top-%d\n",
           trace_path, t.n_tokens, t.n_seqs, t.n_layers, t.n_experts, t.top_k);
    printf("cache %d slots (%.1f%% of %d experts)", n_slots, 100.0 * n_slots / n_keys, n_keys);
    if (n_pinned) printf(", %d pinned from %s", n_pinned, heat_path);
    if (warmup) printf(", first %ld tokens not counted", warmup);
    printf("\n");

    uint64_t *next = next_uses(&t);
    for (int i = 0; i < n_run; i++) {
        df_cache_opts o;
        memset(&o, 0, sizeof o);
        o.n_layers = t.n_layers;
        o.n_experts = t.n_experts;
        o.top_k = t.top_k;
        o.n_slots = n_slots;
        o.policy = (df_cache_policy)run[i];
        o.heat_half_life = half_life;
        o.initial_heat = have_heat ? &heat : NULL;
        o.n_pinned = n_pinned;
        o.tuning = tuning;
        df_cache *c;
        if (df_cache_new(&c, &o, &err) != DF_OK) {
            fprintf(stderr, "cache-sim: %s\n", err.msg);
            status = 1;
            break;
        }
        double t0 = df_now();
        sim_result r;
        replay(&t, c, next, (int)warmup, &r);
        double dt = df_now() - t0;
        const df_cache_stats *st = df_cache_get_stats(c);
        printf("%-9s hit rate %6.2f%%  hits %llu  misses %llu  accesses %llu  bypassed %llu  "
               "(%.2f s)\n",
               df_cache_policy_name(o.policy),
               r.accesses ? 100.0 * (double)r.hits / (double)r.accesses : 0.0,
               (unsigned long long)r.hits, (unsigned long long)(r.accesses - r.hits),
               (unsigned long long)r.accesses, (unsigned long long)st->bypassed, dt);
        if (verbose && o.policy == DF_POLICY_DELTAFIN) {
            double H[4096];
            int nm, nb;
            if (df_cache_hazard(c, H, 4096, &nm, &nb) > 0) {
                if (nm * nb > 4096) nm = 4096 / nb;
                printf("  hazard H[m][b] (rows: missed opportunities m; cols: heat bucket b)\n");
                for (int m = 0; m < nm; m++) {
                    printf("  m=%-3d", m);
                    for (int b = 0; b < nb; b++) printf(" %.3f", H[m * nb + b]);
                    printf("\n");
                }
            }
        }
        if (save_heat && i == n_run - 1) {
            if (df_heat_save(df_cache_heat(c), save_heat, &err) != DF_OK) {
                fprintf(stderr, "cache-sim: %s\n", err.msg);
                status = 1;
            }
        }
        df_cache_free(c);
    }
    free(next);
    if (have_heat) df_heat_free(&heat);
    df_trace_free(&t);
    return status;
}
