/*
 * pack.c - the expert pack (format in docs/pack-format.md): the model
 * fingerprint, the record plan, manifest and progress-journal I/O, the resumable
 * writer, the set reader (df_pack_open and friends), the synchronous record
 * reader and verify.
 *
 * Crash safety rests on three rules. Data goes to experts.bin.partial; the
 * progress journal only ever claims records whose bytes were fdatasync'ed
 * before it was (atomically) replaced; manifest.json appears last, by rename,
 * after everything else is durable. So a directory with manifest.json is
 * complete, and anything else is either resumable or empty.
 */
#include "experts/pack.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#define DATA_NAME "experts.bin"
#define DATA_PARTIAL "experts.bin.partial"
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_PARTIAL "manifest.json.partial"
#define PROGRESS_NAME "progress"
#define PROGRESS_TMP "progress.tmp"
#define FORMAT_NAME "deltafin-pack"
#define PROGRESS_FORMAT "deltafin-pack-progress"
#define MAX_MANIFEST_BYTES ((size_t)1 << 30)
/* Checkpoint (fdatasync + journal) at least this often while writing. */
#define CKPT_BYTES ((uint64_t)1 << 30)
#define CKPT_SECONDS 10.0

enum { ST_EMPTY = 0, ST_PARTIAL = 1, ST_COMPLETE = 2 };

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- small I/O helpers ------------------------------------------------------ */

/* 0, or an errno value. */
static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off) {
    size_t put = 0;
    while (put < n) {
        ssize_t r = pwrite(fd, (const char *)buf + put, n - put, (off_t)(off + put));
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) return EIO;
        put += (size_t)r;
    }
    return 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    int rc = fsync(fd) ? errno : 0;
    close(fd);
    /* some filesystems cannot fsync a directory; that is not a write failure */
    return rc == EINVAL ? 0 : rc;
}

static bool exists(const char *dir, const char *name) {
    char *p = df_path_join(dir, name);
    struct stat sb;
    bool r = stat(p, &sb) == 0;
    free(p);
    return r;
}

static void unlink_in(const char *dir, const char *name) {
    char *p = df_path_join(dir, name);
    unlink(p);
    free(p);
}

static void hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

static bool parse_hex64(const char *s, uint64_t *v) {
    if (!s || strlen(s) != 16) return false;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return true;
}

static bool is_hex(const char *s, size_t n) {
    if (!s || strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static bool is_uuid(const char *s) {
    if (!s || strlen(s) != 36) return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    }
    return true;
}

static void human_bytes(uint64_t b, char *out, size_t n) {
    if (b >= 1000000000ull) snprintf(out, n, "%.2f GB", (double)b / 1e9);
    else if (b >= 1000000ull) snprintf(out, n, "%.1f MB", (double)b / 1e6);
    else if (b >= 1000ull) snprintf(out, n, "%.1f kB", (double)b / 1e3);
    else snprintf(out, n, "%" PRIu64 " B", b);
}

/* Appends to the message already in err (df_fail must not read what it writes). */
static int fail_more(df_error *err, int code, const char *more) {
    if (!err) return code;
    char was[sizeof err->msg];
    snprintf(was, sizeof was, "%s", err->msg);
    return df_fail(err, code, "%s%s", was, more);
}

/* A growable string for the manifest and journal. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int k = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if ((size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->s = df_xrealloc(b->s, b->cap);
    }
}

/* ---- progress bar -------------------------------------------------------------- */

typedef struct pbar {
    bool on;
    const char *label;
    uint64_t total, start, done;
    double t0, last;
} pbar;

static void pbar_init(pbar *b, bool on, const char *label, uint64_t total, uint64_t start) {
    b->on = on;
    b->label = label;
    b->total = total;
    b->start = b->done = start;
    b->t0 = df_now();
    b->last = 0;
}

static void pbar_draw(pbar *b, bool final) {
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
    human_bytes(b->done, d, sizeof d);
    human_bytes(b->total, tot, sizeof tot);
    fprintf(stderr, "\r%s [%s] %s / %s  %.1f MB/s  ETA %s\x1b[K", b->label, bar, d, tot,
            rate / 1e6, eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- the record plan --------------------------------------------------------------
 * Layer-major over MoE layers, expert ids ascending; offsets are in each
 * stripe's file, every record taking padded/S bytes there. */

typedef struct plan {
    int S;
    int n;
    df_pack_record *rec;
    const df_tensor *(*src)[3];
    uint64_t stripe_file_bytes; /* size of every experts.bin */
    uint64_t total_padded;      /* all records, all stripes */
    size_t max_padded;
} plan;

/* Part k of expert e of layer li, as the model's inventory names it. */
static const df_tensor *expert_part(const df_model *m, int li, int e, int k) {
    return df_expert_part(&m->experts, li, e, k);
}

static bool model_has_experts(const df_model *m) {
    return m->cfg.num_experts > 0 && m->experts.xt && df_config_moe_layers(&m->cfg) > 0;
}

static void plan_free(plan *p) {
    free(p->rec);
    free(p->src);
    memset(p, 0, sizeof *p);
}

static void plan_build(plan *p, const df_model *m, int S) {
    memset(p, 0, sizeof *p);
    const df_config *c = &m->cfg;
    int n = 0;
    for (int li = 0; li < c->num_hidden_layers; li++)
        if (m->cfg.layer_is_moe[li]) n += c->num_experts;
    p->S = S;
    p->n = n;
    p->rec = df_xcalloc((size_t)n, sizeof *p->rec);
    p->src = df_xcalloc((size_t)n, sizeof *p->src);
    uint64_t off = 0;
    int i = 0;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!m->cfg.layer_is_moe[li]) continue;
        for (int e = 0; e < c->num_experts; e++, i++) {
            df_pack_record *r = &p->rec[i];
            r->layer = li;
            r->expert = e;
            uint64_t po = 0;
            for (int k = 0; k < 3; k++) {
                const df_tensor *t = expert_part(m, li, e, k);
                p->src[i][k] = t;
                r->part[k].offset = po;
                r->part[k].nbytes = t->nbytes;
                r->part[k].dtype = t->dtype;
                r->part[k].rows = t->shape[0];
                r->part[k].cols = t->shape[1];
                po += t->nbytes;
            }
            r->length = po;
            r->padded = round_up(po, (uint64_t)DF_PACK_ALIGN * (uint64_t)S);
            r->offset = off;
            off += r->padded / (uint64_t)S;
            p->total_padded += r->padded;
            if (r->padded > p->max_padded) p->max_padded = (size_t)r->padded;
        }
    }
    p->stripe_file_bytes = off;
}

/* ---- fingerprint -------------------------------------------------------------------- */

static void fp_u64(XXH3_state_t *st, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_128bits_update(st, b, 8);
}

static char *model_dir_of(const df_model *m) {
    const char *f = df_st_file_path(m->st, 0);
    if (!f) return df_xstrdup(".");
    char *d = df_xstrdup(f);
    char *slash = strrchr(d, '/');
    if (!slash) {
        free(d);
        return df_xstrdup(".");
    }
    if (slash == d) slash[1] = 0;
    else *slash = 0;
    return d;
}

/* Data samples: two checkpoints with the same config and shapes (a fine-tune)
 * differ here, at the cost of a few small reads instead of hashing every byte.
 * Read with pread(), not through the model's mapping: a touched page of the
 * mapping (and the fault-around pages next to it) would stay in our RSS, and
 * with experts streaming under a budget that was 40 MiB of expert bytes on
 * a 6-layer, 64-expert checkpoint that the budget did not count. */
static int fp_samples(XXH3_state_t *st, const df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!m->cfg.layer_is_moe[li]) continue;
        int ex[3] = {0, c->num_experts / 2, c->num_experts - 1};
        for (int j = 0; j < 3; j++) {
            if ((j == 1 && ex[1] == ex[0]) || (j == 2 && (ex[2] == ex[1] || ex[2] == ex[0])))
                continue;
            for (int k = 0; k < 3; k++) {
                const df_tensor *t = expert_part(m, li, ex[j], k);
                uint64_t len = t->nbytes < 64 ? t->nbytes : 64;
                uint64_t offs[3] = {0, (t->nbytes / 2) & ~(uint64_t)63, t->nbytes - len};
                for (int s = 0; s < 3; s++) {
                    uint8_t buf[64];
                    if (offs[s] + len > t->nbytes) offs[s] = t->nbytes - len;
                    ssize_t got = df_pread_full(df_st_file_fd(m->st, t->file), buf, (size_t)len,
                                                t->file_offset + offs[s]);
                    if (got != (ssize_t)len)
                        return df_fail(err, DF_ERR_IO, "%s: tensor '%s': %s", df_st_file_path(m->st, t->file),
                                       t->name, got < 0 ? strerror(errno) : "unexpected end of file");
                    fp_u64(st, offs[s]);
                    XXH3_128bits_update(st, buf, (size_t)len);
                }
            }
        }
    }
    return DF_OK;
}

int df_pack_fingerprint(const df_model *m, const char *model_dir, char out[DF_PACK_FP_HEX + 1],
                        df_error *err) {
    if (!m || !out) return df_fail(err, DF_ERR_ARG, "df_pack_fingerprint: bad arguments");
    if (!model_has_experts(m))
        return df_fail(err, DF_ERR_UNSUPPORTED, "model has no routed experts (architecture %s)",
                       m->cfg.model_type);
    char *dir = model_dir ? df_xstrdup(model_dir) : model_dir_of(m);
    char *cpath = df_path_join(dir, "config.json");
    free(dir);
    char *cfg;
    size_t clen;
    int rc = df_read_file(cpath, &cfg, &clen, err);
    free(cpath);
    if (rc) return rc;

    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        free(cfg);
        return df_fail(err, DF_ERR_NOMEM, "out of memory");
    }
    XXH3_128bits_reset(st);
    static const char magic[] = "deltafin-pack-fingerprint v1\n";
    XXH3_128bits_update(st, magic, sizeof magic - 1);
    fp_u64(st, clen);
    XXH3_128bits_update(st, cfg, clen);
    free(cfg);
    const df_config *c = &m->cfg;
    fp_u64(st, (uint64_t)c->num_hidden_layers);
    fp_u64(st, (uint64_t)c->num_experts);
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!m->cfg.layer_is_moe[li]) continue;
        for (int e = 0; e < c->num_experts; e++)
            for (int k = 0; k < 3; k++) {
                const df_tensor *t = expert_part(m, li, e, k);
                XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
                const char *dn = df_dtype_name(t->dtype);
                XXH3_128bits_update(st, dn, strlen(dn) + 1);
                fp_u64(st, (uint64_t)t->ndim);
                for (int d = 0; d < t->ndim; d++) fp_u64(st, (uint64_t)t->shape[d]);
            }
    }
    rc = fp_samples(st, m, err);
    if (rc) {
        XXH3_freeState(st);
        return rc;
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    snprintf(out, DF_PACK_FP_HEX + 1, "%016" PRIx64 "%016" PRIx64, h.high64, h.low64);
    return DF_OK;
}

/* ---- manifest ---------------------------------------------------------------------- */

typedef struct manifest {
    char uuid[40];
    char fp[DF_PACK_FP_HEX + 1];
    int stripe, stripes;
    int n_layers, n_experts;
    char arch[32];
    uint64_t data_bytes;
    int n;
    df_pack_record *rec;
    uint64_t *sxxh3; /* this stripe's checksum of each record's stripe */
} manifest;

static void manifest_free(manifest *mf) {
    free(mf->rec);
    free(mf->sxxh3);
    memset(mf, 0, sizeof *mf);
}

static char *json_quote(const char *s) {
    json_t *j = json_string(s ? s : "");
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return q ? q : df_xstrdup("\"\"");
}

/* One record per line, so that a human (or grep) can read it. */
static char *manifest_text(const plan *p, const df_model *m, const char *uuid, const char *fp,
                           int stripe, const uint64_t *rec_xxh3, const uint64_t *stripe_xxh3) {
    sbuf b = {0};
    char *arch = json_quote(m->cfg.model_type);
    sb_printf(&b,
              "{\n"
              "  \"format\": \"" FORMAT_NAME "\",\n"
              "  \"version\": %d,\n"
              "  \"uuid\": \"%s\",\n"
              "  \"stripe\": %d,\n"
              "  \"stripes\": %d,\n"
              "  \"align\": %d,\n"
              "  \"fingerprint\": \"%s\",\n"
              "  \"model\": {\"architecture\": %s, \"num_hidden_layers\": %d, "
              "\"num_experts\": %d, \"hidden_size\": %d, \"moe_intermediate_size\": %d},\n"
              "  \"data_file\": \"" DATA_NAME "\",\n"
              "  \"data_bytes\": %" PRIu64 ",\n"
              "  \"record_fields\": [\"layer\", \"expert\", \"offset\", \"length\", \"xxh3\", "
              "\"stripe_xxh3\", \"gate\", \"up\", \"down\"],\n"
              "  \"records\": [\n",
              DF_PACK_VERSION, uuid, stripe, p->S, DF_PACK_ALIGN, fp, arch,
              m->cfg.num_hidden_layers, m->cfg.num_experts, m->cfg.hidden_size,
              m->cfg.moe_intermediate_size, p->stripe_file_bytes);
    free(arch);
    for (int i = 0; i < p->n; i++) {
        const df_pack_record *r = &p->rec[i];
        char h[17], sh[17];
        hex64(rec_xxh3[i], h);
        hex64(stripe_xxh3[i], sh);
        sb_printf(&b, "    [%d, %d, %" PRIu64 ", %" PRIu64 ", \"%s\", \"%s\"", r->layer, r->expert,
                  r->offset, r->length, h, sh);
        for (int k = 0; k < 3; k++)
            sb_printf(&b, ", [\"%s\", [%" PRId64 ", %" PRId64 "], %" PRIu64 "]",
                      df_dtype_name(r->part[k].dtype), r->part[k].rows, r->part[k].cols,
                      r->part[k].nbytes);
        sb_printf(&b, "]%s\n", i + 1 < p->n ? "," : "");
    }
    sb_printf(&b, "  ]\n}\n");
    return b.s;
}

/* Integer field in [lo, hi]. */
static bool jint(json_t *o, const char *key, long long lo, long long hi, long long *v) {
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j)) return false;
    long long x = json_integer_value(j);
    if (x < lo || x > hi) return false;
    *v = x;
    return true;
}

static const char *jstr(json_t *o, const char *key) {
    json_t *j = json_object_get(o, key);
    return json_is_string(j) ? json_string_value(j) : NULL;
}

static int parse_part(json_t *a, df_pack_part *pt, uint64_t off) {
    if (!json_is_array(a) || json_array_size(a) != 3) return -1;
    json_t *dt = json_array_get(a, 0), *sh = json_array_get(a, 1), *nb = json_array_get(a, 2);
    if (!json_is_string(dt) || !json_is_array(sh) || json_array_size(sh) != 2 ||
        !json_is_integer(nb))
        return -1;
    int d = df_dtype_from_name(json_string_value(dt));
    if (d < 0) return -1;
    json_t *r = json_array_get(sh, 0), *c = json_array_get(sh, 1);
    if (!json_is_integer(r) || !json_is_integer(c)) return -1;
    long long rows = json_integer_value(r), cols = json_integer_value(c),
              n = json_integer_value(nb);
    if (rows < 1 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX) return -1;
    /* rows, cols < 2^31 and dtype size <= 8: no overflow below 2^65 / ... checked */
    unsigned __int128 want = (unsigned __int128)rows * (unsigned __int128)cols *
                             df_dtype_size((df_dtype)d);
    if (want != (unsigned __int128)n || n <= 0 || n > ((long long)1 << 50)) return -1;
    pt->offset = off;
    pt->nbytes = (uint64_t)n;
    pt->dtype = (df_dtype)d;
    pt->rows = rows;
    pt->cols = cols;
    return 0;
}

/* Parses and validates a manifest (untrusted: every offset, length and range is
 * checked, records are in file order and do not overlap). `dir` names errors. */
static int manifest_parse(manifest *mf, const char *dir, const char *text, size_t len,
                          df_error *err) {
    memset(mf, 0, sizeof *mf);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": not valid JSON: %s "
                       "(line %d)", dir, je.text, je.line);
    int rc = DF_OK;
    long long v;
#define BAD(...) do { rc = df_fail(err, DF_ERR_FORMAT, __VA_ARGS__); goto out; } while (0)
    const char *fmt = jstr(root, "format");
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0)
        BAD("pack %s: " MANIFEST_NAME ": not a deltafin pack manifest (field 'format' is not "
            "\"" FORMAT_NAME "\")", dir);
    if (!jint(root, "version", 0, INT32_MAX, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'version' missing or not an integer", dir);
    if (v != DF_PACK_VERSION) {
        rc = df_fail(err, DF_ERR_UNSUPPORTED, "pack %s: format version %lld, this deltafin "
                     "reads version %d (repack with this version)", dir, v, DF_PACK_VERSION);
        goto out;
    }
    const char *uuid = jstr(root, "uuid"), *fp = jstr(root, "fingerprint");
    if (!is_uuid(uuid)) BAD("pack %s: " MANIFEST_NAME ": field 'uuid' is not a uuid", dir);
    if (!is_hex(fp, DF_PACK_FP_HEX))
        BAD("pack %s: " MANIFEST_NAME ": field 'fingerprint' is not %d hex digits", dir,
            DF_PACK_FP_HEX);
    snprintf(mf->uuid, sizeof mf->uuid, "%s", uuid);
    snprintf(mf->fp, sizeof mf->fp, "%s", fp);
    if (!jint(root, "stripes", 1, DF_PACK_MAX_STRIPES, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'stripes' must be an integer in 1..%d", dir,
            DF_PACK_MAX_STRIPES);
    mf->stripes = (int)v;
    if (!jint(root, "stripe", 0, mf->stripes - 1, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'stripe' must be an integer in 0..%d", dir,
            mf->stripes - 1);
    mf->stripe = (int)v;
    if (!jint(root, "align", DF_PACK_ALIGN, DF_PACK_ALIGN, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'align' must be %d", dir, DF_PACK_ALIGN);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) BAD("pack %s: " MANIFEST_NAME ": field 'model' missing", dir);
    if (!jint(model, "num_hidden_layers", 1, DF_MAX_LAYERS, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'model.num_hidden_layers' must be in 1..%d", dir,
            DF_MAX_LAYERS);
    mf->n_layers = (int)v;
    if (!jint(model, "num_experts", 1, 65536, &v))
        BAD("pack %s: " MANIFEST_NAME ": field 'model.num_experts' must be in 1..65536", dir);
    mf->n_experts = (int)v;
    const char *arch = jstr(model, "architecture");
    snprintf(mf->arch, sizeof mf->arch, "%s", arch ? arch : "?");
    const char *df = jstr(root, "data_file");
    if (!df || strcmp(df, DATA_NAME) != 0)
        BAD("pack %s: " MANIFEST_NAME ": field 'data_file' must be \"" DATA_NAME "\"", dir);
    if (!jint(root, "data_bytes", 0, INT64_MAX, &v) || v % DF_PACK_ALIGN)
        BAD("pack %s: " MANIFEST_NAME ": field 'data_bytes' must be a multiple of %d", dir,
            DF_PACK_ALIGN);
    mf->data_bytes = (uint64_t)v;
    json_t *recs = json_object_get(root, "records");
    size_t n = json_is_array(recs) ? json_array_size(recs) : 0;
    if (n == 0 || n > (size_t)mf->n_layers * (size_t)mf->n_experts)
        BAD("pack %s: " MANIFEST_NAME ": field 'records' must be an array of 1..%lld records",
            dir, (long long)mf->n_layers * mf->n_experts);
    mf->n = (int)n;
    mf->rec = df_xcalloc(n, sizeof *mf->rec);
    mf->sxxh3 = df_xcalloc(n, sizeof *mf->sxxh3);
    uint8_t *seen = df_xcalloc((size_t)mf->n_layers * (size_t)mf->n_experts, 1);
    uint64_t prev_end = 0, unit = (uint64_t)DF_PACK_ALIGN * (uint64_t)mf->stripes;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(recs, i);
        df_pack_record *r = &mf->rec[i];
        json_t *f[9];
        bool ok = json_is_array(a) && json_array_size(a) == 9;
        for (int k = 0; ok && k < 9; k++) f[k] = json_array_get(a, (size_t)k);
        ok = ok && json_is_integer(f[0]) && json_is_integer(f[1]) && json_is_integer(f[2]) &&
             json_is_integer(f[3]) && json_is_string(f[4]) && json_is_string(f[5]);
        long long layer = ok ? json_integer_value(f[0]) : -1, ex = ok ? json_integer_value(f[1]) : -1;
        long long off = ok ? json_integer_value(f[2]) : -1, ln = ok ? json_integer_value(f[3]) : -1;
        ok = ok && layer >= 0 && layer < mf->n_layers && ex >= 0 && ex < mf->n_experts &&
             off >= 0 && ln > 0 && ln < ((long long)1 << 52) &&
             parse_hex64(json_string_value(f[4]), &r->xxh3) &&
             parse_hex64(json_string_value(f[5]), &mf->sxxh3[i]);
        uint64_t po = 0;
        for (int k = 0; ok && k < 3; k++) {
            ok = parse_part(f[6 + k], &r->part[k], po) == 0;
            po += ok ? r->part[k].nbytes : 0;
        }
        if (!ok) {
            free(seen);
            BAD("pack %s: " MANIFEST_NAME ": record %zu is malformed", dir, i);
        }
        r->layer = (int)layer;
        r->expert = (int)ex;
        r->offset = (uint64_t)off;
        r->length = (uint64_t)ln;
        r->padded = round_up(r->length, unit);
        const char *why = NULL;
        if (po != r->length) why = "its parts do not add up to its length";
        else if (r->offset % DF_PACK_ALIGN) why = "its offset is not a multiple of 4096";
        else if (r->offset < prev_end) why = "it overlaps the record before it";
        else if (r->offset + r->padded / (uint64_t)mf->stripes > mf->data_bytes)
            why = "it extends past data_bytes";
        else if (seen[(size_t)layer * (size_t)mf->n_experts + (size_t)ex]++)
            why = "its layer and expert appear twice";
        if (why) {
            free(seen);
            BAD("pack %s: " MANIFEST_NAME ": record %zu (layer %d expert %d): %s", dir, i,
                r->layer, r->expert, why);
        }
        prev_end = r->offset + r->padded / (uint64_t)mf->stripes;
    }
    free(seen);
#undef BAD
out:
    json_decref(root);
    if (rc) manifest_free(mf);
    return rc;
}

static int manifest_load(manifest *mf, const char *dir, df_error *err) {
    char *path = df_path_join(dir, MANIFEST_NAME);
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) {
        rc = df_fail(err, DF_ERR_IO, "pack %s: " MANIFEST_NAME ": cannot open: %s", dir,
                     strerror(errno));
    } else if (!S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_MANIFEST_BYTES) {
        rc = df_fail(err, DF_ERR_FORMAT, "pack %s: " MANIFEST_NAME ": not a regular file of at "
                     "most 1 GiB", dir);
    } else {
        char *text;
        size_t len;
        df_error e2;
        rc = df_read_file(path, &text, &len, &e2);
        if (rc) rc = df_fail(err, rc, "pack %s: %s", dir, e2.msg);
        else {
            rc = manifest_parse(mf, dir, text, len, err);
            free(text);
        }
    }
    free(path);
    return rc;
}

static bool record_equal(const df_pack_record *a, const df_pack_record *b) {
    if (a->layer != b->layer || a->expert != b->expert || a->offset != b->offset ||
        a->length != b->length || a->padded != b->padded || a->xxh3 != b->xxh3)
        return false;
    for (int k = 0; k < 3; k++)
        if (a->part[k].offset != b->part[k].offset || a->part[k].nbytes != b->part[k].nbytes ||
            a->part[k].dtype != b->part[k].dtype || a->part[k].rows != b->part[k].rows ||
            a->part[k].cols != b->part[k].cols)
            return false;
    return true;
}

/* ---- progress journal ----------------------------------------------------------------- */

typedef struct progress {
    char uuid[40];
    char fp[DF_PACK_FP_HEX + 1];
    int stripe, stripes, total, done;
    uint64_t *xxh3, *sxxh3;
} progress;

static void progress_free(progress *pg) {
    free(pg->xxh3);
    free(pg->sxxh3);
    memset(pg, 0, sizeof *pg);
}

static int progress_load(progress *pg, const char *dir, df_error *err) {
    memset(pg, 0, sizeof *pg);
    char *path = df_path_join(dir, PROGRESS_NAME);
    char *text;
    size_t len;
    df_error e2;
    int rc = df_read_file(path, &text, &len, &e2);
    free(path);
    if (rc) return df_fail(err, rc, "pack %s: %s", dir, e2.msg);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    long long v;
    const char *s;
    json_t *a, *b;
    bool ok = root && (s = jstr(root, "format")) && !strcmp(s, PROGRESS_FORMAT) &&
              jint(root, "version", DF_PACK_VERSION, DF_PACK_VERSION, &v) &&
              is_uuid(jstr(root, "uuid")) && is_hex(jstr(root, "fingerprint"), DF_PACK_FP_HEX);
    if (ok) {
        snprintf(pg->uuid, sizeof pg->uuid, "%s", jstr(root, "uuid"));
        snprintf(pg->fp, sizeof pg->fp, "%s", jstr(root, "fingerprint"));
        ok = jint(root, "stripes", 1, DF_PACK_MAX_STRIPES, &v);
        pg->stripes = (int)v;
    }
    if (ok) {
        ok = jint(root, "stripe", 0, pg->stripes - 1, &v);
        pg->stripe = (int)v;
    }
    if (ok) {
        ok = jint(root, "records_total", 1, INT32_MAX, &v);
        pg->total = (int)v;
    }
    if (ok) {
        ok = jint(root, "records_done", 0, pg->total, &v);
        pg->done = (int)v;
    }
    a = ok ? json_object_get(root, "xxh3") : NULL;
    b = ok ? json_object_get(root, "stripe_xxh3") : NULL;
    ok = ok && json_is_array(a) && json_is_array(b) && json_array_size(a) == (size_t)pg->done &&
         json_array_size(b) == (size_t)pg->done;
    if (ok) {
        pg->xxh3 = df_xcalloc((size_t)pg->done + 1, sizeof *pg->xxh3);
        pg->sxxh3 = df_xcalloc((size_t)pg->done + 1, sizeof *pg->sxxh3);
        for (int i = 0; ok && i < pg->done; i++)
            ok = parse_hex64(json_string_value(json_array_get(a, (size_t)i)), &pg->xxh3[i]) &&
                 parse_hex64(json_string_value(json_array_get(b, (size_t)i)), &pg->sxxh3[i]);
    }
    json_decref(root);
    if (!ok) {
        progress_free(pg);
        return df_fail(err, DF_ERR_FORMAT, "pack %s: the " PROGRESS_NAME " journal of an "
                       "unfinished pack is damaged; delete %s/" PROGRESS_NAME " and the "
                       ".partial files there to start over", dir, dir);
    }
    return DF_OK;
}

/* Writes text to dir/name atomically enough for our purposes: a temporary
 * name, fsync, rename, fsync of the directory. 0 or an errno value. */
static int write_file_durable(const char *dir, const char *tmp_name, const char *name,
                              const char *text, size_t len) {
    char *tmp = df_path_join(dir, tmp_name), *fin = name ? df_path_join(dir, name) : NULL;
    int e = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) e = errno;
    if (!e) e = pwrite_full(fd, text, len, 0);
    if (!e && fsync(fd) != 0) e = errno;
    if (fd >= 0) close(fd);
    if (!e && fin && rename(tmp, fin) != 0) e = errno;
    if (!e) e = fsync_dir(dir);
    if (e && fd >= 0) unlink(tmp);
    free(tmp);
    free(fin);
    return e;
}

static char *progress_text(const char *uuid, const char *fp, int stripe, int stripes, int total,
                           int done, const uint64_t *xxh3, const uint64_t *sxxh3) {
    sbuf b = {0};
    sb_printf(&b,
              "{\"format\": \"" PROGRESS_FORMAT "\", \"version\": %d, \"uuid\": \"%s\", "
              "\"fingerprint\": \"%s\", \"stripe\": %d, \"stripes\": %d, "
              "\"records_total\": %d, \"records_done\": %d,\n\"xxh3\": [",
              DF_PACK_VERSION, uuid, fp, stripe, stripes, total, done);
    char h[17];
    for (int i = 0; i < done; i++) {
        hex64(xxh3[i], h);
        sb_printf(&b, "%s\"%s\"", i ? "," : "", h);
    }
    sb_printf(&b, "],\n\"stripe_xxh3\": [");
    for (int i = 0; i < done; i++) {
        hex64(sxxh3[i], h);
        sb_printf(&b, "%s\"%s\"", i ? "," : "", h);
    }
    sb_printf(&b, "]}\n");
    return b.s;
}

/* ---- writer ----------------------------------------------------------------------------- */

typedef struct wdir {
    const char *dir;
    int stripe;
    int state;
    manifest mf; /* ST_COMPLETE */
    progress pg; /* ST_PARTIAL */
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
    df_model m;
    plan pl;
    char fp[DF_PACK_FP_HEX + 1];
    char uuid[40];
    int S;
    wdir *wd;       /* in the order given */
    wdir **by;      /* by stripe */
    uint64_t *xxh3; /* [n] */
    uint64_t written_run;
    pbar bar;
} writer;

static int disk_full(writer *w, const wdir *d, const char *what, int e, df_error *err) {
    if (e == ENOSPC || e == EDQUOT) {
        char at[96] = "";
        if (!strcmp(what, DATA_PARTIAL)) {
            char a[32], b[32];
            human_bytes(d->buf_off, a, sizeof a);
            human_bytes(w->pl.stripe_file_bytes, b, sizeof b);
            snprintf(at, sizeof at, " (%s of %s written there)", a, b);
        }
        return df_fail(err, DF_ERR_IO, "pack %s: disk full writing %s%s; free some space and run "
                       "the same command again to resume", d->dir, what, at);
    }
    return df_fail(err, DF_ERR_IO, "pack %s: writing %s failed: %s", d->dir, what, strerror(e));
}

/* The data write, with the test hook that pretends the disk filled up. */
static int data_write(writer *w, wdir *d, const void *buf, size_t n, uint64_t off) {
    uint64_t lim = w->o->fail_enospc_after_bytes;
    if (lim && w->written_run + n > lim) {
        size_t k = lim > w->written_run ? (size_t)(lim - w->written_run) : 0;
        if (k) pwrite_full(d->fd, buf, k, off);
        w->written_run += k;
        return ENOSPC;
    }
    int e = pwrite_full(d->fd, buf, n, off);
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
        char *t = progress_text(w->uuid, w->fp, i, w->S, w->pl.n, done, w->xxh3, d->sxxh3);
        int e = write_file_durable(d->dir, PROGRESS_TMP, PROGRESS_NAME, t, strlen(t));
        free(t);
        if (e) return disk_full(w, d, PROGRESS_NAME, e, err);
    }
    return DF_OK;
}

/* Reads record i of the plan from the checkpoint into buf (padded with zeros). */
static int read_source(writer *w, int i, uint8_t *buf, df_error *err) {
    const df_pack_record *r = &w->pl.rec[i];
    for (int k = 0; k < 3; k++) {
        const df_tensor *t = w->pl.src[i][k];
        int fd = df_st_file_fd(w->m.st, t->file);
        ssize_t got = df_pread_full(fd, buf + r->part[k].offset, (size_t)t->nbytes, t->file_offset);
        if (got != (ssize_t)t->nbytes)
            return df_fail(err, DF_ERR_IO, "%s: tensor '%s': %s", df_st_file_path(w->m.st, t->file),
                           t->name, got < 0 ? strerror(errno) : "file is shorter than its header says");
        posix_fadvise(fd, (off_t)t->file_offset, (off_t)t->nbytes, POSIX_FADV_DONTNEED);
    }
    memset(buf + r->length, 0, (size_t)(r->padded - r->length));
    return DF_OK;
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
        if (exists(d->dir, MANIFEST_NAME)) {
            if ((rc = manifest_load(&d->mf, d->dir, err)))
                return fail_more(err, rc, "; not overwriting it: delete it or choose another "
                                 "directory");
            d->state = ST_COMPLETE;
            n_complete++;
        } else if (exists(d->dir, PROGRESS_NAME)) {
            if ((rc = progress_load(&d->pg, d->dir, err))) return rc;
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
            human_bytes(need, a, sizeof a);
            human_bytes(avail, b, sizeof b);
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
        if (!fresh && access(p, F_OK) != 0 && exists(d->dir, DATA_NAME)) {
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

static int finish(writer *w, df_error *err) {
    int renames = 0;
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
        char *t = manifest_text(&w->pl, &w->m, w->uuid, w->fp, i, w->xxh3, d->sxxh3);
        int e = write_file_durable(d->dir, MANIFEST_PARTIAL, NULL, t, strlen(t));
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
            int e = rename(a, b) != 0 ? errno : fsync_dir(d->dir);
            free(a);
            free(b);
            if (e) return df_fail(err, DF_ERR_IO, "pack %s: cannot rename %s to %s: %s", d->dir,
                                  from, to, strerror(e));
            if (++renames == w->o->stop_after_renames)
                return df_fail(err, DF_ERR_IO, "pack: stopped after %d renames (test hook)",
                               renames);
        }
    for (int i = 0; i < w->S; i++) { /* complete ones too: a finish cut short leaves it */
        unlink_in(w->by[i]->dir, PROGRESS_NAME);
        fsync_dir(w->by[i]->dir);
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

    writer w = {0};
    w.o = opts;
    w.model_dir = model_dir;
    w.S = n_dirs;
    double t0 = df_now();
    int rc = df_model_load(&w.m, model_dir, err);
    if (rc) return rc;
    uint8_t *buf = NULL;
    if (!model_has_experts(&w.m)) {
        rc = df_fail(err, DF_ERR_UNSUPPORTED, "%s: the model has no routed experts (architecture "
                     "%s); nothing to pack", model_dir, w.m.cfg.model_type);
        goto out_model;
    }
    if ((rc = df_pack_fingerprint(&w.m, model_dir, w.fp, err))) goto out_model;
    plan_build(&w.pl, &w.m, w.S);
    w.wd = df_xcalloc((size_t)w.S, sizeof *w.wd);
    w.by = df_xcalloc((size_t)w.S, sizeof *w.by);
    w.xxh3 = df_xcalloc((size_t)w.pl.n, sizeof *w.xxh3);
    for (int i = 0; i < w.S; i++) {
        w.wd[i].dir = dirs[i];
        w.wd[i].fd = -1;
        w.wd[i].lock_fd = -1;
        w.wd[i].stripe = i;
        w.wd[i].sxxh3 = df_xcalloc((size_t)w.pl.n, sizeof *w.wd[i].sxxh3);
    }
    if ((rc = prepare_dirs(&w, err))) goto out;
    int action;
    if ((rc = inspect_dirs(&w, &action, err))) goto out;
    for (int i = 0; i < w.S; i++) w.by[w.wd[i].stripe] = &w.wd[i];
    if (res) {
        res->records = w.pl.n;
        res->bytes = w.pl.total_padded;
    }
    if (action == 2) {
        df_pack *p;
        if ((rc = df_pack_open(&p, dirs, n_dirs, &w.m, err))) {
            rc = fail_more(err, rc, "; it looks like a complete pack of this model but is not "
                           "usable: delete it and repack");
            goto out;
        }
        df_pack_close(p);
        for (int i = 0; i < w.S; i++) { /* leftovers of an interrupted finish */
            unlink_in(dirs[i], PROGRESS_NAME);
            unlink_in(dirs[i], DATA_PARTIAL);
            unlink_in(dirs[i], MANIFEST_PARTIAL);
        }
        if (res) res->up_to_date = true;
        if (opts->log)
            fprintf(opts->log, "deltafin pack: %s: already holds this model's pack (%d experts); "
                    "up to date\n", dirs[0], w.pl.n);
        goto out;
    }
    bool fresh = action == 0;
    if (fresh) {
        random_uuid(w.uuid);
        for (int i = 0; i < w.S; i++) unlink_in(w.by[i]->dir, MANIFEST_PARTIAL);
    }
    if ((rc = open_data(&w, fresh, err))) goto out;
    buf = aligned_alloc(DF_PACK_ALIGN, round_up(w.pl.max_padded, DF_PACK_ALIGN));
    if (!buf) {
        rc = df_fail(err, DF_ERR_NOMEM, "pack: out of memory for a %zu-byte record", w.pl.max_padded);
        goto out;
    }
    int start = 0;
    if (fresh) {
        if ((rc = checkpoint(&w, 0, err))) goto out;
    } else if (any_complete(&w)) {
        /* interrupted while renaming into place: every record is written */
        if (opts->log)
            fprintf(opts->log, "deltafin pack: finishing an interrupted pack\n");
        if (res) res->resumed_from = w.pl.n;
        int done;
        const wdir *ref;
        if ((rc = load_journals(&w, &done, &ref, err)) == DF_OK) rc = finish(&w, err);
        goto out;
    } else {
        if ((rc = resume_point(&w, buf, &start, err))) goto out;
        if (opts->log && start < w.pl.n)
            fprintf(opts->log, "deltafin pack: resuming an unfinished pack at record %d of %d "
                    "(layer %d expert %d)\n", start, w.pl.n, w.pl.rec[start].layer,
                    w.pl.rec[start].expert);
    }
    if (res) res->resumed_from = start;
    if (!opts->skip_space_check && (rc = check_space(&w, err))) goto out;

    size_t cap = (size_t)16 << 20;
    cap = cap / (size_t)w.S < ((size_t)4 << 20) ? (size_t)4 << 20 : round_up(cap / (size_t)w.S, DF_PACK_ALIGN);
    uint64_t off0 = start < w.pl.n ? w.pl.rec[start].offset : w.pl.stripe_file_bytes;
    for (int i = 0; i < w.S; i++) {
        w.by[i]->buf = aligned_alloc(DF_PACK_ALIGN, cap);
        if (!w.by[i]->buf) {
            rc = df_fail(err, DF_ERR_NOMEM, "pack: out of memory");
            goto out;
        }
        w.by[i]->cap = cap;
        w.by[i]->buf_off = off0;
    }
    uint64_t done_bytes = 0;
    for (int i = 0; i < start; i++) done_bytes += w.pl.rec[i].padded;
    pbar_init(&w.bar, opts->progress, "packing", w.pl.total_padded, done_bytes);
    pbar_draw(&w.bar, false);
    uint64_t since_ckpt = 0;
    double t_ckpt = df_now();
    int this_run = 0;
    for (int i = start; i < w.pl.n; i++) {
        const df_pack_record *r = &w.pl.rec[i];
        if ((rc = read_source(&w, i, buf, err))) goto out_bar;
        w.xxh3[i] = XXH3_64bits(buf, (size_t)r->length);
        size_t sb = (size_t)(r->padded / (uint64_t)w.S);
        for (int s = 0; s < w.S; s++) {
            w.by[s]->sxxh3[i] = XXH3_64bits(buf + (size_t)s * sb, sb);
            if ((rc = wdir_append(&w, w.by[s], buf + (size_t)s * sb, sb, err))) goto out_bar;
        }
        w.bar.done += r->padded;
        since_ckpt += r->padded;
        pbar_draw(&w.bar, false);
        this_run++;
        if (opts->stop_after_records > 0 && this_run >= opts->stop_after_records && i + 1 < w.pl.n) {
            rc = df_fail(err, DF_ERR_IO, "pack: stopped after %d records (test hook)", this_run);
            goto out_bar;
        }
        bool due = opts->checkpoint_every_records > 0
                       ? (i + 1) % opts->checkpoint_every_records == 0
                       : since_ckpt >= CKPT_BYTES || df_now() - t_ckpt >= CKPT_SECONDS;
        if (due && i + 1 < w.pl.n) {
            if ((rc = checkpoint(&w, i + 1, err))) goto out_bar;
            since_ckpt = 0;
            t_ckpt = df_now();
        }
    }
    rc = finish(&w, err);
out_bar:
    if (w.bar.on) pbar_draw(&w.bar, true);
out:
    free(buf);
    for (int i = 0; i < w.S; i++) {
        if (w.wd[i].fd >= 0) close(w.wd[i].fd);
        if (w.wd[i].lock_fd >= 0) close(w.wd[i].lock_fd);
        free(w.wd[i].buf);
        free(w.wd[i].sxxh3);
        manifest_free(&w.wd[i].mf);
        progress_free(&w.wd[i].pg);
    }
    free(w.wd);
    free(w.by);
    free(w.xxh3);
    plan_free(&w.pl);
out_model:
    df_model_free(&w.m);
    if (res) res->seconds = df_now() - t0;
    return rc;
}

/* ---- reader -------------------------------------------------------------------------- */

struct df_pack {
    int S;
    char **dir;     /* by stripe */
    int *fd;
    bool *direct;
    uint64_t **sxxh3; /* [stripe][record] */
    char uuid[40];
    char fp[DF_PACK_FP_HEX + 1];
    int n;
    df_pack_record *rec;
    int n_layers, n_experts;
    int *index; /* [layer * n_experts + expert] -> record, -1 */
    size_t max_padded;
};

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
    free(p->index);
    free(p);
}

/* Opens experts.bin with O_DIRECT where the filesystem supports it (a probe read
 * tells, since some accept the flag at open and refuse the reads). */
static int open_data_ro(const char *dir, uint64_t need, int *fd_out, bool *direct, df_error *err) {
    char *path = df_path_join(dir, DATA_NAME);
    const char *nd = getenv("DF_PACK_BUFFERED"); /* force the page cache (odd filesystems, tests) */
    int fd = nd && *nd && strcmp(nd, "0") ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
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
    if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC);
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
    if ((uint64_t)sb.st_size < need) {
        close(fd);
        return df_fail(err, DF_ERR_IO, "pack %s: " DATA_NAME " is %lld bytes but the manifest "
                       "needs %" PRIu64 " (truncated?)", dir, (long long)sb.st_size, need);
    }
    *fd_out = fd;
    return DF_OK;
}

static int check_against_model(const df_pack *p, const manifest *mf, const df_model *m,
                               const char *dir, df_error *err) {
    char fp[DF_PACK_FP_HEX + 1];
    int rc = df_pack_fingerprint(m, NULL, fp, err);
    if (rc) return rc;
    if (strcmp(fp, mf->fp) != 0)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: built from a different model (pack "
                       "fingerprint %s, this model's %s); repack it with deltafin pack", dir,
                       mf->fp, fp);
    const df_config *c = &m->cfg;
    int want = 0;
    for (int li = 0; li < c->num_hidden_layers; li++)
        if (m->cfg.layer_is_moe[li]) want += c->num_experts;
    if (mf->n_layers != c->num_hidden_layers || mf->n_experts != c->num_experts || p->n != want)
        return df_fail(err, DF_ERR_FORMAT, "pack %s: has %d records for %d layers x %d experts, "
                       "the model needs %d for %d x %d", dir, p->n, mf->n_layers, mf->n_experts,
                       want, c->num_hidden_layers, c->num_experts);
    for (int i = 0; i < p->n; i++) {
        const df_pack_record *r = &p->rec[i];
        if (!m->cfg.layer_is_moe[r->layer])
            return df_fail(err, DF_ERR_FORMAT, "pack %s: record for layer %d, which has no "
                           "routed experts", dir, r->layer);
        for (int k = 0; k < 3; k++) {
            const df_tensor *t = expert_part(m, r->layer, r->expert, k);
            const df_pack_part *pt = &r->part[k];
            if (pt->dtype != t->dtype || pt->rows != t->shape[0] || pt->cols != t->shape[1] ||
                pt->nbytes != t->nbytes)
                return df_fail(err, DF_ERR_FORMAT, "pack %s: layer %d expert %d: part %d is "
                               "%s [%" PRId64 ",%" PRId64 "], the model's '%s' is %s [%" PRId64 ",%" PRId64 "]",
                               dir, r->layer, r->expert, k, df_dtype_name(pt->dtype), pt->rows, pt->cols,
                               t->name, df_dtype_name(t->dtype), t->shape[0], t->shape[1]);
        }
    }
    return DF_OK;
}

static const char *unfinished_hint(const char *dir) {
    return exists(dir, PROGRESS_NAME) || exists(dir, DATA_PARTIAL)
               ? " (an unfinished pack: run deltafin pack again to complete it)"
               : " (not a deltafin pack directory)";
}

int df_pack_open(df_pack **out, const char *const *dirs, int n_dirs, const df_model *m,
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
    manifest *mf = df_xcalloc((size_t)n_dirs, sizeof *mf);
    int rc = DF_OK, first = -1;
    for (int i = 0; i < n_dirs && !rc; i++) {
        const char *d = dirs[i];
        struct stat sb;
        if (!d || stat(d, &sb) != 0) {
            rc = df_fail(err, DF_ERR_IO, "pack %s: %s", d ? d : "(null)",
                         d && errno == ENOENT ? "directory not found" : strerror(errno));
            break;
        }
        if (!S_ISDIR(sb.st_mode)) {
            rc = df_fail(err, DF_ERR_IO, "pack %s: not a directory", d);
            break;
        }
        if (!exists(d, MANIFEST_NAME)) {
            rc = df_fail(err, DF_ERR_IO, "pack %s: no " MANIFEST_NAME "%s", d, unfinished_hint(d));
            break;
        }
        if ((rc = manifest_load(&mf[i], d, err))) break;
        const manifest *a = &mf[i];
        if (first < 0) {
            first = i;
        }
        const manifest *f = &mf[first];
        if (a->stripes != n_dirs) {
            rc = df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d of a %d-stripe pack, but %d "
                         "director%s given: give every directory of the pack", d, a->stripe,
                         a->stripes, n_dirs, n_dirs == 1 ? "y was" : "ies were");
        } else if (strcmp(a->uuid, f->uuid) != 0) {
            rc = df_fail(err, DF_ERR_ARG, "pack %s: belongs to a different pack than %s (uuid %s "
                         "vs %s)", d, dirs[first], a->uuid, f->uuid);
        } else if (p->dir[a->stripe]) {
            rc = df_fail(err, DF_ERR_ARG, "pack %s: holds stripe %d, and so does %s", d, a->stripe,
                         p->dir[a->stripe]);
        } else if (strcmp(a->fp, f->fp) != 0 || a->n != f->n || a->data_bytes != f->data_bytes ||
                   a->n_layers != f->n_layers || a->n_experts != f->n_experts) {
            rc = df_fail(err, DF_ERR_FORMAT, "pack %s: its manifest disagrees with %s's though "
                         "they share a uuid", d, dirs[first]);
        } else {
            for (int r = 0; r < a->n && !rc; r++)
                if (!record_equal(&a->rec[r], &f->rec[r]))
                    rc = df_fail(err, DF_ERR_FORMAT, "pack %s: record %d of its manifest disagrees "
                                 "with %s's", d, r, dirs[first]);
        }
        if (rc) break;
        p->dir[a->stripe] = df_xstrdup(d);
    }
    if (rc) goto fail;
    const manifest *f = &mf[first];
    snprintf(p->uuid, sizeof p->uuid, "%s", f->uuid);
    snprintf(p->fp, sizeof p->fp, "%s", f->fp);
    p->n = f->n;
    p->rec = df_xcalloc((size_t)p->n, sizeof *p->rec);
    memcpy(p->rec, f->rec, (size_t)p->n * sizeof *p->rec);
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
    if (m && (rc = check_against_model(p, f, m, dirs[first], err))) goto fail;
    for (int s = 0; s < n_dirs && !rc; s++)
        rc = open_data_ro(p->dir[s], f->data_bytes, &p->fd[s], &p->direct[s], err);
    if (rc) goto fail;
    for (int i = 0; i < n_dirs; i++) manifest_free(&mf[i]);
    free(mf);
    *out = p;
    return DF_OK;
fail:
    for (int i = 0; i < n_dirs; i++) manifest_free(&mf[i]);
    free(mf);
    df_pack_close(p);
    return rc;
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

static int read_stripe(const df_pack *p, const df_pack_record *r, int s, uint8_t *dst,
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
        int rc = read_stripe(p, r, s, dst + (size_t)s * sb, err);
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
    sbuf b = {0};
    for (int i = 0; i < p->S; i++) sb_printf(&b, "%s%s", i ? "+" : "", p->dir[i]);
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

static int check_record(const df_pack *p, const df_pack_record *r, uint8_t *dst, bool stripes,
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
    return check_record(p, r, dst_aligned, false, false, NULL, err);
}

/* ---- verify ----------------------------------------------------------------------------
 * The stripes of a record are read in parallel, one thread per drive. Records
 * are megabytes, so starting threads per record costs nothing measurable, and a
 * thread that cannot start just means that stripe is read inline. */

typedef struct vjob {
    const df_pack *p;
    const df_pack_record *r;
    int stripe;
    uint8_t *buf;
    df_error err;
    int rc;
} vjob;

static void *vworker(void *arg) {
    vjob *j = arg;
    size_t sb = df_pack_stripe_bytes(j->r, j->p->S);
    j->rc = read_stripe(j->p, j->r, j->stripe, j->buf + (size_t)j->stripe * sb, &j->err);
    return NULL;
}

static int read_parallel(const df_pack *p, const df_pack_record *r, uint8_t *buf, vjob *jobs,
                         pthread_t *th, df_error *err) {
    bool started[DF_PACK_MAX_STRIPES] = {0};
    for (int s = 0; s < p->S; s++) {
        jobs[s] = (vjob){.p = p, .r = r, .stripe = s, .buf = buf};
        if (s > 0) started[s] = pthread_create(&th[s], NULL, vworker, &jobs[s]) == 0;
    }
    for (int s = 0; s < p->S; s++)
        if (!started[s]) vworker(&jobs[s]);
    for (int s = 1; s < p->S; s++)
        if (started[s]) pthread_join(th[s], NULL);
    for (int s = 0; s < p->S; s++)
        if (jobs[s].rc) {
            *err = jobs[s].err;
            return jobs[s].rc;
        }
    return DF_OK;
}

int df_pack_verify(const char *const *dirs, int n_dirs, df_error *err) {
    df_pack *p;
    int rc = df_pack_open(&p, dirs, n_dirs, NULL, err);
    if (rc) return rc;
    uint8_t *buf = aligned_alloc(DF_PACK_ALIGN, round_up(p->max_padded, DF_PACK_ALIGN));
    if (!buf) {
        df_pack_close(p);
        return df_fail(err, DF_ERR_NOMEM, "pack: out of memory");
    }
    uint64_t total = 0;
    for (int i = 0; i < p->n; i++) total += p->rec[i].padded;
    pbar bar;
    pbar_init(&bar, isatty(2), "verifying", total, 0);
    vjob *jobs = df_xcalloc((size_t)p->S, sizeof *jobs);
    pthread_t *th = df_xcalloc((size_t)p->S, sizeof *th);
    int n_bad = 0;
    df_error first = {0};
    for (int i = 0; i < p->n && !rc; i++) {
        const df_pack_record *r = &p->rec[i];
        if ((rc = read_parallel(p, r, buf, jobs, th, err))) break;
        df_error e;
        bool bad;
        int c = check_record(p, r, buf, true, true, &bad, &e);
        if (c && bad) {
            if (!n_bad++) first = e;
        } else if (c) {
            rc = c;
            *err = e;
        }
        bar.done += r->padded;
        pbar_draw(&bar, false);
    }
    if (bar.on) pbar_draw(&bar, true);
    free(jobs);
    free(th);
    free(buf);
    if (!rc && n_bad) {
        if (n_bad > 1)
            rc = df_fail(err, DF_ERR_IO, "%s (%d of %d records bad)", first.msg, n_bad, p->n);
        else
            rc = df_fail(err, DF_ERR_IO, "%s", first.msg);
    }
    df_pack_close(p);
    return rc;
}
