/*
 * safetensors.h - safetensors checkpoint files: header parsing and validation,
 * memory mapping, and sharded checkpoints (model.safetensors.index.json).
 *
 * A header is untrusted input: its length, every offset, dtype and shape are
 * checked (in bounds, no overlap, byte size == product(shape) * dtype size)
 * before any tensor is handed out. Tensor data is mapped, never copied.
 */
#ifndef DF_SAFETENSORS_H
#define DF_SAFETENSORS_H

#include "util/util.h"

#define DF_MAX_DIMS 8

typedef struct df_tensor {
    char *name;
    df_dtype dtype;
    int ndim;
    int64_t shape[DF_MAX_DIMS];
    uint64_t nbytes;
    const void *data;     /* inside the file mapping */
    int file;             /* index into df_st's files */
    uint64_t file_offset; /* absolute byte offset of the data in that file */
} df_tensor;

/* Parses a safetensors header (the 8-byte length, JSON, then data of data_len
 * bytes following the header). Pure function over memory: what the fuzzer drives.
 * On success fills *tensors (malloc'ed array, names malloc'ed; data pointers are
 * relative to `file_data`, which may be NULL) and *n. `what` names the file in
 * errors. */
int df_st_parse(const uint8_t *file_data, size_t file_len, const char *what,
                df_tensor **tensors, size_t *n, df_error *err);
void df_st_free_tensors(df_tensor *t, size_t n);

typedef struct df_st df_st;

/* Opens a checkpoint directory: model.safetensors, or the shards listed in
 * model.safetensors.index.json (every tensor must be in the shard the index
 * names; tensor names unique across shards). */
int df_st_open_dir(df_st **out, const char *dir, df_error *err);
void df_st_close(df_st *st);
/* A df_st over tensors parsed from memory (df_st_parse), named `what` in
 * errors and owned by it from now on, even on failure: what the fuzzer hands
 * df_quant_bind. No descriptors (df_st_file_fd is -1). Fails on a name
 * present twice. */
int df_st_from_tensors(df_st **out, df_tensor *t, size_t n, const char *what, df_error *err);
size_t df_st_count(const df_st *st);
const df_tensor *df_st_at(const df_st *st, size_t i);
const df_tensor *df_st_find(const df_st *st, const char *name);
/* The index i with df_st_at(st, i) == t (t must be one of st's tensors). */
size_t df_st_index(const df_st *st, const df_tensor *t);
const char *df_st_file_path(const df_st *st, int file);
int df_st_file_count(const df_st *st);
/* The file that lists the checkpoint's tensors, for errors about a tensor that
 * is not there: model.safetensors.index.json when sharded, else model.safetensors. */
const char *df_st_where(const df_st *st);
/* The open read-only descriptor of file `file` (kept open for the life of the
 * df_st, for pread by the expert streamer); -1 if out of range. */
int df_st_file_fd(const df_st *st, int file);

#endif
