/*
 * test_config_kimi.c - the Kimi-Linear family's config.json (kimi_linear,
 * and Kimi K3's kimi_k3 wrapper): the real K3 config in tests/data/configs,
 * the layer schedule, the gate forms, SiTU, the latent MoE, attention
 * residuals, and every malformed schedule or field (the error names it).
 */
#include "cfgtest.h"

#include "model/arch.h"

#include <stdio.h>

static const char *KL =
    "{\"model_type\":\"kimi_linear\",\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"kv_lora_rank\":32,\"qk_nope_head_dim\":16,"
    "\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"mla_use_nope\":true,\"num_experts\":8,\"num_experts_per_token\":2,"
    "\"moe_intermediate_size\":32,\"num_shared_experts\":1,\"first_k_dense_replace\":1,"
    "\"linear_attn_config\":{\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"num_heads\":4,\"head_dim\":16}}";

static void test_real_k3(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/configs/Kimi-K3", df_test_root());
    df_config c;
    df_error err = {0};
    int rc = df_config_load_dir(&c, dir, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    assert_string_equal(c.tensor_prefix, "language_model.");
    assert_int_equal(c.num_hidden_layers, 93);
    int mla = 0;
    for (int i = 0; i < 93; i++) mla += !c.layer_is_linear[i];
    assert_int_equal(mla, 24);
    assert_false(c.layer_is_linear[3]);  /* layer 4, 1-based */
    assert_false(c.layer_is_linear[92]); /* and the last */
    assert_false(c.layer_is_linear[91]); /* 92 and 93 are both MLA */
    assert_true(c.layer_is_linear[90]);
    assert_true(c.linear_lower_bound_form);
    assert_true(c.linear_lower_bound == -5.0f);
    assert_true(c.linear_full_rank_gate && c.mla_output_gate && c.mla_nope);
    assert_int_equal(c.act, DF_ACT_SITU);
    assert_true(c.act_beta == 4.0f && c.act_lbeta == 25.0f);
    assert_int_equal(c.moe_latent_size, 3584);
    assert_true(c.moe_latent_norm);
    assert_int_equal(c.attn_res_block, 12);
    assert_int_equal(c.num_experts, 896);
    assert_int_equal(c.num_experts_per_tok, 16);
    assert_int_equal(df_config_moe_layers(&c), 92);
    assert_int_equal(c.eos_token_ids[0], 163586);
}

static void test_defaults(void **state) {
    (void)state;
    df_config c;
    ok(&c, KL);
    assert_false(c.linear_lower_bound_form);
    assert_false(c.linear_full_rank_gate);
    assert_int_equal(c.linear_conv, 4);
    assert_int_equal(c.act, DF_ACT_SILU);
    assert_int_equal(c.attn_res_block, 0);
    assert_int_equal(c.moe_latent_size, 0);
    assert_true(c.norm_topk_prob);
    assert_false(c.layer_is_moe[0]);
    assert_true(c.layer_is_moe[1]);
    assert_int_equal(c.head_dim, 24);
}

#define LAC(x) "{\"num_heads\":4,\"head_dim\":16," x "}"

static void test_schedule(void **state) {
    (void)state;
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[1,2,3],\"full_attn_layers\":[5]"), NULL), DF_ERR_FORMAT,
        "full_attn_layers", "1..4");
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[0,1,2],\"full_attn_layers\":[4]"), NULL), DF_ERR_FORMAT,
        "kda_layers", "1-based");
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[1,2,3],\"full_attn_layers\":[3,4]"), NULL),
        DF_ERR_FORMAT, "full_attn_layers", "layer 3 is listed twice");
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[1,1,2,3],\"full_attn_layers\":[4]"), NULL),
        DF_ERR_FORMAT, "kda_layers", "listed twice");
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[1,2],\"full_attn_layers\":[4]"), NULL), DF_ERR_FORMAT,
        "layer 3", "neither");
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":\"1,2\",\"full_attn_layers\":[4]"), NULL),
        DF_ERR_FORMAT, "kda_layers", "list");
    bad(with(KL, "linear_attn_config", NULL, NULL), DF_ERR_FORMAT, "linear_attn_config", NULL);
    bad(with(KL, "linear_attn_config", "{\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"head_dim\":16}", NULL),
        DF_ERR_FORMAT, "linear_attn_config.num_heads", NULL);
    bad(with(KL, "linear_attn_config", LAC("\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"gate_lower_bound\":5"),
             NULL),
        DF_ERR_FORMAT, "gate_lower_bound", "negative");
    bad(with(KL, "linear_attn_config",
             LAC("\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"short_conv_kernel_size\":0"), NULL),
        DF_ERR_FORMAT, "short_conv_kernel_size", NULL);
}

static void test_fields(void **state) {
    (void)state;
    df_config c;
    char *j = with(KL, "hidden_act", "\"situ\"", "activation_situ_beta", "4.0", "activation_situ_linear_beta", "25",
                   "routed_expert_hidden_size", "48", "latent_moe_use_norm", "true", "attn_res_block_size", "2", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.act, DF_ACT_SITU);
    assert_int_equal(c.moe_latent_size, 48);
    assert_int_equal(c.attn_res_block, 2);
    bad(with(KL, "hidden_act", "\"situ\"", NULL), DF_ERR_FORMAT, "activation_situ_beta", NULL);
    bad(with(KL, "hidden_act", "\"gelu\"", NULL), DF_ERR_UNSUPPORTED, "hidden_act", "'gelu'");
    bad(with(KL, "mla_use_nope", "false", NULL), DF_ERR_UNSUPPORTED, "mla_use_nope", NULL);
    bad(with(KL, "moe_router_activation_func", "\"softmax\"", NULL), DF_ERR_UNSUPPORTED,
        "moe_router_activation_func", NULL);
    bad(with(KL, "use_grouped_topk", "true", "num_expert_group", "3", NULL), DF_ERR_FORMAT, "num_expert_group",
        NULL);
    bad(with(KL, "num_experts_per_token", "9", NULL), DF_ERR_FORMAT, "num_experts_per_token", NULL);
    bad(with(KL, "attn_res_block_size", "0", NULL), DF_ERR_FORMAT, "attn_res_block_size", NULL);
    bad(with(KL, "num_nextn_predict_layers", "1", NULL), DF_ERR_FORMAT, "num_nextn_predict_layers", NULL);
}

/* A kimi_k3 wrapper: the text model is its text_config, tensors under language_model. */
static void test_wrapper(void **state) {
    (void)state;
    char *text = with(KL, "eos_token_id", "7", NULL);
    char *outer = malloc(strlen(text) + 128);
    snprintf(outer, strlen(text) + 128, "{\"model_type\":\"kimi_k3\",\"text_config\":%s,\"vision_config\":{}}", text);
    df_config c;
    ok(&c, outer);
    assert_string_equal(c.tensor_prefix, "language_model.");
    assert_string_equal(c.model_type, "kimi_linear");
    assert_int_equal(c.eos_token_ids[0], 7);
    free(outer);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_k3),  cmocka_unit_test(test_defaults), cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_fields),   cmocka_unit_test(test_wrapper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
