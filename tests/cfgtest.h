/*
 * cfgtest.h - helpers of the config.json tests (test_config.c,
 * test_config_kimi.c): JSON with keys replaced, and parse-and-expect checks
 * that the error names the field and leaves the output untouched.
 */
#ifndef DF_CFGTEST_H
#define DF_CFGTEST_H

#include "testutil.h"

#include "model/config.h"

#include <jansson.h>
#include <stdarg.h>
#include <string.h>

/* base with some top-level keys replaced: pairs of key, JSON text (NULL text
 * deletes the key), ended by NULL. Returns malloc'ed JSON text. */
static char *with(const char *base, ...) {
    json_t *o = json_loads(base, 0, NULL);
    assert_non_null(o);
    va_list ap;
    va_start(ap, base);
    const char *k;
    while ((k = va_arg(ap, const char *))) {
        const char *v = va_arg(ap, const char *);
        if (!v) {
            json_object_del(o, k);
            continue;
        }
        json_t *x = json_loads(v, JSON_DECODE_ANY, NULL);
        assert_non_null(x);
        json_object_set_new(o, k, x);
    }
    va_end(ap);
    char *s = json_dumps(o, 0);
    json_decref(o);
    return s;
}

static void check_fail(int rc, const df_error *err, int code, const char *n1, const char *n2) {
    if (getenv("DF_TEST_VERBOSE")) fprintf(stderr, "    [%d] %s\n", rc, err->msg);
    if (rc != code || (n1 && !strstr(err->msg, n1)) || (n2 && !strstr(err->msg, n2)))
        print_error("rc=%d (want %d) msg='%s' want '%s' and '%s'\n", rc, code, err->msg,
                    n1 ? n1 : "", n2 ? n2 : "");
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    if (n1) assert_non_null(strstr(err->msg, n1));
    if (n2) assert_non_null(strstr(err->msg, n2));
}

static int parse(df_config *c, const char *json, df_error *err) {
    return df_config_parse(c, json, strlen(json), "config.json", err);
}

static void ok(df_config *c, const char *json) {
    df_error err = {0};
    int rc = parse(c, json, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, DF_OK);
}

/* Parses `json` (freed here) and expects failure; the message must name the
 * file and contain n1, n2. The output must be left untouched. */
static void bad(char *json, int code, const char *n1, const char *n2) {
    df_config c;
    memset(&c, 0xAB, sizeof c);
    df_error err = {0};
    int rc = parse(&c, json, &err);
    check_fail(rc, &err, code, n1, n2);
    assert_non_null(strstr(err.msg, "config.json"));
    unsigned char *p = (unsigned char *)&c;
    for (size_t i = 0; i < sizeof c; i++) assert_int_equal(p[i], 0xAB);
    free(json);
}

#endif
