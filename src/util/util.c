/*
 * util.c - error reporting, file reads and durable writes, checked allocation,
 * growing strings, byte counts for people, dtype tables and the F16/BF16
 * conversions shared by the whole engine.
 */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int df_fail(df_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void df_fd_clear_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK)) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

int df_read_file(const char *path, char **data, size_t *len, df_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* df_fd_clear_nonblock */
    if (fd < 0)
        return df_fail(err, DF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return df_fail(err, DF_ERR_IO, "%s: not a regular file", path);
    }
    df_fd_clear_nonblock(fd);
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return df_fail(err, DF_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return df_fail(err, DF_ERR_IO, "%s: read failed after %zu of %zu bytes", path,
                           got, n);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return DF_OK;
}

ssize_t df_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int df_pwrite_full(int fd, const void *buf, size_t n, uint64_t off) {
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

int df_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    int rc = fsync(fd) ? errno : 0;
    close(fd);
    return rc == EINVAL ? 0 : rc;
}

void df_sb_printf(df_sbuf *b, const char *fmt, ...) {
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

void df_fmt_bytes(char *out, size_t n, uint64_t b) {
    if (b >= 1000000000ull) snprintf(out, n, "%.2f GB", (double)b / 1e9);
    else if (b >= 1000000ull) snprintf(out, n, "%.1f MB", (double)b / 1e6);
    else if (b >= 1000ull) snprintf(out, n, "%.1f kB", (double)b / 1e3);
    else snprintf(out, n, "%llu B", (unsigned long long)b);
}

void df_fmt_bytes_iec(char *out, size_t n, uint64_t b) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, n, "%.2f %s", v, u[i]);
}

char *df_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = df_xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

static void oom(size_t n) {
    fprintf(stderr, "deltafin: out of memory allocating %zu bytes\n", n);
    abort();
}
void *df_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}
void *df_xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) oom(n * sz);
    return p;
}
void *df_xrealloc(void *q, size_t n) {
    void *p = realloc(q, n ? n : 1);
    if (!p) oom(n);
    return p;
}
char *df_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = df_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
void *df_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) oom(n);
    return p;
}

double df_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const struct { const char *name; size_t size; } DTYPES[DF_DT_COUNT] = {
    [DF_DT_F32] = {"F32", 4},   [DF_DT_F16] = {"F16", 2},
    [DF_DT_BF16] = {"BF16", 2}, [DF_DT_F64] = {"F64", 8},
    [DF_DT_I64] = {"I64", 8},   [DF_DT_I32] = {"I32", 4},
    [DF_DT_I16] = {"I16", 2},   [DF_DT_I8] = {"I8", 1},
    [DF_DT_U8] = {"U8", 1},     [DF_DT_BOOL] = {"BOOL", 1},
    [DF_DT_F8_E4M3] = {"F8_E4M3", 1}, [DF_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *df_dtype_name(df_dtype t) {
    return (unsigned)t < DF_DT_COUNT ? DTYPES[t].name : "?";
}
int df_dtype_from_name(const char *s) {
    for (int i = 0; i < DF_DT_COUNT; i++)
        if (strcmp(s, DTYPES[i].name) == 0) return i;
    return -1;
}
size_t df_dtype_size(df_dtype t) { return (unsigned)t < DF_DT_COUNT ? DTYPES[t].size : 0; }
bool df_dtype_computable(df_dtype t) {
    return t == DF_DT_F32 || t == DF_DT_F16 || t == DF_DT_BF16;
}

float df_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0); /* NaNs come out quiet, as F16C does */
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t df_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t df_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;
    if (a >= 0x477ff000u) return sign | 0x7c00; /* overflow -> inf (rounds up past 65504) */
    if (a < 0x38800000u) { /* subnormal or zero in f16 */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
        int shift = (int)(126 - e); /* 13 mantissa bits + distance below 2^-14 */
        uint32_t half = 1u << (shift - 1);
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
    uint32_t rem = r & 0x1fff;
    r >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return sign | (uint16_t)r;
}

int df_parse_size(const char *text, const char *what, uint64_t *bytes, df_error *err) {
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (errno || end == text || !(x > 0))
        return df_fail(err, DF_ERR_ARG, "%s expects a size such as 8G or 512M, got '%s'", what, text);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end)
        return df_fail(err, DF_ERR_ARG, "%s expects a size such as 8G or 512M, got '%s'", what, text);
    double b = x * mul;
    if (b > 1e18) return df_fail(err, DF_ERR_ARG, "%s: '%s' is too large", what, text);
    *bytes = (uint64_t)b;
    return DF_OK;
}

/* ---- memory advice ------------------------------------------------------------------ */

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#define MADV_NOHUGEPAGE 15
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

void df_advise_huge(void *p, size_t n) { madvise(p, n, MADV_HUGEPAGE); }

void df_advise_no_huge(void *p, size_t n) { madvise(p, n, MADV_NOHUGEPAGE); }

void df_prefault_write(void *p, size_t n) {
    if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
    long pg = sysconf(_SC_PAGESIZE); /* older kernels: touch every page */
    for (size_t o = 0; o < n; o += (size_t)pg) ((volatile char *)p)[o] = 0;
}

void df_prefault_overwrite(void *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + n) & ~(pg - 1);
    if (e > a) df_prefault_write((void *)a, e - a); /* its fallback's zeros land inside [p, p + n) */
}

bool df_populate_read(const void *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(pg - 1);
    return madvise((void *)a, (uintptr_t)p + n - a, MADV_POPULATE_READ) == 0;
}

void df_prefault_read(const void *p, size_t n) {
    if (!n || df_populate_read(p, n)) return;
    long pg = sysconf(_SC_PAGESIZE); /* older kernels: read every page */
    volatile const char *c = p;
    char sink = 0;
    for (size_t o = 0; o < n; o += (size_t)pg) sink ^= c[o];
    sink ^= c[n - 1];
    (void)sink;
}
