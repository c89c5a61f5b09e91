/*
 * engine/pcache.c - the prompt cache's store (pcache.h): the file format,
 * writing under a temporary name and renaming, reading and verifying,
 * listing the directory, keeping it under its size (least recently used
 * first), turning writes off after a failure, and the RAM tier of recent
 * segments (the server's).
 */
#include "engine/pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <time.h>
#include <xxhash.h>

static const char MAGIC[8] = {'D', 'F', 'P', 'C', 'A', 'C', 'H', 'E'};
#define LAYER_DESC 16
#define STALE_TMP_S 3600 /* a temporary file this old is a crashed writer's */

typedef struct ram_entry {
    df_pc_blob *b;
    uint64_t used; /* the tier's clock when last used */
    int refs;      /* restores reading it now */
} ram_entry;

struct df_pcache {
    char *dir;
    uint64_t cap, ram_cap;
    uint8_t fp[16];
    unsigned long counter; /* temporary names: pid, a start time, a counter */
    unsigned long nonce;
    df_pc_stats st;
    ram_entry *ram;
    int n_ram, ram_size;
    uint64_t clock;
};

/* ---- little-endian fields ------------------------------------------------------------ */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- keys and names ---------------------------------------------------------------------- */

df_pc_key df_pcache_key(const df_pcache *pc, const int32_t *ids, int q) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, pc->fp, sizeof pc->fp);
    uint8_t buf[4096];
    for (int i = 0; i < q;) { /* the ids as little-endian bytes, whatever the host */
        int k = 0;
        for (; i < q && k < (int)sizeof buf; i++, k += 4) put_u32(buf + k, (uint32_t)ids[i]);
        XXH3_128bits_update(&st, buf, (size_t)k);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    df_pc_key key;
    put_u64(key.b, h.high64);
    put_u64(key.b + 8, h.low64);
    return key;
}

static void key_hex(const df_pc_key *k, char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", k->b[i]);
}

/* The file name of (q, key): q<q>-<hex>.dfpc. */
static char *seg_path(const df_pcache *pc, int q, const df_pc_key *k) {
    char hex[33], name[64];
    key_hex(k, hex);
    snprintf(name, sizeof name, "q%d-%s.dfpc", q, hex);
    return df_path_join(pc->dir, name);
}

/* Parses a segment's file name; false for any other name. */
static bool parse_name(const char *name, int *q, df_pc_key *k) {
    if (name[0] != 'q') return false;
    char *end;
    errno = 0;
    long v = strtol(name + 1, &end, 10);
    if (errno || end == name + 1 || v <= 0 || v > INT32_MAX || *end != '-' || strlen(end + 1) != 32 + 5 ||
        strcmp(end + 33, ".dfpc"))
        return false;
    for (int i = 0; i < 16; i++) {
        unsigned x;
        char two[3] = {end[1 + 2 * i], end[2 + 2 * i], 0};
        if (!strchr("0123456789abcdef", two[0]) || !strchr("0123456789abcdef", two[1])) return false;
        sscanf(two, "%x", &x);
        k->b[i] = (uint8_t)x;
    }
    *q = (int)v;
    return true;
}

/* ---- open and close ---------------------------------------------------------------------- */

int df_pcache_open(df_pcache **out, const char *dir, uint64_t cap, uint64_t ram_cap, const uint8_t fp[16],
                   df_error *err) {
    *out = NULL;
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return df_fail(err, DF_ERR_IO, "prompt cache: cannot create the directory '%s': %s", dir, strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return df_fail(err, DF_ERR_IO, "prompt cache: '%s' is not a directory", dir);
    if (access(dir, R_OK | W_OK | X_OK) != 0)
        return df_fail(err, DF_ERR_IO, "prompt cache: cannot use the directory '%s': %s", dir, strerror(errno));
    df_pcache *pc = df_xcalloc(1, sizeof *pc);
    pc->dir = df_xstrdup(dir);
    pc->cap = cap ? cap : DF_PC_DEFAULT_SIZE;
    pc->ram_cap = ram_cap;
    pc->nonce = (unsigned long)(df_now() * 1e9);
    memcpy(pc->fp, fp, sizeof pc->fp);
    *out = pc;
    return DF_OK;
}

void df_pcache_close(df_pcache *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->n_ram; i++) df_pcache_blob_free(pc->ram[i].b);
    free(pc->ram);
    free(pc->dir);
    free(pc);
}

const uint8_t *df_pcache_fingerprint(const df_pcache *pc) { return pc->fp; }
df_pc_stats *df_pcache_stats(df_pcache *pc) { return &pc->st; }

/* ---- segments in memory ------------------------------------------------------------------- */

static size_t file_size(uint32_t n_layers, uint32_t q, uint64_t payload) {
    return DF_PC_HEADER + (size_t)n_layers * LAYER_DESC + (size_t)q * 4 + (size_t)payload + 8;
}

static void write_head(uint8_t *p, const df_pc_head *h) {
    memset(p, 0, DF_PC_HEADER);
    memcpy(p, MAGIC, 8);
    put_u32(p + 8, h->version);
    put_u32(p + 12, h->n_layers);
    memcpy(p + 16, h->fp, 16);
    memcpy(p + 32, h->key.b, 16);
    put_u32(p + 48, h->q);
    put_u32(p + 52, h->from);
    put_u64(p + 56, h->payload);
}

/* False when p is not a header of this format. */
static bool read_head(const uint8_t *p, df_pc_head *h) {
    if (memcmp(p, MAGIC, 8)) return false;
    h->version = get_u32(p + 8);
    h->n_layers = get_u32(p + 12);
    memcpy(h->fp, p + 16, 16);
    memcpy(h->key.b, p + 32, 16);
    h->q = get_u32(p + 48);
    h->from = get_u32(p + 52);
    h->payload = get_u64(p + 56);
    return h->version == DF_PC_VERSION && h->q > 0 && h->q <= INT32_MAX && h->from < h->q &&
           h->n_layers <= 1 << 16 && h->payload < (uint64_t)1 << 50;
}

df_pc_blob *df_pcache_blob_new(const df_pcache *pc, const int32_t *ids, int q, int from,
                               const df_seq_layer_desc *layout, int n_layers, uint64_t payload) {
    df_pc_blob *b = df_xcalloc(1, sizeof *b);
    b->h = (df_pc_head){.version = DF_PC_VERSION, .n_layers = (uint32_t)n_layers, .key = df_pcache_key(pc, ids, q),
                        .q = (uint32_t)q, .from = (uint32_t)from, .payload = payload};
    memcpy(b->h.fp, pc->fp, 16);
    b->size = file_size(b->h.n_layers, b->h.q, payload);
    b->data = df_xmalloc(b->size);
    df_prefault_overwrite(b->data, b->size); /* written whole next: no fault per page */
    write_head(b->data, &b->h);
    uint8_t *p = b->data + DF_PC_HEADER;
    for (int i = 0; i < n_layers; i++, p += LAYER_DESC) {
        put_u32(p, layout[i].code);
        put_u32(p + 4, 0);
        put_u64(p + 8, layout[i].width);
    }
    for (int i = 0; i < q; i++, p += 4) put_u32(p, (uint32_t)ids[i]);
    b->payload = p;
    return b;
}

void df_pcache_blob_free(df_pc_blob *b) {
    if (!b) return;
    if (b->mapped) munmap(b->data, b->size);
    else free(b->data);
    free(b);
}

static uint64_t blob_sum(const df_pc_blob *b) { return XXH3_64bits(b->data, b->size - 8); }

/* ---- the RAM tier --------------------------------------------------------------------------- */

static int ram_find(const df_pcache *pc, int q, const df_pc_key *k) {
    for (int i = 0; i < pc->n_ram; i++)
        if (pc->ram[i].b->h.q == (uint32_t)q && !memcmp(pc->ram[i].b->h.key.b, k->b, 16)) return i;
    return -1;
}

static void ram_drop(df_pcache *pc, int i) {
    pc->st.ram_bytes -= pc->ram[i].b->size;
    df_pcache_blob_free(pc->ram[i].b);
    pc->ram[i] = pc->ram[--pc->n_ram];
}

/* Keeps b (taken) in the tier, dropping the least recently used segments
 * that are not being read until it fits; false (b not taken) when it cannot. */
static bool ram_keep(df_pcache *pc, df_pc_blob *b) {
    if (b->size > pc->ram_cap || ram_find(pc, (int)b->h.q, &b->h.key) >= 0) return false;
    while (pc->st.ram_bytes + b->size > pc->ram_cap) {
        int old = -1;
        for (int i = 0; i < pc->n_ram; i++)
            if (!pc->ram[i].refs && (old < 0 || pc->ram[i].used < pc->ram[old].used)) old = i;
        if (old < 0) return false;
        ram_drop(pc, old);
    }
    if (pc->n_ram == pc->ram_size) {
        pc->ram_size = pc->ram_size ? 2 * pc->ram_size : 8;
        pc->ram = df_xrealloc(pc->ram, sizeof *pc->ram * (size_t)pc->ram_size);
    }
    pc->ram[pc->n_ram++] = (ram_entry){b, ++pc->clock, 0};
    pc->st.ram_bytes += b->size;
    return true;
}

/* ---- the directory ------------------------------------------------------------------------- */

typedef struct dir_file {
    char *name;
    uint64_t size;
    struct timespec mtime;
} dir_file;

static int by_mtime(const void *a, const void *b) {
    const struct timespec *x = &((const dir_file *)a)->mtime, *y = &((const dir_file *)b)->mtime;
    if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
    return x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec;
}

static bool is_tmp(const char *name) { return !strncmp(name, ".tmp-", 5) && strstr(name, ".dfpc"); }

/* Segments and temporary files of the directory; files that vanish while
 * it is listed (another process) are left out. */
static dir_file *list_dir(const df_pcache *pc, int *n_out) {
    int n = 0, cap = 0;
    dir_file *f = NULL;
    DIR *d = opendir(pc->dir);
    struct dirent *de;
    int q;
    df_pc_key k;
    while (d && (de = readdir(d))) {
        if (!parse_name(de->d_name, &q, &k) && !is_tmp(de->d_name)) continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) f = df_xrealloc(f, sizeof *f * (size_t)(cap = cap ? 2 * cap : 64));
        f[n++] = (dir_file){df_xstrdup(de->d_name), (uint64_t)sb.st_size, sb.st_mtim};
    }
    if (d) closedir(d);
    *n_out = n;
    return f;
}

/* Removes the least recently used files until the directory is within its
 * size (and temporary files a crashed writer left). */
static void evict(df_pcache *pc) {
    int n;
    dir_file *f = list_dir(pc, &n);
    qsort(f, (size_t)n, sizeof *f, by_mtime);
    uint64_t total = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < n; i++) {
        char *path = df_path_join(pc->dir, f[i].name);
        if (is_tmp(f[i].name) && now.tv_sec - f[i].mtime.tv_sec > STALE_TMP_S && !unlink(path)) f[i].size = 0;
        free(path);
        total += f[i].size;
    }
    for (int i = 0; i < n && total > pc->cap; i++) {
        if (is_tmp(f[i].name) || !f[i].size) continue; /* being written by someone */
        char *path = df_path_join(pc->dir, f[i].name);
        if (!unlink(path)) {
            total -= f[i].size;
            pc->st.evicted++;
        } else if (errno == ENOENT) { /* another process took it */
            total -= f[i].size;
        }
        free(path);
    }
    for (int i = 0; i < n; i++) free(f[i].name);
    free(f);
}

void df_pcache_list(df_pcache *pc, int lo, int hi, int **qs, df_pc_key **keys, int *n_out) {
    int n = 0, cap = 16;
    int *q = df_xmalloc(sizeof *q * (size_t)cap);
    df_pc_key *k = df_xmalloc(sizeof *k * (size_t)cap);
    DIR *d = opendir(pc->dir);
    struct dirent *de;
    for (int i = 0;; i++) { /* the RAM tier, then the directory */
        int qq;
        df_pc_key kk;
        if (i < pc->n_ram) {
            qq = (int)pc->ram[i].b->h.q, kk = pc->ram[i].b->h.key;
        } else {
            if (!d || !(de = readdir(d))) break;
            if (!parse_name(de->d_name, &qq, &kk)) continue;
        }
        if (qq <= lo || qq > hi) continue;
        if (n == cap) {
            q = df_xrealloc(q, sizeof *q * (size_t)(cap *= 2));
            k = df_xrealloc(k, sizeof *k * (size_t)cap);
        }
        q[n] = qq, k[n++] = kk;
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++) /* highest first (insertion sort: few) */
        for (int j = i; j > 0 && q[j] > q[j - 1]; j--) {
            int t = q[j];
            q[j] = q[j - 1], q[j - 1] = t;
            df_pc_key tk = k[j];
            k[j] = k[j - 1], k[j - 1] = tk;
        }
    *qs = q, *keys = k, *n_out = n;
}

/* A file that is not what its name says, or not this cache's: removed. */
static void refuse(const char *path, const char *why) {
    fprintf(stderr, "deltafin: warning: prompt cache: %s %s: removed\n", path, why);
    unlink(path);
}

bool df_pcache_has(df_pcache *pc, int q, const df_pc_key *key) {
    if (ram_find(pc, q, key) >= 0) return true;
    char *path = seg_path(pc, q, key);
    bool ok = access(path, F_OK) == 0;
    free(path);
    return ok;
}

bool df_pcache_head(df_pcache *pc, int q, const df_pc_key *key, df_pc_head *h) {
    int i = ram_find(pc, q, key);
    if (i >= 0) {
        *h = pc->ram[i].b->h;
        return true;
    }
    char *path = seg_path(pc, q, key);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    uint8_t buf[DF_PC_HEADER];
    bool ok = false;
    if (fd >= 0) {
        if (df_pread_full(fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf) refuse(path, "is truncated");
        else if (!read_head(buf, h)) refuse(path, "is not a prompt cache file of this version");
        else if (memcmp(h->fp, pc->fp, 16)) refuse(path, "belongs to another model (fingerprint)");
        else if (h->q != (uint32_t)q || memcmp(h->key.b, key->b, 16)) refuse(path, "is misnamed");
        else ok = true;
        close(fd);
    }
    free(path);
    return ok;
}

/* Why blob b (read from a file) is not q's segment under key over ids with
 * this layout and payload size; NULL when it is. */
static const char *check_blob(const df_pcache *pc, df_pc_blob *b, int q, const df_pc_key *key,
                              const int32_t *ids, const df_seq_layer_desc *layout, int n_layers, uint64_t payload) {
    const df_pc_head *h = &b->h;
    if (b->size < DF_PC_HEADER + 8 || !read_head(b->data, &b->h)) return "is not a valid prompt cache file";
    if (b->size != file_size(h->n_layers, h->q, h->payload)) return "is truncated or too long";
    if (get_u64(b->data + b->size - 8) != blob_sum(b)) return "is corrupt (checksum)";
    if (memcmp(h->fp, pc->fp, 16)) return "belongs to another model (fingerprint)";
    if (h->q != (uint32_t)q || memcmp(h->key.b, key->b, 16)) return "is misnamed";
    const uint8_t *p = b->data + DF_PC_HEADER;
    if (h->n_layers != (uint32_t)n_layers) return "has another state layout (layers)";
    for (int i = 0; i < n_layers; i++, p += LAYER_DESC)
        if (get_u32(p) != layout[i].code || get_u64(p + 8) != layout[i].width) return "has another state layout";
    for (int i = 0; i < q; i++, p += 4)
        if (get_u32(p) != (uint32_t)ids[i]) return "holds other token ids than its name says";
    if (h->payload != payload) return "has a payload of the wrong size";
    return NULL;
}

/* Maps q's file whole, its pages put in at once (MAP_POPULATE: the page
 * cache's own pages, no copy and no fault per page, where a read into fresh
 * memory spent most of a restore in page faults); files are replaced by
 * rename, never rewritten in place, so the mapping keeps what was checked
 * (the RAM tier, which keeps blobs long, takes a copy: own_copy). Where it
 * cannot be mapped, read into memory. NULL when it is missing or cannot be
 * read. */
static df_pc_blob *read_file(df_pcache *pc, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return NULL; /* gone: evicted by another process */
    struct stat sb;
    df_pc_blob *b = NULL;
    if (fstat(fd, &sb) == 0 && sb.st_size >= DF_PC_HEADER + 8) {
        b = df_xcalloc(1, sizeof *b);
        b->size = (size_t)sb.st_size;
        void *m = mmap(NULL, b->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (m != MAP_FAILED) {
            b->data = m, b->mapped = true;
        } else if (!(b->data = malloc(b->size)) || df_pread_full(fd, b->data, b->size, 0) != (ssize_t)b->size) {
            df_pcache_blob_free(b);
            b = NULL;
        }
        if (b) pc->st.bytes_read += b->size;
    } else if (fstat(fd, &sb) == 0) {
        refuse(path, "is truncated");
    }
    close(fd);
    return b;
}

/* A mapped blob the RAM tier is to keep becomes a copy of its own: the
 * mapping would fault (SIGBUS) if the file were ever truncated in place
 * (cp over it), which no deltafin process does but a person might, and the
 * tier keeps blobs for as long as the server runs. */
static void own_copy(df_pc_blob *b) {
    if (!b->mapped) return;
    uint8_t *d = df_xmalloc(b->size);
    df_prefault_overwrite(d, b->size);
    memcpy(d, b->data, b->size);
    munmap(b->data, b->size);
    b->payload = d + (b->payload - b->data);
    b->data = d, b->mapped = false;
}

const df_pc_blob *df_pcache_get(df_pcache *pc, int q, const df_pc_key *key, const int32_t *ids,
                                const df_seq_layer_desc *layout, int n_layers, uint64_t payload) {
    int i = ram_find(pc, q, key);
    if (i >= 0) {
        pc->ram[i].used = ++pc->clock;
        pc->ram[i].refs++;
        pc->st.ram_hits++;
        return pc->ram[i].b;
    }
    char *path = seg_path(pc, q, key);
    df_pc_blob *b = read_file(pc, path);
    const char *why = b ? check_blob(pc, b, q, key, ids, layout, n_layers, payload) : NULL;
    if (why) {
        refuse(path, why);
        df_pcache_blob_free(b);
        b = NULL;
    }
    if (b) {
        b->payload = b->data + DF_PC_HEADER + (size_t)n_layers * LAYER_DESC + (size_t)q * 4;
    }
    free(path);
    if (b && pc->ram_cap && b->size <= pc->ram_cap) own_copy(b);
    if (b && pc->ram_cap && ram_keep(pc, b)) {
        i = ram_find(pc, q, key);
        pc->ram[i].refs++;
    }
    return b;
}

void df_pcache_touch(df_pcache *pc, int q, const df_pc_key *key) {
    char *path = seg_path(pc, q, key);
    utimensat(AT_FDCWD, path, NULL, 0);
    free(path);
}

void df_pcache_release(df_pcache *pc, const df_pc_blob *b) {
    for (int i = 0; i < pc->n_ram; i++)
        if (pc->ram[i].b == b) {
            pc->ram[i].refs--;
            return;
        }
    df_pcache_blob_free((df_pc_blob *)b);
}

/* ---- writing -------------------------------------------------------------------------------- */

#ifdef DF_TEST_HOOKS
/* DF_TEST_PCACHE_FULL set: writes fail as on a full disk, after a part of
 * the file is written (tests; the release build has no such hook). */
static int injected_failure(int fd) {
    if (!getenv("DF_TEST_PCACHE_FULL")) return 0;
    df_pwrite_full(fd, "DFPC", 4, 0);
    return ENOSPC;
}
#else
static int injected_failure(int fd) {
    (void)fd;
    return 0;
}
#endif

/* The directory's entries (a rename) on the disk; failures are ignored (a
 * file system that cannot sync a directory still renamed). */
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

/* Writes b under a temporary name, syncs it, then renames it and syncs the
 * directory: after a crash or power loss the name holds the whole file or is
 * absent, never a renamed file whose blocks were not yet written; 0 or an
 * errno. */
static int write_file(df_pcache *pc, const df_pc_blob *b, const char *path) {
    char name[96];
    snprintf(name, sizeof name, ".tmp-%ld-%lx-%lu.dfpc", (long)getpid(), pc->nonce, ++pc->counter);
    char *tmp = df_path_join(pc->dir, name);
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) rc = errno;
    else if (!(rc = injected_failure(fd)))
        rc = df_pwrite_full(fd, b->data, b->size, 0);
    if (!rc && fdatasync(fd) != 0) rc = errno;
    if (fd >= 0 && close(fd) != 0 && !rc) rc = errno;
    if (!rc && rename(tmp, path) != 0) rc = errno;
    if (rc) unlink(tmp);
    else sync_dir(pc->dir);
    free(tmp);
    return rc;
}

void df_pcache_put(df_pcache *pc, df_pc_blob *b) {
    put_u64(b->data + b->size - 8, blob_sum(b));
    char *path = seg_path(pc, (int)b->h.q, &b->h.key);
    if (!pc->st.writes_off && b->size <= pc->cap) {
        int rc = write_file(pc, b, path);
        if (rc) {
            fprintf(stderr, "deltafin: warning: prompt cache: cannot write to %s: %s; no more states are "
                    "written there\n", pc->dir, strerror(rc));
            pc->st.writes_off = 1;
        } else {
            pc->st.bytes_written += b->size;
            evict(pc);
        }
    }
    free(path);
    if (!pc->ram_cap || !ram_keep(pc, b)) df_pcache_blob_free(b);
}
