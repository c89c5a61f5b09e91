/*
 * test_chat.c - the Qwen3 chat template. The expected strings were derived by hand
 * from the Jinja "chat_template" in Qwen3's tokenizer_config.json: system/user/
 * assistant/tool turns, <think> stripping in history, reasoning kept after the last
 * user query, the generation prompt with enable_thinking on and off, and errors.
 */
#include "testutil.h"

#include "tokenizer/chat.h"
#include "util/util.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void expect_render(const df_chat_msg *m, int n, int gen, int think, const char *want) {
    char *out = NULL;
    df_error err = {0};
    int rc = df_chat_render_qwen3(m, n, gen, think, &out, &err);
    if (rc) fprintf(stderr, "render failed: %s\n", err.msg);
    assert_int_equal(rc, DF_OK);
    assert_non_null(out);
    if (strcmp(out, want) != 0) {
        fprintf(stderr, "got:\n---\n%s\n---\nwant:\n---\n%s\n---\n", out, want);
        free(out);
        fail();
    }
    free(out);
}

static void test_system_user_generation_prompt(void **state) {
    (void)state;
    const df_chat_msg m[] = {{"system", "You are helpful."}, {"user", "Hi"}};
    const char *base = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
                       "<|im_start|>user\nHi<|im_end|>\n";
    char want[512];
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n", base);
    expect_render(m, N(m), 1, 1, want);
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n<think>\n\n</think>\n\n", base);
    expect_render(m, N(m), 1, 0, want);
    /* no generation prompt: enable_thinking has no effect */
    expect_render(m, N(m), 0, 0, base);
    expect_render(m, N(m), 0, 1, base);
}

static void test_user_only(void **state) {
    (void)state;
    const df_chat_msg m[] = {{"user", "Give me a short introduction to large language models."}};
    expect_render(m, N(m), 1, 1,
                  "<|im_start|>user\nGive me a short introduction to large language "
                  "models.<|im_end|>\n<|im_start|>assistant\n");
}

/* History assistant turns (before the last user query) lose their reasoning. */
static void test_history_think_stripped(void **state) {
    (void)state;
    const df_chat_msg m[] = {
        {"user", "What is 2+2?"},
        {"assistant", "<think>\nLet me add.\n</think>\n\n4"},
        {"user", "And 3+3?"},
    };
    const char *hist = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n4<|im_end|>\n"
                       "<|im_start|>user\nAnd 3+3?<|im_end|>\n";
    char want[512];
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n", hist);
    expect_render(m, N(m), 1, 1, want);
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n<think>\n\n</think>\n\n", hist);
    expect_render(m, N(m), 1, 0, want);

    /* an assistant turn without </think> is kept verbatim, newlines and all */
    const df_chat_msg m2[] = {{"user", "a"}, {"assistant", "\n\nplain <think> text"},
                              {"user", "b"}};
    expect_render(m2, N(m2), 0, 1,
                  "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n\n\nplain <think> "
                  "text<|im_end|>\n<|im_start|>user\nb<|im_end|>\n");

    /* several </think>: content after the last, reasoning dropped */
    const df_chat_msg m3[] = {{"user", "a"}, {"assistant", "<think>x</think>y</think>\nz"},
                              {"user", "b"}};
    expect_render(m3, N(m3), 0, 1,
                  "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nz<|im_end|>\n"
                  "<|im_start|>user\nb<|im_end|>\n");
}

/* The final assistant turn after the last query always gets a think block. */
static void test_last_assistant_gets_think_block(void **state) {
    (void)state;
    const df_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Hello!"}};
    expect_render(m, N(m), 0, 1,
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
    const df_chat_msg m2[] = {{"user", "Hi"},
                              {"assistant", "<think>\n\nThe user greets.\n\n</think>\n\n\nHello!"}};
    expect_render(m2, N(m2), 0, 1,
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nThe user greets.\n</think>\n\nHello!"
                  "<|im_end|>\n");
    /* reasoning before the first </think>, after the last <think> in it */
    const df_chat_msg m3[] = {{"user", "Q"},
                              {"assistant", "<think>a<think>b\n</think>c</think>\n\nd"}};
    expect_render(m3, N(m3), 0, 1,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nb\n</think>\n\nd<|im_end|>\n");
    /* </think> without <think> */
    const df_chat_msg m4[] = {{"user", "Q"}, {"assistant", "why</think>ans"}};
    expect_render(m4, N(m4), 0, 1,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nwhy\n</think>\n\nans<|im_end|>\n");
}

/* Agentic steps: assistant turns after the last real query keep non-empty reasoning;
 * tool turns are grouped into one user turn; a user turn that is only a tool
 * response does not count as a query. */
static void test_tool_steps(void **state) {
    (void)state;
    const df_chat_msg m[] = {
        {"user", "Q"},
        {"assistant", "<think>r1</think>a1"},
        {"tool", "<result>"},
        {"assistant", "<think>\n\nr2\n\n</think>\n\n\na2"},
    };
    expect_render(m, N(m), 0, 1,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\n<result>\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");

    const df_chat_msg m2[] = {
        {"user", "Q"},
        {"assistant", "<think>t</think>A"},
        {"user", "<tool_response>x</tool_response>"},
        {"assistant", "B"},
        {"assistant", "C"}, /* middle of the step, no reasoning: plain */
    };
    expect_render(m2, N(m2) - 1, 0, 1,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nt\n</think>\n\nA<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n");
    expect_render(m2, N(m2), 0, 1,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nt\n</think>\n\nA<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\nB<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nC<|im_end|>\n");

    const df_chat_msg m3[] = {{"user", "q"}, {"tool", "r1"}, {"tool", "r2"}};
    expect_render(m3, N(m3), 1, 0,
                  "<|im_start|>user\nq<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\n"
                  "r2\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

static void test_system_not_first(void **state) {
    (void)state;
    const df_chat_msg m[] = {{"user", "a"}, {"system", "b"}, {"system", "c"}};
    expect_render(m, N(m), 0, 1,
                  "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n"
                  "<|im_start|>system\nc<|im_end|>\n");
    const df_chat_msg m2[] = {{"system", ""}, {"user", ""}};
    expect_render(m2, N(m2), 0, 1,
                  "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n");
}

static void test_errors(void **state) {
    (void)state;
    char *out = (char *)1;
    df_error err = {0};
    const df_chat_msg bad[] = {{"user", "hi"}, {"bot", "hello"}};
    assert_int_equal(df_chat_render_qwen3(bad, N(bad), 1, 1, &out, &err), DF_ERR_ARG);
    assert_null(out);
    assert_non_null(strstr(err.msg, "\"bot\""));
    const df_chat_msg norole[] = {{NULL, "x"}};
    assert_int_equal(df_chat_render_qwen3(norole, 1, 1, 1, &out, &err), DF_ERR_ARG);
    const df_chat_msg nocontent[] = {{"user", NULL}};
    assert_int_equal(df_chat_render_qwen3(nocontent, 1, 1, 1, &out, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "content"));
    assert_int_equal(df_chat_render_qwen3(NULL, 2, 1, 1, &out, &err), DF_ERR_ARG);
    /* the template cannot render an empty conversation (it reads messages[0]) */
    assert_int_equal(df_chat_render_qwen3(bad, 0, 1, 1, &out, &err), DF_ERR_ARG);
    assert_int_equal(df_chat_render_qwen3(bad, -1, 1, 1, &out, &err), DF_ERR_ARG);
    assert_int_equal(df_chat_render_qwen3(bad, 1, 1, 1, NULL, &err), DF_ERR_ARG);
    /* role names are case-sensitive, as in the template */
    const df_chat_msg upper[] = {{"User", "x"}};
    assert_int_equal(df_chat_render_qwen3(upper, 1, 1, 1, &out, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "User"));
}

static void test_jinja_rendered_cases(void **state) {
    (void)state;
    char *path = df_path_join(df_test_root(), "tests/data/chat/qwen3_template_cases.json");
    json_error_t je;
    json_t *cases = json_load_file(path, 0, &je);
    if (!cases) fprintf(stderr, "%s: %s\n", path, je.text);
    free(path);
    assert_true(json_is_array(cases));
    assert_true(json_array_size(cases) >= 100);
    size_t i, ok = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *ms = json_object_get(c, "messages");
        int n = (int)json_array_size(ms);
        assert_true(n > 0 && n <= 16);
        df_chat_msg m[16];
        for (int k = 0; k < n; k++) {
            json_t *e = json_array_get(ms, k);
            m[k].role = json_string_value(json_object_get(e, "role"));
            m[k].content = json_string_value(json_object_get(e, "content"));
            assert_non_null(m[k].role);
            assert_non_null(m[k].content);
        }
        const char *want = json_string_value(json_object_get(c, "expected"));
        assert_non_null(want);
        char *out = NULL;
        df_error err = {0};
        int rc = df_chat_render_qwen3(m, n, json_is_true(json_object_get(c, "add_generation_prompt")),
                                      json_is_true(json_object_get(c, "enable_thinking")), &out,
                                      &err);
        if (rc == DF_OK && strcmp(out, want) == 0) ok++;
        else fprintf(stderr, "case %zu: %s\ngot:\n%s\nwant:\n%s\n", i, rc ? err.msg : "differs",
                     out ? out : "", want);
        free(out);
    }
    fprintf(stderr, "  %zu/%zu jinja-rendered conversations match\n", ok, json_array_size(cases));
    assert_int_equal(ok, json_array_size(cases));
    json_decref(cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_system_user_generation_prompt),
        cmocka_unit_test(test_user_only),
        cmocka_unit_test(test_history_think_stripped),
        cmocka_unit_test(test_last_assistant_gets_think_block),
        cmocka_unit_test(test_tool_steps),
        cmocka_unit_test(test_system_not_first),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_jinja_rendered_cases),
    };
    return cmocka_run_group_tests_name("chat", tests, NULL, NULL);
}
