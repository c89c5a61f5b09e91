/*
 * test_pack_faults.c - the expert pack when things go wrong: corrupted records,
 * broken pack sets (missing, repeated or foreign stripes, a bad manifest), a
 * truncated data file, writer errors and a full disk (injected, and a real 200 KiB
 * tmpfs when the test may mount one). The round trips are in test_pack.c.
 */
#include "packtest.h"

/* The packs the tests below break or misuse: 1, 2 and 3 stripes, and a second
 * 2-stripe pack (another pack's stripe 1). */
static int setup_packs(void **st) {
    if (setup(st)) return -1;
    const char *a[1] = {tmp("rta-0")}, *b[2] = {tmp("rtb-0"), tmp("rtb-1")};
    const char *c[3] = {tmp("rtc-0"), tmp("rtc-1"), tmp("rtc-2")}, *o[2] = {tmp("oth-0"), tmp("oth-1")};
    pack_ok(a, 1);
    pack_ok(b, 2);
    pack_ok(c, 3);
    pack_ok(o, 2);
    return 0;
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
    const char *mixed[2] = {b[0], tmp("oth-1")};
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

static void test_bad_manifest(void **st) {
    (void)st;
    const char *d[1] = {tmp("badman")};
    copy_pack(tmp("rta-0"), d[0]);
    size_t len;
    char *orig = slurp(d[0], "manifest.json", &len);
    df_error e = {0};
    df_pack *p;
    int rc;

    df_test_write_text(d[0], "manifest.json", "{\"format\": \"deltafin-pack\", ");
    expect_err(df_pack_open(&p, d, 1, &g_ck, &e), &e, "not valid JSON", NULL);
    df_test_write_text(d[0], "manifest.json", "[1,2,3]");
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
        df_test_write_text(d[0], "manifest.json", t);
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
        df_test_write_text(d[0], "manifest.json", t);
        free(t);
        rc = df_pack_open(&p, d, 1, &g_ck, &e);
        expect_err(rc, &e, "part 0 is 'w1.weight', the model's is 'gate_proj.weight'", d[0]);
        rc = df_pack_open(&p, d, 1, NULL, &e);
        if (rc) fail_msg("open without the model: %s", e.msg);
        df_pack_close(p);
    }
    /* a damaged manifest is not overwritten by pack either */
    df_test_write_text(d[0], "manifest.json", "[1,2,3]");
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
    df_test_write_text(g_root, "a-file", "x");
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_corrupt_striped),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_manifest),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_enospc_injected),
        cmocka_unit_test(test_enospc_tmpfs),
        cmocka_unit_test(test_tmpfs_and_buffered),
    };
    return cmocka_run_group_tests(tests, setup_packs, teardown);
}
