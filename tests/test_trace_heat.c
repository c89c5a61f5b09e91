/*
 * test_trace_heat.c - what the cache policies learn from and are measured
 * with: routing-trace parsing (malformed input rejected with its line),
 * writing and round trip; heat decay and persistence (round trip, missing,
 * corrupt, truncated, other shape, atomic save, through the cache); the
 * cache-sim command line, also with several streams.
 */
#include "testutil.h"

#include "experts/cachesim.h"
#include "experts/heat.h"
#include "experts/policy.h"
#include "experts/trace.h"
#include "cli/cli.h" /* the command-line tests: cli/pack.c, cli/cachesim.c */

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

static const char *tmp(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

/* ---- trace parsing ---------------------------------------------------------- */

#define HDR "# moe-routing-trace v1\n# model: toy\n# moe_layers: 2  experts_per_layer: 4  top_k: 2\n"

static void test_trace_parse_ok(void **st) {
    (void)st;
    const char *text = HDR "0,1 2,3\r\n1,2 0,3\n\n\n# a comment between sequences\n3,0 1,2\n";
    df_trace t;
    df_error err;
    assert_int_equal(df_trace_parse(&t, text, strlen(text), "toy", &err), DF_OK);
    assert_int_equal(t.n_layers, 2);
    assert_int_equal(t.n_experts, 4);
    assert_int_equal(t.top_k, 2);
    assert_string_equal(t.model, "toy");
    assert_int_equal(t.n_tokens, 3);
    assert_int_equal(t.n_seqs, 2);
    assert_int_equal(t.seq_start[0], 0);
    assert_int_equal(t.seq_start[1], 2);
    assert_int_equal(t.seq_start[2], 3);
    const uint16_t *a = df_trace_at(&t, 1, 0), *b = df_trace_at(&t, 2, 1);
    assert_int_equal(a[0], 1);
    assert_int_equal(a[1], 2);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[1], 2);
    df_trace_free(&t);

    /* the real header, including "(model layers 1..26)" */
    assert_int_equal(df_trace_load(&t, df_test_trace_excerpt(), &err), DF_OK);
    assert_int_equal(t.n_layers, 26);
    assert_int_equal(t.n_experts, 64);
    assert_int_equal(t.top_k, 6);
    assert_int_equal(t.first_layer, 1);
    assert_int_equal(t.n_seqs, 4);
    assert_int_equal(t.n_tokens, 263);
    assert_int_equal(df_trace_at(&t, 0, 0)[0], 8);
    assert_int_equal(df_trace_at(&t, 0, 0)[5], 11);
    df_trace_free(&t);
}

static void test_trace_rejects_malformed(void **st) {
    (void)st;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"", "bad:1: not a routing trace"},
        {"# moe-routing-trace\n", "bad:1: not a routing trace"},
        {"hello\n", "bad:1: not a routing trace"},
        {"# moe-routing-trace v2\n", "bad:1: unsupported trace version"},
        {"# moe-routing-trace v1\n0,1 2,3\n", "bad:2: token line before the header"},
        {"# moe-routing-trace v1\n# moe_layers: 2  top_k: 2\n0,1 2,3\n",
         "bad:3: token line before the header"},
        {"# moe-routing-trace v1\n# moe_layers: 2  experts_per_layer: 4  top_k: 2\n",
         NULL},
        {"# moe-routing-trace v1\n# nothing\n", "bad: header lacks"},
        {"# moe-routing-trace v1\n# moe_layers: x experts_per_layer: 4 top_k: 2\n",
         "bad:2: header 'moe_layers' needs an integer"},
        {"# moe-routing-trace v1\n# moe_layers: 2 experts_per_layer: 4 top_k: 2\n"
         "# moe_layers: 3\n",
         "bad:3: header 'moe_layers' given twice"},
        {"# moe-routing-trace v1\n# moe_layers: 2 experts_per_layer: 4 top_k: 5\n0,1 2,3\n",
         "bad:3: header top_k = 5 exceeds experts_per_layer = 4"},
        /* the same header with no token line (found by fuzz_trace) */
        {"# moe-routing-trace v1\n# moe_layers: 2 experts_per_layer: 4 top_k: 5\n",
         "bad: header top_k = 5 exceeds experts_per_layer = 4"},
        {HDR "0,1 2,3\n0,1\n", "bad:5: 1 fields, expected 2"},
        {HDR "0,1 2,3\n0,1 2,3 1,2\n", "bad:5: more than 2 fields"},
        {HDR "0,1 2,3\n\n0,1 2,4\n", "bad:6: field 2 (MoE layer 1): expert id '4' out of range"},
        {HDR "0,1 2,99999999999\n", "bad:4: field 2 (MoE layer 1): expert id '99999999999' out"},
        {HDR "0,0 2,3\n", "bad:4: field 1 (MoE layer 0): expert 0 selected twice"},
        {HDR "0 2,3\n", "bad:4: field 1 (MoE layer 0): 1 expert ids, expected top_k = 2"},
        {HDR "0,1,2 2,3\n", "bad:4: field 1 (MoE layer 0): more than top_k = 2"},
        {HDR "0,1 2,x\n", "bad:4: field 2 (MoE layer 1): unexpected character 'x'"},
        {HDR "0,1 2;3\n", "bad:4: field 2 (MoE layer 1): unexpected character ';'"},
        {HDR "0,,1 2,3\n", "bad:4: field 1 (MoE layer 0): empty expert id"},
        {HDR "0,1 -2,3\n", "bad:4: field 2 (MoE layer 1): unexpected character '-'"},
        {HDR "0,1 2,3,\n", "bad:4: field 2 (MoE layer 1): empty expert id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        df_trace t;
        df_error err = {0, ""};
        int rc = df_trace_parse(&t, cases[i].text, strlen(cases[i].text), "bad", &err);
        if (!cases[i].want) {
            assert_int_equal(rc, DF_OK);
            assert_int_equal(t.n_tokens, 0);
            df_trace_free(&t);
            continue;
        }
        if (rc == DF_OK || !strstr(err.msg, cases[i].want)) {
            fprintf(stderr, "case %zu: rc %d, message '%s', wanted '%s'\n", i, rc, err.msg,
                    cases[i].want);
            fail();
        }
        assert_null(t.ids);
        assert_int_equal(t.n_tokens, 0);
    }
    /* a NUL byte inside a line */
    const char nul[] = HDR "0,1 2\0003\n";
    df_trace t;
    df_error err;
    assert_int_equal(df_trace_parse(&t, nul, sizeof nul - 1, "bad", &err), DF_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "bad:4: NUL byte"));
    /* missing file */
    assert_int_equal(df_trace_load(&t, tmp("no-such.trace"), &err), DF_ERR_IO);
    assert_non_null(strstr(err.msg, "no-such.trace"));
}

static void test_trace_roundtrip_and_writer(void **st) {
    (void)st;
    df_trace a, b;
    df_error err;
    assert_int_equal(df_trace_load(&a, df_test_trace_excerpt(), &err), DF_OK);
    assert_int_equal(df_trace_write_file(&a, tmp("rt.trace"), &err), DF_OK);
    assert_int_equal(df_trace_load(&b, tmp("rt.trace"), &err), DF_OK);
    assert_int_equal(a.n_tokens, b.n_tokens);
    assert_int_equal(a.n_seqs, b.n_seqs);
    assert_int_equal(a.first_layer, b.first_layer);
    assert_string_equal(a.model, b.model);
    assert_memory_equal(a.seq_start, b.seq_start, (size_t)(a.n_seqs + 1) * sizeof(int));
    assert_memory_equal(a.ids, b.ids,
                        (size_t)a.n_tokens * (size_t)a.n_layers * (size_t)a.top_k * 2);
    df_trace_free(&a);
    df_trace_free(&b);

    /* the recorder: validates ids, ends sequences, sanitises the model name */
    df_trace_writer *w;
    assert_int_equal(df_trace_writer_open(&w, tmp("rec.trace"), "my\nmodel", 2, -1, 4, 2, &err),
                     DF_OK);
    int32_t ok[4] = {0, 1, 3, 2}, dup[4] = {0, 0, 1, 2}, range[4] = {0, 1, 2, 4};
    assert_int_equal(df_trace_writer_token(w, ok, &err), DF_OK);
    assert_int_equal(df_trace_writer_token(w, dup, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "selected twice"));
    assert_int_equal(df_trace_writer_token(w, range, &err), DF_ERR_ARG);
    assert_non_null(strstr(err.msg, "out of [0, 4)"));
    assert_int_equal(df_trace_writer_end_sequence(w, &err), DF_OK);
    assert_int_equal(df_trace_writer_end_sequence(w, &err), DF_OK); /* no empty sequence */
    assert_int_equal(df_trace_writer_token(w, ok, &err), DF_OK);
    assert_int_equal(df_trace_writer_token(w, ok, &err), DF_OK);
    assert_int_equal(df_trace_writer_close(w, &err), DF_OK);
    df_trace t;
    assert_int_equal(df_trace_load(&t, tmp("rec.trace"), &err), DF_OK);
    assert_int_equal(t.n_tokens, 3);
    assert_int_equal(t.n_seqs, 2);
    assert_string_equal(t.model, "my model");
    assert_int_equal(df_trace_at(&t, 2, 1)[0], 3);
    df_trace_free(&t);

    /* A model name read with control characters (a terminal escape, a bare CR)
     * holds them as spaces, trimmed, as the writer would write it, so that it
     * prints safely and a trace written back reads the same (found by fuzz_trace). */
    static const char ctl[] = "# moe-routing-trace v1\n# model: \x01 tiny\x1b[0m\rx\x7f \x02\n"
                              "# moe_layers: 2  experts_per_layer: 4  top_k: 2\n0,1 2,3\n";
    assert_int_equal(df_trace_parse(&a, ctl, sizeof ctl - 1, "ctl", &err), DF_OK);
    assert_string_equal(a.model, "tiny [0m x");
    assert_int_equal(df_trace_write_file(&a, tmp("ctl.trace"), &err), DF_OK);
    assert_int_equal(df_trace_load(&b, tmp("ctl.trace"), &err), DF_OK);
    assert_string_equal(b.model, a.model);
    df_trace_free(&a);
    df_trace_free(&b);

    assert_int_equal(df_trace_writer_open(&w, tmp("x.trace"), NULL, 2, 0, 4, 5, &err),
                     DF_ERR_ARG);
    assert_int_equal(df_trace_writer_open(&w, tmp("no/dir/x.trace"), NULL, 2, 0, 4, 2, &err),
                     DF_ERR_IO);
}

/* ---- heat ------------------------------------------------------------------------ */

static void test_heat_decay(void **st) {
    (void)st;
    df_heat h;
    df_error err;
    assert_int_equal(df_heat_init(&h, 1, 4, 10, &err), DF_OK);
    df_heat_add(&h, 1);
    for (int i = 0; i < 10; i++) df_heat_token_end(&h);
    assert_true(fabs(df_heat_get(&h, 1) - 0.5) < 1e-12);
    assert_true(df_heat_get(&h, 0) == 0);
    /* a key used every token has rate -> 1, across many scale folds */
    for (int i = 0; i < 5000; i++) {
        df_heat_add(&h, 2);
        if (i % 2) df_heat_add(&h, 3);
        df_heat_token_end(&h);
    }
    assert_true(fabs(df_heat_rate(&h, 2) - 1.0) < 1e-6);
    assert_true(fabs(df_heat_rate(&h, 3) - 0.5) < 0.05);
    assert_true(df_heat_get(&h, 1) < 1e-100);
    assert_true(h.scale < 2e19);
    df_heat_free(&h);
}

static df_heat_load_result load_into(df_heat *h, const char *path, char *why, size_t cap) {
    df_error e;
    df_heat_load_result r = df_heat_load(h, path, &e);
    snprintf(why, cap, "%s", e.msg);
    return r;
}

static int heat_is_empty(const df_heat *h) {
    for (int i = 0; i < h->n_layers * h->n_experts; i++)
        if (h->v[i] != 0) return 0;
    return h->tokens == 0 && h->norm == 0;
}

/* A 3-layer x 5-expert histogram of 300 tokens in a, saved at path. */
static void saved_heat(df_heat *a, char path[512]) {
    df_error err;
    assert_int_equal(df_heat_init(a, 3, 5, 64, &err), DF_OK);
    for (int t = 0; t < 300; t++) {
        df_heat_add(a, (int)df_test_rnd(15));
        df_heat_add(a, t % 15);
        df_heat_token_end(a);
    }
    snprintf(path, 512, "%s", tmp("experts.heat"));
    assert_int_equal(df_heat_save(a, path, &err), DF_OK);
}

static void test_heat_persistence(void **st) {
    (void)st;
    df_heat a, b;
    df_error err;
    char why[1024], path[512];
    saved_heat(&a, path);
    /* atomic save leaves no temp file behind */
    DIR *d = opendir(g_root);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));) assert_null(strstr(de->d_name, ".tmp."));
    closedir(d);

    assert_int_equal(df_heat_init(&b, 3, 5, 64, &err), DF_OK);
    assert_int_equal(load_into(&b, path, why, sizeof why), DF_HEAT_LOADED);
    assert_int_equal(b.tokens, 300);
    for (int i = 0; i < 15; i++) assert_true(df_heat_get(&b, i) == df_heat_get(&a, i));
    assert_true(fabs(b.norm - a.norm) < 1e-9 * a.norm);
    /* the loaded histogram keeps counting and saves again */
    df_heat_add(&b, 4);
    df_heat_token_end(&b);
    assert_int_equal(df_heat_save(&b, path, &err), DF_OK);
    assert_int_equal(load_into(&b, path, why, sizeof why), DF_HEAT_LOADED);
    assert_int_equal(b.tokens, 301);

    /* missing */
    assert_int_equal(load_into(&b, tmp("none.heat"), why, sizeof why), DF_HEAT_MISSING);
    assert_true(heat_is_empty(&b));
    assert_non_null(strstr(why, "none.heat"));
    df_heat_free(&a);
    df_heat_free(&b);
}

/* Damaged, foreign and unwritable heat files: refused with the reason, the
 * histogram left empty, and a cache started from one runs as from nothing. */
static void test_heat_bad_files(void **st) {
    (void)st;
    df_heat a, b;
    df_error err;
    char why[1024], path[512];
    saved_heat(&a, path);
    assert_int_equal(df_heat_init(&b, 3, 5, 64, &err), DF_OK);
    char *good;
    size_t len;
    assert_int_equal(df_read_file(path, &good, &len, &err), DF_OK);
    assert_int_equal(len, 40 + 15 * 8 + 4);
    char *bad = malloc(len + 8);
    /* every single flipped byte is caught */
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, good, len);
        bad[i] ^= 0x20;
        df_test_write_path(tmp("bad.heat"), bad, len);
        assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
        assert_true(heat_is_empty(&b));
    }
    /* truncated at every length, and extended */
    for (size_t n = 0; n < len; n += 7) {
        df_test_write_path(tmp("bad.heat"), good, n);
        assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
        assert_true(heat_is_empty(&b));
    }
    memcpy(bad, good, len);
    memcpy(bad + len, "trailing", 8);
    df_test_write_path(tmp("bad.heat"), bad, len + 8);
    assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
    assert_non_null(strstr(why, "implies")); /* longer than its header says: not called truncated */
    assert_null(strstr(why, "truncated"));
    df_test_write_path(tmp("bad.heat"), good, len - 1);
    assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
    assert_non_null(strstr(why, "truncated"));
    /* valid checksum over a NaN: still refused */
    memcpy(bad, good, len);
    double nan = NAN;
    memcpy(bad + 40 + 8 * 7, &nan, 8);
    uint32_t crc = df_crc32(0, bad, len - 4);
    for (int i = 0; i < 4; i++) bad[len - 4 + i] = (char)(crc >> (8 * i));
    df_test_write_path(tmp("bad.heat"), bad, len);
    assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
    assert_non_null(strstr(why, "layer 1, expert 2"));
    /* a directory where the file should be */
    assert_int_equal(mkdir(tmp("dir.heat"), 0755), 0);
    assert_int_equal(load_into(&b, tmp("dir.heat"), why, sizeof why), DF_HEAT_CORRUPT);
    /* another model's histogram */
    df_heat other;
    assert_int_equal(df_heat_init(&other, 3, 6, 64, &err), DF_OK);
    assert_int_equal(load_into(&other, path, why, sizeof why), DF_HEAT_MISMATCH);
    assert_true(heat_is_empty(&other));
    assert_non_null(strstr(why, "3 layers x 5 experts"));
    df_heat_free(&other);
    /* a failed save reports and leaves the old file intact */
    assert_int_equal(df_heat_save(&a, tmp("no/such/dir/x.heat"), &err), DF_ERR_IO);
    assert_non_null(strstr(err.msg, "no/such/dir"));
    assert_int_equal(load_into(&b, path, why, sizeof why), DF_HEAT_LOADED);

    /* a cache started from a corrupt file runs as from nothing */
    df_test_write_path(tmp("bad.heat"), "DFHEAT", 6);
    assert_int_equal(load_into(&b, tmp("bad.heat"), why, sizeof why), DF_HEAT_CORRUPT);
    /* two to pin, but nothing is hot: nothing pinned */
    df_cache_opts o = {.n_layers = 3, .n_experts = 5, .top_k = 2, .n_slots = 4, .policy = DF_POLICY_DELTAFIN,
                       .initial_heat = &b, .n_pinned = 2};
    df_cache *c;
    assert_int_equal(df_cache_new(&c, &o, &err), DF_OK);
    for (int s = 0; s < 4; s++) assert_false(df_cache_is_pinned(c, s));
    int32_t ex[2] = {1, 3}, sl[2];
    df_cache_access_layer(c, 0, ex, 2, sl, NULL);
    assert_true(sl[0] >= 0 && sl[1] >= 0);
    df_cache_free(c);

    free(bad);
    free(good);
    df_heat_free(&a);
    df_heat_free(&b);
}

static void test_heat_roundtrip_through_cache(void **st) {
    (void)st;
    /* the heat a cache accumulated, saved and loaded, pins the same experts the
     * replay used most */
    df_trace t;
    df_error err;
    assert_int_equal(df_trace_load(&t, df_test_trace_excerpt(), &err), DF_OK);
    df_cache_opts o = {.n_layers = t.n_layers, .n_experts = t.n_experts, .top_k = t.top_k, .n_slots = 100,
                       .policy = DF_POLICY_LRU, .heat_half_life = 1e9};
    df_cache *c;
    assert_int_equal(df_cache_new(&c, &o, &err), DF_OK);
    int *count = calloc((size_t)(t.n_layers * t.n_experts), sizeof *count);
    int32_t sl[8];
    for (int i = 0; i < t.n_tokens; i++) {
        for (int l = 0; l < t.n_layers; l++) {
            int32_t ex[8];
            for (int k = 0; k < t.top_k; k++) {
                ex[k] = df_trace_at(&t, i, l)[k];
                count[l * t.n_experts + ex[k]]++;
            }
            df_cache_access_layer(c, l, ex, t.top_k, sl, NULL);
        }
        df_cache_token_end(c);
    }
    assert_int_equal(df_heat_save(df_cache_heat(c), tmp("trace.heat"), &err), DF_OK);
    df_cache_free(c);
    df_heat h;
    assert_int_equal(df_heat_init(&h, t.n_layers, t.n_experts, 1e9, &err), DF_OK);
    assert_int_equal(df_heat_load(&h, tmp("trace.heat"), &err), DF_HEAT_LOADED);
    int32_t top[10];
    df_heat_top(&h, 10, top);
    for (int i = 1; i < 10; i++) assert_true(count[top[i - 1]] >= count[top[i]]);
    int maxc = 0;
    for (int i = 0; i < t.n_layers * t.n_experts; i++)
        if (count[i] > maxc) maxc = count[i];
    assert_int_equal(count[top[0]], maxc);
    assert_true(fabs(df_heat_get(&h, top[0]) - maxc) < 1e-6 * maxc);
    free(count);
    df_heat_free(&h);
    df_trace_free(&t);
}

/* ---- cache-sim ---------------------------------------------------------------------- */

static int sim(const char *a1, const char *a2, const char *a3, const char *a4,
               const char *a5, const char *a6) {
    char *argv[7] = {(char *)a1, (char *)a2, (char *)a3, (char *)a4,
                     (char *)a5, (char *)a6, NULL};
    int argc = 0;
    while (argc < 6 && argv[argc]) argc++;
    fflush(stdout);
    return cli_cache_sim_main(argc, argv);
}

static void test_cache_sim_cli(void **st) {
    (void)st;
    const char *tr = df_test_trace_excerpt();
    assert_int_equal(sim("--trace", tr, "--fraction", "0.1", "--policy", "all"), 0);
    assert_int_equal(sim("--trace", tr, "--slots", "200", "--policy", "lru,deltafin"), 0);
    assert_int_equal(sim("--trace", tr, "--slots", "200", "--save-heat", tmp("sim.heat")), 0);
    struct stat sb;
    assert_int_equal(stat(tmp("sim.heat"), &sb), 0);
    char *argv[] = {"--trace", (char *)df_test_trace_excerpt(), "--fraction", "0.1",
                    "--heat", (char *)tmp("sim.heat"), "--pin", "0.5", "--warmup", "10",
                    "--policy", "deltafin", NULL};
    fflush(stdout);
    assert_int_equal(cli_cache_sim_main(12, argv), 0);
    assert_int_equal(cli_cache_sim_main(1, (char *[]){"--help", NULL}), 0);
    assert_int_equal(cli_cache_sim_main(0, (char *[]){NULL}), 2);
    /* usage errors: 2; a bad trace: 1 */
    assert_int_equal(sim("--trace", tr, NULL, NULL, NULL, NULL), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "10", "--fraction", "0.1"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "0", NULL, NULL), 2);
    assert_int_equal(sim("--trace", tr, "--fraction", "1.5", NULL, NULL), 2);
    assert_int_equal(sim("--trace", tr, "--fraction", "nan", NULL, NULL), 2); /* NaN is no number in range */
    assert_int_equal(sim("--trace", tr, "--half-life", "nan", "--slots", "10"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "10", "--policy", "fifo"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "10", "--pin", "0.5"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "10", "--warmup", "100000"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "10", "--bogus", "1"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", NULL, NULL, NULL), 2);
    df_test_write_path(tmp("broken.trace"), HDR "0,1 2\n", strlen(HDR "0,1 2\n"));
    assert_int_equal(sim("--trace", tmp("broken.trace"), "--slots", "2", NULL, NULL), 1);
    assert_int_equal(sim("--trace", tmp("missing.trace"), "--slots", "2", NULL, NULL), 1);
    /* a corrupt heat file is a warning, not a failure */
    df_test_write_path(tmp("junk.heat"), "junk", 4);
    assert_int_equal(sim("--trace", tr, "--slots", "100", "--heat", tmp("junk.heat")), 0);
}

/* Several sequences at once (cache-sim --streams): one stream of one-token
 * steps is the plain replay, and a step asks for the union of its rows. */
static void test_cache_sim_streams(void **st) {
    (void)st;
    df_trace t;
    df_error err;
    assert_int_equal(df_trace_load(&t, df_test_trace_excerpt(), &err), DF_OK);
    df_cache_opts o = {.n_layers = t.n_layers, .n_experts = t.n_experts, .top_k = t.top_k, .n_slots = 60,
                       .policy = DF_POLICY_DELTAFIN};
    int windows;
    df_sim_steps *s = df_cache_sim_steps(&t, &(df_sim_streams){1, 0, 1}, &windows);
    assert_int_equal(windows, t.n_tokens);
    df_cache *a, *b;
    assert_int_equal(df_cache_new(&a, &o, &err), DF_OK);
    assert_int_equal(df_cache_new(&b, &o, &err), DF_OK);
    uint64_t *next = df_cache_sim_next_uses(&t), rows;
    df_sim_result ra, rb;
    df_cache_sim_replay(&t, a, next, 0, &ra);
    df_cache_sim_replay_steps(s, b, &rb, &rows);
    assert_true(ra.hits == rb.hits && ra.accesses == rb.accesses && rows == (uint64_t)t.n_tokens);
    df_cache_free(a), df_cache_free(b), free(next), df_cache_sim_steps_free(s);
    /* 4 streams: Belady never loses to deltafin; a prompt step is not counted */
    uint64_t hits[2];
    s = df_cache_sim_steps(&t, &(df_sim_streams){4, 8, 16}, &windows);
    assert_true(windows == t.n_tokens / 96 && windows > 0);
    for (int i = 0; i < 2; i++) {
        o.policy = i ? DF_POLICY_BELADY : DF_POLICY_DELTAFIN;
        assert_int_equal(df_cache_new(&a, &o, &err), DF_OK);
        df_cache_sim_replay_steps(s, a, &ra, &rows);
        assert_true(rows == (uint64_t)windows * 64 && ra.accesses <= rows * (uint64_t)(t.n_layers * t.top_k));
        hits[i] = ra.hits;
        df_cache_free(a);
    }
    assert_true(hits[1] >= hits[0]);
    df_cache_sim_steps_free(s);
    df_trace_free(&t);
    /* by hand: two streams, one step each, one layer: the union {0, 1, 2} */
    const char *two = HDR "0,1 0,1\n1,2 0,1\n";
    assert_int_equal(df_trace_parse(&t, two, strlen(two), "two", &err), DF_OK);
    s = df_cache_sim_steps(&t, &(df_sim_streams){2, 0, 1}, &windows);
    o = (df_cache_opts){.n_layers = 2, .n_experts = 4, .top_k = 2, .n_slots = 1, .policy = DF_POLICY_LRU};
    assert_int_equal(df_cache_new(&a, &o, &err), DF_OK);
    df_cache_sim_replay_steps(s, a, &ra, &rows);
    assert_true(windows == 1 && rows == 2 && ra.accesses == 3 + 2 && ra.hits == 0);
    df_cache_free(a), df_cache_sim_steps_free(s), df_trace_free(&t);
    assert_null(df_cache_sim_steps(&t, &(df_sim_streams){0, 0, 1}, &windows));
    /* the command: usage errors are 2 */
    const char *tr = df_test_trace_excerpt();
    assert_int_equal(sim("--trace", tr, "--slots", "60", "--streams", "1"), 0); /* 263 tokens: one window of 144 */
    assert_int_equal(sim("--trace", tr, "--slots", "60", "--stream-decode", "4"), 2);
    assert_int_equal(sim("--trace", tr, "--streams", "2", "--warmup", "4"), 2);
    assert_int_equal(sim("--trace", tr, "--slots", "60", "--streams", "1000"), 2);
}

/* ---- main ---------------------------------------------------------------------------- */

static int setup(void **st) {
    (void)st;
    snprintf(g_root, sizeof g_root, "/tmp/df-test-policy-XXXXXX");
    return mkdtemp(g_root) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    df_test_rm_tree(g_root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_parse_ok),
        cmocka_unit_test(test_trace_rejects_malformed),
        cmocka_unit_test(test_trace_roundtrip_and_writer),
        cmocka_unit_test(test_heat_decay),
        cmocka_unit_test(test_heat_persistence),
        cmocka_unit_test(test_heat_bad_files),
        cmocka_unit_test(test_heat_roundtrip_through_cache),
        cmocka_unit_test(test_cache_sim_cli),
        cmocka_unit_test(test_cache_sim_streams),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
