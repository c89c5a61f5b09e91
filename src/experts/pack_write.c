/*
 * pack_write.c - `deltafin pack`'s writer (df_pack_write): reads every routed
 * expert's parts from the checkpoint's safetensors (by the architecture's
 * expert naming, no model loaded), lays them out as the record plan says,
 * stripes them over the output directories, and resumes an interrupted run.
 * Also the progress bar that verify draws too.
 *
 * Crash safety rests on three rules. Data goes to experts.bin.partial; the
 * progress journal (pack_journal.c) only ever claims records whose bytes were
 * fdatasync'ed before it was (atomically) replaced; manifest.json appears
 * last, by rename, after everything else is durable. So a directory with
 * manifest.json is complete, and anything else is either resumable or empty.
 * The fault hooks of df_pack_write_opts exist in the test build only
 * (DF_TEST_HOOKS).
 */
#include "experts/pack_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

/* Checkpoint (fdatasync + journal) at least this often while writing. */
#define CKPT_BYTES ((uint64_t)1 << 30)
#define CKPT_SECONDS 10.0

/* ---- progress bar -------------------------------------------------------------- */

void pk_bar_init(pk_bar *b, bool on, const char *label, uint64_t total, uint64_t start) {
    b->on = on;
    b->label = label;
    b->total = total;
    b->start = b->done = start;
    b->t0 = df_now();
    b->last = 0;
}

void pk_bar_draw(pk_bar *b, bool final) {
    if (!b->on) return;
    double t = df_now();
    if (!final && t - b->last < 0.2) return; /* at most ~5 redraws a second */
    b->last = t;
    double el = t - b->t0;
    double rate = el > 0 ? (double)(b->done - b->start) / el : 0;
    char eta[32] = "--:--";
    if (rate > 0 && b->done < b->total) {
        long s = (long)((double)(b->total - b->done) / rate);
        snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    } else if (b->done >= b->total) {
        snprintf(eta, sizeof eta, "0:00:00");
    }
    int w = 30, fill = b->total ? (int)((double)b->done / (double)b->total * w) : w;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    char d[32], tot[32];
    df_fmt_bytes(d, sizeof d, b->done);
    df_fmt_bytes(tot, sizeof tot, b->total);
    fprintf(stderr, "\r%s [%s] %s / %s  %.1f MB/s  ETA %s\x1b[K", b->label, bar, d, tot,
            rate / 1e6, eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- writer ----------------------------------------------------------------------------- */

typedef struct wdir {
    const char *dir;
    int stripe;
    int state;
    pk_manifest mf; /* ST_COMPLETE */
    pk_progress pg; /* ST_PARTIAL */
    int fd;
    uint8_t *buf;
    size_t cap, fill;
    uint64_t buf_off;  /* file offset of buf[0] */
    uint64_t dropped;  /* written bytes below this are out of the page cache */
    uint64_t *sxxh3;   /* [n] */
    dev_t dev;
    ino_t ino;
    int lock_fd; /* the directory, flock'ed while we write there */
} wdir;

typedef struct writer {
    const df_pack_write_opts *o;
    const char *model_dir;
    pk_source src;
    pk_plan pl;
    char fp[DF_PACK_FP_HEX + 1];
    char uuid[40];
    int S;
    wdir *wd;       /* in the order given */
    wdir **by;      /* by stripe */
    uint64_t *xxh3; /* [n] */
    uint64_t written_run;
    pk_bar bar;
} writer;

static int disk_full(writer *w, const wdir *d, const char *what, int e, df_error *err) {
    if (e == ENOSPC || e == EDQUOT) {
        char at[96] = "";
        if (!strcmp(what, DATA_PARTIAL)) {
            char a[32], b[32];
            df_fmt_bytes(a, sizeof a, d->buf_off);
            df_fmt_bytes(b, sizeof b, w->pl.stripe_file_bytes);
            snprintf(at, sizeof at, " (%s of %s written there)", a, b);
        }
        return df_fail(err, DF_ERR_IO, "pack %s: disk full writing %s%s; free some space and run "
                       "the same command again to resume", d->dir, what, at);
    }
    return df_fail(err, DF_ERR_IO, "pack %s: writing %s failed: %s", d->dir, what, strerror(e));
}

/* The data write (in the test build, with the hook that pretends the disk
 * filled up). */
static int data_write(writer *w, wdir *d, const void *buf, size_t n, uint64_t off) {
#ifdef DF_TEST_HOOKS
    uint64_t lim = w->o->fail_enospc_after_bytes;
    if (lim && w->written_run + n > lim) {
        size_t k = lim > w->written_run ? (size_t)(lim - w->written_run) : 0;
        if (k) df_pwrite_full(d->fd, buf, k, off);
        w->written_run += k;
        return ENOSPC;
    }
#endif
    int e = df_pwrite_full(d->fd, buf, n, off);
    if (!e) w->written_run += n;
    return e;
}

static int wdir_flush(writer *w, wdir *d, df_error *err) {
    if (!d->fill) return DF_OK;
    int e = data_write(w, d, d->buf, d->fill, d->buf_off);
    if (e) return disk_full(w, d, DATA_PARTIAL, e, err);
    d->buf_off += d->fill;
    d->fill = 0;
    return DF_OK;
}

static int wdir_append(writer *w, wdir *d, const uint8_t *p, size_t n, df_error *err) {
    while (n) {
        size_t k = d->cap - d->fill < n ? d->cap - d->fill : n;
        memcpy(d->buf + d->fill, p, k);
        d->fill += k;
        p += k;
        n -= k;
        if (d->fill == d->cap) {
            int rc = wdir_flush(w, d, err);
            if (rc) return rc;
        }
    }
    return DF_OK;
}

/* Makes records [0, done) durable and says so in every directory's journal. */
static int checkpoint(writer *w, int done, df_error *err) {
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state == ST_COMPLETE) continue;
        int rc = wdir_flush(w, d, err);
        if (rc) return rc;
        if (fdatasync(d->fd) != 0) return disk_full(w, d, DATA_PARTIAL, errno, err);
        /* the pack is far bigger than RAM: written pages need not stay cached */
        if (d->buf_off > d->dropped)
            posix_fadvise(d->fd, (off_t)d->dropped, (off_t)(d->buf_off - d->dropped),
                          POSIX_FADV_DONTNEED);
        d->dropped = d->buf_off;
    }
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state == ST_COMPLETE) continue;
        char *t = pk_progress_text(w->uuid, w->fp, i, w->S, w->pl.n, done, w->xxh3, d->sxxh3);
        int e = pk_write_file_durable(d->dir, PROGRESS_TMP, PROGRESS_NAME, t, strlen(t));
        free(t);
        if (e) return disk_full(w, d, PROGRESS_NAME, e, err);
    }
    return DF_OK;
}

/* Reads record i of the plan from the checkpoint into buf (padded with zeros)
 * and checks its scales: a pack is where a streamed expert's bytes are all
 * read, so a NaN scale is refused here rather than met mid-generation. */
static int read_source(writer *w, int i, uint8_t *buf, df_error *err) {
    const df_pack_record *r = &w->pl.rec[i];
    const void *part_data[DF_EXPERT_MAX_PARTS];
    for (int k = 0; k < r->n_parts; k++) {
        part_data[k] = buf + r->part[k].offset;
        const df_tensor *t = w->pl.src[(size_t)i * (size_t)r->n_parts + (size_t)k];
        int fd = df_st_file_fd(w->src.st, t->file);
        ssize_t got = df_pread_full(fd, buf + r->part[k].offset, (size_t)t->nbytes, t->file_offset);
        if (got != (ssize_t)t->nbytes)
            return df_fail(err, DF_ERR_IO, "%s: tensor '%s': %s", df_st_file_path(w->src.st, t->file),
                           t->name, got < 0 ? strerror(errno) : "file is shorter than its header says");
        posix_fadvise(fd, (off_t)t->file_offset, (off_t)t->nbytes, POSIX_FADV_DONTNEED);
    }
    memset(buf + r->length, 0, (size_t)(r->padded - r->length));
    return df_expert_check_scales(&w->src.inv, w->src.st, r->layer, r->expert, part_data, err);
}

/* Whether record i as written in the partial files matches the journal. */
static bool written_ok(writer *w, int i, uint8_t *buf) {
    const df_pack_record *r = &w->pl.rec[i];
    size_t sb = (size_t)(r->padded / (uint64_t)w->S);
    for (int s = 0; s < w->S; s++) {
        wdir *d = w->by[s];
        if (df_pread_full(d->fd, buf + (size_t)s * sb, sb, r->offset) != (ssize_t)sb) return false;
        if (XXH3_64bits(buf + (size_t)s * sb, sb) != d->sxxh3[i]) return false;
    }
    return XXH3_64bits(buf, (size_t)r->length) == w->xxh3[i];
}

static bool any_complete(const writer *w) {
    for (int i = 0; i < w->S; i++)
        if (w->wd[i].state == ST_COMPLETE) return true;
    return false;
}

static const char *state_name(int s) {
    return s == ST_COMPLETE ? "a complete pack" : "an unfinished pack";
}

/* Looks at what each directory holds; refuses anything that is not ours to
 * replace. Sets *action: 0 fresh, 1 resume, 2 up to date. */
static int inspect_dirs(writer *w, int *action, df_error *err) {
    int S = w->S, n_complete = 0, n_partial = 0;
    for (int i = 0; i < S; i++) {
        wdir *d = &w->wd[i];
        int rc;
        if (pk_exists(d->dir, MANIFEST_NAME)) {
            if ((rc = pk_manifest_load(&d->mf, d->dir, err)))
                return pk_fail_more(err, rc, "; not overwriting it: delete it or choose another "
                                 "directory");
            d->state = ST_COMPLETE;
            n_complete++;
        } else if (pk_exists(d->dir, PROGRESS_NAME)) {
            if ((rc = pk_progress_load(&d->pg, d->dir, err))) return rc;
            d->state = ST_PARTIAL;
            n_partial++;
        }
        const char *fp = d->state == ST_COMPLETE ? d->mf.fp : d->state == ST_PARTIAL ? d->pg.fp : NULL;
        if (fp && strcmp(fp, w->fp) != 0)
            return df_fail(err, DF_ERR_FORMAT, "pack %s: holds %s of a different model "
                           "(fingerprint %s, %s has %s); not overwriting it: delete it or "
                           "choose another directory", d->dir, state_name(d->state), fp,
                           w->model_dir, w->fp);
    }
    if (n_complete + n_partial == 0) {
        *action = 0;
        return DF_OK;
    }
    /* Everything present must be one set of this model with S stripes. */
    const char *uuid = NULL;
    int *seen = df_xcalloc((size_t)S, sizeof *seen);
    int rc = DF_OK;
    for (int i = 0; i < S && !rc; i++) {
        wdir *d = &w->wd[i];
        if (d->state == ST_EMPTY) {
            const wdir *o = NULL;
            for (int j = 0; j < S && !o; j++)
                if (w->wd[j].state != ST_EMPTY) o = &w->wd[j];
            rc = df_fail(err, DF_ERR_ARG, "pack %s: holds no pack while %s holds %s of this "
                         "model; give the same directories as when it was started, or delete "
                         "the pack in %s", d->dir, o->dir, state_name(o->state), o->dir);
            break;
        }
        int st = d->state == ST_COMPLETE ? d->mf.stripe : d->pg.stripe;
        int ss = d->state == ST_COMPLETE ? d->mf.stripes : d->pg.stripes;
        const char *u = d->state == ST_COMPLETE ? d->mf.uuid : d->pg.uuid;
        if (ss != S)
            rc = df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d of %s of this model with %d "
                         "stripe(s), but %d director%s given; give all its directories, or "
                         "delete it to repack", d->dir, st, state_name(d->state), ss, S,
                         S == 1 ? "y was" : "ies were");
        else if (uuid && strcmp(uuid, u) != 0)
            rc = df_fail(err, DF_ERR_ARG, "pack %s: belongs to a different pack set than %s "
                         "(uuid %s vs %s); give the directories of one set, or delete them to "
                         "repack", d->dir, w->wd[0].dir, u, uuid);
        else if (seen[st]++)
            rc = df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d, like another directory "
                         "given", d->dir, st);
        uuid = u;
        d->stripe = st;
    }
    free(seen);
    if (rc) return rc;
    snprintf(w->uuid, sizeof w->uuid, "%s", uuid);
    if (n_complete == S) {
        *action = 2;
        return DF_OK;
    }
    for (int i = 0; i < S; i++)
        if (w->wd[i].state == ST_PARTIAL &&
            (w->wd[i].pg.total != w->pl.n || (n_complete && w->wd[i].pg.done != w->pl.n)))
            return df_fail(err, DF_ERR_FORMAT, "pack %s: the unfinished pack there does not "
                           "match the others (records %d of %d); delete the pack in all its "
                           "directories to start over", w->wd[i].dir, w->wd[i].pg.done,
                           w->wd[i].pg.total);
    *action = 1;
    return DF_OK;
}

static int prepare_dirs(writer *w, df_error *err) {
    for (int i = 0; i < w->S; i++) {
        wdir *d = &w->wd[i];
        struct stat sb;
        if (stat(d->dir, &sb) != 0) {
            if (errno != ENOENT || mkdir(d->dir, 0777) != 0 || stat(d->dir, &sb) != 0)
                return df_fail(err, DF_ERR_IO, "pack %s: cannot create the directory: %s", d->dir,
                               strerror(errno));
        }
        if (!S_ISDIR(sb.st_mode))
            return df_fail(err, DF_ERR_IO, "pack %s: not a directory", d->dir);
        if (access(d->dir, W_OK | X_OK) != 0)
            return df_fail(err, DF_ERR_IO, "pack %s: not writable: %s", d->dir, strerror(errno));
        d->dev = sb.st_dev;
        d->ino = sb.st_ino;
        d->fd = -1;
        for (int j = 0; j < i; j++)
            if (w->wd[j].dev == d->dev && w->wd[j].ino == d->ino)
                return df_fail(err, DF_ERR_ARG, "pack %s and %s are the same directory",
                               w->wd[j].dir, d->dir);
        /* two writers in one directory would interleave their records */
        d->lock_fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d->lock_fd >= 0 && flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
            return df_fail(err, DF_ERR_IO, "pack %s: another deltafin pack is writing there",
                           d->dir);
    }
    return DF_OK;
}

/* Free space, per filesystem (several stripes may share one). */
static int check_space(writer *w, df_error *err) {
    uint64_t extra = (uint64_t)w->pl.n * 256 + 65536; /* manifest + journal */
    bool *done = df_xcalloc((size_t)w->S, sizeof *done);
    int rc = DF_OK;
    for (int i = 0; i < w->S && !rc; i++) {
        if (done[i]) continue;
        uint64_t need = 0;
        int n_here = 0;
        for (int j = i; j < w->S; j++) {
            wdir *d = w->by[j];
            if (d->dev != w->by[i]->dev) continue;
            done[j] = true;
            n_here++;
            struct stat sb;
            uint64_t have = fstat(d->fd, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0;
            uint64_t want = w->pl.stripe_file_bytes + extra;
            need += want > have ? want - have : 0;
        }
        struct statvfs vs;
        if (statvfs(w->by[i]->dir, &vs) != 0) continue;
        uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
        if (avail < need) {
            char a[32], b[32];
            df_fmt_bytes(a, sizeof a, need);
            df_fmt_bytes(b, sizeof b, avail);
            rc = df_fail(err, DF_ERR_IO, "pack %s: not enough free space: the pack needs %s more "
                         "there%s, %s is free", w->by[i]->dir, a,
                         n_here > 1 ? " (for the stripes on this filesystem)" : "", b);
        }
    }
    free(done);
    return rc;
}

/* Opens the data files: new ones truncated, resumed ones as they are. An
 * interrupted finish may have renamed experts.bin already: take it back. */
static int open_data(writer *w, bool fresh, df_error *err) {
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state == ST_COMPLETE) continue;
        char *p = df_path_join(d->dir, DATA_PARTIAL);
        if (!fresh && access(p, F_OK) != 0 && pk_exists(d->dir, DATA_NAME)) {
            char *f = df_path_join(d->dir, DATA_NAME);
            if (rename(f, p) != 0) {
                free(f);
                free(p);
                return df_fail(err, DF_ERR_IO, "pack %s: cannot rename " DATA_NAME ": %s",
                               d->dir, strerror(errno));
            }
            free(f);
        }
        d->fd = open(p, O_RDWR | O_CLOEXEC | (fresh ? O_CREAT | O_TRUNC : 0), 0644);
        int e = errno;
        free(p);
        if (d->fd < 0)
            return df_fail(err, DF_ERR_IO, "pack %s: cannot open " DATA_PARTIAL "%s: %s", d->dir,
                           fresh ? "" : " of the unfinished pack", strerror(e));
    }
    return DF_OK;
}

/* Makes the pack complete: final checkpoint, manifests, renames into place. */
static int finish(writer *w, df_error *err) {
#ifdef DF_TEST_HOOKS
    int renames = 0;
#endif
    int rc = checkpoint(w, w->pl.n, err);
    if (rc) return rc;
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state == ST_COMPLETE) continue;
        struct stat sb;
        if (fstat(d->fd, &sb) == 0 && (uint64_t)sb.st_size != w->pl.stripe_file_bytes &&
            ftruncate(d->fd, (off_t)w->pl.stripe_file_bytes) != 0)
            return disk_full(w, d, DATA_PARTIAL, errno, err);
        if (fsync(d->fd) != 0) return disk_full(w, d, DATA_PARTIAL, errno, err);
        char *t = pk_manifest_text(&w->pl, &w->src.cfg, w->src.inv.layout, w->uuid, w->fp, i, w->xxh3, d->sxxh3);
        int e = pk_write_file_durable(d->dir, MANIFEST_PARTIAL, NULL, t, strlen(t));
        free(t);
        if (e) return disk_full(w, d, MANIFEST_PARTIAL, e, err);
    }
    /* Data first everywhere, then the manifests: a manifest never names a
     * data file that is not in place. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < w->S; i++) {
            wdir *d = w->by[i];
            if (d->state == ST_COMPLETE) continue;
            const char *from = pass ? MANIFEST_PARTIAL : DATA_PARTIAL;
            const char *to = pass ? MANIFEST_NAME : DATA_NAME;
            char *a = df_path_join(d->dir, from), *b = df_path_join(d->dir, to);
            int e = rename(a, b) != 0 ? errno : df_fsync_dir(d->dir);
            free(a);
            free(b);
            if (e) return df_fail(err, DF_ERR_IO, "pack %s: cannot rename %s to %s: %s", d->dir,
                                  from, to, strerror(e));
#ifdef DF_TEST_HOOKS
            if (++renames == w->o->stop_after_renames)
                return df_fail(err, DF_ERR_IO, "pack: stopped after %d renames (test hook)",
                               renames);
#endif
        }
    for (int i = 0; i < w->S; i++) { /* complete ones too: a finish cut short leaves it */
        pk_unlink_in(w->by[i]->dir, PROGRESS_NAME);
        df_fsync_dir(w->by[i]->dir);
    }
    return DF_OK;
}

static void random_uuid(char out[40]) {
    uint8_t b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            /* no entropy source: time and pid make a set id unique enough */
            uint64_t x = (uint64_t)(df_now() * 1e9) ^ ((uint64_t)getpid() << 32);
            for (size_t i = got; i < sizeof b; i++) b[i] = (uint8_t)(x >> (8 * (i % 8)));
            break;
        }
        got += (size_t)r;
    }
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    snprintf(out, 40, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

/* Checksums of the records the journals say are written; *done: how many. */
static int load_journals(writer *w, int *done_out, const wdir **ref_out, df_error *err) {
    int done = w->pl.n;
    const wdir *ref = NULL;
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state != ST_PARTIAL) continue;
        if (d->pg.done < done) done = d->pg.done;
        if (!ref) ref = d;
    }
    for (int i = 0; i < w->S; i++) {
        wdir *d = w->by[i];
        if (d->state != ST_PARTIAL) continue;
        for (int r = 0; r < done; r++)
            if (d->pg.xxh3[r] != ref->pg.xxh3[r])
                return df_fail(err, DF_ERR_FORMAT, "pack %s: the unfinished pack's journal "
                               "disagrees with %s's; delete the pack in all its directories to "
                               "start over", d->dir, ref->dir);
        memcpy(d->sxxh3, d->pg.sxxh3, (size_t)done * sizeof *d->sxxh3);
    }
    memcpy(w->xxh3, ref->pg.xxh3, (size_t)done * sizeof *w->xxh3);
    *done_out = done;
    *ref_out = ref;
    return DF_OK;
}

/* Picks up an interrupted pack: checksums from the journals, the last record
 * checked against disk (and against the checkpoint, so changed weights are not
 * mixed in), everything rechecked if that fails. *start: the first record to write. */
static int resume_point(writer *w, uint8_t *buf, int *start, df_error *err) {
    int done;
    const wdir *ref;
    int rc = load_journals(w, &done, &ref, err);
    if (rc) return rc;
    if (done > 0) {
        int last = done - 1;
        const df_pack_record *r = &w->pl.rec[last];
        if ((rc = read_source(w, last, buf, err))) return rc;
        if (XXH3_64bits(buf, (size_t)r->length) != w->xxh3[last])
            return df_fail(err, DF_ERR_FORMAT, "%s: layer %d expert %d differs from what the "
                           "unfinished pack in %s holds: the checkpoint's weights changed; delete "
                           "the pack's .partial files and " PROGRESS_NAME " to start over",
                           w->model_dir, r->layer, r->expert, ref->dir);
        if (!written_ok(w, last, buf)) {
            int first_bad = 0;
            while (first_bad < last && written_ok(w, first_bad, buf)) first_bad++;
            if (w->o->log)
                fprintf(w->o->log, "deltafin pack: layer %d expert %d of the unfinished pack does "
                        "not match its checksum; rewriting from there\n",
                        w->pl.rec[first_bad].layer, w->pl.rec[first_bad].expert);
            done = first_bad;
        }
    }
    *start = done;
    return DF_OK;
}

static void writer_free(writer *w) {
    for (int i = 0; w->wd && i < w->S; i++) {
        if (w->wd[i].fd >= 0) close(w->wd[i].fd);
        if (w->wd[i].lock_fd >= 0) close(w->wd[i].lock_fd);
        free(w->wd[i].buf);
        free(w->wd[i].sxxh3);
        pk_manifest_free(&w->wd[i].mf);
        pk_progress_free(&w->wd[i].pg);
    }
    free(w->wd);
    free(w->by);
    free(w->xxh3);
    pk_plan_free(&w->pl);
    pk_source_close(&w->src);
}

/* The checkpoint, its fingerprint and record plan, and the output directories
 * as given (nothing looked at yet). */
static int writer_init(writer *w, const char *model_dir, const char *const *dirs, int n_dirs,
                       df_error *err) {
    w->model_dir = model_dir;
    w->S = n_dirs;
    int rc = pk_source_open(&w->src, model_dir, err);
    if (rc) return rc;
    if (!pk_has_experts(&w->src.ck))
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: the model has no routed experts (architecture "
                       "%s); nothing to pack", model_dir, w->src.cfg.model_type);
    if ((rc = df_pack_fingerprint(&w->src.ck, w->fp, err))) return rc;
    if ((rc = pk_plan_build(&w->pl, &w->src.ck, w->S, err))) return rc;
    w->wd = df_xcalloc((size_t)w->S, sizeof *w->wd);
    w->by = df_xcalloc((size_t)w->S, sizeof *w->by);
    w->xxh3 = df_xcalloc((size_t)w->pl.n, sizeof *w->xxh3);
    for (int i = 0; i < w->S; i++) {
        w->wd[i].dir = dirs[i];
        w->wd[i].fd = -1;
        w->wd[i].lock_fd = -1;
        w->wd[i].stripe = i;
        w->wd[i].sxxh3 = df_xcalloc((size_t)w->pl.n, sizeof *w->wd[i].sxxh3);
    }
    return DF_OK;
}

/* Every directory already holds this model's pack: checked by opening it,
 * leftovers of an interrupted finish removed. */
static int up_to_date(writer *w, const char *const *dirs, df_pack_write_result *res, df_error *err) {
    df_pack *p;
    int rc = df_pack_open(&p, dirs, w->S, &w->src.ck, err);
    if (rc)
        return pk_fail_more(err, rc, "; it looks like a complete pack of this model but is not "
                            "usable: delete it and repack");
    df_pack_close(p);
    for (int i = 0; i < w->S; i++) {
        pk_unlink_in(dirs[i], PROGRESS_NAME);
        pk_unlink_in(dirs[i], DATA_PARTIAL);
        pk_unlink_in(dirs[i], MANIFEST_PARTIAL);
    }
    if (res) res->up_to_date = true;
    if (w->o->log)
        fprintf(w->o->log, "deltafin pack: %s: already holds this model's pack (%d experts); "
                "up to date\n", dirs[0], w->pl.n);
    return DF_OK;
}

/* The first record this run writes (*start); *finished when all that was
 * left of an interrupted run was its finish, which this completed. */
static int start_point(writer *w, bool fresh, uint8_t *buf, int *start, bool *finished,
                       df_error *err) {
    *start = 0;
    *finished = false;
    if (fresh) return checkpoint(w, 0, err);
    if (any_complete(w)) {
        /* interrupted while renaming into place: every record is written */
        if (w->o->log) fprintf(w->o->log, "deltafin pack: finishing an interrupted pack\n");
        *start = w->pl.n;
        *finished = true;
        int done;
        const wdir *ref;
        int rc = load_journals(w, &done, &ref, err);
        return rc ? rc : finish(w, err);
    }
    int rc = resume_point(w, buf, start, err);
    if (!rc && w->o->log && *start < w->pl.n)
        fprintf(w->o->log, "deltafin pack: resuming an unfinished pack at record %d of %d "
                "(layer %d expert %d)\n", *start, w->pl.n, w->pl.rec[*start].layer,
                w->pl.rec[*start].expert);
    return rc;
}

/* One write buffer per directory, max(4 MiB, 16 MiB / S), from record start on. */
static int alloc_buffers(writer *w, int start, df_error *err) {
    size_t cap = (size_t)16 << 20;
    cap = cap / (size_t)w->S < ((size_t)4 << 20) ? (size_t)4 << 20 : pk_round_up(cap / (size_t)w->S, DF_PACK_ALIGN);
    uint64_t off0 = start < w->pl.n ? w->pl.rec[start].offset : w->pl.stripe_file_bytes;
    for (int i = 0; i < w->S; i++) {
        w->by[i]->buf = aligned_alloc(DF_PACK_ALIGN, cap);
        if (!w->by[i]->buf) return df_fail(err, DF_ERR_NOMEM, "pack: out of memory");
        w->by[i]->cap = cap;
        w->by[i]->buf_off = off0;
    }
    return DF_OK;
}

/* Whether to checkpoint after record i (by bytes and time; in the test build,
 * every N records when asked). */
static bool checkpoint_due(const writer *w, int i, uint64_t since, double t_ckpt) {
#ifdef DF_TEST_HOOKS
    if (w->o->checkpoint_every_records > 0) return (i + 1) % w->o->checkpoint_every_records == 0;
#else
    (void)w, (void)i;
#endif
    return since >= CKPT_BYTES || df_now() - t_ckpt >= CKPT_SECONDS;
}

/* Records [start, n) into the directories, then the finish. */
static int write_records(writer *w, int start, uint8_t *buf, df_error *err) {
    uint64_t since_ckpt = 0;
    double t_ckpt = df_now();
    int this_run = 0, rc = DF_OK;
    for (int i = start; i < w->pl.n; i++) {
        const df_pack_record *r = &w->pl.rec[i];
        if ((rc = read_source(w, i, buf, err))) return rc;
        w->xxh3[i] = XXH3_64bits(buf, (size_t)r->length);
        size_t sb = (size_t)(r->padded / (uint64_t)w->S);
        for (int s = 0; s < w->S; s++) {
            w->by[s]->sxxh3[i] = XXH3_64bits(buf + (size_t)s * sb, sb);
            if ((rc = wdir_append(w, w->by[s], buf + (size_t)s * sb, sb, err))) return rc;
        }
        w->bar.done += r->padded;
        since_ckpt += r->padded;
        pk_bar_draw(&w->bar, false);
        this_run++;
#ifdef DF_TEST_HOOKS
        if (w->o->stop_after_records > 0 && this_run >= w->o->stop_after_records && i + 1 < w->pl.n)
            return df_fail(err, DF_ERR_IO, "pack: stopped after %d records (test hook)", this_run);
#endif
        if (checkpoint_due(w, i, since_ckpt, t_ckpt) && i + 1 < w->pl.n) {
            if ((rc = checkpoint(w, i + 1, err))) return rc;
            since_ckpt = 0;
            t_ckpt = df_now();
        }
    }
    return finish(w, err);
}

/* After the directories were inspected: fresh or resumed, write and finish. */
static int write_pack(writer *w, bool fresh, df_pack_write_result *res, df_error *err) {
    if (fresh) {
        random_uuid(w->uuid);
        for (int i = 0; i < w->S; i++) pk_unlink_in(w->by[i]->dir, MANIFEST_PARTIAL);
    }
    int rc = open_data(w, fresh, err);
    if (rc) return rc;
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, pk_round_up(w->pl.max_padded, DF_PACK_ALIGN));
    if (!buf) return df_fail(err, DF_ERR_NOMEM, "pack: out of memory for a %zu-byte record", w->pl.max_padded);
    int start;
    bool finished;
    rc = start_point(w, fresh, buf, &start, &finished, err);
    if (res) res->resumed_from = start;
    bool check_space_now = true;
#ifdef DF_TEST_HOOKS
    check_space_now = !w->o->skip_space_check;
#endif
    if (!rc && !finished && check_space_now) rc = check_space(w, err);
    if (!rc && !finished) rc = alloc_buffers(w, start, err);
    if (!rc && !finished) {
        uint64_t done_bytes = 0;
        for (int i = 0; i < start; i++) done_bytes += w->pl.rec[i].padded;
        pk_bar_init(&w->bar, w->o->progress, "packing", w->pl.total_padded, done_bytes);
        pk_bar_draw(&w->bar, false);
        rc = write_records(w, start, buf, err);
        if (w->bar.on) pk_bar_draw(&w->bar, true);
    }
    free(buf);
    return rc;
}

int df_pack_write(const char *model_dir, const char *const *dirs, int n_dirs,
                  const df_pack_write_opts *opts, df_pack_write_result *res, df_error *err) {
    df_pack_write_opts defaults = {0};
    if (!opts) opts = &defaults;
    if (res) memset(res, 0, sizeof *res);
    if (!model_dir || !dirs || n_dirs < 1)
        return df_fail(err, DF_ERR_ARG, "pack: a model directory and at least one output "
                       "directory are needed");
    if (n_dirs > DF_PACK_MAX_STRIPES)
        return df_fail(err, DF_ERR_ARG, "pack: at most %d output directories", DF_PACK_MAX_STRIPES);
    for (int i = 0; i < n_dirs; i++)
        if (!dirs[i] || !*dirs[i]) return df_fail(err, DF_ERR_ARG, "pack: empty directory name");
    double t0 = df_now();
    writer w = {0};
    w.o = opts;
    int action = 0;
    int rc = writer_init(&w, model_dir, dirs, n_dirs, err);
    if (!rc) rc = prepare_dirs(&w, err);
    if (!rc) rc = inspect_dirs(&w, &action, err);
    if (!rc) {
        for (int i = 0; i < w.S; i++) w.by[w.wd[i].stripe] = &w.wd[i];
        if (res) {
            res->records = w.pl.n;
            res->bytes = w.pl.total_padded;
        }
        rc = action == 2 ? up_to_date(&w, dirs, res, err) : write_pack(&w, action == 0, res, err);
    }
    writer_free(&w);
    if (res) res->seconds = df_now() - t0;
    return rc;
}
