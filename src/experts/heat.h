/*
 * heat.h - the expert heat histogram: per (layer, expert) use counts with
 * exponential decay (a half-life in tokens), persisted across runs next to the
 * expert pack. The cache policy reads it to rank experts and to fill the optional
 * pinned tier at start-up.
 *
 * Updates are O(1): instead of decaying every entry at every token, entries are
 * stored multiplied by a growing global scale (g = 2^(tokens / half_life)); an
 * entry's heat is v / g. The scale is folded back into the entries, O(keys), only
 * when it grows past 2^64 (every ~64 half-lives).
 *
 * File format (little-endian, version 1), written atomically (temp file, fsync,
 * rename, fsync of the directory):
 *
 *   offset 0   8 bytes  magic "DFHEAT\r\n"
 *          8   u32      version (1)
 *         12   u32      n_layers
 *         16   u32      n_experts
 *         20   u32      reserved (0)
 *         24   f64      half_life in tokens (> 0)
 *         32   u64      tokens observed over the histogram's lifetime
 *         40   f64      heat[n_layers * n_experts], layer-major (finite, >= 0)
 *        end   u32      CRC-32 (IEEE) of every byte before it
 *
 * Loading never fails hard: a missing, truncated, corrupt or other-model file
 * leaves the histogram empty and says why, because losing the heat only costs a
 * slower warm-up while refusing to start would cost the whole run.
 */
#ifndef DF_EXPERTS_HEAT_H
#define DF_EXPERTS_HEAT_H

#include "util/util.h"

#include <stdint.h>

#define DF_HEAT_VERSION 1
#define DF_HEAT_DEFAULT_HALF_LIFE 4096.0

typedef struct df_heat {
    int n_layers, n_experts;
    double half_life; /* tokens */
    double decay;     /* per token: 2^(-1/half_life) */
    uint64_t tokens;  /* tokens observed (persisted) */
    double norm;      /* heat of a key used once in every closed token */
    double scale;     /* g: stored values are heat * g */
    double *v;        /* n_layers * n_experts */
} df_heat;

typedef enum df_heat_load_result {
    DF_HEAT_LOADED = 0,
    DF_HEAT_MISSING,  /* no file: a first run */
    DF_HEAT_CORRUPT,  /* truncated, bad magic/version/checksum/values */
    DF_HEAT_MISMATCH  /* valid file for another shape (layers x experts) */
} df_heat_load_result;

/* half_life <= 0 selects DF_HEAT_DEFAULT_HALF_LIFE. */
int df_heat_init(df_heat *h, int n_layers, int n_experts, double half_life, df_error *err);
void df_heat_free(df_heat *h);
void df_heat_clear(df_heat *h);
int df_heat_copy(df_heat *dst, const df_heat *src, df_error *err);

static inline int df_heat_key(const df_heat *h, int layer, int expert) {
    return layer * h->n_experts + expert;
}
/* One use of key in the current token. */
static inline void df_heat_add(df_heat *h, int key) { h->v[key] += h->scale; }
/* Closes the current token: everything decays by one token's worth. */
void df_heat_token_end(df_heat *h);
static inline double df_heat_get(const df_heat *h, int key) { return h->v[key] / h->scale; }
/* Uses per token: heat relative to a key used in every closed token (1 for such a
 * key; uses in the open token count on top). */
static inline double df_heat_rate(const df_heat *h, int key) {
    return h->norm > 1.0 ? df_heat_get(h, key) / h->norm : df_heat_get(h, key);
}
/* Multiplies every count (and the normaliser) by f in (0, 1]: a histogram
 * weighed down to act as a weaker prior. Rates are unchanged. */
void df_heat_scale(df_heat *h, double f);
/* The n hottest keys (ties: lower key first) into keys[n]; returns how many had
 * non-zero heat (keys beyond that are still filled, coldest-key order). */
int df_heat_top(const df_heat *h, int n, int32_t *keys);

int df_heat_save(const df_heat *h, const char *path, df_error *err);
/* h must be initialised with the expected shape. On anything but DF_HEAT_LOADED
 * h is left empty and why (if non-NULL) says what happened; why->code is DF_OK
 * when loaded, DF_ERR_IO for missing, DF_ERR_FORMAT otherwise. The histogram keeps
 * its configured half-life; the file's only sets how old the counts are. */
df_heat_load_result df_heat_load(df_heat *h, const char *path, df_error *why);
const char *df_heat_load_result_name(df_heat_load_result r);

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32). */
uint32_t df_crc32(uint32_t crc, const void *data, size_t n);

#endif
