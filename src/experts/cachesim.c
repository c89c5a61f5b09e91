/*
 * cachesim.c - the cache simulation behind `deltafin cache-sim` (whose
 * options and printing are in src/cli/cachesim.c): replays a routing trace
 * through an expert cache exactly as the runtime drives it (all of a layer's
 * lookups, then its admissions, then the next layer; df_cache_token_end after
 * each token) so the figures carry over, with Belady's next uses for the
 * oracle policy. The cache lives on across the trace's sequences, as it does
 * across requests in a server.
 */
#include "experts/policy.h"
#include "experts/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int df_cache_tuning_parse(const char *spec, df_cache_tuning *t, df_error *err) {
    char *dup = df_xstrdup(spec), *save = NULL;
    int rc = 0;
    for (char *kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        double v;
        if (!eq || parse_double(eq + 1, &v) != 0) {
            rc = df_fail(err, DF_ERR_ARG, "--tune: bad entry '%s' (want key=value)", kv);
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
            rc = df_fail(err, DF_ERR_ARG, "--tune: unknown key '%s'", kv);
            break;
        }
    }
    free(dup);
    return rc;
}

/* next_step[i] for access i (token-major, layer, k): the layer step of the same
 * key's next use, UINT64_MAX if none. */
uint64_t *df_cache_sim_next_uses(const df_trace *t) {
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

void df_cache_sim_replay(const df_trace *t, df_cache *c, const uint64_t *next, int warmup, df_sim_result *r) {
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
}

