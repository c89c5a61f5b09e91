/*
 * test_config.c - config.json / generation_config.json: the real Qwen3 configs
 * in tests/data/configs, Hugging Face defaults, the derived MoE layer map,
 * rope_scaling variants, and every malformed or unsupported input (each
 * asserting the error code and that the message names the field or file).
 */
#include "cfgtest.h"

#include "model/arch.h"
#include "model/config.h"
#include "model/quant.h"
#include "model/generation.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

static const char *DENSE = "{\"model_type\":\"qwen3\",\"vocab_size\":1000,\"hidden_size\":64,"
                           "\"intermediate_size\":128,\"num_hidden_layers\":4,"
                           "\"num_attention_heads\":4,\"head_dim\":16}";
static const char *MOE = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":1000,\"hidden_size\":64,"
                         "\"intermediate_size\":128,\"num_hidden_layers\":6,"
                         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
                         "\"num_experts\":8,\"num_experts_per_tok\":2,"
                         "\"moe_intermediate_size\":32}";

static void bad_gen(const df_config *cfg, const df_generation *base, const char *json, int code,
                    const char *n1, const char *n2) {
    df_generation g = *base;
    df_error err = {0};
    int rc = df_generation_parse(&g, cfg, json, strlen(json), "generation_config.json", &err);
    check_fail(rc, &err, code, n1, n2);
    assert_non_null(strstr(err.msg, "generation_config.json"));
    assert_memory_equal(&g, base, sizeof g);
}

/* ---- real configs -------------------------------------------------------- */

/* config.json into *c and, with generation_config.json applied, *g */
static void load_real(df_config *c, df_generation *g, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/configs/%s", df_test_root(), name);
    df_error err = {0};
    int rc = df_config_load_dir(c, dir, &err);
    if (!rc) rc = df_generation_load_dir(g, c, dir, &err);
    if (rc) print_error("%s: %s\n", name, err.msg);
    assert_int_equal(rc, DF_OK);
}

static void check_qwen3_generation(const df_generation *g) {
    assert_int_equal(g->bos_token_id, 151643);
    assert_int_equal(g->n_eos_token_ids, 2);
    assert_int_equal(g->eos_token_ids[0], 151645);
    assert_int_equal(g->eos_token_ids[1], 151643);
    assert_true(fabs(g->temperature - 0.6) < 1e-12);
    assert_true(fabs(g->top_p - 0.95) < 1e-12);
    assert_int_equal(g->top_k, 20);
}

static void test_real_qwen3_0_6b(void **state) {
    (void)state;
    df_config c;
    df_generation g;
    load_real(&c, &g, "Qwen3-0.6B");
    assert_ptr_equal(c.arch, df_arch_find("qwen3"));
    assert_string_equal(c.model_type, "qwen3");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 1024);
    assert_int_equal(c.intermediate_size, 3072);
    assert_int_equal(c.num_hidden_layers, 28);
    assert_int_equal(c.num_attention_heads, 16);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 128); /* stated; not hidden/heads (64) */
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 1000000.0);
    assert_true(c.tie_word_embeddings);
    assert_false(c.attention_bias);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(c.rope_type, DF_ROPE_DEFAULT);
    assert_int_equal(c.num_experts, 0);
    for (int i = 0; i < c.num_hidden_layers; i++) assert_false(c.layer_is_moe[i]);
    check_qwen3_generation(&g);
}

static void test_real_qwen3_moe(void **state) {
    (void)state;
    struct {
        const char *name;
        int hidden, inter, moe_inter, layers, heads;
    } m[] = {{"Qwen3-30B-A3B", 2048, 6144, 768, 48, 32},
             {"Qwen3-235B-A22B", 4096, 12288, 1536, 94, 64}};
    for (int k = 0; k < 2; k++) {
        df_config c;
        df_generation g;
        load_real(&c, &g, m[k].name);
        assert_ptr_equal(c.arch, df_arch_find("qwen3_moe"));
        assert_string_equal(c.model_type, "qwen3_moe");
        assert_int_equal(c.hidden_size, m[k].hidden);
        assert_int_equal(c.intermediate_size, m[k].inter);
        assert_int_equal(c.moe_intermediate_size, m[k].moe_inter);
        assert_int_equal(c.num_hidden_layers, m[k].layers);
        assert_int_equal(c.num_attention_heads, m[k].heads);
        assert_int_equal(c.num_key_value_heads, 4);
        assert_int_equal(c.head_dim, 128);
        assert_int_equal(c.num_experts, 128);
        assert_int_equal(c.num_experts_per_tok, 8);
        assert_int_equal(c.decoder_sparse_step, 1);
        assert_true(c.norm_topk_prob);
        assert_false(c.tie_word_embeddings);
        for (int i = 0; i < c.num_hidden_layers; i++) assert_true(c.layer_is_moe[i]);
        assert_false(c.layer_is_moe[c.num_hidden_layers]);
        check_qwen3_generation(&g);
    }
}

/* ---- defaults and derived values ---------------------------------------- */

static void test_defaults_dense(void **state) {
    (void)state;
    df_config c;
    ok(&c, DENSE);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_position_embeddings, 32768);
    {   /* absent: transformers' Qwen3Config default is 128, not hidden/heads */
        df_config d;
        char *j = with(DENSE, "head_dim", NULL, NULL);
        ok(&d, j);
        free(j);
        assert_int_equal(d.head_dim, 128);
    }
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 10000.0);
    assert_false(c.tie_word_embeddings);
    assert_false(c.attention_bias);
    assert_int_equal(c.rope_type, DF_ROPE_DEFAULT);
    assert_true(c.rope_factor == 1.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 32768);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos_token_ids, 0);
    df_generation g;
    df_generation_init(&g, &c);
    assert_true(g.temperature < 0);
    assert_true(g.top_p < 0);
    assert_true(g.top_k < 0);
    assert_int_equal(c.num_experts, 0);
    assert_string_equal(c.torch_dtype, "");
    /* MoE fields are ignored (not even type-checked) for a dense model */
    char *j = with(DENSE, "num_experts", "\"many\"", "mlp_only_layers", "[99]", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.num_experts, 0);
    for (int i = 0; i < 4; i++) assert_false(c.layer_is_moe[i]);
    /* integral reals are integers; nulls are absent */
    j = with(DENSE, "hidden_size", "64.0", "head_dim", "null", "rope_scaling", "null",
             "sliding_window", "null", "dtype", "\"float32\"", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.head_dim, 128);
    assert_string_equal(c.torch_dtype, "float32");
}

static void test_defaults_moe(void **state) {
    (void)state;
    df_config c;
    ok(&c, MOE);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_false(c.norm_topk_prob);
    for (int i = 0; i < 6; i++) assert_true(c.layer_is_moe[i]);

    /* HF rule: moe iff not mlp-only and (i+1) % step == 0 */
    char *j = with(MOE, "decoder_sparse_step", "2", "mlp_only_layers", "[3, 0]", NULL);
    ok(&c, j);
    free(j);
    bool want[6] = {false, true, false, false, false, true};
    for (int i = 0; i < 6; i++) assert_int_equal(c.layer_is_moe[i], want[i]);

    /* no experts: every layer dense */
    j = with(MOE, "num_experts", "0", "num_experts_per_tok", NULL, "moe_intermediate_size", NULL,
             NULL);
    ok(&c, j);
    free(j);
    for (int i = 0; i < 6; i++) assert_false(c.layer_is_moe[i]);

    /* all layers sparse: the dense size may be omitted */
    j = with(MOE, "intermediate_size", NULL, NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.intermediate_size, 0);
    /* ...but not if some layer is dense */
    bad(with(MOE, "intermediate_size", NULL, "mlp_only_layers", "[1]", NULL), DF_ERR_FORMAT,
        "'intermediate_size'", "missing");
}

/* ---- rope_scaling -------------------------------------------------------- */

static void test_rope(void **state) {
    (void)state;
    df_config c;
    char *j = with(DENSE, "max_position_embeddings", "40960", "rope_scaling",
                   "{\"rope_type\":\"yarn\",\"factor\":4.0,"
                   "\"original_max_position_embeddings\":32768}",
                   NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.rope_type, DF_ROPE_YARN);
    assert_true(c.rope_factor == 4.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 32768);
    assert_true(c.yarn_beta_fast == 32.0);
    assert_true(c.yarn_beta_slow == 1.0);
    assert_true(c.yarn_attention_factor <= 0);
    assert_true(c.yarn_mscale == 0 && c.yarn_mscale_all_dim == 0);
    assert_true(c.yarn_truncate);

    j = with(DENSE, "rope_scaling",
             "{\"type\":\"yarn\",\"factor\":2,\"beta_fast\":16,\"beta_slow\":2,"
             "\"attention_factor\":1.5,\"mscale\":1,\"mscale_all_dim\":0.5,\"truncate\":false}",
             NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.rope_type, DF_ROPE_YARN);
    assert_true(c.rope_factor == 2.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 32768); /* defaulted */
    assert_true(c.yarn_beta_fast == 16 && c.yarn_beta_slow == 2);
    assert_true(c.yarn_attention_factor == 1.5);
    assert_true(c.yarn_mscale == 1 && c.yarn_mscale_all_dim == 0.5);
    assert_false(c.yarn_truncate);

    j = with(DENSE, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":8}", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.rope_type, DF_ROPE_LINEAR);
    assert_true(c.rope_factor == 8.0);

    j = with(DENSE, "rope_scaling", "{\"type\":\"dynamic\",\"factor\":2.5}", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.rope_type, DF_ROPE_DYNAMIC);
    assert_true(c.rope_factor == 2.5);

    j = with(DENSE, "rope_scaling", "{\"rope_type\":\"default\"}", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.rope_type, DF_ROPE_DEFAULT);

    /* transformers v5 spelling */
    j = with(DENSE, "rope_theta", NULL, "rope_parameters",
             "{\"rope_type\":\"default\",\"rope_theta\":1000000}", NULL);
    ok(&c, j);
    free(j);
    assert_true(c.rope_theta == 1000000.0);

    bad(with(DENSE, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8}", NULL),
        DF_ERR_UNSUPPORTED, "'llama3'", "rope_scaling");
    bad(with(DENSE, "rope_scaling", "{\"type\":\"longrope\"}", NULL), DF_ERR_UNSUPPORTED,
        "'longrope'", NULL);
    bad(with(DENSE, "rope_scaling", "{\"rope_type\":\"yarn\"}", NULL), DF_ERR_FORMAT,
        "'rope_scaling.factor'", "missing");
    bad(with(DENSE, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":\"2\"}", NULL),
        DF_ERR_FORMAT, "'rope_scaling.factor'", "number");
    bad(with(DENSE, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":-2}", NULL),
        DF_ERR_FORMAT, "'rope_scaling.factor'", "positive");
    bad(with(DENSE, "rope_scaling", "{\"factor\":2}", NULL), DF_ERR_FORMAT,
        "'rope_scaling.rope_type'", "missing");
    bad(with(DENSE, "rope_scaling", "{\"rope_type\":3}", NULL), DF_ERR_FORMAT,
        "'rope_scaling.rope_type'", "string");
    bad(with(DENSE, "rope_scaling", "\"yarn\"", NULL), DF_ERR_FORMAT, "'rope_scaling'", NULL);
    bad(with(DENSE, "rope_scaling",
             "{\"rope_type\":\"yarn\",\"factor\":2,\"original_max_position_embeddings\":1.5}",
             NULL),
        DF_ERR_FORMAT, "'rope_scaling.original_max_position_embeddings'", "integer");
    bad(with(DENSE, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":2,\"truncate\":1}", NULL),
        DF_ERR_FORMAT, "'rope_scaling.truncate'", "boolean");
    bad(with(DENSE, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":\"x\"}", NULL),
        DF_ERR_FORMAT, "'rope_parameters.rope_theta'", NULL);
}

/* ---- malformed and unsupported ------------------------------------------ */

static void test_bad_json(void **state) {
    (void)state;
    bad(strdup("{\"model_type\": \"qwen3\""), DF_ERR_FORMAT, "not valid JSON", NULL);
    bad(strdup(""), DF_ERR_FORMAT, "not valid JSON", NULL);
    bad(strdup("[1,2]"), DF_ERR_FORMAT, "not a JSON object", NULL);
    bad(strdup("null"), DF_ERR_FORMAT, "not a JSON object", NULL);
    bad(strdup("{\"model_type\":\"qwen3\",\"model_type\":\"qwen3\"}"), DF_ERR_FORMAT,
        "duplicate", "model_type");
    /* length is honoured: the text is not NUL-terminated there */
    df_config c;
    df_error err = {0};
    check_fail(df_config_parse(&c, DENSE, strlen(DENSE) - 1, "config.json", &err), &err,
               DF_ERR_FORMAT, "config.json", "not valid JSON");
}

static void test_model_type(void **state) {
    (void)state;
    df_config c;
    df_error err = {0};
    char *j = with(DENSE, "model_type", "\"llama\"", NULL);
    check_fail(parse(&c, j, &err), &err, DF_ERR_UNSUPPORTED, NULL, NULL);
    assert_string_equal(err.msg,
                        "config.json: model_type 'llama' is not supported (supported: qwen3, "
                        "qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, kimi_linear, kimi_k3)");
    free(j);
    bad(with(DENSE, "model_type", "\"qwen2\"", NULL), DF_ERR_UNSUPPORTED, "'qwen2'", NULL);
    bad(with(DENSE, "model_type", NULL, NULL), DF_ERR_FORMAT, "'model_type'", "missing");
    bad(with(DENSE, "model_type", "3", NULL), DF_ERR_FORMAT, "'model_type'", "string");
}

static void test_wrong_types(void **state) {
    (void)state;
    df_config c;
    df_error err = {0};
    char *j = with(DENSE, "hidden_size", "\"1024\"", NULL);
    check_fail(parse(&c, j, &err), &err, DF_ERR_FORMAT, NULL, NULL);
    assert_string_equal(err.msg, "config.json: field 'hidden_size' must be an integer");
    free(j);
    bad(with(DENSE, "hidden_size", "64.5", NULL), DF_ERR_FORMAT, "'hidden_size'", "integer");
    bad(with(DENSE, "vocab_size", "true", NULL), DF_ERR_FORMAT, "'vocab_size'", "integer");
    bad(with(DENSE, "num_hidden_layers", "[4]", NULL), DF_ERR_FORMAT, "'num_hidden_layers'",
        "integer");
    bad(with(DENSE, "intermediate_size", "{}", NULL), DF_ERR_FORMAT, "'intermediate_size'",
        "integer");
    bad(with(DENSE, "num_key_value_heads", "\"2\"", NULL), DF_ERR_FORMAT, "'num_key_value_heads'",
        "integer");
    bad(strdup("{\"model_type\":\"qwen3\",\"head_dim\":1e400}"), DF_ERR_FORMAT, "not valid JSON",
        NULL);
    bad(with(DENSE, "rms_norm_eps", "\"1e-6\"", NULL), DF_ERR_FORMAT, "'rms_norm_eps'", "number");
    bad(with(DENSE, "rope_theta", "false", NULL), DF_ERR_FORMAT, "'rope_theta'", "number");
    bad(with(DENSE, "tie_word_embeddings", "\"true\"", NULL), DF_ERR_FORMAT,
        "'tie_word_embeddings'", "boolean");
    bad(with(DENSE, "attention_bias", "0", NULL), DF_ERR_FORMAT, "'attention_bias'", "boolean");
    bad(with(DENSE, "use_sliding_window", "\"no\"", NULL), DF_ERR_FORMAT, "'use_sliding_window'",
        "boolean");
    bad(with(DENSE, "torch_dtype", "16", NULL), DF_ERR_FORMAT, "'torch_dtype'", "string");
    bad(with(DENSE, "hidden_act", "1", NULL), DF_ERR_FORMAT, "'hidden_act'", "string");
    bad(with(DENSE, "max_position_embeddings", "\"4k\"", NULL), DF_ERR_FORMAT,
        "'max_position_embeddings'", "integer");
    bad(with(MOE, "num_experts", "\"8\"", NULL), DF_ERR_FORMAT, "'num_experts'", "integer");
    bad(with(MOE, "num_experts_per_tok", "2.5", NULL), DF_ERR_FORMAT, "'num_experts_per_tok'",
        "integer");
    bad(with(MOE, "norm_topk_prob", "1", NULL), DF_ERR_FORMAT, "'norm_topk_prob'", "boolean");
    bad(with(MOE, "mlp_only_layers", "3", NULL), DF_ERR_FORMAT, "'mlp_only_layers'", NULL);
    bad(with(MOE, "mlp_only_layers", "[\"3\"]", NULL), DF_ERR_FORMAT, "'mlp_only_layers'", NULL);
    bad(with(MOE, "decoder_sparse_step", "\"1\"", NULL), DF_ERR_FORMAT, "'decoder_sparse_step'",
        "integer");
    bad(with(DENSE, "eos_token_id", "\"2\"", NULL), DF_ERR_FORMAT, "'eos_token_id'", NULL);
    bad(with(DENSE, "eos_token_id", "[1, \"2\"]", NULL), DF_ERR_FORMAT, "'eos_token_id'", NULL);
    bad(with(DENSE, "bos_token_id", "[1]", NULL), DF_ERR_FORMAT, "'bos_token_id'", "integer");
}

static void test_missing_required(void **state) {
    (void)state;
    const char *req[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads"};
    for (size_t i = 0; i < sizeof req / sizeof *req; i++) {
        char want[64];
        snprintf(want, sizeof want, "'%s'", req[i]);
        bad(with(DENSE, req[i], NULL, NULL), DF_ERR_FORMAT, want, "missing");
        bad(with(DENSE, req[i], "null", NULL), DF_ERR_FORMAT, want, "missing");
    }
    const char *req_moe[] = {"num_experts", "num_experts_per_tok", "moe_intermediate_size"};
    for (size_t i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "'%s'", req_moe[i]);
        bad(with(MOE, req_moe[i], NULL, NULL), DF_ERR_FORMAT, want, "missing");
    }
}

static void test_ranges(void **state) {
    (void)state;
    bad(with(DENSE, "hidden_size", "0", NULL), DF_ERR_FORMAT, "'hidden_size'", "between");
    bad(with(DENSE, "vocab_size", "-5", NULL), DF_ERR_FORMAT, "'vocab_size'", "between");
    bad(with(DENSE, "vocab_size", "9223372036854775807", NULL), DF_ERR_FORMAT, "'vocab_size'",
        "between");
    bad(with(DENSE, "hidden_size", "1e300", NULL), DF_ERR_FORMAT, "'hidden_size'", NULL);
    bad(with(DENSE, "num_hidden_layers", "513", NULL), DF_ERR_FORMAT, "'num_hidden_layers'",
        "512");
    bad(with(DENSE, "num_key_value_heads", "3", NULL), DF_ERR_FORMAT, "'num_attention_heads'",
        "num_key_value_heads");
    bad(with(DENSE, "num_key_value_heads", "8", NULL), DF_ERR_FORMAT, "'num_key_value_heads'",
        "between");
    bad(with(DENSE, "num_key_value_heads", "0", NULL), DF_ERR_FORMAT, "'num_key_value_heads'",
        NULL);
    bad(with(DENSE, "head_dim", "31", NULL), DF_ERR_FORMAT, "'head_dim'", "even");
    bad(with(MOE, "num_attention_heads", "3", "num_key_value_heads", "3", "head_dim", NULL, NULL),
        DF_ERR_FORMAT, "'head_dim'",
        "num_attention_heads");
}

static void test_ranges2(void **state) {
    (void)state;
    df_config c;
    char *j = with(MOE, "hidden_size", "24", "head_dim", NULL, NULL);
    ok(&c, j); /* head_dim 6 = hidden/heads for qwen3_moe */
    free(j);
    assert_int_equal(c.head_dim, 6);
    bad(with(MOE, "hidden_size", "20", "head_dim", NULL, NULL), DF_ERR_FORMAT, "'head_dim'", "even"); /* 5 */
    bad(with(DENSE, "rms_norm_eps", "0", NULL), DF_ERR_FORMAT, "'rms_norm_eps'", "positive");
    bad(with(DENSE, "rms_norm_eps", "2", NULL), DF_ERR_FORMAT, "'rms_norm_eps'", NULL);
    bad(with(DENSE, "rope_theta", "-1", NULL), DF_ERR_FORMAT, "'rope_theta'", "positive");
    bad(with(MOE, "num_experts_per_tok", "9", NULL), DF_ERR_FORMAT, "'num_experts_per_tok'",
        "between 1 and 8");
    bad(with(MOE, "num_experts_per_tok", "0", NULL), DF_ERR_FORMAT, "'num_experts_per_tok'",
        NULL);
    bad(with(MOE, "num_experts", "-1", NULL), DF_ERR_FORMAT, "'num_experts'", NULL);
    bad(with(MOE, "mlp_only_layers", "[6]", NULL), DF_ERR_FORMAT, "'mlp_only_layers'",
        "out of range");
    bad(with(MOE, "mlp_only_layers", "[-1]", NULL), DF_ERR_FORMAT, "'mlp_only_layers'",
        "out of range");
    bad(with(MOE, "decoder_sparse_step", "0", NULL), DF_ERR_FORMAT, "'decoder_sparse_step'",
        NULL);
    bad(with(DENSE, "eos_token_id", "1000", NULL), DF_ERR_FORMAT, "'eos_token_id'", NULL);
    bad(with(DENSE, "eos_token_id", "[1,2,3,4,5,6,7,8,9]", NULL), DF_ERR_FORMAT,
        "'eos_token_id'", "max 8");
    bad(with(DENSE, "bos_token_id", "-1", NULL), DF_ERR_FORMAT, "'bos_token_id'", NULL);
}

static void test_unsupported(void **state) {
    (void)state;
    df_config c;
    char *j = with(DENSE, "use_sliding_window", "false", "sliding_window", "4096",
                   "hidden_act", "\"silu\"", "layer_types",
                   "[\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\"]",
                   NULL);
    ok(&c, j);
    free(j);
    bad(with(DENSE, "use_sliding_window", "true", NULL), DF_ERR_UNSUPPORTED, "use_sliding_window",
        NULL);
    bad(with(DENSE, "hidden_act", "\"gelu\"", NULL), DF_ERR_UNSUPPORTED, "'gelu'", "hidden_act");
    bad(with(DENSE, "layer_types", "[\"full_attention\",\"sliding_attention\"]", NULL),
        DF_ERR_UNSUPPORTED, "'sliding_attention'", "layer_types");
    bad(with(DENSE, "layer_types", "\"full_attention\"", NULL), DF_ERR_FORMAT, "'layer_types'",
        NULL);
    bad(with(DENSE, "quantization_config", "7", NULL), DF_ERR_UNSUPPORTED, "quantization_config",
        NULL);
}

/* ---- quantization_config (model/quant.h) ---------------------------------------- */

#define FP8 "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128]}"
#define W4(type) "{\"num_bits\":4,\"type\":\"" type "\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":32,\"dynamic\":false,\"actorder\":null}"
#define CT(fmt, targets, w, extra) "{\"quant_method\":\"compressed-tensors\",\"format\":\"" fmt "\",\"quantization_status\":\"compressed\",\"ignore\":[\"lm_head\",\"re:.*self_attn.*\"],\"config_groups\":{\"group_0\":{\"targets\":" targets ",\"weights\":" w ",\"input_activations\":null" extra "}}}"
#define INT4 CT("pack-quantized", "[\"Linear\"]", W4("int"), "")

static df_quant *quant_of(const char *qc) {
    json_t *j = json_loads(qc, 0, NULL);
    assert_non_null(j);
    df_quant *q = NULL;
    df_error err = {0};
    int rc = df_quant_parse(&q, j, "config.json", "quantization_config", &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    json_decref(j);
    return q;
}

static df_qkind kind_of(const df_quant *q, const char *mod, bool linear) {
    df_qkind k;
    df_error err = {0};
    assert_int_equal(df_quant_kind(q, mod, linear, &k, &err), DF_OK);
    return k;
}

static void test_quant_config(void **state) {
    (void)state;
    df_config c;
    char *j = with(DENSE, "quantization_config", FP8, NULL);
    ok(&c, j);
    free(j);
    assert_non_null(strstr(c.quant_method, "fp8"));
    j = with(DENSE, "quantization_config", INT4, NULL);
    ok(&c, j);
    free(j);
    assert_non_null(strstr(c.quant_method, "int4"));
    /* refused, naming the field */
    bad(with(DENSE, "quantization_config", "{\"quant_method\":\"gptq\"}", NULL), DF_ERR_UNSUPPORTED,
        "quantization_config.quant_method", "'gptq'");
    bad(with(DENSE, "quantization_config", "{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\",\"weight_block_size\":[128,128]}", NULL),
        DF_ERR_UNSUPPORTED, "activation_scheme", "static");
    bad(with(DENSE, "quantization_config", "{\"quant_method\":\"fp8\",\"weight_block_size\":[1,128]}", NULL),
        DF_ERR_UNSUPPORTED, "weight_block_size", NULL);
    bad(with(DENSE, "quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}", NULL),
        DF_ERR_UNSUPPORTED, "quantization_config.fmt", NULL);
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"Linear\"]", "{\"num_bits\":8,\"type\":\"int\"}", ""), NULL),
        DF_ERR_UNSUPPORTED, "config_groups.group_0.weights.num_bits", NULL);
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"Linear\"]", "{\"num_bits\":4,\"type\":\"int\",\"symmetric\":false,\"strategy\":\"group\",\"group_size\":32}", ""), NULL),
        DF_ERR_UNSUPPORTED, "weights.symmetric", "zero points");
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"Linear\"]", "{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":128}", ""), NULL),
        DF_ERR_UNSUPPORTED, "weights.group_size", NULL);
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"Linear\"]", "{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"channel\",\"group_size\":32}", ""), NULL),
        DF_ERR_UNSUPPORTED, "weights.strategy", NULL);
    bad(with(DENSE, "quantization_config", CT("mxfp4-pack-quantized", "[\"Linear\"]", W4("int"), ""), NULL),
        DF_ERR_UNSUPPORTED, "group_0.format", NULL);
    bad(with(DENSE, "quantization_config", CT("float-quantized", "[\"Linear\"]", W4("float"), ""), NULL),
        DF_ERR_UNSUPPORTED, "quantization_config.format", "float-quantized");
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"Linear\"]", W4("int"), ",\"output_activations\":{\"num_bits\":8}"), NULL),
        DF_ERR_UNSUPPORTED, "group_0.output_activations", NULL);
    bad(with(DENSE, "quantization_config", CT("mixed-precision", "[\"Linear\"]", W4("int"), ""), NULL),
        DF_ERR_UNSUPPORTED, "group_0.format", "mixed-precision");
    bad(with(DENSE, "quantization_config", CT("pack-quantized", "[\"re:(unclosed\"]", W4("int"), ""), NULL),
        DF_ERR_FORMAT, "group_0.targets[0]", "regular expression");
    /* a wrapper: its text_config's */
    j = with(DENSE, "quantization_config", "{\"quant_method\":\"awq\"}", NULL);
    char *w = with("{\"model_type\":\"kimi_k25\"}", "text_config", j, NULL);
    free(j);
    bad(w, DF_ERR_UNSUPPORTED, "text_config.quantization_config.quant_method", "'awq'");
}

static void test_quant_match(void **state) {
    (void)state;
    df_quant *q = quant_of(FP8);
    assert_int_equal(kind_of(q, "model.layers.0.self_attn.q_a_proj", true), DF_Q_FP8);
    assert_int_equal(kind_of(q, "lm_head", true), DF_Q_NONE);
    assert_int_equal(kind_of(q, "model.layers.3.mlp.gate", false), DF_Q_NONE); /* a parameter */
    df_quant_free(q);
    q = quant_of("{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"modules_to_not_convert\":"
                 "[\"lm_head\",\"model.layers.1.mlp\"]}");
    assert_int_equal(kind_of(q, "model.layers.1.mlp.experts.3.up_proj", true), DF_Q_NONE);
    assert_int_equal(kind_of(q, "model.layers.11.mlp.experts.3.up_proj", true), DF_Q_FP8); /* parts, not text */
    df_quant_free(q);
    q = quant_of(INT4);
    assert_int_equal(kind_of(q, "model.layers.2.mlp.experts.7.down_proj", true), DF_Q_INT4);
    assert_int_equal(kind_of(q, "model.layers.2.self_attn.o_proj", true), DF_Q_NONE); /* ignored by re: */
    assert_int_equal(kind_of(q, "lm_head", true), DF_Q_NONE);
    assert_int_equal(kind_of(q, "model.embed_tokens", false), DF_Q_NONE);
    df_quant_free(q);
    /* re: matches from the start of the name, like Python's re.match */
    q = quant_of(CT("mxfp4-pack-quantized", "[\"re:mlp\\\\.experts.*\"]", W4("float"), ""));
    assert_int_equal(kind_of(q, "mlp.experts.0.up_proj", true), DF_Q_MXFP4);
    assert_int_equal(kind_of(q, "model.mlp.experts.0.up_proj", true), DF_Q_NONE);
    df_quant_free(q);
    /* two groups targeting one module: an error naming both */
    q = quant_of("{\"quant_method\":\"compressed-tensors\",\"format\":\"mixed-precision\",\"config_groups\":{"
                 "\"a\":{\"format\":\"pack-quantized\",\"targets\":[\"Linear\"],\"weights\":" W4("int") "},"
                 "\"b\":{\"format\":\"mxfp4-pack-quantized\",\"targets\":[\"re:.*experts.*\"],\"weights\":" W4("float") "}}}");
    df_qkind k;
    df_error err = {0};
    assert_int_equal(df_quant_kind(q, "model.layers.1.self_attn.o_proj", true, &k, &err), DF_OK);
    assert_int_equal(k, DF_Q_INT4);
    assert_int_not_equal(df_quant_kind(q, "model.layers.1.mlp.experts.0.up_proj", true, &k, &err), DF_OK);
    assert_non_null(strstr(err.msg, "'a'"));
    assert_non_null(strstr(err.msg, "'b'"));
    df_quant_free(q);
}

static void test_token_ids(void **state) {
    (void)state;
    df_config c;
    char *j = with(DENSE, "bos_token_id", "7", "eos_token_id", "[3, 4]", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.bos_token_id, 7);
    assert_int_equal(c.n_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[0], 3);
    assert_int_equal(c.eos_token_ids[1], 4);
    j = with(DENSE, "eos_token_id", "999", "bos_token_id", "null", NULL);
    ok(&c, j);
    free(j);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 999);
}

/* ---- generation_config.json --------------------------------------------- */

static void test_generation(void **state) {
    (void)state;
    df_config cfg;
    df_generation g, base;
    char *j = with(DENSE, "bos_token_id", "1", "eos_token_id", "2", NULL);
    ok(&cfg, j);
    free(j);
    df_generation_init(&base, &cfg);
    df_error err = {0};

    /* absent file: nothing changes */
    g = base;
    assert_int_equal(df_generation_parse(&g, &cfg, NULL, 0, "g", &err), DF_OK);
    assert_memory_equal(&g, &base, sizeof g);

    /* ids replace config.json's; sampling fields are read */
    const char *t = "{\"eos_token_id\":[5,6,7],\"temperature\":0.7,\"top_p\":0.8,\"top_k\":40,"
                    "\"do_sample\":true,\"pad_token_id\":3}";
    assert_int_equal(df_generation_parse(&g, &cfg, t, strlen(t), "g", &err), DF_OK);
    assert_int_equal(g.n_eos_token_ids, 3);
    assert_int_equal(g.eos_token_ids[2], 7);
    assert_int_equal(g.bos_token_id, 1);
    assert_true(fabs(g.temperature - 0.7) < 1e-12);
    assert_true(fabs(g.top_p - 0.8) < 1e-12);
    assert_int_equal(g.top_k, 40);

    /* a file with none of them changes nothing */
    g = base;
    t = "{\"transformers_version\":\"4.51.0\",\"temperature\":null}";
    assert_int_equal(df_generation_parse(&g, &cfg, t, strlen(t), "g", &err), DF_OK);
    assert_memory_equal(&g, &base, sizeof g);

    bad_gen(&cfg, &base, "{\"eos_token_id\":\"x\"}", DF_ERR_FORMAT, "'eos_token_id'", NULL);
    bad_gen(&cfg, &base, "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", DF_ERR_FORMAT, "'eos_token_id'",
            "max 8");
    bad_gen(&cfg, &base, "{\"eos_token_id\":[1000]}", DF_ERR_FORMAT, "'eos_token_id'", "vocabulary");
    bad_gen(&cfg, &base, "{\"bos_token_id\":1.5}", DF_ERR_FORMAT, "'bos_token_id'", "integer");
    bad_gen(&cfg, &base, "{\"temperature\":\"hot\"}", DF_ERR_FORMAT, "'temperature'", "number");
    bad_gen(&cfg, &base, "{\"temperature\":-1}", DF_ERR_FORMAT, "'temperature'", "negative");
    bad_gen(&cfg, &base, "{\"top_p\":1.5}", DF_ERR_FORMAT, "'top_p'", NULL);
    bad_gen(&cfg, &base, "{\"top_p\":0}", DF_ERR_FORMAT, "'top_p'", NULL);
    bad_gen(&cfg, &base, "{\"top_k\":-3}", DF_ERR_FORMAT, "'top_k'", NULL);
    bad_gen(&cfg, &base, "{\"top_k\":\"20\"}", DF_ERR_FORMAT, "'top_k'", "integer");
    bad_gen(&cfg, &base, "{\"top_k\":1,", DF_ERR_FORMAT, "not valid JSON", NULL);
    bad_gen(&cfg, &base, "[]", DF_ERR_FORMAT, "not a JSON object", NULL);
}

/* ---- directories --------------------------------------------------------- */

static void test_load_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/df-test-cfg-XXXXXX";
    assert_non_null(mkdtemp(dir));
    df_config c;
    df_error err = {0};

    check_fail(df_config_load_dir(&c, dir, &err), &err, DF_ERR_IO, "config.json", dir);

    char *j = with(DENSE, "eos_token_id", "9", NULL);
    df_test_write_text(dir, "config.json", j);
    free(j);
    df_generation g;
    assert_int_equal(df_config_load_dir(&c, dir, &err), DF_OK);
    assert_int_equal(df_generation_load_dir(&g, &c, dir, &err), DF_OK); /* no generation config */
    assert_int_equal(g.n_eos_token_ids, 1);
    assert_int_equal(g.eos_token_ids[0], 9);

    df_test_write_text(dir, "generation_config.json", "{\"eos_token_id\": [10, 11]}");
    assert_int_equal(df_config_load_dir(&c, dir, &err), DF_OK);
    assert_int_equal(df_generation_load_dir(&g, &c, dir, &err), DF_OK);
    assert_int_equal(g.n_eos_token_ids, 2);
    assert_int_equal(g.eos_token_ids[1], 11);
    assert_int_equal(c.n_eos_token_ids, 1); /* config.json's own ids stay */

    df_generation before = g;
    df_test_write_text(dir, "generation_config.json", "{\"eos_token_id\": oops}");
    check_fail(df_generation_load_dir(&g, &c, dir, &err), &err, DF_ERR_FORMAT, "generation_config.json",
               dir);
    assert_memory_equal(&g, &before, sizeof g);

    df_test_write_text(dir, "config.json", "{\"model_type\":\"mistral\"}");
    check_fail(df_config_load_dir(&c, dir, &err), &err, DF_ERR_UNSUPPORTED, "config.json",
               "'mistral'");
    df_test_rm_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_qwen3_0_6b),
        cmocka_unit_test(test_real_qwen3_moe),
        cmocka_unit_test(test_defaults_dense),
        cmocka_unit_test(test_defaults_moe),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_model_type),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_ranges2),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_quant_config),
        cmocka_unit_test(test_quant_match),
        cmocka_unit_test(test_token_ids),
        cmocka_unit_test(test_generation),
        cmocka_unit_test(test_load_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
