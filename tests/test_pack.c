/*
 * test_pack.c - the expert pack: pack the synthetic MoE checkpoint
 * ($DF_TEST_MODELS/engine-moe) with 1, 2 and 3 stripes and read every record
 * back byte for byte; verify; interrupted and resumed packs, a different model,
 * the command line. The DeepSeek-V3 family's sharded checkpoints pack the same
 * way: routed experts only (shared experts stay with the always-active weights),
 * parts named in the manifest, a fingerprint that is stable and tells the models
 * apart. Failures (corruption, broken sets, full disks) are in test_pack_faults.c.
 */
#include "packtest.h"

#include "cli/cli.h" /* the command-line tests: cli/pack.c, cli/cachesim.c */

/* ---- round trips ---------------------------------------------------------------- */

static void roundtrip(int S, const char *tag) {
    char names[3][64];
    const char *dirs[3] = {0}, *shuffled[3] = {0};
    for (int i = 0; i < S; i++) {
        snprintf(names[i], sizeof names[i], "rt%s-%d", tag, i);
        dirs[i] = tmp(names[i]);
    }
    pack_ok(dirs, S);
    for (int i = 0; i < S; i++) {
        assert_true(file_exists(dirs[i], "manifest.json"));
        assert_true(file_exists(dirs[i], "experts.bin"));
        assert_false(file_exists(dirs[i], "progress"));
        assert_false(file_exists(dirs[i], "experts.bin.partial"));
        assert_false(file_exists(dirs[i], "manifest.json.partial"));
    }
    /* any order: reversed, then rotated */
    for (int i = 0; i < S; i++) shuffled[i] = dirs[S - 1 - i];
    check_all_records(shuffled, S);
    for (int i = 0; i < S; i++) shuffled[i] = dirs[(i + 1) % S];
    check_all_records(shuffled, S);
    df_error e = {0};
    int rc = df_pack_verify(shuffled, S, &e);
    if (rc) fail_msg("verify: %s", e.msg);
    /* the same command again: up to date, nothing rewritten */
    size_t l1, l2;
    char *m1 = slurp(dirs[0], "manifest.json", &l1);
    df_pack_write_result res;
    assert_int_equal(pack_into(shuffled, S, NULL, &res, &e), 0);
    assert_true(res.up_to_date);
    char *m2 = slurp(dirs[0], "manifest.json", &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(m1, m2, l1);
    free(m1);
    free(m2);
}

static void test_roundtrip_1(void **st) { (void)st; roundtrip(1, "a"); }
static void test_roundtrip_2(void **st) { (void)st; roundtrip(2, "b"); }
static void test_roundtrip_3(void **st) { (void)st; roundtrip(3, "c"); }

static void test_direct_or_buffered(void **st) {
    (void)st;
    const char *d[1] = {tmp("rta-0")};
    df_pack *p;
    df_error e;
    assert_int_equal(df_pack_open(&p, d, 1, &g_ck, &e), 0);
    /* either is fine; the answer must match the descriptor's flags */
    int fl = fcntl(df_pack_fd(p, 0), F_GETFL);
    assert_int_equal(df_pack_is_direct(p, 0), (fl & O_DIRECT) != 0);
    assert_string_equal(df_pack_dir(p, 0), d[0]);
    assert_int_equal(strlen(df_pack_uuid(p)), 36);
    assert_int_equal(strlen(df_pack_model_fingerprint(p)), DF_PACK_FP_HEX);
    /* misaligned destination: an argument error, not a crash */
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p) + DF_PACK_ALIGN);
    assert_int_equal(df_pack_read_record(p, df_pack_at(p, 0), buf + 1, &e), DF_ERR_ARG);
    free(buf);
    df_pack_close(p);
}

/* ---- interrupted and resumed ---------------------------------------------------------- */
static void test_resume(void **st) {
    (void)st;
    const char *d[2] = {tmp("res-0"), tmp("res-1")};
    df_pack_write_opts o = {0};
    o.stop_after_records = 5;
    o.checkpoint_every_records = 2;
    df_error e = {0};
    df_pack_write_result res;
    int rc = pack_into(d, 2, &o, &res, &e);
    expect_err(rc, &e, "stopped after 5 records", NULL);
    for (int i = 0; i < 2; i++) {
        assert_false(file_exists(d[i], "manifest.json"));
        assert_false(file_exists(d[i], "experts.bin"));
        assert_true(file_exists(d[i], "experts.bin.partial"));
        assert_true(file_exists(d[i], "progress"));
    }
    df_pack *p;
    rc = df_pack_open(&p, d, 2, &g_ck, &e);
    expect_err(rc, &e, "unfinished pack", d[0]);
    rc = df_pack_verify(d, 2, &e);
    expect_err(rc, &e, "unfinished pack", NULL);

    /* a second interruption, directories given the other way round */
    const char *rev[2] = {d[1], d[0]};
    o.stop_after_records = 6;
    rc = pack_into(rev, 2, &o, &res, &e);
    expect_err(rc, &e, "stopped after 6 records", NULL);
    assert_int_equal(res.resumed_from, 4); /* last checkpoint: 4 records */

    /* resume to the end */
    rc = pack_into(rev, 2, NULL, &res, &e);
    if (rc) fail_msg("resume: %s", e.msg);
    assert_int_equal(res.resumed_from, 8); /* stopped before the checkpoint at 10 */
    assert_false(res.up_to_date);
    for (int i = 0; i < 2; i++) {
        assert_true(file_exists(d[i], "manifest.json"));
        assert_false(file_exists(d[i], "progress"));
        assert_false(file_exists(d[i], "experts.bin.partial"));
    }
    check_all_records(d, 2);
    assert_int_equal(df_pack_verify(d, 2, &e), 0);
    const char *clean[2] = {tmp("rtb-0"), tmp("rtb-1")};
    assert_same_pack(d[0], clean[0]);
    assert_same_pack(d[1], clean[1]);
}

/* The journal's last record damaged on disk: found on resume and rewritten. */
static void test_resume_damaged(void **st) {
    (void)st;
    const char *d[1] = {tmp("resd")};
    df_pack_write_opts o = {0};
    o.stop_after_records = 7;
    o.checkpoint_every_records = 3;
    df_error e = {0};
    df_pack_write_result res;
    expect_err(pack_into(d, 1, &o, &res, &e), &e, "stopped", NULL);
    /* records 0..5 are journaled; damage record 5 (the last) and record 2 */
    uint64_t rec_bytes = 28672; /* 27648 rounded up to 4096 */
    flip(d[0], "experts.bin.partial", 5 * rec_bytes + 10);
    flip(d[0], "experts.bin.partial", 2 * rec_bytes + 10);
    assert_int_equal(pack_into(d, 1, NULL, &res, &e), 0);
    assert_int_equal(res.resumed_from, 2);
    check_all_records(d, 1);
    const char *clean[1] = {tmp("rta-0")};
    assert_same_pack(d[0], clean[0]);
}

/* Interrupted while renaming the finished files into place, after every
 * possible number of renames: the next run finishes the same pack, and no
 * directory looks complete before its manifest is in place. */
static void test_resume_in_finish(void **st) {
    (void)st;
    const char *clean[2] = {tmp("rtb-0"), tmp("rtb-1")};
    for (int k = 1; k <= 4; k++) {
        char n0[64], n1[64];
        snprintf(n0, sizeof n0, "fin%d-0", k);
        snprintf(n1, sizeof n1, "fin%d-1", k);
        const char *d[2] = {tmp(n0), tmp(n1)};
        df_pack_write_opts o = {0};
        o.stop_after_renames = k;
        df_error e = {0};
        df_pack_write_result res;
        expect_err(pack_into(d, 2, &o, &res, &e), &e, "renames (test hook)", NULL);
        df_pack *p;
        int rc = df_pack_open(&p, d, 2, &g_ck, &e);
        if (k < 4) {
            expect_err(rc, &e, "no manifest.json", "unfinished pack");
        } else {
            if (rc) fail_msg("open after all renames: %s", e.msg);
            df_pack_close(p);
        }
        const char *rev[2] = {d[1], d[0]};
        rc = pack_into(rev, 2, NULL, &res, &e);
        if (rc) fail_msg("finish after %d renames: %s", k, e.msg);
        assert_int_equal(res.up_to_date, k == 4);
        for (int i = 0; i < 2; i++) {
            assert_false(file_exists(d[i], "progress"));
            assert_false(file_exists(d[i], "experts.bin.partial"));
            assert_false(file_exists(d[i], "manifest.json.partial"));
        }
        check_all_records(d, 2);
        assert_same_pack(d[0], clean[0]);
        assert_same_pack(d[1], clean[1]);
    }
}

/* ---- a different model ------------------------------------------------------------------ */

/* A copy of the test model whose config.json differs by one trailing newline
 * (link_data: safetensors linked, else copied so they can be changed). */
static void make_variant(const char *out, bool link_data) {
    mkdir(out, 0777);
    const char *names[] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                           "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors"};
    for (int i = 0; i < 6; i++) {
        char from[700], to[700];
        snprintf(from, sizeof from, "%s/%s", g_model, names[i]);
        snprintf(to, sizeof to, "%s/%s", out, names[i]);
        if (access(from, F_OK) != 0) continue;
        if (i >= 3 && link_data) {
            char abs[700];
            assert_non_null(realpath(from, abs));
            assert_int_equal(symlink(abs, to), 0);
        } else {
            df_test_copy_file(from, to);
        }
    }
    if (link_data) {
        char p[700];
        snprintf(p, sizeof p, "%s/config.json", out);
        FILE *f = fopen(p, "ab");
        fputc('\n', f);
        fclose(f);
    }
}

static void test_other_model(void **st) {
    (void)st;
    const char *var = tmp("variant");
    make_variant(var, true);
    const char *d[1] = {tmp("rta-0")};
    size_t l1, l2;
    char *before = slurp(d[0], "manifest.json", &l1);
    df_error e = {0};
    df_pack_write_result res;
    int rc = df_pack_write(var, d, 1, NULL, &res, &e);
    expect_err(rc, &e, "holds a complete pack of a different model", d[0]);
    char *after = slurp(d[0], "manifest.json", &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(before, after, l1);
    free(before);
    free(after);
    assert_false(file_exists(d[0], "progress"));
    assert_false(file_exists(d[0], "experts.bin.partial"));

    /* reading the pack with the other model */
    df_model vm;
    assert_int_equal(df_model_load(&vm, var, &e), 0);
    df_pack *p;
    df_pack_ckpt vck = ckpt_of(&vm);
    rc = df_pack_open(&p, d, 1, &vck, &e);
    expect_err(rc, &e, "built from a different model", d[0]);
    df_model_free(&vm);

    /* an unfinished pack of another model is not taken over either */
    const char *u[1] = {tmp("other-partial")};
    df_pack_write_opts o = {0};
    o.stop_after_records = 3;
    o.checkpoint_every_records = 1;
    expect_err(pack_into(u, 1, &o, &res, &e), &e, "stopped", NULL);
    rc = df_pack_write(var, u, 1, NULL, &res, &e);
    expect_err(rc, &e, "holds an unfinished pack of a different model", u[0]);

    /* same config and shapes, different weights: the data samples tell them apart */
    const char *var2 = tmp("variant2");
    make_variant(var2, false);
    const df_tensor *t = df_expert_part(&g_m.experts, 0, 0, 0);
    char shard[700];
    snprintf(shard, sizeof shard, "%s", df_st_file_path(g_m.st, t->file));
    const char *base = strrchr(shard, '/') + 1;
    flip(var2, base, t->file_offset);
    char fa[DF_PACK_FP_HEX + 1], fb[DF_PACK_FP_HEX + 1];
    df_model m2;
    assert_int_equal(df_model_load(&m2, var2, &e), 0);
    df_pack_ckpt ck2 = ckpt_of(&m2);
    assert_int_equal(df_pack_fingerprint(&g_ck, fa, &e), 0);
    assert_int_equal(df_pack_fingerprint(&ck2, fb, &e), 0);
    assert_string_not_equal(fa, fb);
    rc = df_pack_open(&p, d, 1, &ck2, &e);
    expect_err(rc, &e, "different model", NULL);
    df_model_free(&m2);
}

/* ---- command line ---------------------------------------------------------------------------- */

static int run_cli(int n, ...) {
    char *argv[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[n] = NULL;
    fflush(stdout);
    int saved = dup(1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    int rc = cli_pack_main(n, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(devnull);
    return rc;
}

static void test_cli(void **st) {
    (void)st;
    char *out0 = (char *)tmp("cli-0"), *out1 = (char *)tmp("cli-1");
    assert_int_equal(run_cli(1, "--help"), 0);
    assert_int_equal(run_cli(0), 2);
    assert_int_equal(run_cli(1, "--bogus"), 2);
    assert_int_equal(run_cli(2, "--model", g_model), 2);
    assert_int_equal(run_cli(1, "--verify"), 2);
    assert_int_equal(run_cli(2, "--out", out0), 2);
    assert_int_equal(run_cli(1, "--model"), 2);
    assert_int_equal(run_cli(6, "--quiet", "--model", g_model, "--out", out0, "--out"), 2);
    assert_int_equal(run_cli(6, "--quiet", "--model", g_model, "--out", out0, "stray"), 2);
    assert_int_equal(run_cli(6, "--quiet", "--model", g_model, "--out", out0, "--out=" ), 2);
    char o1[700];
    snprintf(o1, sizeof o1, "--out=%s", out1);
    assert_int_equal(run_cli(6, "--quiet", "--model", g_model, "--out", out0, o1), 0);
    assert_int_equal(run_cli(6, "--quiet", "--model", g_model, "--out", out1, o1), 2);
    assert_int_equal(run_cli(5, "--model", g_model, "--out", out1, o1 /* same twice */), 2);
    assert_int_equal(run_cli(7, "--quiet", "--model", g_model, "--out", out1, "--out", out0), 0);
    assert_int_equal(run_cli(3, "--verify", out1, out0), 0);
    assert_int_equal(run_cli(2, "--verify", out1), 2);
    assert_int_equal(run_cli(4, "--verify", out1, out0, "--model"), 2);
    /* a damaged byte: verify fails with exit code 2 */
    flip(out0, "experts.bin", 3);
    assert_int_equal(run_cli(3, "--verify", out0, out1), 2);
}

/* ---- the DeepSeek-V3 family ------------------------------------------------------------------------ */

static df_model g_moe; /* engine-moe while a test runs on another checkpoint */
static char g_moe_dir[512];

/* Per-test setup: the tests' checkpoint (g_model, g_m, g_ck) becomes engine-ds
 * (sharded: its experts lie in four files; q-LoRA MLA, one shared expert, a
 * dense first layer); the teardown puts engine-moe back. */
static int on_ds(void **st) {
    (void)st;
    const char *d = getenv("DF_TEST_MODELS");
    g_moe = g_m; /* moved back into g_m (whose address its weight list holds) */
    snprintf(g_moe_dir, sizeof g_moe_dir, "%s", g_model);
    snprintf(g_model, sizeof g_model, "%s/engine-ds", d ? d : "build/test-models");
    df_error e = {0};
    if (df_model_load(&g_m, g_model, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    g_ck = ckpt_of(&g_m);
    return 0;
}

static int off_ds(void **st) {
    (void)st;
    df_model_free(&g_m);
    g_m = g_moe;
    snprintf(g_model, sizeof g_model, "%s", g_moe_dir);
    g_ck = ckpt_of(&g_m);
    return 0;
}

/* Packs of 1 and 2 stripes read back byte for byte, verify, are up to date
 * when packed again (roundtrip); they hold the routed experts and nothing
 * else, the manifest names the layout's parts, and the fingerprint is stable
 * and is not engine-moe's. */
static void test_family_pack(void **st) {
    (void)st;
    assert_string_equal(g_m.cfg.model_type, "deepseek_v3");
    assert_true(g_m.cfg.n_shared_experts > 0);
    roundtrip(1, "ds1");
    roundtrip(2, "ds2");
    const char *one[1] = {tmp("rtds1-0")};
    /* the records hold exactly the routed experts' bytes */
    df_pack *p;
    df_error e = {0};
    assert_int_equal(df_pack_open(&p, one, 1, &g_ck, &e), 0);
    uint64_t bytes = 0;
    for (int i = 0; i < df_pack_count(p); i++) bytes += df_pack_at(p, i)->length;
    assert_int_equal(bytes, g_m.experts.bytes);
    assert_int_equal(bytes, g_m.bytes_experts);
    uint64_t shared = 0;
    for (size_t i = 0; i < df_st_count(g_m.st); i++)
        if (strstr(df_st_at(g_m.st, i)->name, ".shared_experts.")) shared += df_st_at(g_m.st, i)->nbytes;
    assert_true(shared > 0);
    assert_true(g_m.bytes_dense >= shared); /* counted with the always-active weights */
    char fp[DF_PACK_FP_HEX + 1], fp2[DF_PACK_FP_HEX + 1], fp_moe[DF_PACK_FP_HEX + 1];
    assert_int_equal(df_pack_fingerprint(&g_ck, fp, &e), 0);
    assert_string_equal(df_pack_model_fingerprint(p), fp);
    df_pack_close(p);
    /* the manifest: the family, the layout's part names, no shared expert */
    size_t len;
    char *man = slurp(one[0], "manifest.json", &len);
    assert_non_null(man);
    assert_non_null(strstr(man, "\"architecture\": \"deepseek_v3\""));
    for (int k = 0; k < g_m.experts.layout->n_parts; k++) {
        char q[160];
        snprintf(q, sizeof q, "[\"%s\", \"BF16\"", g_m.experts.layout->part[k]);
        assert_non_null(strstr(man, q));
    }
    assert_null(strstr(man, "shared"));
    free(man);
    /* stable: again, and from the checkpoint loaded anew; another model's differs */
    assert_int_equal(df_pack_fingerprint(&g_ck, fp2, &e), 0);
    assert_string_equal(fp, fp2);
    df_model m2;
    assert_int_equal(df_model_load(&m2, g_model, &e), 0);
    df_pack_ckpt ck2 = ckpt_of(&m2);
    assert_int_equal(df_pack_fingerprint(&ck2, fp2, &e), 0);
    assert_string_equal(fp, fp2);
    df_model_free(&m2);
    df_pack_ckpt moe = ckpt_of(&g_moe);
    assert_int_equal(df_pack_fingerprint(&moe, fp_moe, &e), 0);
    assert_string_not_equal(fp, fp_moe);
    /* the engine-moe checkpoint is refused by this pack, and by name */
    expect_err(df_pack_open(&p, one, 1, &moe, &e), &e, "different model", one[0]);
    /* the command line: pack the sharded checkpoint, verify */
    char *out = (char *)tmp("ds-cli");
    assert_int_equal(run_cli(5, "--quiet", "--model", g_model, "--out", out), 0);
    assert_int_equal(run_cli(2, "--verify", out), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_1),
        cmocka_unit_test(test_roundtrip_2),
        cmocka_unit_test(test_roundtrip_3),
        cmocka_unit_test(test_direct_or_buffered),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_resume_damaged),
        cmocka_unit_test(test_resume_in_finish),
        cmocka_unit_test(test_other_model),
        cmocka_unit_test(test_cli),
        cmocka_unit_test_setup_teardown(test_family_pack, on_ds, off_ds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
