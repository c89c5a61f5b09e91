/*
 * policy.h - the expert cache: N RAM slots over (layer, expert) keys and the
 * policy that decides what stays. Owns hit/miss bookkeeping, admission (a miss
 * may bypass the cache), victim choice, the optional pinned tier and the heat
 * histogram the policy keeps up to date. It does not own the memory of the
 * slots or any I/O: the runtime maps slot numbers to its own buffers.
 *
 * Policies:
 *   lru       least recently used, always admits.
 *   belady    offline optimum given the future (simulation only: the caller
 *             supplies each key's next use with df_cache_set_next_use). Evicts
 *             the entry used farthest in the future, and bypasses the new key
 *             when it is the one needed last, which is optimal for unit-size
 *             entries when bypass is allowed.
 *   deltafin  hazard ranking (docs/cache-policy.md): each entry is in a state
 *             (m = routing opportunities its layer has passed without choosing
 *             it, b = heat bucket); the probability H[m][b] that it is chosen at
 *             its layer's next opportunity is learned online from the routing
 *             itself. Evict the lowest H; among equals, the one whose layer
 *             comes up last. A miss is admitted only if its own H beats the
 *             victim's.
 *
 * `layer` is always the MoE layer index (0 .. n_layers-1), not the model layer.
 * Not thread-safe: one caller (the thread that schedules expert reads).
 *
 * How the runtime drives it, per token and per MoE layer in order:
 *     for each selected expert e: slot = df_cache_lookup(c, layer, e)
 *     for each miss:             slot = df_cache_admit(c, layer, e, &evicted)
 *                                (-1: read into a transient buffer instead)
 *     ... after the last layer:  df_cache_token_end(c)
 * (df_cache_access_layer does the first two steps.) Looking up all of a layer's
 * experts before admitting any matters: every expert selected in the current
 * layer step is protected from eviction until the next layer step, so a miss
 * never evicts an expert the same layer is about to use. A batched step (prefill
 * rows, verified drafts) is one "token" whose layer steps select the union.
 *
 * Every operation is O(log(layers x buckets)) or O(1) in the number of slots, with
 * no allocation after df_cache_new.
 */
#ifndef DF_EXPERTS_POLICY_H
#define DF_EXPERTS_POLICY_H

#include "experts/heat.h"
#include "util/util.h"

#include <stdint.h>

typedef enum df_cache_policy {
    DF_POLICY_LRU = 0,
    DF_POLICY_BELADY,
    DF_POLICY_DELTAFIN,
    DF_POLICY_COUNT
} df_cache_policy;

const char *df_cache_policy_name(df_cache_policy p);
/* "lru", "belady", "deltafin"; -1 if unknown */
int df_cache_policy_from_name(const char *name);

/* Tunables of the deltafin policy; zero fields take the defaults. */
typedef struct df_cache_tuning {
    int max_missed;          /* m is capped here (default 16) */
    int relearn_tokens;      /* H is recomputed every this many tokens (default 8) */
    double learn_half_life;  /* tokens; forgetting of the hazard counts (default: none) */
    double admit_factor;     /* admit when H_new * factor >= H_victim (default 0.85) */
    int n_buckets;           /* heat buckets, 1..8 (default 8) */
    double prior_tokens;     /* persisted heat counts as at most this many tokens of
                                evidence when ranking (default 128) */
} df_cache_tuning;

typedef struct df_cache_opts {
    int n_layers;    /* MoE layers */
    int n_experts;   /* routed experts per layer */
    int top_k;       /* experts selected per layer per token */
    int n_slots;     /* cache capacity in experts, pinned ones included */
    df_cache_policy policy;
    double heat_half_life;       /* tokens; <= 0: DF_HEAT_DEFAULT_HALF_LIFE */
    const df_heat *initial_heat; /* persisted heat to start from (copied); NULL = none */
    int n_pinned;                /* top entries of initial_heat pinned for good */
    df_cache_tuning tuning;
} df_cache_opts;

typedef struct df_cache_stats {
    uint64_t accesses; /* lookups */
    uint64_t hits;
    uint64_t misses;
    uint64_t admitted;  /* misses given a slot */
    uint64_t bypassed;  /* misses not cached */
    uint64_t evictions; /* admitted misses that displaced an entry */
    uint64_t tokens;
} df_cache_stats;

typedef struct df_cache df_cache;

int df_cache_new(df_cache **out, const df_cache_opts *opts, df_error *err);
void df_cache_free(df_cache *c);

/* Records one use of (layer, expert) in the current token. Returns its slot on a
 * hit, -1 on a miss (then call df_cache_admit or read around the cache). */
int df_cache_lookup(df_cache *c, int layer, int expert);
/* After a miss on (layer, expert) in the current layer step: returns the slot to
 * load it into, whose previous key (layer * n_experts + expert) is stored in
 * *evicted (-1 if the slot was free), or -1 if it is not to be cached. A key not
 * looked up in the current layer step is never admitted (-1); a cached key
 * returns its slot. */
int df_cache_admit(df_cache *c, int layer, int expert, int32_t *evicted);
/* Both steps for one layer: slots[i] = slot of experts[i] or -1 (bypassed);
 * hit[i] (if non-NULL) = 1 on a hit. Returns the number of hits. */
int df_cache_access_layer(df_cache *c, int layer, const int32_t *experts, int n,
                          int32_t *slots, uint8_t *hit);
/* The current token is complete. */
void df_cache_token_end(df_cache *c);

/* Belady only (ignored by the others): the absolute layer-step
 * (token * n_layers + layer) of the key's next use after the one about to be
 * looked up, or UINT64_MAX for never. Call before the lookup. */
void df_cache_set_next_use(df_cache *c, int layer, int expert, uint64_t next_step);

/* Slot -> key (layer * n_experts + expert), -1 if free. */
int32_t df_cache_slot_key(const df_cache *c, int slot);
/* Key -> slot, -1 if not cached. Does not count as a use. */
int df_cache_find(const df_cache *c, int layer, int expert);
int df_cache_is_pinned(const df_cache *c, int slot);
const df_cache_stats *df_cache_get_stats(const df_cache *c);
/* The heat histogram as updated by every lookup so far (save it at exit). */
const df_heat *df_cache_heat(const df_cache *c);
int df_cache_n_slots(const df_cache *c);
/* Copies the learned hazard table (deltafin), H[m * n_buckets + b]; returns the
 * number of entries (0 for other policies). For diagnostics. */
int df_cache_hazard(const df_cache *c, double *out, int cap, int *n_missed, int *n_buckets);

/* Verifies the internal invariants (maps, lists, heap, and deltafin's victim
 * against a full scan). O(slots); for tests. */
int df_cache_check(const df_cache *c, df_error *err);

/* ---- cache simulation (cachesim.c; `deltafin cache-sim`) ---- */

/* "key=value,..." of df_cache_tuning (max_missed, relearn, learn_half_life,
 * admit, buckets, prior_tokens) into t; DF_ERR_ARG naming the bad entry. */
int df_cache_tuning_parse(const char *spec, df_cache_tuning *t, df_error *err);

struct df_trace;
/* For each access of the trace (token-major, layer, k): the layer step of the
 * same expert's next use, UINT64_MAX if none (Belady's oracle). Free with free(). */
uint64_t *df_cache_sim_next_uses(const struct df_trace *t);

typedef struct df_sim_result {
    uint64_t accesses, hits; /* over the tokens from warmup on */
} df_sim_result;
/* Replays the trace through c as the runtime drives it: per layer every
 * lookup, then the admissions; df_cache_token_end after each token. */
void df_cache_sim_replay(const struct df_trace *t, df_cache *c, const uint64_t *next, int warmup,
                         df_sim_result *r);

#endif
