/*
 * packtest.h - what the expert pack's tests (test_pack.c, test_pack_faults.c) share:
 * the synthetic MoE checkpoint ($DF_TEST_MODELS/engine-moe) loaded once per test binary,
 * a scratch directory, packing it, reading every record back against the checkpoint,
 * and the checks on errors and on two packs being the same.
 */
#ifndef DF_TESTS_PACKTEST_H
#define DF_TESTS_PACKTEST_H

#include "testutil.h"

#include "experts/pack.h"
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

static inline df_pack_ckpt ckpt_of(const df_model *m) { return (df_pack_ckpt){NULL, &m->cfg, m->st, &m->experts}; }

/* Records of g_m's pack: one per routed expert of each MoE layer. */
static inline int n_records(void) {
    int n = 0;
    for (int li = 0; li < g_m.cfg.num_hidden_layers; li++) n += g_m.cfg.layer_is_moe[li] ? g_m.cfg.num_experts : 0;
    return n;
}

static inline const char *tmp(const char *name) {
    static char bufs[16][600];
    static int k;
    char *b = bufs[k++ % 16];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

static inline bool file_exists(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static inline char *slurp(const char *dir, const char *name, size_t *len) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *d = NULL;
    df_error e;
    if (df_read_file(p, &d, len, &e)) return NULL;
    return d;
}

static inline void flip(const char *dir, const char *name, uint64_t off) {
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

static inline int pack_into(const char *const *dirs, int n, const df_pack_write_opts *o,
                     df_pack_write_result *res, df_error *e) {
    return df_pack_write(g_model, dirs, n, o, res, e);
}

static inline void pack_ok(const char *const *dirs, int n) {
    df_error e = {0};
    df_pack_write_result res;
    int rc = pack_into(dirs, n, NULL, &res, &e);
    if (rc) fail_msg("pack: %s", e.msg);
    assert_false(res.up_to_date);
    assert_int_equal(res.records, n_records());
}

/* Every record of the model read back through the pack equals the checkpoint's
 * bytes; padding is zero; layout rules hold. */
static inline void check_all_records(const char *const *dirs, int n) {
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

static inline void expect_err(int rc, const df_error *e, const char *a, const char *b) {
    if (rc == 0) fail_msg("expected an error containing '%s'", a);
    if (!strstr(e->msg, a) || (b && !strstr(e->msg, b)))
        fail_msg("error '%s' does not contain '%s'%s%s", e->msg, a, b ? " and " : "", b ? b : "");
    assert_null(strchr(e->msg, '\n'));
}

/* The manifest text with the uuid line blanked (the only run-dependent field). */
static inline char *manifest_sans_uuid(const char *dir, size_t *len) {
    char *m = slurp(dir, "manifest.json", len);
    assert_non_null(m);
    char *u = strstr(m, "\"uuid\": \"");
    assert_non_null(u);
    memset(u + 9, 'x', 36);
    return m;
}

/* Two packs hold the same bytes and the same manifest but for the uuid. */
static inline void assert_same_pack(const char *a, const char *b) {
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

/* ---- fixture ------------------------------------------------------------------------------------ */

static inline int setup(void **st) {
    (void)st;
    const char *d = getenv("DF_TEST_MODELS");
    snprintf(g_model, sizeof g_model, "%s/engine-moe", d ? d : "build/test-models");
    df_error e = {0};
    if (df_model_load(&g_m, g_model, &e)) {
        fprintf(stderr, "pack tests: cannot load %s (run tests/make_test_models.sh and set "
                "DF_TEST_MODELS): %s\n", g_model, e.msg);
        return -1;
    }
    g_ck = ckpt_of(&g_m);
    const char *t = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/df-pack-test-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_root)) return -1;
    return 0;
}

static inline int teardown(void **st) {
    (void)st;
    df_model_free(&g_m);
    df_test_rm_tree(g_root);
    return 0;
}

#endif
