/*
 * test_pack_v1.c - packs written before manifest version 2 stay usable: the
 * fixture tests/data/pack-v1 (a tiny qwen3_moe checkpoint and its pack, as
 * written by deltafin e5b23cc; make.sh there regenerates both) opens with
 * today's reader, its records are the checkpoint's bytes, it verifies, the
 * fingerprint today's code computes from the checkpoint's config and expert
 * inventory (no model loaded) is the one in its manifest, the writer takes it
 * as up to date, a fresh version-2 pack of the same checkpoint has the same
 * data bytes, and logits streamed from it equal the resident ones bit for bit.
 */
#include "testutil.h"

#include "deltafin.h"
#include "experts/pack.h"
#include "model/model.h"

#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NTOK 24

static char g_tmp[256], g_model[320], g_pack[320];
static df_model g_m;
static df_pack_ckpt g_ck;

static void path_in(char *out, size_t n, const char *a, const char *b) { snprintf(out, n, "%s/%s", a, b); }

/* The fingerprint field of dir's manifest.json. */
static char *manifest_fingerprint(const char *dir, int *version) {
    char p[400];
    path_in(p, sizeof p, dir, "manifest.json");
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    assert_non_null(root);
    *version = (int)json_integer_value(json_object_get(root, "version"));
    char *fp = strdup(json_string_value(json_object_get(root, "fingerprint")));
    json_decref(root);
    return fp;
}

/* The fingerprint from config.json, the safetensors and the expert inventory
 * alone, and the one in the v1 manifest: the same. */
static void test_fingerprint_unchanged(void **st) {
    (void)st;
    df_config c;
    df_st *sf;
    df_expert_inventory inv;
    df_error e = {0};
    assert_int_equal(df_config_load_dir(&c, g_model, &e), 0);
    assert_int_equal(df_st_open_dir(&sf, g_model, &e), 0);
    assert_int_equal(df_expert_inventory_build(&inv, &c, sf, NULL, &e), 0);
    df_pack_ckpt ck = {g_model, &c, sf, &inv};
    char fp[DF_PACK_FP_HEX + 1], fp2[DF_PACK_FP_HEX + 1];
    assert_int_equal(df_pack_fingerprint(&ck, fp, &e), 0);
    assert_int_equal(df_pack_fingerprint(&g_ck, fp2, &e), 0);
    int version;
    char *want = manifest_fingerprint(g_pack, &version);
    assert_int_equal(version, 1);
    assert_string_equal(fp, want);
    assert_string_equal(fp2, want);
    free(want);
    df_expert_inventory_free(&inv);
    df_st_close(sf);
}

static void test_open_and_read(void **st) {
    (void)st;
    const char *d[1] = {g_pack};
    df_pack *p;
    df_error e = {0};
    if (df_pack_open(&p, d, 1, &g_ck, &e)) fail_msg("open: %s", e.msg);
    assert_int_equal(df_pack_count(p), 4);
    assert_null(df_pack_find(p, 0, 0)); /* layer 0 is dense */
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p));
    assert_non_null(buf);
    for (int ex = 0; ex < 4; ex++) {
        const df_pack_record *r = df_pack_find(p, 1, ex);
        assert_non_null(r);
        assert_int_equal(r->n_parts, 3);
        if (df_pack_read_record(p, r, buf, &e)) fail_msg("read expert %d: %s", ex, e.msg);
        for (int k = 0; k < 3; k++) {
            const df_tensor *t = df_expert_part(&g_m.experts, 1, ex, k);
            assert_string_equal(r->part[k].name, g_m.experts.layout->part[k]);
            assert_int_equal(r->part[k].ndim, 2);
            assert_int_equal(r->part[k].shape[0], t->shape[0]);
            assert_int_equal(r->part[k].shape[1], t->shape[1]);
            assert_int_equal(r->part[k].nbytes, t->nbytes);
            assert_memory_equal(buf + r->part[k].offset, t->data, t->nbytes);
        }
    }
    free(buf);
    df_pack_close(p);
    if (df_pack_verify(d, 1, &e)) fail_msg("verify: %s", e.msg);
}

/* The writer finds the v1 pack up to date; a fresh pack is version 2 with
 * the same data bytes and fingerprint. */
static void test_writer(void **st) {
    (void)st;
    const char *d[1] = {g_pack};
    df_pack_write_result res;
    df_error e = {0};
    if (df_pack_write(g_model, d, 1, NULL, &res, &e)) fail_msg("pack over v1: %s", e.msg);
    assert_true(res.up_to_date);
    char fresh[400];
    path_in(fresh, sizeof fresh, g_tmp, "fresh");
    const char *f[1] = {fresh};
    if (df_pack_write(g_model, f, 1, NULL, &res, &e)) fail_msg("pack: %s", e.msg);
    assert_false(res.up_to_date);
    int v1, v2;
    char *a = manifest_fingerprint(g_pack, &v1), *b = manifest_fingerprint(fresh, &v2);
    assert_int_equal(v1, 1);
    assert_int_equal(v2, 2);
    assert_string_equal(a, b);
    free(a);
    free(b);
    char pa[400], pb[400];
    path_in(pa, sizeof pa, g_pack, "experts.bin");
    path_in(pb, sizeof pb, fresh, "experts.bin");
    char *x, *y;
    size_t lx, ly;
    assert_int_equal(df_read_file(pa, &x, &lx, &e), 0);
    assert_int_equal(df_read_file(pb, &y, &ly, &e), 0);
    assert_int_equal(lx, ly);
    assert_memory_equal(x, y, lx);
    free(x);
    free(y);
}

static float *logits(const char *experts, uint64_t cache, int step, int *V) {
    df_engine_opts o = {.model_dir = g_model, .n_threads = 1, .experts = experts, .expert_cache = cache};
    df_engine *eng;
    df_error err;
    if (df_engine_open(&eng, &o, &err)) fail_msg("open: %s", err.msg);
    *V = df_engine_info(eng)->vocab_size;
    df_session *s;
    assert_int_equal(df_session_new(&s, eng, NTOK, &err), DF_OK);
    int32_t toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = (int32_t)((i * 7 + 3) % *V);
    float *lg = malloc(sizeof(float) * (size_t)*V * NTOK);
    for (int i = 0; i < NTOK; i += step) {
        int k = NTOK - i < step ? NTOK - i : step;
        if (df_session_eval(s, toks + i, k, lg + (size_t)i * (size_t)*V, 1, &err))
            fail_msg("eval: %s", err.msg);
    }
    df_session_free(s);
    df_engine_close(eng);
    return lg;
}

/* Streamed from the v1 pack (one slot, a few slots; whole and token by
 * token): the resident logits, bit for bit. */
static void test_stream_logits(void **st) {
    (void)st;
    int V;
    float *ref = logits(NULL, 0, NTOK, &V);
    uint64_t caches[] = {4096, 3 * 4096, 1 << 20};
    for (size_t c = 0; c < sizeof caches / sizeof caches[0]; c++)
        for (int step = 1; step <= NTOK; step += NTOK - 1) {
            float *got = logits(g_pack, caches[c], step, &V);
            if (memcmp(ref, got, sizeof(float) * (size_t)V * NTOK))
                fail_msg("cache %llu step %d: streamed logits differ from resident",
                         (unsigned long long)caches[c], step);
            free(got);
        }
    free(ref);
}

static void copy_dir_files(const char *from, const char *to, const char *const *names, int n) {
    mkdir(to, 0755);
    for (int i = 0; i < n; i++) {
        char a[400], b[400];
        path_in(a, sizeof a, from, names[i]);
        path_in(b, sizeof b, to, names[i]);
        df_test_copy_file(a, b);
    }
}

static int setup(void **st) {
    (void)st;
    char fx[300], tk[300];
    snprintf(fx, sizeof fx, "%s/tests/data/pack-v1", df_test_root());
    snprintf(g_tmp, sizeof g_tmp, "/tmp/deltafin-test-pack-v1-%d", (int)getpid());
    mkdir(g_tmp, 0755);
    path_in(g_model, sizeof g_model, g_tmp, "model");
    path_in(g_pack, sizeof g_pack, g_tmp, "pack");
    /* copies: the store writes its heat file next to the pack */
    char from[400];
    const char *model_files[] = {"config.json", "generation_config.json", "model.safetensors"};
    const char *pack_files[] = {"manifest.json", "experts.bin"};
    path_in(from, sizeof from, fx, "model");
    copy_dir_files(from, g_model, model_files, 3);
    path_in(from, sizeof from, fx, "pack");
    copy_dir_files(from, g_pack, pack_files, 2);
    snprintf(tk, sizeof tk, "%s/assets/tokenizers/qwen3", df_test_root());
    const char *tok_files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char a[400], b[400], abs[PATH_MAX];
        path_in(a, sizeof a, tk, tok_files[i]);
        path_in(b, sizeof b, g_model, tok_files[i]);
        if (!realpath(a, abs) || symlink(abs, b) != 0) {
            fprintf(stderr, "test_pack_v1: no tokenizer at %s (set DF_ROOT)\n", a);
            return -1;
        }
    }
    df_error e = {0};
    if (df_model_load(&g_m, g_model, &e)) {
        fprintf(stderr, "test_pack_v1: cannot load %s: %s\n", g_model, e.msg);
        return -1;
    }
    g_ck = (df_pack_ckpt){NULL, &g_m.cfg, g_m.st, &g_m.experts};
    return 0;
}

static int teardown(void **st) {
    (void)st;
    df_model_free(&g_m);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_unchanged),
        cmocka_unit_test(test_open_and_read),
        cmocka_unit_test(test_stream_logits),
        cmocka_unit_test(test_writer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
