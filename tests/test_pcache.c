/*
 * test_pcache.c - the prompt cache through the public API on synthetic
 * checkpoints of every family (Qwen3 dense and MoE: KV cache; DeepSeek-V3:
 * latent cache; Kimi-Linear and Kimi K3: recurrent KDA state and latent
 * cache): the logits after a restore are bit-identical to a fresh prefill's,
 * from the prompt's end and from an interval position (a recurrent model's
 * chunk split); df_generate gives the same tokens with and without it; corrupt,
 * truncated and foreign files are refused and removed and the restore falls
 * back to a shorter prefix; the directory stays under its size; a failed write
 * (full disk) turns writing off without failing; the RAM tier serves a restore
 * with no file left, and with its segments' files truncated in place.
 */
#include "testutil.h"

#include "deltafin.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NP 200    /* prompt that fills the cache */
#define NQ 220    /* later prompt sharing a prefix with it */
#define SHARED2 170 /* another one sharing less: restored from an interval position */
#define EVERY 16  /* interval asked for (the Kimi models' recurrent state makes theirs 80, 120) */
#define CTX 320

static const char *model(const char *name) {
    static char path[4][512];
    static int k;
    const char *d = getenv("DF_TEST_MODELS");
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", d ? d : "build/test-models", name);
    return p;
}

static void rand_tokens(int32_t *t, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % 1000);
    }
}

static char *new_dir(void) {
    char tmpl[] = "/tmp/df-pcache-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return df_xstrdup(d);
}

static void rm_dir(char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.' || strlen(de->d_name) > 2) {
            char *p = df_path_join(dir, de->d_name);
            unlink(p);
            free(p);
        }
    if (d) closedir(d);
    rmdir(dir);
    free(dir);
}

/* Files in dir and their bytes; *tmp: temporary files among them. */
static int dir_files(const char *dir, uint64_t *bytes, int *tmp) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    *bytes = 0, *tmp = 0;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = df_path_join(dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0) *bytes += (uint64_t)sb.st_size;
        free(p);
        *tmp += !strncmp(de->d_name, ".tmp-", 5);
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* The path of dir's file for position q (exactly one expected). */
static char *file_of(const char *dir, int q) {
    char pre[32];
    snprintf(pre, sizeof pre, "q%d-", q);
    DIR *d = opendir(dir);
    struct dirent *de;
    char *found = NULL;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, pre, strlen(pre))) {
            assert_null(found);
            found = df_path_join(dir, de->d_name);
        }
    if (d) closedir(d);
    if (!found) fail_msg("no file for position %d in %s", q, dir);
    return found;
}

/* The interval a session of e stores prompts at. */
static int interval(df_engine *e) {
    df_session *s;
    df_error err;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    int iv = df_session_cache_interval(s);
    df_session_free(s);
    return iv;
}

static df_engine *open_eng(const char *m, const char *dir, uint64_t size, uint64_t ram) {
    df_engine_opts o = {.model_dir = m, .n_threads = 2, .prompt_cache = dir, .prompt_cache_size = size,
                        .prompt_cache_ram = ram, .prompt_cache_every = EVERY};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", m, err.msg);
    return e;
}

typedef struct got {
    int32_t t[64];
    int n;
} got;

static int on_token(void *user, int32_t t) {
    got *g = user;
    if (g->n < 64) g->t[g->n++] = t;
    return 0;
}

/* Greedy generation of max_new tokens after prompt into out (may be NULL). */
static df_generate_result generate(df_engine *e, const int32_t *prompt, int n, int max_new, int32_t *out) {
    df_sampler_params sp;
    df_sampler_params_default(&sp);
    sp.temperature = 0;
    df_sampler *smp;
    df_error err;
    assert_int_equal(df_sampler_new(&smp, &sp, &err), DF_OK);
    df_session *s;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    got g = {.n = 0};
    df_generate_opts o = {.sampler = smp, .max_new = max_new, .prefill_chunk = 7, .on_token = on_token, .user = &g};
    df_generate_result r;
    if (df_generate(s, prompt, n, &o, &r, &err)) fail_msg("generate: %s", err.msg);
    if (out) memcpy(out, g.t, sizeof(int32_t) * (size_t)g.n);
    df_session_free(s);
    df_sampler_free(smp);
    return r;
}

/* Every row's logits of toks[0..n) from a fresh prefill, no cache. */
static float *fresh(const char *m, const int32_t *toks, int n, int *V) {
    df_engine_opts o = {.model_dir = m, .n_threads = 2};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &o, &err)) fail_msg("open %s: %s", m, err.msg);
    *V = df_engine_info(e)->vocab_size;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    float *lg = malloc(sizeof(float) * (size_t)*V * (size_t)n);
    if (df_session_eval(s, toks, n, lg, 1, &err)) fail_msg("eval: %s", err.msg);
    df_session_free(s);
    df_engine_close(e);
    return lg;
}

/* Restores the longest cached prefix of toks (at most n - 1), evaluates the
 * rest and checks its rows against ref bit for bit; returns where it restored to. */
static int restore_check(df_engine *e, const int32_t *toks, int n, const float *ref, int V) {
    df_error err;
    df_session *s;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    int at = df_session_cache_restore(s, toks, n - 1, &err);
    if (at < 0) fail_msg("restore: %s", err.msg);
    assert_int_equal(df_session_pos(s), at);
    assert_memory_equal(df_session_tokens(s), toks, sizeof(int32_t) * (size_t)at);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)(n - at));
    if (df_session_eval(s, toks + at, n - at, lg, 1, &err)) fail_msg("eval: %s", err.msg);
    for (int r = at; r < n; r++)
        if (memcmp(lg + (size_t)(r - at) * V, ref + (size_t)r * V, sizeof(float) * (size_t)V))
            fail_msg("restored at %d: row %d differs from a fresh prefill", at, r);
    free(lg);
    df_session_free(s);
    return at;
}

/* A prompt P that fills the cache, and Q (shares P's first `shared` tokens). */
static void prompts(int32_t *p, int32_t *q, int shared, uint32_t seed) {
    rand_tokens(p, NP, seed);
    rand_tokens(q, NQ, seed + 99);
    memcpy(q, p, sizeof(int32_t) * (size_t)shared);
    if (q[shared] == p[shared]) q[shared] = (q[shared] + 1) % 1000;
}

static void check_family(const char *name, uint32_t seed) {
    const char *m = model(name);
    char *dir = new_dir();
    int32_t p[NP], q[NQ], q2[NQ];
    prompts(p, q, NP - 1, seed);
    prompts(p, q2, SHARED2, seed);
    /* fill, then the same prompt again: same tokens, one row evaluated */
    int32_t first[8], again[8];
    df_engine *e = open_eng(m, dir, 0, 0);
    df_generate_result r1 = generate(e, p, NP, 6, first);
    df_engine_close(e);
    assert_int_equal(r1.prompt_cached, 0);
    e = open_eng(m, dir, 0, 0);
    df_generate_result r2 = generate(e, p, NP, 6, again);
    assert_int_equal(r2.prompt_cached, NP - 1);
    assert_int_equal(r2.produced, r1.produced);
    assert_memory_equal(first, again, sizeof(int32_t) * (size_t)r1.produced);
    df_stats st;
    df_engine_stats(e, &st);
    assert_int_equal(st.pcache_hits, 1);
    assert_true(st.pcache_bytes_read > 0);
    df_engine_close(e);
    /* logits after a restore: from the prompt's end (49), from an interval position (32) */
    int V;
    float *ref = fresh(m, q, NQ, &V), *ref2 = fresh(m, q2, NQ, &V);
    e = open_eng(m, dir, 0, 0);
    int iv = interval(e);
    assert_true(iv >= EVERY && iv <= SHARED2); /* an interval position lies in the shared prefix */
    assert_int_equal(restore_check(e, q, NQ, ref, V), NP - 1);
    assert_int_equal(restore_check(e, q2, NQ, ref2, V), SHARED2 / iv * iv);
    df_engine_close(e);
    free(ref), free(ref2);
    rm_dir(dir);
}

static void test_dense(void **st) { (void)st; check_family("engine-dense", 1); }
static void test_moe(void **st) { (void)st; check_family("engine-moe", 2); }
static void test_deepseek(void **st) { (void)st; check_family("engine-ds", 3); }
static void test_kimi_linear(void **st) { (void)st; check_family("engine-kimi-linear", 4); }
static void test_k3(void **st) { (void)st; check_family("engine-k3", 5); }

/* A restore that compares the wrong rows fails: the comparison is real. */
static void test_check_can_fail(void **st) {
    (void)st;
    const char *m = model("engine-dense");
    char *dir = new_dir();
    int32_t p[NP], q[NQ];
    prompts(p, q, NP - 1, 6);
    df_engine *e = open_eng(m, dir, 0, 0);
    generate(e, p, NP, 2, NULL);
    int V;
    float *ref = fresh(m, q, NQ, &V);
    df_session *s;
    df_error err;
    assert_int_equal(df_session_new(&s, e, CTX, &err), DF_OK);
    assert_int_equal(df_session_cache_restore(s, q, NQ - 1, &err), NP - 1);
    /* a position's row evaluated one position off differs */
    float *lg = malloc(sizeof(float) * (size_t)V);
    assert_int_equal(df_session_rollback(s, NP - 2, &err), NP - 2);
    assert_int_equal(df_session_eval(s, q + NP - 1, 1, lg, 0, &err), DF_OK);
    assert_int_not_equal(memcmp(lg, ref + (size_t)(NP - 1) * V, sizeof(float) * (size_t)V), 0);
    free(lg), free(ref);
    df_session_free(s);
    df_engine_close(e);
    rm_dir(dir);
}

/* Corrupt, truncated and foreign files: refused, removed, and the restore
 * falls back to the longest prefix whose chain holds (K3's interval is 80:
 * 80 <- 160 <- 199). */
static void test_bad_files(void **st) {
    (void)st;
    const char *m = model("engine-k3"), *other = model("engine-kimi-linear");
    char *dir = new_dir(), *dir2 = new_dir();
    int32_t p[NP], q[NQ];
    prompts(p, q, NP - 1, 7);
    int V;
    float *ref = fresh(m, q, NQ, &V);
    df_engine *e = open_eng(m, dir, 0, 0);
    assert_int_equal(interval(e), 80);
    generate(e, p, NP, 2, NULL);
    df_engine_close(e);
    e = open_eng(other, dir2, 0, 0);
    generate(e, p, NP, 2, NULL);
    df_engine_close(e);
    /* a flipped byte in the payload of 199 */
    char *f199 = file_of(dir, NP - 1);
    FILE *f = fopen(f199, "r+b");
    assert_non_null(f);
    fseek(f, -100, SEEK_END);
    int c = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    e = open_eng(m, dir, 0, 0);
    assert_int_equal(restore_check(e, q, NQ, ref, V), 160);
    assert_int_not_equal(access(f199, F_OK), 0);
    /* 160 cut in half */
    char *f160 = file_of(dir, 160);
    struct stat sb;
    assert_int_equal(stat(f160, &sb), 0);
    assert_int_equal(truncate(f160, sb.st_size / 2), 0);
    assert_int_equal(restore_check(e, q, NQ, ref, V), 80);
    assert_int_not_equal(access(f160, F_OK), 0);
    /* another model's file under this model's name for 80 */
    char *f80 = file_of(dir, 80), *o199 = file_of(dir2, NP - 1);
    assert_int_equal(rename(o199, f80), 0);
    assert_int_equal(restore_check(e, q, NQ, ref, V), 0);
    assert_int_not_equal(access(f80, F_OK), 0);
    df_stats s;
    df_engine_stats(e, &s);
    assert_int_equal(s.pcache_hits, 2);
    assert_int_equal(s.pcache_misses, 1);
    df_engine_close(e);
    free(f199), free(f160), free(f80), free(o199), free(ref);
    rm_dir(dir), rm_dir(dir2);
}

/* The directory never holds more than its size; the oldest files go. */
static void test_size_cap(void **st) {
    (void)st;
    const char *m = model("engine-dense");
    char *dir = new_dir();
    const uint64_t cap = 120000;
    df_engine *e = open_eng(m, dir, cap, 0);
    for (int i = 0; i < 6; i++) {
        int32_t p[NP], q[NQ];
        prompts(p, q, 10, 100 + (uint32_t)i);
        generate(e, p, NP, 2, NULL);
        uint64_t bytes;
        int tmp;
        dir_files(dir, &bytes, &tmp);
        assert_true(bytes <= cap);
        assert_int_equal(tmp, 0);
    }
    df_stats s;
    df_engine_stats(e, &s);
    assert_true(s.pcache_evicted > 0);
    assert_true(s.pcache_bytes_written > cap);
    df_engine_close(e);
    rm_dir(dir);
}

/* A write that fails (the disk is full) turns writing off: no failure, no
 * file left behind. */
static void test_full_disk(void **st) {
    (void)st;
    const char *m = model("engine-dense");
    char *dir = new_dir();
    int32_t p[NP], q[NQ], a[8], b[8];
    prompts(p, q, 10, 8);
    setenv("DF_TEST_PCACHE_FULL", "1", 1);
    df_engine *e = open_eng(m, dir, 0, 0);
    df_generate_result r = generate(e, p, NP, 4, a);
    df_stats s;
    df_engine_stats(e, &s);
    df_engine_close(e);
    unsetenv("DF_TEST_PCACHE_FULL");
    assert_int_equal(s.pcache_writes_off, 1);
    assert_int_equal(s.pcache_bytes_written, 0);
    uint64_t bytes;
    int tmp;
    assert_int_equal(dir_files(dir, &bytes, &tmp), 0);
    /* the same tokens as with a working cache */
    e = open_eng(m, dir, 0, 0);
    df_generate_result r2 = generate(e, p, NP, 4, b);
    df_engine_close(e);
    assert_int_equal(r.produced, r2.produced);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)r.produced);
    rm_dir(dir);
}

/* The RAM tier: with every file gone, the restore still finds the states. */
static void test_ram_tier(void **st) {
    (void)st;
    const char *m = model("engine-kimi-linear");
    char *dir = new_dir();
    int32_t p[NP], q[NQ];
    prompts(p, q, NP - 1, 9);
    int V;
    float *ref = fresh(m, q, NQ, &V);
    df_engine *e = open_eng(m, dir, 0, 1 << 20);
    generate(e, p, NP, 2, NULL);
    uint64_t bytes;
    int tmp;
    assert_int_equal(dir_files(dir, &bytes, &tmp), 3); /* 120, 199 and the end of the generation */
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] == 'q') {
            char *f = df_path_join(dir, de->d_name);
            unlink(f);
            free(f);
        }
    closedir(d);
    assert_int_equal(restore_check(e, q, NQ, ref, V), NP - 1);
    df_stats s;
    df_engine_stats(e, &s);
    assert_int_equal(s.pcache_bytes_read, 0);
    assert_int_equal(s.pcache_ram_hits, 2);
    assert_true(s.pcache_ram_bytes > 0 && s.pcache_ram_bytes <= 1 << 20);
    df_engine_close(e);
    free(ref);
    rm_dir(dir);
}

/* Segments read from files into the RAM tier are its own copies: after every
 * file is truncated in place (as `cp` over it does), the tier still restores
 * them (a file mapping kept there would fault with SIGBUS instead). */
static void test_ram_tier_from_files(void **st) {
    (void)st;
    const char *m = model("engine-kimi-linear");
    char *dir = new_dir();
    int32_t p[NP], q[NQ];
    prompts(p, q, NP - 1, 11);
    int V;
    float *ref = fresh(m, q, NQ, &V);
    df_engine *e = open_eng(m, dir, 0, 0);
    generate(e, p, NP, 2, NULL);
    df_engine_close(e);
    e = open_eng(m, dir, 0, 1 << 20);
    assert_int_equal(restore_check(e, q, NQ, ref, V), NP - 1); /* from the files, kept in RAM */
    df_stats s;
    df_engine_stats(e, &s);
    assert_true(s.pcache_bytes_read > 0);
    assert_int_equal(s.pcache_ram_hits, 0);
    DIR *d = opendir(dir);
    struct dirent *de;
    int cut = 0;
    while ((de = readdir(d)))
        if (de->d_name[0] == 'q') {
            char *f = df_path_join(dir, de->d_name);
            assert_int_equal(truncate(f, 0), 0);
            cut++;
            free(f);
        }
    closedir(d);
    assert_int_equal(cut, 3);
    assert_int_equal(restore_check(e, q, NQ, ref, V), NP - 1);
    df_engine_stats(e, &s);
    assert_int_equal(s.pcache_ram_hits, 2);
    df_engine_close(e);
    free(ref);
    rm_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),       cmocka_unit_test(test_moe),       cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_kimi_linear), cmocka_unit_test(test_k3),        cmocka_unit_test(test_check_can_fail),
        cmocka_unit_test(test_bad_files),   cmocka_unit_test(test_size_cap),  cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_ram_tier),    cmocka_unit_test(test_ram_tier_from_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
