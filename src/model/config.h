/*
 * config.h - a Hugging Face config.json, parsed and validated into a df_config.
 *
 * Owns the fields every family shares (vocabulary, widths, layer count,
 * context, norms, rotary scaling, token ids) and the field readers families use
 * for their own fields (config_json.h). Which family a checkpoint belongs to
 * is config.json's model_type, looked up in the architecture table (arch.h);
 * the family's parse_config reads the rest. Sampling defaults from
 * generation_config.json are not here: model/generation.h.
 */
#ifndef DF_CONFIG_H
#define DF_CONFIG_H

#include "util/util.h"

struct df_arch;

typedef enum df_rope_type {
    DF_ROPE_DEFAULT = 0,
    DF_ROPE_LINEAR,
    DF_ROPE_DYNAMIC, /* dynamic NTK */
    DF_ROPE_YARN
} df_rope_type;

#define DF_MAX_LAYERS 512

typedef enum df_score_fn { DF_SCORE_SOFTMAX = 0, DF_SCORE_SIGMOID } df_score_fn;
typedef enum df_topk_method {
    DF_TOPK_GREEDY = 0,         /* the k best scores */
    DF_TOPK_GROUP_LIMITED,      /* within the topk_group groups of best max score */
    DF_TOPK_NOAUX_TC            /* score + correction bias, groups by top-2 sum */
} df_topk_method;

typedef enum df_act_kind { DF_ACT_SILU = 0, DF_ACT_SITU } df_act_kind;

typedef struct df_config {
    const struct df_arch *arch; /* the architecture table entry of model_type */
    char model_type[32];
    int vocab_size;
    int hidden_size;
    int intermediate_size;      /* dense feed-forward width */
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings;
    bool attention_bias;
    char torch_dtype[16];       /* informative */
    char quant_method[160];     /* quantization_config, described (model/quant.h); "" if none */

    /* rope_scaling */
    df_rope_type rope_type;
    double rope_factor;
    int rope_original_max_position_embeddings;
    double yarn_beta_fast, yarn_beta_slow;
    double yarn_attention_factor; /* <= 0: derived from factor */
    double yarn_mscale, yarn_mscale_all_dim;
    bool yarn_truncate;

    /* routed experts (0 experts: a dense model) */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int decoder_sparse_step;
    bool norm_topk_prob;
    bool layer_is_moe[DF_MAX_LAYERS]; /* derived by the family */
    int n_shared_experts;       /* always-active experts beside the routed ones */
    double routed_scaling_factor;
    df_score_fn scoring;        /* router scores from logits */
    df_topk_method topk_method; /* how the top-k is selected */
    int n_group, topk_group;    /* expert groups, and how many a token may use */

    /* multi-head latent attention (0 kv_lora_rank: none) */
    int q_lora_rank;            /* 0: a plain q_proj */
    int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;

    /* Activation of gated MLPs and experts: silu(g) * u, or Kimi K3's SiTU
     * (beta tanh(g/beta) sigmoid(g)) * (lbeta tanh(u/lbeta)) */
    df_act_kind act;
    float act_beta, act_lbeta;
    /* routed experts in a latent width (0: the hidden width), and whether
     * their weighted sum is RMS-normalised before the up projection */
    int moe_latent_size;
    bool moe_latent_norm;

    /* linear-attention layers (Kimi Delta Attention; 0 heads: none) */
    bool layer_is_linear[DF_MAX_LAYERS];
    int linear_heads, linear_head_dim, linear_conv;
    bool linear_lower_bound_form;   /* g = lb sigmoid(...), else -a softplus(...) */
    float linear_lower_bound;
    bool linear_full_rank_gate;     /* g_proj, else g_a_proj/g_b_proj */
    bool mla_nope, mla_output_gate; /* MLA without rotary; sigmoid(g_proj x) gate */
    int attn_res_block;             /* attention residuals' depth block (0: plain residual) */

    /* Prefix of the text model's tensor names: "" or, for a multimodal
     * wrapper whose config.json has a text_config, "language_model." */
    char tensor_prefix[32];

    /* token ids named in config.json (generation_config.json may override the
     * end-of-sequence ids: model/generation.h) */
    int bos_token_id;           /* -1 if none */
    int eos_token_ids[8];
    int n_eos_token_ids;
} df_config;

/* Parses config.json text; `path` names the file in errors. */
int df_config_parse(df_config *c, const char *json, size_t len, const char *path,
                    df_error *err);
/* Loads DIR/config.json. */
int df_config_load_dir(df_config *c, const char *dir, df_error *err);
/* MoE layers among the model's layers. */
int df_config_moe_layers(const df_config *c);

#endif
