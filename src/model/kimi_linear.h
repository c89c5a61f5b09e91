/*
 * kimi_linear.h - what the two files of the Kimi-Linear family share (private
 * to src/model/kimi_linear*.c): its layers' weights, and the entry points the
 * forward-pass file (kimi_linear_fwd.c: work buffers, the forward pass)
 * gives the table file (kimi_linear.c: config, tensors, state, inspect).
 */
#ifndef DF_KIMI_LINEAR_H
#define DF_KIMI_LINEAR_H

#include "model/arch.h"
#include "model/blocks.h"

typedef struct layer {
    float *attn_norm, *ffn_norm;           /* [H] */
    float *attn_res_q, *mlp_res_q;         /* AttnRes pseudo-queries norm.weight * proj.weight [H] */
    bool linear, is_moe;
    df_weight q, k, v, o;                  /* KDA's q/k/v/o; MLA's q_proj and o_proj */
    df_weight g, g_a, g_b, f_a, f_b, beta; /* KDA gates */
    float *conv[3], *a, *dt_bias, *o_norm;
    df_kda kda;
    df_weight q_a, q_b, kv_a, kv_b, mg;    /* MLA */
    float *q_a_norm, *kv_a_norm;
    df_weight gate, up, down;              /* dense MLP, or the shared experts */
    df_weight router, lat_down, lat_up;
    float *router_bias, *lat_norm;
} layer;

typedef struct fam {
    layer *layers;
    df_mla mla;
    df_router router;
    float *out_res_q;                      /* the output site's AttnRes pseudo-query */
} fam;

/* A sequence's latent cache row: the normalised latent, then the (unrotated)
 * shared key part. */
static inline int kl_cache_dim(const df_config *c) { return c->kv_lora_rank + c->qk_rope_head_dim; }

void *kl_work_new(const df_model *m, int max_rows, int max_ctx);
void kl_work_free(void *work);
uint64_t kl_work_bytes(const df_model *m, int max_rows, int max_ctx);
int kl_forward(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err);

#endif
