/*
 * pack_internal.h - what the pack's own files share, and nothing outside
 * src/experts/pack_*.c includes: file names, the record plan, the parsed
 * manifest, the progress journal, the set reader's state, the progress bar
 * and small helpers. The public side is pack.h.
 */
#ifndef DF_EXPERTS_PACK_INTERNAL_H
#define DF_EXPERTS_PACK_INTERNAL_H

#include "experts/pack.h"

#include <jansson.h>

#define DATA_NAME "experts.bin"
#define DATA_PARTIAL "experts.bin.partial"
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_PARTIAL "manifest.json.partial"
#define PROGRESS_NAME "progress"
#define PROGRESS_TMP "progress.tmp"
#define FORMAT_NAME "deltafin-pack"
#define PROGRESS_FORMAT "deltafin-pack-progress"
/* The journal's own version: its layout did not change with manifest
 * version 2, so a pack interrupted under version 1 still resumes. */
#define PROGRESS_VERSION 1
#define MAX_MANIFEST_BYTES ((size_t)1 << 30)
#define PK_MAX_NAMES 64   /* distinct part names in one manifest */
#define PK_MAX_NAME 128   /* bytes of one part name */

/* What an output directory holds. */
enum { ST_EMPTY = 0, ST_PARTIAL = 1, ST_COMPLETE = 2 };

static inline uint64_t pk_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- small helpers (pack_format.c) ----------------------------------------------- */

bool pk_exists(const char *dir, const char *name);
void pk_unlink_in(const char *dir, const char *name);
void pk_hex64(uint64_t v, char out[17]);
bool pk_parse_hex64(const char *s, uint64_t *v);
bool pk_is_hex(const char *s, size_t n);
bool pk_is_uuid(const char *s);
/* Integer field in [lo, hi]; string field or NULL. */
bool pk_jint(json_t *o, const char *key, long long lo, long long hi, long long *v);
const char *pk_jstr(json_t *o, const char *key);
/* Appends to the message already in err (df_fail must not read what it writes). */
int pk_fail_more(df_error *err, int code, const char *more);

/* ---- the checkpoint, opened for packing (pack_format.c) ------------------------- */

typedef struct pk_source {
    df_config cfg;
    df_st *st;
    df_quant *quant;
    df_expert_inventory inv;
    df_pack_ckpt ck; /* points at the config, files and inventory above */
} pk_source;

/* config.json, the safetensors and the expert inventory of dir. */
int pk_source_open(pk_source *s, const char *dir, df_error *err);
void pk_source_close(pk_source *s);
bool pk_has_experts(const df_pack_ckpt *ck);

/* ---- the record plan (pack_format.c) ----------------------------------------------
 * Layer-major over MoE layers, expert ids ascending; offsets are in each
 * stripe's file, every record taking padded/S bytes there. */

typedef struct pk_plan {
    int S;
    int n;
    df_pack_record *rec;
    df_pack_part *parts;     /* every record's parts, record after record */
    const df_tensor **src;   /* the tensor of each of those parts */
    uint64_t stripe_file_bytes; /* size of every experts.bin */
    uint64_t total_padded;      /* all records, all stripes */
    size_t max_padded;
} pk_plan;

int pk_plan_build(pk_plan *p, const df_pack_ckpt *ck, int S, df_error *err);
void pk_plan_free(pk_plan *p);

/* ---- the manifest (pack_format.c) -------------------------------------------------- */

typedef struct pk_manifest {
    int version;
    char uuid[40];
    char fp[DF_PACK_FP_HEX + 1];
    int stripe, stripes;
    int n_layers, n_experts;
    char arch[32];
    uint64_t data_bytes;
    int n;
    df_pack_record *rec;
    df_pack_part *parts;  /* the records' parts */
    char **names;         /* the distinct part names the parts point to */
    int n_names;
    uint64_t *sxxh3;      /* this stripe's checksum of each record's stripe */
} pk_manifest;

/* The manifest of stripe `stripe` (version DF_PACK_VERSION), one record a line. */
char *pk_manifest_text(const pk_plan *p, const df_config *c, const df_expert_layout *xl, const char *uuid, const char *fp,
                       int stripe, const uint64_t *rec_xxh3, const uint64_t *stripe_xxh3);
/* Reads and validates dir/manifest.json (version 1 or 2); errors name dir. */
int pk_manifest_load(pk_manifest *mf, const char *dir, df_error *err);
void pk_manifest_free(pk_manifest *mf);
bool pk_record_equal(const df_pack_record *a, const df_pack_record *b);

/* ---- the progress journal (pack_journal.c) ----------------------------------------- */

typedef struct pk_progress {
    char uuid[40];
    char fp[DF_PACK_FP_HEX + 1];
    int stripe, stripes, total, done;
    uint64_t *xxh3, *sxxh3;
} pk_progress;

int pk_progress_load(pk_progress *pg, const char *dir, df_error *err);
void pk_progress_free(pk_progress *pg);
char *pk_progress_text(const char *uuid, const char *fp, int stripe, int stripes, int total,
                       int done, const uint64_t *xxh3, const uint64_t *sxxh3);
/* text to dir/name by way of tmp_name, fsync, rename, fsync of the directory
 * (name NULL: left under tmp_name). 0 or an errno value. */
int pk_write_file_durable(const char *dir, const char *tmp_name, const char *name,
                          const char *text, size_t len);

/* ---- the progress bar (pack_write.c; verify draws it too) ------------------------- */

typedef struct pk_bar {
    bool on;
    const char *label;
    uint64_t total, start, done;
    double t0, last;
} pk_bar;

void pk_bar_init(pk_bar *b, bool on, const char *label, uint64_t total, uint64_t start);
void pk_bar_draw(pk_bar *b, bool final);

/* ---- the set reader (pack_read.c) ---------------------------------------------------- */

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
    df_pack_part *parts; /* what rec[].part point into */
    char **names;        /* what parts[].name point to */
    int n_names;
    int n_layers, n_experts;
    int *index; /* [layer * n_experts + expert] -> record, -1 */
    size_t max_padded;
};

/* Stripe s of record r into dst (sb bytes); errors name the directory. */
int pk_read_stripe(const df_pack *p, const df_pack_record *r, int s, uint8_t *dst, df_error *err);
/* Checks record r in dst (read first unless already_read), re-reading once
 * from the device on a mismatch; stripes: every stripe checksum too. *bad:
 * the record stayed bad (rather than a read failing). */
int pk_check_record(const df_pack *p, const df_pack_record *r, uint8_t *dst, bool stripes,
                    bool already_read, bool *bad, df_error *err);

#endif
