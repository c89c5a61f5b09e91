/*
 * fuzz_trace.c - libFuzzer target for routing traces (src/experts/trace.c), the
 * text files `--replay-routing` and `cache-sim` read. A trace must be refused with
 * a message naming the file and line, or parse into one whose every id the
 * engine may index with (in range, distinct within a layer, sequences covering
 * the tokens in order), and writing it back out must parse to the same trace.
 */
#include "experts/trace.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[120];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "# moe-routing-trace v1\n", "# model: x\n", "# moe_layers: ", "experts_per_layer: ",
    "top_k: ", "(model layers 1..26)", "\n\n", "\r\n", "65535", "65536", "4096", "0,1,2,3",
    " ", ",", "#",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static void check(const df_trace *t) {
    if (t->n_layers < 1 || t->n_layers > DF_TRACE_MAX_LAYERS || t->top_k < 1 ||
        t->top_k > t->n_experts || t->n_experts > DF_TRACE_MAX_EXPERTS || t->n_tokens < 0 ||
        t->n_seqs < 0 || (t->n_tokens > 0 && t->n_seqs < 1))
        abort();
    if (t->n_seqs && (t->seq_start[0] != 0 || t->seq_start[t->n_seqs] != t->n_tokens)) abort();
    for (int s = 0; s < t->n_seqs; s++)
        if (t->seq_start[s + 1] <= t->seq_start[s]) abort();
    for (int i = 0; i < t->n_tokens; i++)
        for (int l = 0; l < t->n_layers; l++) {
            const uint16_t *ids = df_trace_at(t, i, l);
            for (int k = 0; k < t->top_k; k++) {
                if (ids[k] >= t->n_experts) abort();
                for (int j = 0; j < k; j++)
                    if (ids[j] == ids[k]) abort();
            }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    df_trace t, u;
    df_error err = {0};
    int rc = df_trace_parse(&t, (const char *)data, size, "in.trace", &err);
    if (rc) {
        if (err.code != rc || strncmp(err.msg, "in.trace", 8) != 0) abort();
        /* the line number and the offending values vary; the complaint does not */
        const char *m = strchr(err.msg + 8, ' ');
        const char *msg = m ? m + 1 : err.msg;
        char head[16];
        snprintf(head, sizeof head, "%d ", rc);
        df_fuzz_describe(outcome, sizeof outcome, head, msg, strlen(msg), '\''); /* 'what was found' */
        df_trace_free(&t);
        return 0;
    }
    check(&t);
    const char *path = df_fuzz_scratch("written.trace"); /* as the engine's recorder writes it */
    if (df_trace_write_file(&t, path, &err) != DF_OK) abort();
    if (df_trace_load(&u, path, &err) != DF_OK) abort();
    size_t per = (size_t)t.n_layers * (size_t)t.top_k;
    if (u.n_layers != t.n_layers || u.n_experts != t.n_experts || u.top_k != t.top_k ||
        u.n_tokens != t.n_tokens || u.n_seqs != t.n_seqs || strcmp(u.model, t.model) != 0 ||
        u.first_layer != t.first_layer ||
        (t.n_tokens && memcmp(u.ids, t.ids, per * (size_t)t.n_tokens * sizeof *t.ids) != 0) ||
        (t.n_seqs && memcmp(u.seq_start, t.seq_start, ((size_t)t.n_seqs + 1) * sizeof(int)) != 0))
        abort();
    snprintf(outcome, sizeof outcome, "ok %d %d", t.n_tokens > 0, t.n_seqs > 1);
    df_trace_free(&u);
    df_trace_free(&t);
    return 0;
}
