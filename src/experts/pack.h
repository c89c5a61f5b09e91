/*
 * pack.h - the expert pack: a checkpoint's routed experts rewritten so that one
 * expert is one contiguous, 4 KiB-aligned record that can be read with O_DIRECT,
 * optionally striped across several directories (one per drive) so that one
 * expert read uses every drive at once. A record holds the expert's named
 * parts (its checkpoint tensors, as the architecture's expert layout names
 * them: gate, up and down matrices today, their scale tensors for a scaled
 * format), byte for byte. The on-disk format is described precisely in
 * docs/pack-format.md.
 *
 * The code: pack_format.c (fingerprint, record plan, manifest), pack_journal.c
 * (the resumable writer's progress journal), pack_write.c (the writer behind
 * `deltafin pack`), pack_read.c (the set reader the runtime's expert streamer
 * builds on, a synchronous record reader), pack_verify.c (`--verify`).
 *
 * Files in each pack directory:
 *   experts.bin     this directory's stripe of every record
 *   manifest.json   format, version, set uuid, stripe index/count, model
 *                   fingerprint, the record table with checksums.
 *                   Written last: a directory with manifest.json is complete.
 *   experts.bin.partial, manifest.json.partial, progress
 *                   only while a pack is being written (resumable state)
 */
#ifndef DF_EXPERTS_PACK_H
#define DF_EXPERTS_PACK_H

#include "model/config.h"
#include "model/experts.h"
#include "model/safetensors.h"
#include "util/util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DF_PACK_VERSION 2        /* written; version 1 is still read */
#define DF_PACK_ALIGN 4096       /* record and stripe alignment, O_DIRECT-safe */
#define DF_PACK_MAX_STRIPES 64
#define DF_PACK_FP_HEX 32        /* fingerprint: XXH3-128 as 32 hex digits */
#define DF_PACK_MAX_DIMS 4       /* of one part */

typedef struct df_pack df_pack;

/* One tensor of an expert inside its record. */
typedef struct df_pack_part {
    const char *name; /* the architecture's part name, e.g. "gate_proj.weight" */
    uint64_t offset;  /* from the start of the record */
    uint64_t nbytes;
    df_dtype dtype;   /* stored dtype, bytes untouched */
    int ndim;
    int64_t shape[DF_PACK_MAX_DIMS];
} df_pack_part;

/* One (layer, expert): its parts concatenated in the layout's order, padded to
 * padded bytes. Stripe i of the record is bytes [i*sb, (i+1)*sb) of the padded
 * record (sb = df_pack_stripe_bytes) and lies at `offset` in stripe i's
 * experts.bin. */
typedef struct df_pack_record {
    int layer, expert;
    uint64_t offset;  /* in every stripe's experts.bin; a multiple of 4096 */
    uint64_t length;  /* unpadded: sum of the parts */
    uint64_t padded;  /* length rounded up to 4096 * stripes */
    uint64_t xxh3;    /* XXH3_64bits of the `length` unpadded bytes */
    int n_parts;      /* 1..DF_EXPERT_MAX_PARTS */
    const df_pack_part *part; /* [n_parts], owned by the pack */
} df_pack_record;

/* A checkpoint as the pack sees it: what a pack is written from and checked
 * against. Nothing here needs a loaded model: the config, the safetensors
 * files and the expert inventory built by the architecture's naming. */
typedef struct df_pack_ckpt {
    const char *dir;                /* holds config.json; NULL: st's first file's */
    const df_config *cfg;
    const df_st *st;
    const df_expert_inventory *inv;
} df_pack_ckpt;

/* ---- identity ------------------------------------------------------------- */

/* The model fingerprint a pack is tied to (32 lowercase hex digits + NUL): XXH3-128
 * over config.json's bytes, every routed-expert tensor's name, dtype and shape,
 * and a few sampled bytes of expert data (see docs/pack-format.md). */
int df_pack_fingerprint(const df_pack_ckpt *ck, char out[DF_PACK_FP_HEX + 1], df_error *err);

/* ---- writing ---------------------------------------------------------------- */

typedef struct df_pack_write_opts {
    bool progress;  /* progress bar on stderr (callers pass isatty(2)) */
    FILE *log;      /* one-line notes: resuming, up to date; NULL = quiet */
#ifdef DF_TEST_HOOKS
    /* Fault hooks of the test build only; zero = off. */
    int stop_after_records;      /* stop (as if killed) after writing this many
                                    records in this run: no final checkpoint */
    int checkpoint_every_records;/* checkpoint every N records instead of by
                                    bytes/time */
    uint64_t fail_enospc_after_bytes; /* writes fail with ENOSPC once this many
                                         bytes were written in this run */
    bool skip_space_check;       /* skip the free-space check before writing */
    int stop_after_renames;      /* stop while renaming the finished files into
                                    place, after this many renames */
#endif
} df_pack_write_opts;

typedef struct df_pack_write_result {
    bool up_to_date;   /* the directories already held this model's complete pack */
    int records;
    int resumed_from;  /* first record this run wrote (0: from the start) */
    uint64_t bytes;    /* padded bytes of all records, all stripes together */
    double seconds;
} df_pack_write_result;

/* Packs the routed experts of the checkpoint in model_dir into dirs[0..n_dirs)
 * (stripe i goes to dirs[i]; a directory that does not exist is created),
 * from its config, safetensors and expert inventory (no model is loaded).
 * Resumes an interrupted pack of the same model into the same directories (in
 * any order). Refuses directories holding another model's pack, complete or not.
 * res may be NULL. */
int df_pack_write(const char *model_dir, const char *const *dirs, int n_dirs,
                  const df_pack_write_opts *opts, df_pack_write_result *res,
                  df_error *err);

/* ---- reading ---------------------------------------------------------------- */

/* Opens a pack set (format version 1 or 2): every directory of the set exactly
 * once, in any order. ck: the checkpoint it must belong to (the fingerprint,
 * and every record's parts against the inventory's tensors: names, dtypes,
 * shapes); NULL skips those checks (verify does). Data files are opened with
 * O_DIRECT when the filesystem allows it, else buffered. */
int df_pack_open(df_pack **out, const char *const *dirs, int n_dirs, const df_pack_ckpt *ck,
                 df_error *err);
void df_pack_close(df_pack *p);

int df_pack_stripes(const df_pack *p);
int df_pack_count(const df_pack *p);                      /* records */
const df_pack_record *df_pack_at(const df_pack *p, int i); /* in file order */
/* NULL when (layer, expert) has no record (dense layer, out of range). */
const df_pack_record *df_pack_find(const df_pack *p, int layer, int expert);
/* padded / n_stripes: bytes of one stripe of r, a multiple of 4096. */
size_t df_pack_stripe_bytes(const df_pack_record *r, int n_stripes);
/* Largest padded record: the buffer size df_pack_read_record needs. */
size_t df_pack_max_padded(const df_pack *p);
/* experts.bin of stripe `stripe` (read-only), -1 if out of range. */
int df_pack_fd(const df_pack *p, int stripe);
/* Whether that descriptor was opened with O_DIRECT (then reads must use
 * 4096-aligned buffers, offsets and lengths). */
bool df_pack_is_direct(const df_pack *p, int stripe);
const char *df_pack_dir(const df_pack *p, int stripe);
const char *df_pack_uuid(const df_pack *p);
const char *df_pack_model_fingerprint(const df_pack *p);

/* Reads record r into dst (4096-aligned, r->padded bytes): every stripe with
 * pread (short reads and EINTR handled), checks the checksum, re-reads once on a
 * mismatch, then fails with "pack DIR: layer L expert E: checksum mismatch". */
int df_pack_read_record(const df_pack *p, const df_pack_record *r, void *dst_aligned,
                        df_error *err);

/* Re-reads every record of the set and checks every checksum (record and
 * per-stripe). Progress on stderr when it is a terminal. The error names the
 * first bad expert and its directory. */
int df_pack_verify(const char *const *dirs, int n_dirs, df_error *err);

#endif
