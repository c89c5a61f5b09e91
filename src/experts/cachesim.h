/*
 * experts/cachesim.h - the cache simulation of several sequences decoded
 * together (`deltafin cache-sim --streams N`), next to the one-token replay
 * declared in policy.h; both are experts/cachesim.c.
 */
#ifndef DF_EXPERTS_CACHESIM_H
#define DF_EXPERTS_CACHESIM_H

#include "experts/policy.h"
#include "experts/trace.h"

#include <stdint.h>

/* Several sequences decoded together, as `deltafin bench --parallel N` and a
 * server batch drive the cache: the trace is cut into windows of n_streams x
 * (prompt + decode) tokens; in a window stream i takes its own stretch
 * (tokens i x (prompt + decode) on), one step holds every stream's prompt
 * rows (none when prompt is 0), then each of `decode` steps one row of every
 * stream, and a layer step asks for the union of its rows' experts. The cache
 * lives on across windows (a server's next batch). */
typedef struct df_sim_streams {
    int n_streams, prompt, decode;
} df_sim_streams;

typedef struct df_sim_steps df_sim_steps;

/* The layer steps' accesses, with Belady's next uses; NULL on bad options.
 * *windows: how many whole windows the trace holds. */
df_sim_steps *df_cache_sim_steps(const df_trace *t, const df_sim_streams *o, int *windows);
void df_cache_sim_steps_free(df_sim_steps *s);
/* Replays the steps through c; r counts the decode steps only, *rows their
 * rows (decoded tokens). */
void df_cache_sim_replay_steps(const df_sim_steps *s, df_cache *c, df_sim_result *r, uint64_t *rows);

#endif
