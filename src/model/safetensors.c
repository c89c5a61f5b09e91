/*
 * safetensors.c - owns the safetensors reader: validation of an untrusted
 * header (df_st_parse), the read-only mappings of one or many shard files, the
 * cross-check of model.safetensors.index.json against the shards, and the
 * name -> tensor hash table the engine uses for its thousands of look-ups.
 *
 * Nothing from a header is trusted: lengths and offsets are checked in 64-bit
 * arithmetic with explicit overflow checks before anything is added to a
 * pointer, and tensors are sorted by offset to prove they do not overlap.
 */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation's limit: a larger header is hostile, not big. */
#define DF_ST_MAX_HEADER 100000000ull

/* Names are attacker-controlled and may be huge; messages show at most this. */
#define NM "%.200s"

/* ---- header parsing ------------------------------------------------------ */

static uint64_t rd_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void df_st_free_tensors(df_tensor *t, size_t n) {
    if (!t) return;
    for (size_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

/* data_offsets are kept relative to the data region while parsing; the sort
 * and the overlap proof work on them. */
typedef struct st_span {
    uint64_t begin, end;
    size_t idx;
} st_span;

static int span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx; /* header order: deterministic */
}

/* shape: an array of at most DF_MAX_DIMS non-negative integers whose element
 * and byte counts fit 64 bits (t->dtype is set). */
static int parse_shape(const char *what, const char *name, json_t *js, df_tensor *t, df_error *err) {
    if (!json_is_array(js))
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': shape is not an array", what,
                       name);
    size_t nd = json_array_size(js);
    if (nd > DF_MAX_DIMS)
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': shape has %zu dimensions (max %d)",
                       what, name, nd, DF_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t elems = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(js, d);
        if (!json_is_integer(e))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: tensor '" NM "': shape[%zu] is not an integer", what, name, d);
        json_int_t dim = json_integer_value(e);
        if (dim < 0)
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': shape[%zu] is negative (%lld)",
                           what, name, d, (long long)dim);
        t->shape[d] = (int64_t)dim;
        if (__builtin_mul_overflow(elems, (uint64_t)dim, &elems))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: tensor '" NM "': element count of the shape overflows", what, name);
    }
    if (__builtin_mul_overflow(elems, (uint64_t)df_dtype_size(t->dtype), &t->nbytes))
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': byte size of the shape overflows",
                       what, name);
    return DF_OK;
}

/* data_offsets: [begin, end] inside the data region, spanning exactly the
 * shape's t->nbytes. */
static int parse_offsets(const char *what, const char *name, json_t *jo, uint64_t data_len,
                         const df_tensor *t, st_span *sp, df_error *err) {
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: tensor '" NM "': data_offsets is not an array of two integers", what,
                       name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < 0)
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': negative data_offsets [%lld, %lld]",
                       what, name, (long long)b, (long long)e);
    if (e < b)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: tensor '" NM "': data_offsets end %lld is before begin %lld", what, name,
                       (long long)e, (long long)b);
    if ((uint64_t)e > data_len)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: tensor '" NM "': data_offsets end %lld is past the end of the data "
                       "(%llu bytes; file truncated?)",
                       what, name, (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != t->nbytes)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: tensor '" NM "': data_offsets span %lld bytes but %s shape needs %llu",
                       what, name, (long long)(e - b), df_dtype_name(t->dtype),
                       (unsigned long long)t->nbytes);
    sp->begin = (uint64_t)b;
    sp->end = (uint64_t)e;
    return DF_OK;
}

/* One tensor's entry: exactly the keys dtype, shape and data_offsets. */
static int parse_entry(const char *what, const char *name, json_t *v, uint64_t data_len,
                       df_tensor *t, st_span *sp, df_error *err) {
    if (!json_is_object(v))
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': entry is not a JSON object",
                       what, name);
    json_t *jd = NULL, *js = NULL, *jo = NULL;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") == 0) jd = x;
        else if (strcmp(k, "shape") == 0) js = x;
        else if (strcmp(k, "data_offsets") == 0) jo = x;
        else
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': unknown key '" NM "'",
                           what, name, k);
    }
    if (!jd) return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': missing 'dtype'", what, name);
    if (!js) return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': missing 'shape'", what, name);
    if (!jo)
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': missing 'data_offsets'", what,
                       name);

    if (!json_is_string(jd))
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': dtype is not a string", what,
                       name);
    int dt = df_dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': unknown dtype '%.40s'", what,
                       name, json_string_value(jd));
    t->dtype = (df_dtype)dt;
    int rc = parse_shape(what, name, js, t, err);
    return rc ? rc : parse_offsets(what, name, jo, data_len, t, sp, err);
}

static int check_metadata(const char *what, json_t *v, df_error *err) {
    if (!json_is_object(v))
        return df_fail(err, DF_ERR_FORMAT, "%s: __metadata__ is not a JSON object", what);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!json_is_string(x))
            return df_fail(err, DF_ERR_FORMAT, "%s: __metadata__ value '" NM "' is not a string",
                           what, k);
    }
    return DF_OK;
}

/* The 8-byte length and the JSON object it covers; *data_start: the data
 * region's offset in the file. */
static int read_header(const uint8_t *file_data, size_t file_len, const char *what, json_t **root,
                       uint64_t *data_start, df_error *err) {
    if (file_len < 8)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for a safetensors header", what,
                       file_len);
    uint64_t hlen = rd_le64(file_data);
    if (hlen > DF_ST_MAX_HEADER)
        return df_fail(err, DF_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit",
                       what, (unsigned long long)hlen, DF_ST_MAX_HEADER);
    if (hlen > (uint64_t)file_len - 8)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: header length %llu exceeds the file size (%zu bytes; file truncated?)",
                       what, (unsigned long long)hlen, file_len);
    *data_start = 8 + hlen;
    json_error_t je;
    *root = json_loadb((const char *)file_data + 8, (size_t)hlen,
                       JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!*root)
        return df_fail(err, DF_ERR_FORMAT, "%s: header is not valid JSON: %s (line %d, column %d)",
                       what, je.text, je.line, je.column);
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return df_fail(err, DF_ERR_FORMAT, "%s: header is not a JSON object", what);
    }
    return DF_OK;
}

/* Every entry of the header but __metadata__, into t and sp (header order);
 * *cnt: how many were filled, also on failure (their names are owned). */
static int parse_entries(json_t *root, const char *what, uint64_t data_len, df_tensor *t,
                         st_span *sp, size_t *cnt, df_error *err) {
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            int rc = check_metadata(what, val, err);
            if (rc) return rc;
            continue;
        }
        int rc = parse_entry(what, key, val, data_len, &t[*cnt], &sp[*cnt], err);
        if (rc) return rc;
        t[*cnt].name = df_xstrdup(key);
        sp[*cnt].idx = *cnt;
        (*cnt)++;
    }
    return DF_OK;
}

/* Sorts sp by offset and proves the tensors disjoint: each non-empty one must
 * start at or after the furthest end seen so far; empty tensors occupy
 * nothing and cannot overlap. */
static int check_overlaps(const char *what, const df_tensor *t, st_span *sp, size_t cnt,
                          df_error *err) {
    qsort(sp, cnt, sizeof *sp, span_cmp);
    uint64_t max_end = 0;
    size_t max_idx = (size_t)-1;
    for (size_t i = 0; i < cnt; i++) {
        if (sp[i].begin == sp[i].end) continue;
        if (max_idx != (size_t)-1 && sp[i].begin < max_end)
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: tensor '" NM "': data [%llu, %llu) overlaps tensor '" NM
                           "' [.., %llu)",
                           what, t[sp[i].idx].name, (unsigned long long)sp[i].begin,
                           (unsigned long long)sp[i].end, t[max_idx].name,
                           (unsigned long long)max_end);
        max_end = sp[i].end;
        max_idx = sp[i].idx;
    }
    return DF_OK;
}

int df_st_parse(const uint8_t *file_data, size_t file_len, const char *what,
                df_tensor **tensors, size_t *n, df_error *err) {
    if (!what) what = "safetensors";
    if (!tensors || !n || (!file_data && file_len))
        return df_fail(err, DF_ERR_ARG, "%s: df_st_parse: bad arguments", what);
    *tensors = NULL;
    *n = 0;
    json_t *root;
    uint64_t data_start;
    int rc = read_header(file_data, file_len, what, &root, &data_start, err);
    if (rc) return rc;

    size_t cap = json_object_size(root), cnt = 0;
    df_tensor *t = df_xcalloc(cap ? cap : 1, sizeof *t);
    st_span *sp = df_xcalloc(cap ? cap : 1, sizeof *sp);
    rc = parse_entries(root, what, (uint64_t)file_len - data_start, t, sp, &cnt, err);
    json_decref(root);
    if (!rc) rc = check_overlaps(what, t, sp, cnt, err);
    if (rc) {
        df_st_free_tensors(t, cnt);
        free(sp);
        return rc;
    }

    /* Hand the tensors out in file order (deterministic, and the order a reader
     * streaming the file would meet them). */
    df_tensor *out = df_xcalloc(cnt ? cnt : 1, sizeof *out);
    for (size_t i = 0; i < cnt; i++) {
        out[i] = t[sp[i].idx];
        out[i].file_offset = data_start + sp[i].begin;
        /* Pointer arithmetic only on a real buffer (NULL + n is undefined). */
        out[i].data = file_data ? file_data + out[i].file_offset : NULL;
        out[i].file = 0;
    }
    free(t);
    free(sp);
    *tensors = out;
    *n = cnt;
    return DF_OK;
}

/* ---- name lookup --------------------------------------------------------- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final avalanche */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* ---- directories, shards, mappings -------------------------------------- */

typedef struct st_file {
    char *path;
    int fd;
    void *map;
    size_t size;
} st_file;

struct df_st {
    st_file *files;
    int n_files;
    df_tensor *t;
    size_t n;
    size_t *slot; /* open addressing; tensor index + 1, 0 = empty */
    size_t mask;
    char *where;  /* the file that lists the tensors (df_st_where) */
};

size_t df_st_count(const df_st *st) { return st ? st->n : 0; }
const df_tensor *df_st_at(const df_st *st, size_t i) {
    return st && i < st->n ? &st->t[i] : NULL;
}
size_t df_st_index(const df_st *st, const df_tensor *t) { return (size_t)(t - st->t); }
const char *df_st_file_path(const df_st *st, int file) {
    return st && file >= 0 && file < st->n_files ? st->files[file].path : NULL;
}
int df_st_file_count(const df_st *st) { return st ? st->n_files : 0; }
const char *df_st_where(const df_st *st) { return st ? st->where : NULL; }
int df_st_file_fd(const df_st *st, int file) {
    return st && file >= 0 && file < st->n_files ? st->files[file].fd : -1;
}

const df_tensor *df_st_find(const df_st *st, const char *name) {
    if (!st || !name || !st->slot) return NULL;
    for (size_t i = name_hash(name) & st->mask;; i = (i + 1) & st->mask) {
        size_t s = st->slot[i];
        if (!s) return NULL;
        if (strcmp(st->t[s - 1].name, name) == 0) return &st->t[s - 1];
    }
}

/* Builds the table; fails on a name present twice (only possible across shards). */
static int build_index(df_st *st, df_error *err) {
    size_t cap = 16;
    while (cap < 2 * st->n + 1) cap <<= 1;
    st->slot = df_xcalloc(cap, sizeof *st->slot);
    st->mask = cap - 1;
    for (size_t k = 0; k < st->n; k++) {
        size_t i = name_hash(st->t[k].name) & st->mask;
        for (;; i = (i + 1) & st->mask) {
            size_t s = st->slot[i];
            if (!s) break;
            if (strcmp(st->t[s - 1].name, st->t[k].name) == 0) {
                const df_tensor *a = &st->t[s - 1], *b = &st->t[k];
                return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': also present in %s",
                               st->files[b->file].path, b->name, st->files[a->file].path);
            }
        }
        st->slot[i] = k + 1;
    }
    return DF_OK;
}

void df_st_close(df_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        if (st->files[i].fd >= 0) close(st->files[i].fd);
        free(st->files[i].path);
    }
    free(st->files);
    df_st_free_tensors(st->t, st->n);
    free(st->slot);
    free(st->where);
    free(st);
}

int df_st_from_tensors(df_st **out, df_tensor *t, size_t n, const char *what, df_error *err) {
    *out = NULL;
    df_st *st = df_xcalloc(1, sizeof *st);
    st->files = df_xcalloc(1, sizeof *st->files);
    st->n_files = 1;
    st->files[0] = (st_file){.path = df_xstrdup(what), .fd = -1};
    st->where = df_xstrdup(what);
    st->t = t;
    st->n = n;
    for (size_t i = 0; i < n; i++) t[i].file = 0;
    int rc = build_index(st, err);
    if (rc) {
        df_st_close(st);
        return rc;
    }
    *out = st;
    return DF_OK;
}

/* Maps one file and appends its tensors. The file is added to st->files before
 * anything can fail so that df_st_close releases it. */
static int open_one(df_st *st, const char *path, df_tensor **got, size_t *n_got, df_error *err) {
    st->files = df_xrealloc(st->files, (size_t)(st->n_files + 1) * sizeof *st->files);
    int fi = st->n_files++;
    st_file *f = &st->files[fi];
    f->path = df_xstrdup(path);
    f->fd = -1;
    f->map = NULL;
    f->size = 0;

    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* df_fd_clear_nonblock */
    if (f->fd < 0) return df_fail(err, DF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0)
        return df_fail(err, DF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return df_fail(err, DF_ERR_IO, "%s: not a regular file", path);
    df_fd_clear_nonblock(f->fd); /* its expert reads go through io_uring */
    if (sb.st_size < 8)
        return df_fail(err, DF_ERR_FORMAT,
                       "%s: file is %lld bytes, too short for a safetensors header", path,
                       (long long)sb.st_size);
    f->size = (size_t)sb.st_size;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (m == MAP_FAILED) return df_fail(err, DF_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    f->map = m;

    df_tensor *t;
    size_t n;
    int rc = df_st_parse(m, f->size, path, &t, &n, err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) t[i].file = fi;
    st->t = df_xrealloc(st->t, (st->n + n) * sizeof *st->t);
    memcpy(st->t + st->n, t, n * sizeof *t);
    free(t); /* names now owned by st->t */
    if (got) *got = st->t + st->n;
    if (n_got) *n_got = n;
    st->n += n;
    return DF_OK;
}

/* A shard name from the index must name a file beside it, nothing else. */
static bool plain_file_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Distinct shard names of the index's weight_map in order of first mention. */
static int shard_names(json_t *wm, const char *index_path, const char **shard, size_t *n_shard,
                       df_error *err) {
    const char *name;
    json_t *v;
    *n_shard = 0;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v))
            return df_fail(err, DF_ERR_FORMAT, "%s: weight_map entry for tensor '" NM
                           "' is not a string", index_path, name);
        const char *s = json_string_value(v);
        if (!plain_file_name(s))
            return df_fail(err, DF_ERR_FORMAT,
                           "%s: tensor '" NM "': shard name '" NM "' is not a file name in the "
                           "checkpoint directory", index_path, name, s);
        /* Neighbouring entries often share a shard: try the latest first. */
        if (*n_shard && strcmp(shard[*n_shard - 1], s) == 0) continue;
        size_t j = 0;
        while (j < *n_shard && strcmp(shard[j], s) != 0) j++;
        if (j == *n_shard) shard[(*n_shard)++] = s;
    }
    if (*n_shard == 0) return df_fail(err, DF_ERR_FORMAT, "%s: weight_map is empty", index_path);
    return DF_OK;
}

/* Opens one shard; every tensor in it must be listed in the index under it. */
static int open_shard(df_st *st, const char *dir, const char *shard, json_t *wm, const char *index_path,
                      df_error *err) {
    char *path = df_path_join(dir, shard);
    df_tensor *got;
    size_t n_got;
    int rc = open_one(st, path, &got, &n_got, err);
    for (size_t i = 0; rc == DF_OK && i < n_got; i++) {
        json_t *w = json_object_get(wm, got[i].name);
        if (!w)
            rc = df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': not listed in %s", path, got[i].name,
                         index_path);
        else if (strcmp(json_string_value(w), shard) != 0)
            rc = df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': %s places it in '" NM "'", path,
                         got[i].name, index_path, json_string_value(w));
    }
    free(path);
    return rc;
}

/* Every shard tensor is in the index under its own shard and names are
 * unique, so equal counts mean the index lists nothing that is absent. */
static int check_index_complete(const df_st *st, json_t *wm, size_t n_idx, const char *index_path,
                                df_error *err) {
    if (st->n == n_idx) return DF_OK;
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!df_st_find(st, name))
            return df_fail(err, DF_ERR_FORMAT, "%s: tensor '" NM "': listed in %s but not in that "
                           "shard", index_path, name, json_string_value(v));
    }
    return df_fail(err, DF_ERR_FORMAT, "%s: index lists %zu tensors, shards hold %zu", index_path, n_idx,
                   st->n);
}

static int open_sharded(df_st *st, const char *dir, const char *index_path, df_error *err) {
    char *text;
    size_t len;
    int rc = df_read_file(index_path, &text, &len, err);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    free(text);
    if (!root)
        return df_fail(err, DF_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)",
                       index_path, je.text, je.line, je.column);
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        json_decref(root);
        return df_fail(err, DF_ERR_FORMAT, "%s: field 'weight_map' must be an object", index_path);
    }
    size_t n_idx = json_object_size(wm), n_shard = 0;
    const char **shard = df_xcalloc(n_idx ? n_idx : 1, sizeof *shard);
    rc = shard_names(wm, index_path, shard, &n_shard, err);
    for (size_t j = 0; rc == DF_OK && j < n_shard; j++) rc = open_shard(st, dir, shard[j], wm, index_path, err);
    if (rc == DF_OK) rc = build_index(st, err);
    if (rc == DF_OK) rc = check_index_complete(st, wm, n_idx, index_path, err);
    free(shard);
    json_decref(root);
    return rc;
}

int df_st_open_dir(df_st **out, const char *dir, df_error *err) {
    if (!out || !dir) return df_fail(err, DF_ERR_ARG, "df_st_open_dir: bad arguments");
    *out = NULL;
    df_st *st = df_xcalloc(1, sizeof *st);
    char *index_path = df_path_join(dir, "model.safetensors.index.json");
    int rc;
    if (access(index_path, F_OK) == 0) {
        st->where = df_xstrdup(index_path);
        rc = open_sharded(st, dir, index_path, err);
    } else {
        char *path = df_path_join(dir, "model.safetensors");
        st->where = df_xstrdup(path);
        rc = open_one(st, path, NULL, NULL, err);
        if (rc == DF_ERR_IO && access(path, F_OK) != 0)
            rc = df_fail(err, DF_ERR_IO, "%s: not found (nor model.safetensors.index.json "
                         "beside it)", path);
        free(path);
        if (rc == DF_OK) rc = build_index(st, err);
    }
    free(index_path);
    if (rc) {
        df_st_close(st);
        return rc;
    }
    *out = st;
    return DF_OK;
}
