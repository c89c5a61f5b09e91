/*
 * engine/pcache.h - the prompt cache's store (pcache.c): session states on
 * disk, keyed by the model's fingerprint and the token ids before them, and
 * the server's tier of recent ones in RAM. What it stores and when is the
 * sessions' business (pcache_session.c).
 *
 * One file holds one segment of a sequence's state (model/state.h): the
 * rows of positions [from, q) of every positional layer and the value at q
 * of every recurrent one, and names its parent, the file of position
 * `from` on the same tokens (none when from is 0). Restoring q loads the
 * chain from the root up, so each prompt writes its new rows once. A file:
 *
 *   header (64 bytes)  "DFPCACHE", version, layers, fingerprint, key, q,
 *                      from, payload bytes
 *   layout             per layer: kind, width (model/state.h df_seq_layout)
 *   token ids          the q ids before the state (checked against the prompt)
 *   payload            df_seq_save's segment
 *   checksum           XXH3-64 of everything before it
 *
 * named q<q>-<key as 32 hex digits>.dfpc, where key = XXH3-128(fingerprint,
 * ids[0..q)). Files are written under a temporary name and renamed, so a
 * reader sees whole files or none; one that does not verify (corrupt,
 * truncated, another model's, another layout) is removed with a warning.
 * The directory is kept under its size, after each write, by removing the
 * least recently used files (mtime). A use touches a chain from its leaf to
 * its root, so a chain's root is its most recent file and leaves go first.
 * No fsync: a file cut short by a machine crash fails its checksum. A write that fails (full disk)
 * turns writing off with one warning. Several processes may share a
 * directory: names are unique per process, renames atomic, and a file that
 * vanishes between listing and reading is a miss.
 */
#ifndef DF_ENGINE_PCACHE_H
#define DF_ENGINE_PCACHE_H

#include "model/state.h"

#define DF_PC_VERSION 1
#define DF_PC_HEADER 64
#define DF_PC_DEFAULT_SIZE ((uint64_t)4 << 30)
#define DF_PC_DEFAULT_EVERY 1024

typedef struct df_pcache df_pcache;

typedef struct df_pc_key {
    uint8_t b[16];
} df_pc_key;

/* A file's header, as read. */
typedef struct df_pc_head {
    uint32_t version, n_layers;
    uint8_t fp[16];
    df_pc_key key;
    uint32_t q, from;
    uint64_t payload;
} df_pc_head;

/* A segment in memory: the whole file image. */
typedef struct df_pc_blob {
    df_pc_head h;
    uint8_t *data;       /* the file's bytes */
    size_t size;
    uint8_t *payload;    /* inside data */
    bool mapped;         /* data is the file mapped read-only (read), not malloc'ed (written) */
} df_pc_blob;

typedef struct df_pc_stats {
    uint64_t hits, misses, tokens, bytes_read, bytes_written, evicted, ram_hits, ram_bytes;
    double restore_s, store_s; /* wall time restoring (reading, checking, loading) and storing */
    int writes_off;
} df_pc_stats;

/* Opens (creating it if need be) the directory; cap: most bytes of files
 * (0: DF_PC_DEFAULT_SIZE); ram_cap: bytes of segments kept in RAM too. */
int df_pcache_open(df_pcache **out, const char *dir, uint64_t cap, uint64_t ram_cap, const uint8_t fp[16],
                   df_error *err);
void df_pcache_close(df_pcache *pc);
const uint8_t *df_pcache_fingerprint(const df_pcache *pc);
df_pc_stats *df_pcache_stats(df_pcache *pc);

/* The key of ids[0..q). */
df_pc_key df_pcache_key(const df_pcache *pc, const int32_t *ids, int q);

/* A new segment of positions [from, q) over ids[0..q) with the given
 * layout and payload size: the caller writes the payload, then df_pcache_put. */
df_pc_blob *df_pcache_blob_new(const df_pcache *pc, const int32_t *ids, int q, int from,
                               const df_seq_layer_desc *layout, int n_layers, uint64_t payload);
void df_pcache_blob_free(df_pc_blob *b);
/* Stores the segment (takes it): in the RAM tier if there is one, and in a
 * file unless writing is off. Never fails; problems are warnings. */
void df_pcache_put(df_pcache *pc, df_pc_blob *b);
/* Whether the cache (RAM or directory) has key's segment of q. */
bool df_pcache_has(df_pcache *pc, int q, const df_pc_key *key);

/* Positions q in (lo, hi] with a segment in the cache, highest first, each
 * with the key its name gives; *n of them (malloc'ed arrays). */
void df_pcache_list(df_pcache *pc, int lo, int hi, int **qs, df_pc_key **keys, int *n);
/* The header of q's segment under key; false when there is none or it is
 * not a valid header (then removed, with a warning). */
bool df_pcache_head(df_pcache *pc, int q, const df_pc_key *key, df_pc_head *h);
/* q's segment under key, verified: it is whole, its checksum holds, and it
 * is this model's, of this layout, over ids[0..q). NULL when missing or
 * refused (a refused file is removed with a warning). The blob belongs to
 * the cache (df_pcache_release when done). */
const df_pc_blob *df_pcache_get(df_pcache *pc, int q, const df_pc_key *key, const int32_t *ids,
                                const df_seq_layer_desc *layout, int n_layers, uint64_t payload);
void df_pcache_release(df_pcache *pc, const df_pc_blob *b);
/* Marks q's file as just used (its mtime). */
void df_pcache_touch(df_pcache *pc, int q, const df_pc_key *key);

#endif
