/*
 * fuzz_config.c - libFuzzer target for config.json and generation_config.json
 * parsing (Qwen3, the DeepSeek-V3 family, text_config wrappers, and the
 * quantization_config of weights as shipped: model/quant.c, reached through
 * df_config_parse). The input is parsed as config.json; if it parses, the result must
 * satisfy the invariants the engine relies on, and the same text is then
 * applied as a generation_config.json. It is also applied as a generation
 * config to a fixed valid config.
 */
#include "model/config.h"
#include "model/generation.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[2208];

const char *df_fuzz_outcome(void) { return outcome; }

/* Outcome lines are newline-separated: names must not break them. */
static void flatten(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20) *s = '?';
}


static const char *const DICT[] = {
    "\"model_type\"", "\"qwen3\"", "\"qwen3_moe\"", "\"vocab_size\"", "\"hidden_size\"",
    "\"intermediate_size\"", "\"num_hidden_layers\"", "\"num_attention_heads\"",
    "\"num_key_value_heads\"", "\"head_dim\"", "\"max_position_embeddings\"",
    "\"rms_norm_eps\"", "\"rope_theta\"", "\"tie_word_embeddings\"", "\"attention_bias\"",
    "\"torch_dtype\"", "\"rope_scaling\"", "\"rope_parameters\"", "\"rope_type\"", "\"type\"",
    "\"factor\"", "\"yarn\"", "\"linear\"", "\"dynamic\"", "\"default\"", "\"llama3\"",
    "\"original_max_position_embeddings\"", "\"beta_fast\"", "\"beta_slow\"",
    "\"attention_factor\"", "\"mscale\"", "\"mscale_all_dim\"", "\"truncate\"",
    "\"num_experts\"", "\"num_experts_per_tok\"", "\"moe_intermediate_size\"",
    "\"decoder_sparse_step\"", "\"norm_topk_prob\"", "\"mlp_only_layers\"",
    "\"use_sliding_window\"", "\"layer_types\"", "\"full_attention\"", "\"hidden_act\"",
    "\"silu\"", "\"bos_token_id\"", "\"eos_token_id\"", "\"temperature\"", "\"top_p\"",
    "\"top_k\"", "[0,1,2,3,4,5,6,7,8]", "[151645,151643]",
    /* the DeepSeek-V3 family and a Kimi K2.5-style wrapper */
    "\"deepseek_v2\"", "\"deepseek_v3\"", "\"kimi_k2\"", "\"kimi_k25\"", "\"text_config\"",
    "\"q_lora_rank\"", "\"kv_lora_rank\"", "\"qk_nope_head_dim\"", "\"qk_rope_head_dim\"",
    "\"v_head_dim\"", "\"n_routed_experts\"", "\"n_shared_experts\"", "\"first_k_dense_replace\"",
    "\"moe_layer_freq\"", "\"routed_scaling_factor\"", "\"scoring_func\"", "\"sigmoid\"", "\"softmax\"",
    "\"topk_method\"", "\"greedy\"", "\"group_limited_greedy\"", "\"noaux_tc\"", "\"n_group\"",
    "\"topk_group\"", "\"num_nextn_predict_layers\"", "null",
    /* quantization_config (model/quant.c): fp8 and compressed-tensors */
    "\"quantization_config\"", "\"quant_method\"", "\"fp8\"", "\"compressed-tensors\"", "\"fmt\"", "\"e4m3\"",
    "\"weight_block_size\"", "[128,128]", "\"activation_scheme\"", "\"static\"", "\"scale_fmt\"", "\"ue8m0\"",
    "\"modules_to_not_convert\"", "\"ignored_layers\"", "\"format\"", "\"pack-quantized\"",
    "\"mxfp4-pack-quantized\"", "\"mixed-precision\"", "\"config_groups\"", "\"targets\"", "\"Linear\"",
    "\"weights\"", "\"num_bits\"", "\"group_size\"", "\"strategy\"", "\"group\"", "\"symmetric\"", "\"int\"",
    "\"float\"", "\"ignore\"", "\"re:.*\"", "\"re:(\"", "\"input_activations\"", "\"quantization_status\"",
    "\"compressed\"", "\"kv_cache_scheme\"", "\"scale_dtype\"", "\"torch.uint8\"", "\"actorder\"", "\"zp_dtype\"",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static const char BASE[] = "{\"model_type\":\"qwen3\",\"vocab_size\":1000,\"hidden_size\":64,"
                           "\"intermediate_size\":128,\"num_hidden_layers\":4,"
                           "\"num_attention_heads\":4,\"eos_token_id\":2}";

/* MLA (the DeepSeek-V3 family): heads share one latent; rotary pairs are in the
 * rope part only; the router's groups are consistent. */
static void check_mla(const df_config *c) {
    if (c->num_key_value_heads != c->num_attention_heads || c->qk_nope_head_dim <= 0 ||
        c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 != 0 || c->v_head_dim <= 0 ||
        c->head_dim != c->qk_nope_head_dim + c->qk_rope_head_dim || c->q_lora_rank < 0 ||
        c->n_shared_experts < 0 || !(c->routed_scaling_factor > 0) || !isfinite(c->routed_scaling_factor))
        abort();
    if (c->num_experts > 0 &&
        (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts || c->moe_intermediate_size <= 0 ||
         c->n_group < 1 || c->num_experts % c->n_group != 0 || c->topk_group < 1 || c->topk_group > c->n_group ||
         (int)c->scoring < 0 || (int)c->scoring > 1 || (int)c->topk_method < 0 || (int)c->topk_method > 2))
        abort();
}

static void check(const df_config *c) {
    bool mla = c->kv_lora_rank > 0;
    if (mla) check_mla(c);
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_hidden_layers <= 0 ||
        c->num_hidden_layers > DF_MAX_LAYERS || c->num_attention_heads <= 0 ||
        c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads != 0 ||
        c->head_dim <= 0 || (!mla && c->head_dim % 2 != 0) || c->max_position_embeddings <= 0 ||
        !(c->rms_norm_eps > 0) || !(c->rope_theta > 0) || !(c->rope_factor > 0) ||
        c->n_eos_token_ids < 0 || c->n_eos_token_ids > 8 || c->bos_token_id >= c->vocab_size ||
        c->decoder_sparse_step < 1 || memchr(c->model_type, 0, sizeof c->model_type) == NULL ||
        memchr(c->torch_dtype, 0, sizeof c->torch_dtype) == NULL ||
        memchr(c->quant_method, 0, sizeof c->quant_method) == NULL)
        abort();
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] < 0 || c->eos_token_ids[i] >= c->vocab_size) abort();
    bool any_dense = false;
    for (int i = 0; i < DF_MAX_LAYERS; i++) {
        if (c->layer_is_moe[i] && (i >= c->num_hidden_layers || c->num_experts <= 0)) abort();
        if (i < c->num_hidden_layers && !c->layer_is_moe[i]) any_dense = true;
    }
    if (any_dense && c->intermediate_size <= 0) abort();
    if (c->num_experts > 0 && strcmp(c->model_type, "qwen3_moe") == 0 &&
        (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts ||
         c->moe_intermediate_size <= 0))
        abort();
}

/* What a parsed generation_config.json may hold. */
static void check_gen(const df_config *c, const df_generation *g) {
    if (g->n_eos_token_ids < 0 || g->n_eos_token_ids > 8 || g->bos_token_id >= c->vocab_size ||
        (g->temperature < 0 && g->temperature != -1) || (g->top_p != -1 && !(g->top_p > 0 && g->top_p <= 1)) ||
        g->top_k < -1)
        abort();
    for (int i = 0; i < g->n_eos_token_ids; i++)
        if (g->eos_token_ids[i] < 0 || g->eos_token_ids[i] >= c->vocab_size) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data; /* not NUL-terminated: the length rules */
    static char line1[1100], line2[1100];
    df_config c;
    df_error err = {0};
    int rc = df_config_parse(&c, json, size, "config.json", &err);
    if (rc == DF_OK) {
        check(&c);
        df_error e2 = {0};
        df_generation g;
        df_generation_init(&g, &c);
        int rc2 = df_generation_parse(&g, &c, json, size, "generation_config.json", &e2);
        if (rc2 == DF_OK) check_gen(&c, &g);
        int dense = 0;
        for (int i = 0; i < c.num_hidden_layers; i++) dense += !c.layer_is_moe[i];
        snprintf(line1, sizeof line1, "ok arch %.16s%s rope %c dense %c eos %c gen %c quant %.24s", c.model_type,
                 c.tensor_prefix[0] ? " wrapped" : "", 'a' + (int)c.rope_type,
                 dense == 0 ? 'n' : dense == c.num_hidden_layers ? 'a' : 's',
                 'a' + c.n_eos_token_ids, 'a' + rc2, c.quant_method);
    } else {
        if (err.code != rc || strncmp(err.msg, "config.json: ", 13) != 0) abort();
        snprintf(line1, sizeof line1, "%d %s", rc, err.msg);
        flatten(line1);
    }
    df_config b;
    if (df_config_parse(&b, BASE, sizeof BASE - 1, "base", &err) != DF_OK) abort();
    df_generation gb;
    df_generation_init(&gb, &b);
    rc = df_generation_parse(&gb, &b, json, size, "generation_config.json", &err);
    if (rc == DF_OK) {
        check_gen(&b, &gb);
        snprintf(line2, sizeof line2, "gen ok");
    } else {
        if (err.code != rc || strncmp(err.msg, "generation_config.json: ", 24) != 0) abort();
        snprintf(line2, sizeof line2, "%d %s", rc, err.msg);
        flatten(line2);
    }
    snprintf(outcome, sizeof outcome, "%s\n%s", line1, line2);
    return 0;
}
