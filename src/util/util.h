/*
 * util.h - small shared helpers: error reporting, whole-file reads, checked
 * allocation, durable writes, growing strings, byte counts for people, dtypes
 * and their widening to F32. Everything here is used by more
 * than one room of the engine.
 */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include "deltafin.h"
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

/* Fills err (if non-NULL) and returns code, so callers can `return df_fail(...)`. */
int df_fail(df_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reads a whole file (NUL-terminated for convenience). *len excludes the NUL. */
int df_read_file(const char *path, char **data, size_t *len, df_error *err);
/* Input files are opened with O_NONBLOCK, so that a FIFO in their place is
 * refused as not a regular file instead of waiting for a writer; once fstat
 * has shown a regular file this clears the flag (io_uring would otherwise
 * answer EAGAIN where a read has to wait for the disk). */
void df_fd_clear_nonblock(int fd);

/* Reads n bytes at off, retrying EINTR and short reads; returns the byte count
 * (less than n only at end of file) or -1 with errno set. */
ssize_t df_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* Writes n bytes at off, retrying EINTR and short writes; 0 or an errno value. */
int df_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* fsyncs a directory (a rename in it becomes durable); 0 or an errno value.
 * A filesystem that cannot fsync a directory (EINVAL) counts as success. */
int df_fsync_dir(const char *dir);

/* A growing NUL-terminated string: start from {0}, free(b.s) when done. */
typedef struct df_sbuf {
    char *s;
    size_t len, cap;
} df_sbuf;
void df_sb_printf(df_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Byte counts for people: decimal, "1.23 GB" / "4.5 MB" / "6.7 kB" / "89 B"
 * (progress and pack messages), and binary, "1.50 MiB" (inspect). */
void df_fmt_bytes(char *out, size_t n, uint64_t bytes);
void df_fmt_bytes_iec(char *out, size_t n, uint64_t bytes);

/* path join into a malloc'ed string */
char *df_path_join(const char *dir, const char *name);

void *df_xmalloc(size_t n);
void *df_xcalloc(size_t n, size_t sz);
void *df_xrealloc(void *p, size_t n);
char *df_xstrdup(const char *s);
/* 64-byte aligned allocation, free with free() */
void *df_aligned_alloc(size_t n);

double df_now(void); /* monotonic seconds */

/* Byte counts that must never wrap (a --ram-budget of 1e18, a product of a
 * config's dimensions): sums and products saturate at UINT64_MAX, and a
 * difference stops at 0. */
static inline uint64_t df_add_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t df_mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t df_sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* Element types of stored tensors. Only F32/F16/BF16 can be computed with. */
typedef enum df_dtype {
    DF_DT_F32 = 0,
    DF_DT_F16,
    DF_DT_BF16,
    DF_DT_F64,
    DF_DT_I64,
    DF_DT_I32,
    DF_DT_I16,
    DF_DT_I8,
    DF_DT_U8,
    DF_DT_BOOL,
    DF_DT_F8_E4M3,
    DF_DT_F8_E5M2,
    DF_DT_COUNT
} df_dtype;

const char *df_dtype_name(df_dtype t);   /* "BF16" etc (safetensors spelling) */
int df_dtype_from_name(const char *s);   /* -1 if unknown */
size_t df_dtype_size(df_dtype t);
bool df_dtype_computable(df_dtype t);    /* F32, F16, BF16 */

/* Exact widening conversions (every BF16/F16 value is exactly an F32). */
static inline float df_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
float df_f16_to_f32(uint16_t h);
/* Round-to-nearest-even narrowing, used only by tools and tests. */
uint16_t df_f32_to_bf16(float f);
uint16_t df_f32_to_f16(float f);

/* ---- memory advice: madvise with the fallbacks older kernels need ---------------- */

/* Asks for transparent huge pages on [p, p + n) (page-aligned p); best effort. */
void df_advise_huge(void *p, size_t n);
/* ... and asks for none there. */
void df_advise_no_huge(void *p, size_t n);
/* Faults [p, p + n) in for writing now (MADV_POPULATE_WRITE; older kernels:
 * a write to every page), so the first use pays no page faults. */
void df_prefault_write(void *p, size_t n);
/* For [p, p + n) about to be overwritten whole (p need not be aligned): faults
 * in the whole pages inside it at once, the one or two partial pages at its
 * ends being left to the write. A large copy into fresh memory otherwise pays
 * one page fault per page, several times the copy itself. */
void df_prefault_overwrite(void *p, size_t n);
/* Maps the pages covering [p, p + n) in for reading (MADV_POPULATE_READ);
 * false when the kernel cannot. */
bool df_populate_read(const void *p, size_t n);
/* df_populate_read, and where the kernel cannot, a read of every page. */
void df_prefault_read(const void *p, size_t n);

#endif
