/*
 * test_pack.c - the expert pack: pack the synthetic MoE checkpoint
 * ($DF_TEST_MODELS/engine-moe) with 1, 2 and 3 stripes and read every record
 * back byte for byte; verify; corruption, interrupted and resumed packs, a
 * different model, broken pack sets, a truncated data file and a full disk
 * (injected, and a real 200 KiB tmpfs when the test may mount one). The
 * DeepSeek-V3 family's sharded checkpoints pack the same way: routed experts
 * only (shared experts stay with the always-active weights), parts named in
 * the manifest, a fingerprint that is stable and tells the models apart.
 */
#include "testutil.h"

#include "experts/pack.h"
#include "cli/cli.h" /* the command-line tests: cli/pack.c, cli/cachesim.c */
#include "model/model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];
static char g_model[512];
static df_model g_m;
static df_pack_ckpt g_ck; /* g_m as the pack sees it */

static df_pack_ckpt ckpt_of(const df_model *m) { return (df_pack_ckpt){NULL, &m->cfg, m->st, &m->experts}; }

/* Records of g_m's pack: one per routed expert of each MoE layer. */
static int n_records(void) {
    int n = 0;
    for (int li = 0; li < g_m.cfg.num_hidden_layers; li++) n += g_m.cfg.layer_is_moe[li] ? g_m.cfg.num_experts : 0;
    return n;
}

static const char *tmp(const char *name) {
    static char bufs[16][600];
    static int k;
    char *b = bufs[k++ % 16];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

static bool file_exists(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static char *slurp(const char *dir, const char *name, size_t *len) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *d = NULL;
    df_error e;
    if (df_read_file(p, &d, len, &e)) return NULL;
    return d;
}

static void flip(const char *dir, const char *name, uint64_t off) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    uint8_t c;
    assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

static int pack_into(const char *const *dirs, int n, const df_pack_write_opts *o,
                     df_pack_write_result *res, df_error *e) {
    return df_pack_write(g_model, dirs, n, o, res, e);
}

static void pack_ok(const char *const *dirs, int n) {
    df_error e = {0};
    df_pack_write_result res;
    int rc = pack_into(dirs, n, NULL, &res, &e);
    if (rc) fail_msg("pack: %s", e.msg);
    assert_false(res.up_to_date);
    assert_int_equal(res.records, n_records());
}

/* Every record of the model read back through the pack equals the checkpoint's
 * bytes; padding is zero; layout rules hold. */
static void check_all_records(const char *const *dirs, int n) {
    df_pack *p;
    df_error e = {0};
    int rc = df_pack_open(&p, dirs, n, &g_ck, &e);
    if (rc) fail_msg("open: %s", e.msg);
    assert_int_equal(df_pack_stripes(p), n);
    assert_int_equal(df_pack_count(p), n_records());
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p));
    assert_non_null(buf);
    int idx = 0;
    uint64_t next_off = 0;
    for (int li = 0; li < g_m.cfg.num_hidden_layers; li++) {
        if (!g_m.cfg.layer_is_moe[li]) {
            assert_null(df_pack_find(p, li, 0));
            continue;
        }
        for (int ex = 0; ex < g_m.cfg.num_experts; ex++, idx++) {
            const df_pack_record *r = df_pack_find(p, li, ex);
            assert_non_null(r);
            assert_ptr_equal(r, df_pack_at(p, idx)); /* layer-major, experts ascending */
            assert_int_equal(r->layer, li);
            assert_int_equal(r->expert, ex);
            assert_int_equal(r->offset, next_off);
            assert_int_equal(r->offset % DF_PACK_ALIGN, 0);
            assert_int_equal(r->padded % ((uint64_t)DF_PACK_ALIGN * (uint64_t)n), 0);
            assert_int_equal(df_pack_stripe_bytes(r, n) % DF_PACK_ALIGN, 0);
            next_off += df_pack_stripe_bytes(r, n);
            memset(buf, 0xee, r->padded);
            rc = df_pack_read_record(p, r, buf, &e);
            if (rc) fail_msg("read layer %d expert %d: %s", li, ex, e.msg);
            uint64_t off = 0;
            assert_int_equal(r->n_parts, 3);
            assert_int_equal(r->n_parts, g_m.experts.layout->n_parts);
            for (int k = 0; k < r->n_parts; k++) {
                const df_tensor *w = df_expert_part(&g_m.experts, li, ex, k);
                assert_string_equal(r->part[k].name, g_m.experts.layout->part[k]);
                assert_int_equal(r->part[k].offset, off);
                assert_int_equal(r->part[k].nbytes, w->nbytes);
                assert_int_equal(r->part[k].dtype, w->dtype);
                assert_int_equal(r->part[k].ndim, 2);
                assert_int_equal(r->part[k].shape[0], w->shape[0]);
                assert_int_equal(r->part[k].shape[1], w->shape[1]);
                assert_memory_equal(buf + off, w->data, w->nbytes);
                off += w->nbytes;
            }
            assert_int_equal(r->length, off);
            for (uint64_t b = off; b < r->padded; b++) assert_int_equal(buf[b], 0);
        }
    }
    assert_null(df_pack_find(p, g_m.cfg.num_hidden_layers - 1, g_m.cfg.num_experts));
    assert_null(df_pack_find(p, 99, 0));
    assert_null(df_pack_find(p, -1, 0));
    for (int s = 0; s < n; s++) {
        assert_true(df_pack_fd(p, s) >= 0);
        struct stat sb;
        assert_int_equal(fstat(df_pack_fd(p, s), &sb), 0);
        assert_int_equal((uint64_t)sb.st_size, next_off);
    }
    assert_int_equal(df_pack_fd(p, n), -1);
    free(buf);
    df_pack_close(p);
}

static void expect_err(int rc, const df_error *e, const char *a, const char *b) {
    if (rc == 0) fail_msg("expected an error containing '%s'", a);
    if (!strstr(e->msg, a) || (b && !strstr(e->msg, b)))
        fail_msg("error '%s' does not contain '%s'%s%s", e->msg, a, b ? " and " : "", b ? b : "");
    assert_null(strchr(e->msg, '\n'));
}

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

/* ---- corruption ------------------------------------------------------------------- */

static void test_corrupt(void **st) {
    (void)st;
    const char *d1[1] = {tmp("bad1")};
    pack_ok(d1, 1);
    df_pack *p;
    df_error e = {0};
    assert_int_equal(df_pack_open(&p, d1, 1, &g_ck, &e), 0);
    const df_pack_record *r = df_pack_find(p, 2, 3);
    uint64_t off = r->offset + r->part[g_m.experts.layout->mat[DF_XM_UP].values].offset + 77;
    df_pack_close(p);
    flip(d1[0], "experts.bin", off);

    int rc = df_pack_verify(d1, 1, &e);
    expect_err(rc, &e, "layer 2 expert 3: checksum mismatch", d1[0]);
    char want[700];
    snprintf(want, sizeof want, "pack %s: layer 2 expert 3: checksum mismatch", d1[0]);
    assert_string_equal(e.msg, want);

    assert_int_equal(df_pack_open(&p, d1, 1, &g_ck, &e), 0);
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p));
    rc = df_pack_read_record(p, df_pack_find(p, 2, 3), buf, &e);
    expect_err(rc, &e, "layer 2 expert 3: checksum mismatch", d1[0]);
    assert_int_equal(df_pack_read_record(p, df_pack_find(p, 2, 2), buf, &e), 0);
    free(buf);
    df_pack_close(p);

    /* two bad records: the first is named, the count given */
    assert_int_equal(df_pack_open(&p, d1, 1, &g_ck, &e), 0);
    r = df_pack_find(p, 0, 1);
    off = r->offset + 5;
    df_pack_close(p);
    flip(d1[0], "experts.bin", off);
    rc = df_pack_verify(d1, 1, &e);
    expect_err(rc, &e, "layer 0 expert 1: checksum mismatch", "2 of 16 records bad");
}

static void test_corrupt_striped(void **st) {
    (void)st;
    const char *d[2] = {tmp("bad2-0"), tmp("bad2-1")};
    pack_ok(d, 2);
    df_pack *p;
    df_error e = {0};
    assert_int_equal(df_pack_open(&p, d, 2, &g_ck, &e), 0);
    const df_pack_record *r = df_pack_find(p, 0, 6);
    uint64_t sb = df_pack_stripe_bytes(r, 2);
    assert_true(r->length > sb); /* the flipped byte is real data in stripe 1 */
    uint64_t off = r->offset + 100;
    uint64_t pad_off = r->offset + sb - 1; /* last byte of stripe 1: padding */
    assert_true(sb + sb - 1 >= r->length);
    df_pack_close(p);
    flip(d[1], "experts.bin", off);
    int rc = df_pack_verify(d, 2, &e);
    expect_err(rc, &e, "layer 0 expert 6: checksum mismatch", d[1]);
    flip(d[1], "experts.bin", off); /* undo */
    assert_int_equal(df_pack_verify(d, 2, &e), 0);

    /* padding only: the record reads fine, verify still reports the stripe */
    flip(d[1], "experts.bin", pad_off);
    assert_int_equal(df_pack_open(&p, d, 2, &g_ck, &e), 0);
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p));
    assert_int_equal(df_pack_read_record(p, df_pack_find(p, 0, 6), buf, &e), 0);
    free(buf);
    df_pack_close(p);
    rc = df_pack_verify(d, 2, &e);
    expect_err(rc, &e, "layer 0 expert 6: checksum mismatch", d[1]);
}

/* ---- interrupted and resumed ---------------------------------------------------------- */

/* The manifest text with the uuid line blanked (the only run-dependent field). */
static char *manifest_sans_uuid(const char *dir, size_t *len) {
    char *m = slurp(dir, "manifest.json", len);
    assert_non_null(m);
    char *u = strstr(m, "\"uuid\": \"");
    assert_non_null(u);
    memset(u + 9, 'x', 36);
    return m;
}

static void assert_same_pack(const char *a, const char *b) {
    size_t la, lb;
    char *x = slurp(a, "experts.bin", &la), *y = slurp(b, "experts.bin", &lb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(la, lb);
    assert_memory_equal(x, y, la);
    free(x);
    free(y);
    x = manifest_sans_uuid(a, &la);
    y = manifest_sans_uuid(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(x, y, la);
    free(x);
    free(y);
}

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

/* ---- broken sets and files ---------------------------------------------------------------- */

static void test_open_errors(void **st) {
    (void)st;
    df_error e = {0};
    df_pack *p = NULL;
    int rc;
    const char *missing[1] = {tmp("no-such-dir")};
    rc = df_pack_open(&p, missing, 1, &g_ck, &e);
    expect_err(rc, &e, "directory not found", missing[0]);
    rc = df_pack_verify(missing, 1, &e);
    expect_err(rc, &e, "directory not found", NULL);

    const char *empty[1] = {tmp("empty-dir")};
    mkdir(empty[0], 0777);
    rc = df_pack_open(&p, empty, 1, &g_ck, &e);
    expect_err(rc, &e, "no manifest.json", "not a deltafin pack");

    /* one stripe of a 2-stripe pack */
    const char *b[2] = {tmp("rtb-0"), tmp("rtb-1")};
    rc = df_pack_open(&p, b, 1, &g_ck, &e);
    expect_err(rc, &e, "2-stripe pack", "1 directory was given");
    /* the same directory twice */
    const char *twice[2] = {b[0], b[0]};
    rc = df_pack_open(&p, twice, 2, &g_ck, &e);
    expect_err(rc, &e, "holds stripe 0, and so does", NULL);
    /* stripe 0 of one set with stripe 1 of another */
    const char *mixed[2] = {b[0], tmp("res-1")};
    rc = df_pack_open(&p, mixed, 2, &g_ck, &e);
    expect_err(rc, &e, "belongs to a different pack", NULL);
    /* 3-stripe pack given 2 */
    const char *c[2] = {tmp("rtc-0"), tmp("rtc-2")};
    rc = df_pack_open(&p, c, 2, &g_ck, &e);
    expect_err(rc, &e, "3-stripe pack", NULL);
    assert_null(p);
}

static void copy_pack(const char *from, const char *to) {
    mkdir(to, 0777);
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/manifest.json", from);
    snprintf(b, sizeof b, "%s/manifest.json", to);
    df_test_copy_file(a, b);
    snprintf(a, sizeof a, "%s/experts.bin", from);
    snprintf(b, sizeof b, "%s/experts.bin", to);
    df_test_copy_file(a, b);
}

static void test_truncated(void **st) {
    (void)st;
    const char *d[1] = {tmp("trunc")};
    copy_pack(tmp("rta-0"), d[0]);
    char path[700];
    snprintf(path, sizeof path, "%s/experts.bin", d[0]);
    df_error e = {0};
    df_pack *p;
    /* truncated after opening: the read fails cleanly */
    assert_int_equal(df_pack_open(&p, d, 1, &g_ck, &e), 0);
    assert_int_equal(truncate(path, 5 * 28672 + 1000), 0);
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, df_pack_max_padded(p));
    int rc = df_pack_read_record(p, df_pack_at(p, 9), buf, &e);
    expect_err(rc, &e, "layer 2 expert 1", "truncated");
    rc = df_pack_read_record(p, df_pack_at(p, 5), buf, &e);
    expect_err(rc, &e, "layer 0 expert 5", "truncated");
    assert_int_equal(df_pack_read_record(p, df_pack_at(p, 4), buf, &e), 0);
    free(buf);
    df_pack_close(p);
    /* truncated before: refused at open, and by verify */
    rc = df_pack_open(&p, d, 1, &g_ck, &e);
    expect_err(rc, &e, "experts.bin is 144360 bytes", "truncated");
    rc = df_pack_verify(d, 1, &e);
    expect_err(rc, &e, "truncated", NULL);
    /* missing data file */
    unlink(path);
    rc = df_pack_open(&p, d, 1, &g_ck, &e);
    expect_err(rc, &e, "experts.bin is missing", NULL);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_manifest(void **st) {
    (void)st;
    const char *d[1] = {tmp("badman")};
    copy_pack(tmp("rta-0"), d[0]);
    size_t len;
    char *orig = slurp(d[0], "manifest.json", &len);
    df_error e = {0};
    df_pack *p;
    int rc;

    write_text(d[0], "manifest.json", "{\"format\": \"deltafin-pack\", ");
    expect_err(df_pack_open(&p, d, 1, &g_ck, &e), &e, "not valid JSON", NULL);
    write_text(d[0], "manifest.json", "[1,2,3]");
    expect_err(df_pack_open(&p, d, 1, &g_ck, &e), &e, "not a deltafin pack manifest", NULL);

    struct { const char *from, *to, *want; } cases[] = {
        {"\"version\": 2", "\"version\": 3", "format version 3"},
        {"\"version\": 2", "\"version\": 0", "format version 0"},
        {"\"version\": 2", "\"version\": 1", "malformed"}, /* a version-2 record table */
        {"\"stripes\": 1", "\"stripes\": 0", "'stripes'"},
        {"\"align\": 4096", "\"align\": 512", "'align'"},
        {"[0, 1, 28672, 27648", "[0, 1, 28673, 27648", "not a multiple of 4096"},
        {"[0, 1, 28672, 27648", "[0, 1, 0, 27648", "overlaps"},
        {"[0, 1, 28672, 27648", "[0, 0, 28672, 27648", "appear twice"},
        {"[0, 1, 28672, 27648", "[0, 1, 28672, 27649", "do not add up"},
        {"[0, 1, 28672, 27648", "[0, 1, 28672000, 27648", "past data_bytes"},
        {"[0, 1, 28672, 27648", "[7, 1, 28672, 27648", "malformed"},
        {"\"BF16\", [48, 96], 9216]", "\"BF16\", [48, 96], 9217]", "malformed"},
        {"\"BF16\", [48, 96], 9216]", "\"Q4\", [48, 96], 9216]", "malformed"},
        {"\"BF16\", [48, 96], 9216]", "\"BF16\", [48, 96, 1, 1, 1], 9216]", "malformed"},
        {"\"BF16\", [48, 96], 9216]", "\"BF16\", [], 9216]", "malformed"},
        {"[[\"gate_proj.weight\"", "[[\"\"", "malformed"},
        {"[[\"gate_proj.weight\"", "[[7", "malformed"},
        {", [[\"gate_proj.weight\"", ", [], [[\"gate_proj.weight\"", "malformed"},
        {"\"fingerprint\": \"", "\"fingerprint\": \"zz", "'fingerprint'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = strstr(orig, cases[i].from);
        assert_non_null(s);
        size_t pre = (size_t)(s - orig), fl = strlen(cases[i].from), tl = strlen(cases[i].to);
        char *t = malloc(len + tl + 1);
        memcpy(t, orig, pre);
        memcpy(t + pre, cases[i].to, tl);
        memcpy(t + pre + tl, s + fl, len - pre - fl + 1);
        write_text(d[0], "manifest.json", t);
        free(t);
        rc = df_pack_open(&p, d, 1, &g_ck, &e);
        expect_err(rc, &e, cases[i].want, d[0]);
        rc = df_pack_open(&p, d, 1, NULL, &e);
        expect_err(rc, &e, cases[i].want, NULL);
    }
    /* a part named otherwise than the model's layout names it: well-formed,
     * but not this model's */
    {
        const char *from = "[[\"gate_proj.weight\"", *to = "[[\"w1.weight\"";
        char *s = strstr(orig, from);
        assert_non_null(s);
        size_t pre = (size_t)(s - orig), fl = strlen(from), tl = strlen(to);
        char *t = malloc(len + tl + 1);
        memcpy(t, orig, pre);
        memcpy(t + pre, to, tl);
        memcpy(t + pre + tl, s + fl, len - pre - fl + 1);
        write_text(d[0], "manifest.json", t);
        free(t);
        rc = df_pack_open(&p, d, 1, &g_ck, &e);
        expect_err(rc, &e, "part 0 is 'w1.weight', the model's is 'gate_proj.weight'", d[0]);
        rc = df_pack_open(&p, d, 1, NULL, &e);
        if (rc) fail_msg("open without the model: %s", e.msg);
        df_pack_close(p);
    }
    /* a damaged manifest is not overwritten by pack either */
    write_text(d[0], "manifest.json", "[1,2,3]");
    df_pack_write_result res;
    rc = pack_into(d, 1, NULL, &res, &e);
    expect_err(rc, &e, "not a deltafin pack manifest", "not overwriting");
    free(orig);
}

/* ---- writer errors ------------------------------------------------------------------------- */

static void test_write_errors(void **st) {
    (void)st;
    df_error e = {0};
    df_pack_write_result res;
    int rc;
    /* a file where a directory should be */
    const char *f[1] = {tmp("a-file")};
    write_text(g_root, "a-file", "x");
    rc = pack_into(f, 1, NULL, &res, &e);
    expect_err(rc, &e, "not a directory", f[0]);
    /* parent missing */
    const char *deep[1] = {tmp("no/such/parent")};
    rc = pack_into(deep, 1, NULL, &res, &e);
    expect_err(rc, &e, "cannot create the directory", deep[0]);
    /* the same directory twice */
    const char *twice[2] = {tmp("twice"), tmp("twice/")};
    rc = pack_into(twice, 2, NULL, &res, &e);
    expect_err(rc, &e, "are the same directory", NULL);
    /* a complete pack of this model, other striping: refused, not rewritten */
    const char *one[1] = {tmp("rtb-0")};
    rc = pack_into(one, 1, NULL, &res, &e);
    expect_err(rc, &e, "with 2 stripe(s)", "1 directory was given");
    /* a complete pack plus an empty directory */
    const char *plus[2] = {tmp("rta-0"), tmp("fresh-extra")};
    rc = pack_into(plus, 2, NULL, &res, &e);
    expect_err(rc, &e, "with 1 stripe(s)", NULL);
    /* another writer holds the directory */
    const char *busy[1] = {tmp("busy")};
    mkdir(busy[0], 0777);
    int lk = open(busy[0], O_RDONLY | O_DIRECTORY);
    assert_int_equal(flock(lk, LOCK_EX), 0);
    rc = pack_into(busy, 1, NULL, &res, &e);
    close(lk);
    expect_err(rc, &e, "another deltafin pack is writing there", busy[0]);
    assert_false(file_exists(busy[0], "progress"));
    /* a dense model */
    char dense[600];
    snprintf(dense, sizeof dense, "%.*s/engine-dense", (int)(strrchr(g_model, '/') - g_model), g_model);
    const char *dd[1] = {tmp("dense-out")};
    rc = df_pack_write(dense, dd, 1, NULL, &res, &e);
    expect_err(rc, &e, "no routed experts", NULL);
    /* a missing model */
    rc = df_pack_write(tmp("no-model"), dd, 1, NULL, &res, &e);
    assert_int_not_equal(rc, 0);
}

/* ---- full disk -------------------------------------------------------------------------------- */

static void assert_only_partials(const char *dir) {
    assert_false(file_exists(dir, "manifest.json"));
    assert_false(file_exists(dir, "experts.bin"));
    assert_false(file_exists(dir, "manifest.json.partial"));
    assert_true(file_exists(dir, "experts.bin.partial"));
    assert_true(file_exists(dir, "progress"));
}

static void test_enospc_injected(void **st) {
    (void)st;
    const char *d[2] = {tmp("full-0"), tmp("full-1")};
    df_pack_write_opts o = {0};
    o.fail_enospc_after_bytes = 100000;
    o.checkpoint_every_records = 1;
    df_error e = {0};
    df_pack_write_result res;
    int rc = pack_into(d, 2, &o, &res, &e);
    expect_err(rc, &e, "disk full writing experts.bin.partial", "resume");
    assert_true(strstr(e.msg, d[0]) || strstr(e.msg, d[1]));
    assert_only_partials(d[0]);
    assert_only_partials(d[1]);
    /* space freed: the same command finishes the job */
    rc = pack_into(d, 2, NULL, &res, &e);
    if (rc) fail_msg("resume: %s", e.msg);
    assert_true(res.resumed_from > 0);
    check_all_records(d, 2);
    const char *clean[2] = {tmp("rtb-0"), tmp("rtb-1")};
    assert_same_pack(d[0], clean[0]);
    assert_same_pack(d[1], clean[1]);
}

/* A real 200 KiB tmpfs, where this test may mount one (root, not in a
 * restricted container); otherwise only the injected case above runs. */
static void test_enospc_tmpfs(void **st) {
    (void)st;
    const char *mnt = tmp("small-fs");
    mkdir(mnt, 0777);
    if (geteuid() != 0 || mount("tmpfs", mnt, "tmpfs", 0, "size=200k") != 0) {
        print_message("cannot mount a tmpfs here (%s): real full-disk case skipped\n",
                      strerror(errno));
        return;
    }
    const char *d[1] = {tmp("small-fs/pack")};
    df_error e = {0};
    df_pack_write_result res;
    int rc = pack_into(d, 1, NULL, &res, &e);
    expect_err(rc, &e, "not enough free space", d[0]);
    df_pack_write_opts o = {0};
    o.skip_space_check = true;
    o.checkpoint_every_records = 1;
    rc = pack_into(d, 1, &o, &res, &e);
    if (rc == 0 || !strstr(e.msg, "disk full")) {
        umount2(mnt, MNT_DETACH);
        fail_msg("expected a disk-full error, got rc %d: %s", rc, e.msg);
    }
    bool ok = !file_exists(d[0], "manifest.json") && !file_exists(d[0], "experts.bin") &&
              file_exists(d[0], "progress") && file_exists(d[0], "experts.bin.partial");
    umount2(mnt, MNT_DETACH);
    assert_true(ok);
}

/* The reader on a tmpfs copy (O_DIRECT there depends on the kernel: the flag
 * reported must match the descriptor), then forced buffered. */
static void test_tmpfs_and_buffered(void **st) {
    (void)st;
    const char *mnt = tmp("tmpfs-ro");
    mkdir(mnt, 0777);
    bool mounted = geteuid() == 0 && mount("tmpfs", mnt, "tmpfs", 0, "size=4m") == 0;
    if (!mounted) print_message("cannot mount a tmpfs here: using the plain directory\n");
    const char *d[1] = {tmp("tmpfs-ro/p")};
    copy_pack(tmp("rta-0"), d[0]);
    df_pack *p;
    df_error e = {0};
    int rc = df_pack_open(&p, d, 1, &g_ck, &e);
    bool consistent = rc == 0 &&
                      df_pack_is_direct(p, 0) == ((fcntl(df_pack_fd(p, 0), F_GETFL) & O_DIRECT) != 0);
    if (rc == 0) df_pack_close(p);
    df_error ve = {0};
    int vrc = rc == 0 ? df_pack_verify(d, 1, &ve) : -1;
    setenv("DF_PACK_BUFFERED", "1", 1);
    df_error be = {0};
    int brc = df_pack_open(&p, d, 1, &g_ck, &be);
    bool buffered = brc == 0 && !df_pack_is_direct(p, 0) &&
                    !(fcntl(df_pack_fd(p, 0), F_GETFL) & O_DIRECT);
    if (brc == 0) df_pack_close(p);
    unsetenv("DF_PACK_BUFFERED");
    if (mounted) umount2(mnt, MNT_DETACH);
    if (rc) fail_msg("open: %s", e.msg);
    assert_true(consistent);
    if (vrc) fail_msg("verify: %s", ve.msg);
    if (brc) fail_msg("open buffered: %s", be.msg);
    assert_true(buffered);
    /* the buffered path reads every record correctly too */
    setenv("DF_PACK_BUFFERED", "1", 1);
    const char *r[1] = {tmp("rta-0")};
    check_all_records(r, 1);
    unsetenv("DF_PACK_BUFFERED");
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

/* ---- fixture ------------------------------------------------------------------------------------ */

static int setup(void **st) {
    (void)st;
    const char *d = getenv("DF_TEST_MODELS");
    snprintf(g_model, sizeof g_model, "%s/engine-moe", d ? d : "build/test-models");
    df_error e = {0};
    if (df_model_load(&g_m, g_model, &e)) {
        fprintf(stderr, "test_pack: cannot load %s (run tests/make_test_models.sh and set "
                "DF_TEST_MODELS): %s\n", g_model, e.msg);
        return -1;
    }
    g_ck = ckpt_of(&g_m);
    const char *t = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/df-pack-test-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_root)) return -1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    df_model_free(&g_m);
    df_test_rm_tree(g_root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_1),
        cmocka_unit_test(test_roundtrip_2),
        cmocka_unit_test(test_roundtrip_3),
        cmocka_unit_test(test_direct_or_buffered),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_corrupt_striped),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_resume_damaged),
        cmocka_unit_test(test_resume_in_finish),
        cmocka_unit_test(test_other_model),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_manifest),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_enospc_injected),
        cmocka_unit_test(test_enospc_tmpfs),
        cmocka_unit_test(test_tmpfs_and_buffered),
        cmocka_unit_test(test_cli),
        cmocka_unit_test_setup_teardown(test_family_pack, on_ds, off_ds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
