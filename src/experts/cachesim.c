/*
 * cachesim.c - the cache simulation behind `deltafin cache-sim` (whose
 * options and printing are in src/cli/cachesim.c): replays a routing trace
 * through an expert cache exactly as the runtime drives it (all of a layer's
 * lookups, then its admissions, then the next layer; df_cache_token_end after
 * each token) so the figures carry over, with Belady's next uses for the
 * oracle policy. The cache lives on across the trace's sequences, as it does
 * across requests in a server. With several streams (df_cache_sim_steps),
 * the steps of N sequences decoded together, each layer step the union of
 * its rows' experts.
 */
#include "experts/cachesim.h"
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


/* ---- several sequences at once ------------------------------------------------------ */

struct df_sim_steps {
    int n_layers, n_steps;
    size_t *start;     /* [n_steps * n_layers + 1]: a layer step's accesses in ids[] */
    int32_t *ids;      /* the union of the step's rows' experts, in first-seen order */
    uint64_t *next;    /* each access's key's next layer step, UINT64_MAX if none */
    uint8_t *counted;  /* [n_steps]: a decode step */
    int *rows;         /* [n_steps]: its rows */
};

/* The union of layer l's experts over tokens [a, b) of each stream's stretch. */
static int step_union(const df_trace *t, int l, const int *a, const int *b, int n, uint8_t *seen, int32_t *out) {
    int m = 0;
    memset(seen, 0, (size_t)t->n_experts);
    for (int s = 0; s < n; s++)
        for (int tok = a[s]; tok < b[s]; tok++) {
            const uint16_t *ids = df_trace_at(t, tok, l);
            for (int k = 0; k < t->top_k; k++)
                if (!seen[ids[k]]) seen[ids[k]] = 1, out[m++] = ids[k];
        }
    return m;
}

/* Steps of one window starting at trace token w0: the prompt step (when
 * prompt > 0), then the decode steps. Appends to s; returns the steps added. */
static int window_steps(const df_trace *t, const df_sim_streams *o, int w0, df_sim_steps *s, size_t *n_ids,
                        uint8_t *seen) {
    int N = o->n_streams, per = o->prompt + o->decode, a[N], b[N], added = 0;
    for (int st = o->prompt > 0 ? -1 : 0; st < o->decode; st++, added++) {
        for (int i = 0; i < N; i++) {
            int base = w0 + i * per;
            a[i] = st < 0 ? base : base + o->prompt + st;
            b[i] = st < 0 ? base + o->prompt : a[i] + 1;
        }
        int si = s->n_steps++;
        s->counted[si] = st >= 0;
        s->rows[si] = st < 0 ? N * o->prompt : N;
        for (int l = 0; l < t->n_layers; l++) {
            s->start[(size_t)si * (size_t)t->n_layers + (size_t)l] = *n_ids;
            *n_ids += (size_t)step_union(t, l, a, b, N, seen, s->ids + *n_ids);
        }
    }
    return added;
}

df_sim_steps *df_cache_sim_steps(const df_trace *t, const df_sim_streams *o, int *n_windows) {
    *n_windows = 0;
    if (o->n_streams < 1 || o->prompt < 0 || o->decode < 1) return NULL;
    int64_t per = (int64_t)o->n_streams * (o->prompt + o->decode);
    int64_t windows = per > 0 ? t->n_tokens / per : 0;
    df_sim_steps *s = df_xcalloc(1, sizeof *s);
    s->n_layers = t->n_layers;
    int64_t max_steps = windows * (o->decode + (o->prompt > 0));
    s->start = df_xmalloc(sizeof *s->start * (size_t)(max_steps * t->n_layers + 1));
    s->counted = df_xmalloc((size_t)(max_steps ? max_steps : 1));
    s->rows = df_xmalloc(sizeof *s->rows * (size_t)(max_steps ? max_steps : 1));
    /* a layer step asks for at most every expert, and at most every row's top-k */
    size_t cap = (size_t)windows * (size_t)per * (size_t)t->n_layers * (size_t)t->top_k;
    s->ids = df_xmalloc(sizeof *s->ids * (cap ? cap : 1));
    uint8_t *seen = df_xmalloc((size_t)t->n_experts);
    size_t n_ids = 0;
    for (int64_t w = 0; w < windows; w++) window_steps(t, o, (int)(w * per), s, &n_ids, seen);
    *n_windows = (int)windows;
    s->start[(size_t)s->n_steps * (size_t)t->n_layers] = n_ids;
    /* Belady's next uses, backwards over the layer steps */
    s->next = df_xmalloc(sizeof *s->next * (n_ids ? n_ids : 1));
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    uint64_t *last = df_xmalloc(sizeof *last * nk);
    for (size_t i = 0; i < nk; i++) last[i] = UINT64_MAX;
    for (int64_t ls = (int64_t)s->n_steps * t->n_layers - 1; ls >= 0; ls--) {
        size_t l = (size_t)(ls % t->n_layers);
        for (size_t j = s->start[ls]; j < s->start[ls + 1]; j++) {
            s->next[j] = last[l * (size_t)t->n_experts + (size_t)s->ids[j]];
            last[l * (size_t)t->n_experts + (size_t)s->ids[j]] = (uint64_t)ls;
        }
    }
    free(last);
    free(seen);
    return s;
}

void df_cache_sim_steps_free(df_sim_steps *s) {
    if (!s) return;
    free(s->start), free(s->ids), free(s->next), free(s->counted), free(s->rows);
    free(s);
}

void df_cache_sim_replay_steps(const df_sim_steps *s, df_cache *c, df_sim_result *r, uint64_t *rows) {
    memset(r, 0, sizeof *r);
    *rows = 0;
    size_t most = 1;
    for (size_t ls = 0; ls < (size_t)s->n_steps * (size_t)s->n_layers; ls++)
        if (s->start[ls + 1] - s->start[ls] > most) most = s->start[ls + 1] - s->start[ls];
    int32_t *slots = df_xmalloc(sizeof *slots * most);
    uint8_t *hit = df_xmalloc(most);
    for (int st = 0; st < s->n_steps; st++) {
        for (int l = 0; l < s->n_layers; l++) {
            size_t ls = (size_t)st * (size_t)s->n_layers + (size_t)l, a = s->start[ls];
            int n = (int)(s->start[ls + 1] - a);
            for (int j = 0; j < n; j++) df_cache_set_next_use(c, l, s->ids[a + j], s->next[a + (size_t)j]);
            int h = df_cache_access_layer(c, l, s->ids + a, n, slots, hit);
            if (s->counted[st]) r->accesses += (uint64_t)n, r->hits += (uint64_t)h;
        }
        if (s->counted[st]) *rows += (uint64_t)s->rows[st];
        df_cache_token_end(c);
    }
    free(slots);
    free(hit);
}
