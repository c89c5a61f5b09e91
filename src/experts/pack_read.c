/*
 * pack_read.c - the pack set reader: df_pack_open (every directory of a set,
 * manifest versions 1 and 2, checked against the checkpoint's fingerprint
 * and expert inventory when one is given), the record table and data files
 * the expert store reads, and a synchronous record reader with its checksum
 * check and one re-read from the device.
 */
#include "experts/pack_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

void df_pack_close(df_pack *p) {
    if (!p) return;
    for (int i = 0; i < p->S; i++) {
        if (p->fd && p->fd[i] >= 0) close(p->fd[i]);
        if (p->dir) free(p->dir[i]);
        if (p->sxxh3) free(p->sxxh3[i]);
    }
    free(p->dir);
    free(p->fd);
    free(p->direct);
    free(p->sxxh3);
    free(p->rec);
    free(p->parts);
    for (int i = 0; i < p->n_names; i++) free(p->names[i]);
    free(p->names);
    free(p->index);
    free(p);
}

/* Opens experts.bin with O_DIRECT where the filesystem supports it (a probe read
 * tells, since some accept the flag at open and refuse the reads). */
static int open_data_ro(const char *dir, uint64_t need, int *fd_out, bool *direct, df_error *err) {
    char *path = df_path_join(dir, DATA_NAME);
    const char *nd = getenv("DF_PACK_BUFFERED"); /* force the page cache (odd filesystems, tests) */
    int fd = nd && *nd && strcmp(nd, "0") ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
    *direct = fd >= 0;
    if (fd >= 0 && need >= DF_PACK_ALIGN) {
        void *probe = aligned_alloc(DF_PACK_ALIGN, DF_PACK_ALIGN);
        ssize_t r = probe ? pread(fd, probe, DF_PACK_ALIGN, 0) : -1;
        if (r < 0 && errno == EINVAL) {
            close(fd);
            fd = -1;
            *direct = false;
        }
        free(probe);
    }
    if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* df_fd_clear_nonblock */
    int e = errno;
    free(path);
    if (fd < 0) {
        if (e == ENOENT)
            return df_fail(err, DF_ERR_IO, "pack %s: " DATA_NAME " is missing", dir);
        return df_fail(err, DF_ERR_IO, "pack %s: " DATA_NAME ": cannot open: %s", dir, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return df_fail(err, DF_ERR_IO, "pack %s: " DATA_NAME " is not a regular file", dir);
    }
    df_fd_clear_nonblock(fd); /* before io_uring reads it */
    if ((uint64_t)sb.st_size < need) {
        close(fd);
        return df_fail(err, DF_ERR_IO, "pack %s: " DATA_NAME " is %lld bytes but the manifest "
                       "needs %" PRIu64 " (truncated?)", dir, (long long)sb.st_size, need);
    }
    *fd_out = fd;
    return DF_OK;
}

/* "[48,96]": a shape for messages. */
static void shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, "%s%" PRId64, d ? "," : "", shape[d]);
    if (k < n) snprintf(out + k, n - k, "]");
}

/* Record r's parts are the inventory's tensors of its (layer, expert): the
 * same names, in the layout's order, dtypes, shapes and sizes. */
static int check_parts(const df_pack_record *r, const df_expert_inventory *inv, const char *dir,
                       df_error *err) {
    const df_expert_layout *xl = inv->layout;
    if (r->n_parts != xl->n_parts)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: layer %d expert %d: %d parts, the model's "
                       "experts have %d", dir, r->layer, r->expert, r->n_parts, xl->n_parts);
    for (int k = 0; k < r->n_parts; k++) {
        const df_tensor *t = df_expert_part(inv, r->layer, r->expert, k);
        const df_pack_part *pt = &r->part[k];
        if (strcmp(pt->name, xl->part[k]) != 0)
            return df_fail(err, DF_ERR_FORMAT, "pack %s: layer %d expert %d: part %d is '%s', the "
                           "model's is '%s'", dir, r->layer, r->expert, k, pt->name, xl->part[k]);
        bool same = pt->dtype == t->dtype && pt->ndim == t->ndim && pt->nbytes == t->nbytes;
        for (int d = 0; same && d < t->ndim; d++) same = pt->shape[d] == t->shape[d];
        if (!same) {
            char a[96], b[96];
            shape_str(a, sizeof a, pt->ndim, pt->shape);
            shape_str(b, sizeof b, t->ndim, t->shape);
            return df_fail(err, DF_ERR_FORMAT, "pack %s: layer %d expert %d: part %d is %s %s, the "
                           "model's '%s' is %s %s", dir, r->layer, r->expert, k,
                           df_dtype_name(pt->dtype), a, t->name, df_dtype_name(t->dtype), b);
        }
    }
    return DF_OK;
}

static int check_against_ckpt(const df_pack *p, const pk_manifest *mf, const df_pack_ckpt *ck,
                              const char *dir, df_error *err) {
    char fp[DF_PACK_FP_HEX + 1];
    int rc = df_pack_fingerprint(ck, fp, err);
    if (rc) return rc;
    if (strcmp(fp, mf->fp) != 0)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: built from a different model (pack "
                       "fingerprint %s, this model's %s); repack it with deltafin pack", dir,
                       mf->fp, fp);
    const df_config *c = ck->cfg;
    int want = 0;
    for (int li = 0; li < c->num_hidden_layers; li++)
        if (c->layer_is_moe[li]) want += c->num_experts;
    if (mf->n_layers != c->num_hidden_layers || mf->n_experts != c->num_experts || p->n != want)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: has %d records for %d layers x %d experts, "
                       "the model needs %d for %d x %d", dir, p->n, mf->n_layers, mf->n_experts,
                       want, c->num_hidden_layers, c->num_experts);
    for (int i = 0; i < p->n; i++) {
        const df_pack_record *r = &p->rec[i];
        if (!c->layer_is_moe[r->layer])
            return df_fail(err, DF_ERR_FORMAT, "pack %s: record for layer %d, which has no "
                           "routed experts", dir, r->layer);
        if ((rc = check_parts(r, ck->inv, dir, err))) return rc;
    }
    return DF_OK;
}

static const char *unfinished_hint(const char *dir) {
    return pk_exists(dir, PROGRESS_NAME) || pk_exists(dir, DATA_PARTIAL)
               ? " (an unfinished pack: run deltafin pack again to complete it)"
               : " (not a deltafin pack directory)";
}

/* Directory d (given as dirs[i]) holds a manifest that belongs with the
 * first one read (f, from dirs[first]) and a stripe no other directory has. */
static int load_one(df_pack *p, pk_manifest *a, const char *d, const pk_manifest *f,
                    const char *first_dir, int n_dirs, df_error *err) {
    struct stat sb;
    if (!d || stat(d, &sb) != 0)
        return df_fail(err, DF_ERR_IO, "pack %s: %s", d ? d : "(null)",
                       d && errno == ENOENT ? "directory not found" : strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return df_fail(err, DF_ERR_IO, "pack %s: not a directory", d);
    if (!pk_exists(d, MANIFEST_NAME))
        return df_fail(err, DF_ERR_IO, "pack %s: no " MANIFEST_NAME "%s", d, unfinished_hint(d));
    int rc = pk_manifest_load(a, d, err);
    if (rc) return rc;
    if (!f) f = a;
    if (a->stripes != n_dirs)
        return df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d of a %d-stripe pack, but %d "
                       "director%s given: give every directory of the pack", d, a->stripe,
                       a->stripes, n_dirs, n_dirs == 1 ? "y was" : "ies were");
    if (strcmp(a->uuid, f->uuid) != 0)
        return df_fail(err, DF_ERR_ARG, "pack %s: belongs to a different pack than %s (uuid %s "
                       "vs %s)", d, first_dir, a->uuid, f->uuid);
    if (p->dir[a->stripe])
        return df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d, and so does %s", d, a->stripe,
                       p->dir[a->stripe]);
    if (strcmp(a->fp, f->fp) != 0 || a->n != f->n || a->data_bytes != f->data_bytes ||
        a->n_layers != f->n_layers || a->n_experts != f->n_experts)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: its manifest disagrees with %s's though "
                       "they share a uuid", d, first_dir);
    for (int r = 0; r < a->n; r++)
        if (!pk_record_equal(&a->rec[r], &f->rec[r]))
            return df_fail(err, DF_ERR_FORMAT, "pack %s: record %d of its manifest disagrees "
                           "with %s's", d, r, first_dir);
    p->dir[a->stripe] = df_xstrdup(d);
    return DF_OK;
}

/* The record table of manifest f (taken over: records, parts, names), its
 * (layer, expert) index, and every stripe's checksums. */
static void take_records(df_pack *p, pk_manifest *mf, int n_dirs) {
    pk_manifest *f = &mf[0];
    snprintf(p->uuid, sizeof p->uuid, "%s", f->uuid);
    snprintf(p->fp, sizeof p->fp, "%s", f->fp);
    p->n = f->n;
    p->rec = f->rec;
    p->parts = f->parts;
    p->names = f->names;
    p->n_names = f->n_names;
    f->rec = NULL;
    f->parts = NULL;
    f->names = NULL;
    f->n_names = 0;
    p->n_layers = f->n_layers;
    p->n_experts = f->n_experts;
    p->index = df_xmalloc((size_t)p->n_layers * (size_t)p->n_experts * sizeof *p->index);
    for (size_t i = 0; i < (size_t)p->n_layers * (size_t)p->n_experts; i++) p->index[i] = -1;
    for (int i = 0; i < p->n; i++) {
        p->index[(size_t)p->rec[i].layer * (size_t)p->n_experts + (size_t)p->rec[i].expert] = i;
        if (p->rec[i].padded > p->max_padded) p->max_padded = (size_t)p->rec[i].padded;
    }
    for (int i = 0; i < n_dirs; i++) {
        p->sxxh3[mf[i].stripe] = mf[i].sxxh3;
        mf[i].sxxh3 = NULL;
    }
}

int df_pack_open(df_pack **out, const char *const *dirs, int n_dirs, const df_pack_ckpt *ck,
                 df_error *err) {
    if (!out || !dirs || n_dirs < 1 || n_dirs > DF_PACK_MAX_STRIPES)
        return df_fail(err, DF_ERR_ARG, "pack: 1..%d directories are needed", DF_PACK_MAX_STRIPES);
    *out = NULL;
    df_pack *p = df_xcalloc(1, sizeof *p);
    p->S = n_dirs;
    p->dir = df_xcalloc((size_t)n_dirs, sizeof *p->dir);
    p->fd = df_xcalloc((size_t)n_dirs, sizeof *p->fd);
    p->direct = df_xcalloc((size_t)n_dirs, sizeof *p->direct);
    p->sxxh3 = df_xcalloc((size_t)n_dirs, sizeof *p->sxxh3);
    for (int i = 0; i < n_dirs; i++) p->fd[i] = -1;
    pk_manifest *mf = df_xcalloc((size_t)n_dirs, sizeof *mf);
    int rc = DF_OK;
    for (int i = 0; i < n_dirs && !rc; i++)
        rc = load_one(p, &mf[i], dirs[i], i ? &mf[0] : NULL, dirs[0], n_dirs, err);
    uint64_t data_bytes = mf[0].data_bytes;
    if (!rc) take_records(p, mf, n_dirs);
    if (!rc && ck) rc = check_against_ckpt(p, &mf[0], ck, dirs[0], err);
    for (int s = 0; s < n_dirs && !rc; s++)
        rc = open_data_ro(p->dir[s], data_bytes, &p->fd[s], &p->direct[s], err);
    for (int i = 0; i < n_dirs; i++) pk_manifest_free(&mf[i]);
    free(mf);
    if (rc) {
        df_pack_close(p);
        return rc;
    }
    *out = p;
    return DF_OK;
}

int df_pack_stripes(const df_pack *p) { return p ? p->S : 0; }
int df_pack_count(const df_pack *p) { return p ? p->n : 0; }
const df_pack_record *df_pack_at(const df_pack *p, int i) {
    return p && i >= 0 && i < p->n ? &p->rec[i] : NULL;
}
const df_pack_record *df_pack_find(const df_pack *p, int layer, int expert) {
    if (!p || layer < 0 || layer >= p->n_layers || expert < 0 || expert >= p->n_experts)
        return NULL;
    int i = p->index[(size_t)layer * (size_t)p->n_experts + (size_t)expert];
    return i >= 0 ? &p->rec[i] : NULL;
}
size_t df_pack_stripe_bytes(const df_pack_record *r, int n_stripes) {
    return r && n_stripes > 0 ? (size_t)(r->padded / (uint64_t)n_stripes) : 0;
}
size_t df_pack_max_padded(const df_pack *p) { return p ? p->max_padded : 0; }
int df_pack_fd(const df_pack *p, int stripe) {
    return p && stripe >= 0 && stripe < p->S ? p->fd[stripe] : -1;
}
bool df_pack_is_direct(const df_pack *p, int stripe) {
    return p && stripe >= 0 && stripe < p->S && p->direct[stripe];
}
const char *df_pack_dir(const df_pack *p, int stripe) {
    return p && stripe >= 0 && stripe < p->S ? p->dir[stripe] : NULL;
}
const char *df_pack_uuid(const df_pack *p) { return p ? p->uuid : NULL; }
const char *df_pack_model_fingerprint(const df_pack *p) { return p ? p->fp : NULL; }

int pk_read_stripe(const df_pack *p, const df_pack_record *r, int s, uint8_t *dst,
                       df_error *err) {
    size_t sb = df_pack_stripe_bytes(r, p->S);
    ssize_t got = df_pread_full(p->fd[s], dst, sb, r->offset);
    struct stat st;
    /* a file cut short shows as a short read, or with O_DIRECT as EINVAL when
     * the retry after a partial block lands on an unaligned offset */
    if (got != (ssize_t)sb && fstat(p->fd[s], &st) == 0 &&
        (uint64_t)st.st_size < r->offset + sb)
        return df_fail(err, DF_ERR_IO, "pack %s: layer %d expert %d: " DATA_NAME " is %lld bytes, "
                       "the record ends at %" PRIu64 " (truncated?)", p->dir[s], r->layer,
                       r->expert, (long long)st.st_size, r->offset + sb);
    if (got < 0)
        return df_fail(err, DF_ERR_IO, "pack %s: layer %d expert %d: read failed at offset %" PRIu64
                       ": %s", p->dir[s], r->layer, r->expert, r->offset, strerror(errno));
    if ((size_t)got < sb)
        return df_fail(err, DF_ERR_IO, "pack %s: layer %d expert %d: " DATA_NAME " ends at byte "
                       "%" PRIu64 ", inside the record (truncated?)", p->dir[s], r->layer,
                       r->expert, r->offset + (uint64_t)got);
    return DF_OK;
}

static int read_all(const df_pack *p, const df_pack_record *r, uint8_t *dst, df_error *err) {
    size_t sb = df_pack_stripe_bytes(r, p->S);
    for (int s = 0; s < p->S; s++) {
        int rc = pk_read_stripe(p, r, s, dst + (size_t)s * sb, err);
        if (rc) return rc;
    }
    return DF_OK;
}

/* First stripe whose bytes do not match its checksum, -1 if none. */
static int bad_stripe(const df_pack *p, const df_pack_record *r, const uint8_t *buf) {
    size_t sb = df_pack_stripe_bytes(r, p->S);
    int ri = (int)(r - p->rec);
    for (int s = 0; s < p->S; s++)
        if (XXH3_64bits(buf + (size_t)s * sb, sb) != p->sxxh3[s][ri]) return s;
    return -1;
}

static int mismatch(const df_pack *p, const df_pack_record *r, const uint8_t *buf, df_error *err) {
    int s = bad_stripe(p, r, buf);
    if (s >= 0 || p->S == 1)
        return df_fail(err, DF_ERR_IO, "pack %s: layer %d expert %d: checksum mismatch",
                       p->dir[s >= 0 ? s : 0], r->layer, r->expert);
    df_sbuf b = {0};
    for (int i = 0; i < p->S; i++) df_sb_printf(&b, "%s%s", i ? "+" : "", p->dir[i]);
    int rc = df_fail(err, DF_ERR_IO, "pack %s: layer %d expert %d: checksum mismatch", b.s,
                     r->layer, r->expert);
    free(b.s);
    return rc;
}

/* The re-read must reach the device: drop cached pages of buffered stripes first. */
static void drop_cache(const df_pack *p, const df_pack_record *r) {
    size_t sb = df_pack_stripe_bytes(r, p->S);
    for (int s = 0; s < p->S; s++)
        if (!p->direct[s]) posix_fadvise(p->fd[s], (off_t)r->offset, (off_t)sb, POSIX_FADV_DONTNEED);
}

static bool record_ok(const df_pack *p, const df_pack_record *r, const uint8_t *buf, bool stripes) {
    return XXH3_64bits(buf, (size_t)r->length) == r->xxh3 && (!stripes || bad_stripe(p, r, buf) < 0);
}

int pk_check_record(const df_pack *p, const df_pack_record *r, uint8_t *dst, bool stripes,
                        bool already_read, bool *bad, df_error *err) {
    int rc;
    if (bad) *bad = false;
    if (!already_read && (rc = read_all(p, r, dst, err))) return rc;
    if (record_ok(p, r, dst, stripes)) return DF_OK;
    drop_cache(p, r);
    if ((rc = read_all(p, r, dst, err))) return rc;
    if (record_ok(p, r, dst, stripes)) return DF_OK;
    if (bad) *bad = true;
    return mismatch(p, r, dst, err);
}

int df_pack_read_record(const df_pack *p, const df_pack_record *r, void *dst_aligned,
                        df_error *err) {
    if (!p || !r || !dst_aligned || r < p->rec || r >= p->rec + p->n)
        return df_fail(err, DF_ERR_ARG, "df_pack_read_record: bad arguments");
    if ((uintptr_t)dst_aligned % DF_PACK_ALIGN)
        return df_fail(err, DF_ERR_ARG, "df_pack_read_record: destination is not %d-byte aligned",
                       DF_PACK_ALIGN);
    return pk_check_record(p, r, dst_aligned, false, false, NULL, err);
}

