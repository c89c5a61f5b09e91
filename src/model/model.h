/*
 * model.h - a loaded Qwen3 / Qwen3-MoE model: the config, the mapped checkpoint,
 * and typed views of every weight the forward pass uses, plus the forward pass
 * itself (qwen3.c) over a batch of T consecutive positions of one sequence.
 */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/safetensors.h"

/* A 2-D weight [rows][cols] in its stored dtype, pointing into the mapping. */
typedef struct df_weight {
    const void *data;
    df_dtype dtype;
    int rows, cols;
    const df_tensor *t;
} df_weight;

typedef struct df_expert {
    df_weight gate, up, down; /* [I][H], [I][H], [H][I] */
} df_expert;

typedef struct df_layer {
    float *attn_norm, *ffn_norm; /* [H], widened from the stored dtype */
    float *q_norm, *k_norm;      /* [head_dim] */
    df_weight q, k, v, o;
    float *q_bias, *k_bias, *v_bias, *o_bias; /* attention_bias only */
    bool is_moe;
    df_weight gate, up, down;    /* dense MLP */
    df_weight router;            /* [E][H] */
    df_expert *experts;          /* [E] */
} df_layer;

typedef struct df_model {
    df_config cfg;
    df_st *st;
    df_weight embed;   /* [V][H] */
    df_weight lm_head; /* [V][H], == embed when tied */
    float *final_norm; /* [H] */
    df_layer *layers;
    float *inv_freq;   /* [head_dim/2] rotary inverse frequencies (HF float32 values) */
    float rope_attn_factor;
    uint64_t bytes_total, bytes_dense, bytes_experts;
    /* Always-active matrices read into anonymous memory (df_model_dense_to_ram),
     * or NULL: the weights then point into the file mapping. */
    void *ram;
    size_t ram_bytes;
    const void **ram_of; /* [df_st_count]: a tensor's copy, or NULL */
} df_model;

int df_model_load(df_model *m, const char *dir, df_error *err);
void df_model_free(df_model *m);
/* Reads the matrices every token uses (attention, routers, dense MLPs, the LM
 * head; the embedding table only when the LM head is tied to it) out of the
 * checkpoint into one anonymous region advised for 2 MiB pages, and points the
 * weights there. For streaming, where the file cannot be mapped with 2 MiB
 * pages (the expert tensors between them would be charged to the RSS). */
int df_model_dense_to_ram(df_model *m, df_error *err);
/* The in-RAM copy of tensor t, or NULL if it is used from the mapping. */
const void *df_model_ram_copy(const df_model *m, const df_tensor *t);

/* ---- forward pass ---------------------------------------------------------- */

/* One timeline's key/value cache: [layer][position][kv_heads * head_dim], F32. */
typedef struct df_kv {
    int max_ctx;
    int kv_dim;
    float *k, *v;
} df_kv;

int df_kv_init(df_kv *kv, const df_model *m, int max_ctx, df_error *err);
void df_kv_free(df_kv *kv);

/* Work buffers for up to max_rows rows at once. */
typedef struct df_fwd_buf df_fwd_buf;
df_fwd_buf *df_fwd_buf_new(const df_model *m, int max_rows, int max_ctx);
void df_fwd_buf_free(df_fwd_buf *b);
int df_fwd_buf_rows(const df_fwd_buf *b);
/* Routing replay (benchmarks and tests only): called for every row of every MoE
 * layer after the router ran; writes the top_k expert ids (distinct, in
 * [0, num_experts)) that row uses instead of the router's top-k. `layer` is the
 * model layer index, `row` the row within the pass. NULL: the router's choice. */
typedef void (*df_route_fn)(void *user, int layer, int row, int *ids);
void df_fwd_buf_set_route(df_fwd_buf *b, df_route_fn fn, void *user);
/* Bytes df_fwd_buf_new(m, rows, max_ctx) and a forward pass allocate. */
size_t df_fwd_buf_bytes(const df_model *m, int rows, int max_ctx);

struct df_store;

/* Runs rows tokens[0..T) at positions pos0..pos0+T-1 (T <= max_rows), writing
 * their K/V into kv. logits: NULL, or [T][vocab] when all_rows, else [vocab]
 * for the last row. store: where routed experts come from (NULL: the mapped
 * checkpoint). A row's results do not depend on T, the thread count, or where
 * the experts came from. on_layer (may be NULL) is called after each layer.
 * Fails only on expert read errors. */
typedef void (*df_layer_cb)(void *user, int layers_done, int n_layers, int rows);
int df_qwen3_forward(const df_model *m, struct df_store *store, df_pool *pool, df_kv *kv,
                     df_fwd_buf *b, const int32_t *tokens, int T, int pos0, float *logits,
                     bool all_rows, df_layer_cb on_layer, void *user, df_error *err);

#endif
