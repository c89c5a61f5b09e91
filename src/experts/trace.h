/*
 * trace.h - MoE routing traces: which experts every token selected in every MoE
 * layer. Owns the text format (parsing with line-accurate errors, and writing the
 * same format so the engine can record its own routing), used by the cache
 * simulator, the policy tests and, later, the runtime's recorder.
 *
 * Format ("moe-routing-trace v1"):
 *
 *   # moe-routing-trace v1
 *   # model: <free text>
 *   # moe_layers: 26 (model layers 1..26)  experts_per_layer: 64  top_k: 6
 *   8,26,56,57,60,11 3,38,50,60,62,63 ...     <- one line per token
 *                                             <- a blank line ends a sequence
 *
 * The first line must be the magic line. Header comments ("# key: value") before
 * the first token must give moe_layers, experts_per_layer and top_k; other
 * comments are ignored anywhere. A token line has exactly moe_layers
 * whitespace-separated fields, each exactly top_k distinct comma-separated expert
 * ids in [0, experts_per_layer). CRLF line ends are accepted.
 */
#ifndef DF_EXPERTS_TRACE_H
#define DF_EXPERTS_TRACE_H

#include "util/util.h"

#include <stdint.h>
#include <stdio.h>

#define DF_TRACE_MAX_LAYERS 4096
#define DF_TRACE_MAX_EXPERTS 65535
#define DF_TRACE_MAX_TOPK 1024

typedef struct df_trace {
    int n_layers;    /* MoE layers per token */
    int n_experts;   /* routed experts per layer */
    int top_k;       /* experts selected per layer per token */
    int first_layer; /* model index of the first MoE layer (informational; -1 unknown) */
    char model[256]; /* "# model:" header, "" if absent */
    int n_tokens;
    int n_seqs;
    /* n_tokens * n_layers * top_k ids, token-major, then layer, in file order */
    uint16_t *ids;
    /* seq_start[s] = first token of sequence s, s in [0, n_seqs]; seq_start[n_seqs] = n_tokens */
    int *seq_start;
} df_trace;

/* Parses a whole trace held in memory. `name` is used in error messages
 * ("name:LINE: ..."). On failure *t is left empty (safe to df_trace_free). */
int df_trace_parse(df_trace *t, const char *text, size_t len, const char *name,
                   df_error *err);
int df_trace_load(df_trace *t, const char *path, df_error *err);
void df_trace_free(df_trace *t);

/* Pointer to the top_k ids of (token, layer). */
static inline const uint16_t *df_trace_at(const df_trace *t, int token, int layer) {
    return t->ids + ((size_t)token * (size_t)t->n_layers + (size_t)layer) * (size_t)t->top_k;
}

/* ---- writing (the engine's recorder) ------------------------------------ */

typedef struct df_trace_writer df_trace_writer;

/* Creates/truncates `path` and writes the header. model may be NULL; first_layer
 * < 0 leaves the "(model layers a..b)" note out. */
int df_trace_writer_open(df_trace_writer **out, const char *path, const char *model,
                         int n_layers, int first_layer, int n_experts, int top_k,
                         df_error *err);
/* Same, over an already open stream (not closed by df_trace_writer_close). */
int df_trace_writer_open_stream(df_trace_writer **out, FILE *f, const char *name,
                                const char *model, int n_layers, int first_layer,
                                int n_experts, int top_k, df_error *err);
/* One token: ids[n_layers * top_k], layer-major. Ids are validated (range,
 * duplicates within a layer) so a recorded trace always parses back. */
int df_trace_writer_token(df_trace_writer *w, const int32_t *ids, df_error *err);
/* Ends the current sequence (a blank line); a no-op if no token since the last. */
int df_trace_writer_end_sequence(df_trace_writer *w, df_error *err);
/* Flushes and closes; reports a write error that happened at any point. Always
 * frees w. */
int df_trace_writer_close(df_trace_writer *w, df_error *err);

/* Writes a whole parsed trace (round trip of df_trace_parse). */
int df_trace_write_file(const df_trace *t, const char *path, df_error *err);

#endif
