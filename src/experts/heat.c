/*
 * heat.c - the decayed expert heat histogram and its crash-safe persistence
 * (format and rationale in heat.h).
 */
#include "experts/heat.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char HEAT_MAGIC[8] = {'D', 'F', 'H', 'E', 'A', 'T', '\r', '\n'};
#define HEAT_HDR 40
/* fold the lazy scale back into the entries before it gets near overflow */
#define HEAT_SCALE_MAX 18446744073709551616.0 /* 2^64 */

uint32_t df_crc32(uint32_t crc, const void *data, size_t n) {
    static uint32_t table[256];
    static int init;
    if (!init) { /* benign race: every thread computes the same table */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        init = 1;
    }
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

int df_heat_init(df_heat *h, int n_layers, int n_experts, double half_life, df_error *err) {
    memset(h, 0, sizeof *h);
    if (n_layers < 1 || n_experts < 1 || n_layers > 65536 || n_experts > 65536 ||
        (int64_t)n_layers * n_experts > (1 << 26))
        return df_fail(err, DF_ERR_ARG, "heat: bad shape %d layers x %d experts", n_layers,
                       n_experts);
    if (!(half_life > 0) || !isfinite(half_life)) half_life = DF_HEAT_DEFAULT_HALF_LIFE;
    h->n_layers = n_layers;
    h->n_experts = n_experts;
    h->half_life = half_life;
    h->decay = exp2(-1.0 / half_life);
    h->scale = 1.0;
    h->v = calloc((size_t)n_layers * (size_t)n_experts, sizeof *h->v);
    if (!h->v) return df_fail(err, DF_ERR_NOMEM, "heat: out of memory");
    return DF_OK;
}

void df_heat_free(df_heat *h) {
    if (!h) return;
    free(h->v);
    memset(h, 0, sizeof *h);
}

void df_heat_clear(df_heat *h) {
    if (h->v) memset(h->v, 0, (size_t)h->n_layers * (size_t)h->n_experts * sizeof *h->v);
    h->tokens = 0;
    h->norm = 0;
    h->scale = 1.0;
}

int df_heat_copy(df_heat *dst, const df_heat *src, df_error *err) {
    int rc = df_heat_init(dst, src->n_layers, src->n_experts, src->half_life, err);
    if (rc) return rc;
    memcpy(dst->v, src->v, (size_t)src->n_layers * (size_t)src->n_experts * sizeof *src->v);
    dst->tokens = src->tokens;
    dst->norm = src->norm;
    dst->scale = src->scale;
    return DF_OK;
}

static void fold_scale(df_heat *h) {
    size_t n = (size_t)h->n_layers * (size_t)h->n_experts;
    double inv = 1.0 / h->scale;
    for (size_t i = 0; i < n; i++) h->v[i] *= inv;
    h->scale = 1.0;
}

void df_heat_token_end(df_heat *h) {
    h->tokens++;
    /* the heat of a key used in every token, decayed like the entries below */
    h->norm = (h->norm + 1.0) * h->decay;
    h->scale /= h->decay;
    if (h->scale > HEAT_SCALE_MAX) fold_scale(h);
}

void df_heat_scale(df_heat *h, double f) {
    if (!(f > 0) || f >= 1.0) return;
    size_t n = (size_t)h->n_layers * (size_t)h->n_experts;
    for (size_t i = 0; i < n; i++) h->v[i] *= f;
    h->norm *= f;
}

typedef struct {
    double heat;
    int32_t key;
} heat_rank;

static int cmp_rank(const void *a, const void *b) {
    const heat_rank *x = a, *y = b;
    if (x->heat != y->heat) return x->heat > y->heat ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

int df_heat_top(const df_heat *h, int n, int32_t *keys) {
    int nk = h->n_layers * h->n_experts;
    if (n > nk) n = nk;
    if (n <= 0) return 0;
    heat_rank *r = df_xmalloc((size_t)nk * sizeof *r);
    for (int i = 0; i < nk; i++) {
        r[i].heat = h->v[i];
        r[i].key = i;
    }
    qsort(r, (size_t)nk, sizeof *r, cmp_rank);
    int hot = 0;
    for (int i = 0; i < n; i++) {
        keys[i] = r[i].key;
        if (r[i].heat > 0) hot++;
    }
    free(r);
    return hot;
}

/* ---- persistence -------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void putf64(unsigned char *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    put64(p, u);
}
static double getf64(const unsigned char *p) {
    uint64_t u = get64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

int df_heat_save(const df_heat *h, const char *path, df_error *err) {
    size_t nk = (size_t)h->n_layers * (size_t)h->n_experts;
    size_t size = HEAT_HDR + nk * 8 + 4;
    unsigned char *buf = df_xmalloc(size);
    memcpy(buf, HEAT_MAGIC, 8);
    put32(buf + 8, DF_HEAT_VERSION);
    put32(buf + 12, (uint32_t)h->n_layers);
    put32(buf + 16, (uint32_t)h->n_experts);
    put32(buf + 20, 0);
    putf64(buf + 24, h->half_life);
    put64(buf + 32, h->tokens);
    for (size_t i = 0; i < nk; i++) putf64(buf + HEAT_HDR + 8 * i, h->v[i] / h->scale);
    put32(buf + size - 4, df_crc32(0, buf, size - 4));

    /* temp name unique per process so two writers never share a temp file */
    size_t pl = strlen(path);
    char *tmp = df_xmalloc(pl + 32);
    snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
    int rc = DF_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = df_fail(err, DF_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    int we = df_pwrite_full(fd, buf, size, 0);
    if (we != 0) {
        rc = df_fail(err, DF_ERR_IO, "%s: write failed: %s", tmp, strerror(we));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (fsync(fd) != 0) {
        rc = df_fail(err, DF_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) != 0) {
        rc = df_fail(err, DF_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = df_fail(err, DF_ERR_IO, "%s: rename to %s failed: %s", tmp, path,
                     strerror(errno));
        unlink(tmp);
        goto out;
    }
    /* make the rename itself durable */
    {
        char *dir = df_xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash == dir) slash[1] = 0;
        else if (slash) *slash = 0;
        else strcpy(dir, ".");
        df_fsync_dir(dir); /* best effort */
        free(dir);
    }
out:
    free(tmp);
    free(buf);
    return rc;
}

const char *df_heat_load_result_name(df_heat_load_result r) {
    switch (r) {
    case DF_HEAT_LOADED: return "loaded";
    case DF_HEAT_MISSING: return "missing";
    case DF_HEAT_CORRUPT: return "corrupt";
    case DF_HEAT_MISMATCH: return "mismatch";
    }
    return "?";
}

df_heat_load_result df_heat_load(df_heat *h, const char *path, df_error *why) {
    df_heat_clear(h);
    char *data = NULL;
    size_t len = 0;
    df_error e;
    if (df_read_file(path, &data, &len, &e) != DF_OK) {
        struct stat st;
        if (stat(path, &st) != 0 && errno == ENOENT) {
            df_fail(why, DF_ERR_IO, "%s: no heat file yet, starting empty", path);
            return DF_HEAT_MISSING;
        }
        df_fail(why, DF_ERR_FORMAT, "%s (starting with empty heat)", e.msg);
        return DF_HEAT_CORRUPT;
    }
    const unsigned char *p = (const unsigned char *)data;
    df_heat_load_result res = DF_HEAT_CORRUPT;
    size_t nk = (size_t)h->n_layers * (size_t)h->n_experts;
    if (len < HEAT_HDR + 4 || memcmp(p, HEAT_MAGIC, 8) != 0) {
        df_fail(why, DF_ERR_FORMAT, "%s: not a heat file (%zu bytes, bad magic or too short); "
                "starting with empty heat", path, len);
        goto out;
    }
    uint32_t ver = get32(p + 8);
    if (ver != DF_HEAT_VERSION) {
        df_fail(why, DF_ERR_FORMAT, "%s: heat file version %u, expected %d; starting with "
                "empty heat", path, ver, DF_HEAT_VERSION);
        goto out;
    }
    uint32_t fl = get32(p + 12), fe = get32(p + 16);
    uint64_t want = (uint64_t)HEAT_HDR + (uint64_t)fl * fe * 8 + 4;
    if (fl == 0 || fe == 0 || fl > 65536 || fe > 65536 || want != len) {
        df_fail(why, DF_ERR_FORMAT, "%s: heat file is %zu bytes, its header (%u x %u) "
                "implies %llu%s; starting with empty heat", path, len, fl, fe,
                (unsigned long long)want, len < want ? " (truncated?)" : "");
        goto out;
    }
    uint32_t crc = get32(p + len - 4), got = df_crc32(0, p, len - 4);
    if (crc != got) {
        df_fail(why, DF_ERR_FORMAT, "%s: heat file checksum mismatch (stored %08x, "
                "computed %08x); starting with empty heat", path, crc, got);
        goto out;
    }
    double fhl = getf64(p + 24);
    if (!(fhl > 0) || !isfinite(fhl)) {
        df_fail(why, DF_ERR_FORMAT, "%s: bad half-life %g; starting with empty heat", path,
                fhl);
        goto out;
    }
    if ((int)fl != h->n_layers || (int)fe != h->n_experts) {
        df_fail(why, DF_ERR_FORMAT, "%s: heat is for %u layers x %u experts, the model has "
                "%d x %d; starting with empty heat", path, fl, fe, h->n_layers,
                h->n_experts);
        res = DF_HEAT_MISMATCH;
        goto out;
    }
    for (size_t i = 0; i < nk; i++) {
        double v = getf64(p + HEAT_HDR + 8 * i);
        if (!(v >= 0) || !isfinite(v)) {
            df_fail(why, DF_ERR_FORMAT, "%s: heat entry %zu (layer %zu, expert %zu) is %g; "
                    "starting with empty heat", path, i, i / fe, i % fe, v);
            df_heat_clear(h);
            goto out;
        }
        h->v[i] = v;
    }
    h->tokens = get64(p + 32);
    h->scale = 1.0;
    /* what a key used in every one of `tokens` tokens would have, at our decay */
    h->norm = h->tokens > 0 ? h->decay * (1.0 - pow(h->decay, (double)h->tokens)) /
                                  (1.0 - h->decay)
                            : 0.0;
    res = DF_HEAT_LOADED;
    df_fail(why, DF_OK, "%s: heat loaded (%llu tokens)", path,
            (unsigned long long)h->tokens);
out:
    free(data);
    return res;
}
