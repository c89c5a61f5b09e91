/*
 * config.h - a Hugging Face config.json and generation_config.json, parsed and
 * validated for the architectures deltafin runs (qwen3, qwen3_moe).
 */
#ifndef DF_CONFIG_H
#define DF_CONFIG_H

#include "util/util.h"

typedef enum df_arch { DF_ARCH_QWEN3 = 0, DF_ARCH_QWEN3_MOE = 1 } df_arch;

typedef enum df_rope_type {
    DF_ROPE_DEFAULT = 0,
    DF_ROPE_LINEAR,
    DF_ROPE_DYNAMIC, /* dynamic NTK */
    DF_ROPE_YARN
} df_rope_type;

#define DF_MAX_LAYERS 512

typedef struct df_config {
    df_arch arch;
    char model_type[32];
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;               /* defaults to hidden_size / num_attention_heads */
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings;
    bool attention_bias;
    char torch_dtype[16];       /* informative */

    /* rope_scaling */
    df_rope_type rope_type;
    double rope_factor;
    int rope_original_max_position_embeddings;
    double yarn_beta_fast, yarn_beta_slow;
    double yarn_attention_factor; /* <= 0: derived from factor */
    double yarn_mscale, yarn_mscale_all_dim;
    bool yarn_truncate;

    /* mixture of experts (qwen3_moe) */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int decoder_sparse_step;
    bool norm_topk_prob;
    bool layer_is_moe[DF_MAX_LAYERS]; /* derived: sparse step and mlp_only_layers */

    /* generation_config.json (and config.json fallbacks) */
    int bos_token_id;           /* -1 if none */
    int eos_token_ids[8];
    int n_eos_token_ids;
    double gen_temperature;     /* < 0 if unset */
    double gen_top_p;
    int gen_top_k;
} df_config;

/* Parses config.json text; `path` names the file in errors. */
int df_config_parse(df_config *c, const char *json, size_t len, const char *path,
                    df_error *err);
/* Applies generation_config.json text (optional file: NULL json = absent). */
int df_config_parse_generation(df_config *c, const char *json, size_t len,
                               const char *path, df_error *err);
/* Loads DIR/config.json and DIR/generation_config.json (if present). */
int df_config_load_dir(df_config *c, const char *dir, df_error *err);

#endif
