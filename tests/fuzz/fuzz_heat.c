/*
 * fuzz_heat.c - libFuzzer target for the expert heat file (src/experts/heat.c),
 * the cache policy's prior persisted next to a pack, and for what the policy
 * does with it. The input is the file without its trailing CRC-32, which the
 * target appends (the checksum test is a unit test's; here the fuzzer should
 * reach the values behind it). Loading never fails hard: a file is loaded,
 * reported corrupt, or for another shape, with a reason. A loaded histogram
 * holds finite, non-negative heat, and a cache started from it (the hottest
 * pinned) serves a fixed stream of tokens with sane bookkeeping, under UBSan:
 * hostile but finite values (1e308, denormals, a lifetime of 2^64 tokens) must
 * not overflow into undefined conversions.
 */
#include "experts/heat.h"
#include "experts/policy.h"
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 3
#define EXPERTS 8

static char outcome[96];

const char *df_fuzz_outcome(void) { return outcome; }

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size) {
    const char *path = df_fuzz_scratch("experts.heat");
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint32_t crc = df_crc32(0, d, size);
    uint8_t le[4] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16), (uint8_t)(crc >> 24)};
    if ((size && fwrite(d, 1, size, f) != size) || fwrite(le, 1, 4, f) != 4 || fclose(f)) abort();

    df_heat h;
    df_error err = {0};
    if (df_heat_init(&h, LAYERS, EXPERTS, 0, &err)) abort();
    df_heat_load_result r = df_heat_load(&h, path, &err);
    if (!err.msg[0] || !strstr(err.msg, path)) abort();
    /* the reason, without the path, the numbers and what follows ';' */
    const char *m = strstr(err.msg, path) + strlen(path), *semi = strchr(m, ';');
    df_fuzz_describe(outcome, sizeof outcome, df_heat_load_result_name(r), m,
                     semi ? (size_t)(semi - m) : strlen(m), 0);
    if (r != DF_HEAT_LOADED) {
        for (int i = 0; i < LAYERS * EXPERTS; i++)
            if (h.v[i] != 0) abort(); /* a refused file leaves the histogram empty */
        df_heat_free(&h);
        return 0;
    }
    for (int i = 0; i < LAYERS * EXPERTS; i++)
        if (!(df_heat_get(&h, i) >= 0) || !isfinite(df_heat_get(&h, i))) abort();
    df_cache *c;
    df_cache_opts co = {.n_layers = LAYERS, .n_experts = EXPERTS, .top_k = 2, .n_slots = 5,
                       .policy = DF_POLICY_DELTAFIN, .initial_heat = &h, .n_pinned = 2};
    if (df_cache_new(&c, &co, &err)) abort();
    int32_t ids[2], slot[2];
    uint8_t hit[2];
    for (int t = 0; t < 40; t++) {
        for (int l = 0; l < LAYERS; l++) {
            ids[0] = (t * 3 + l) % EXPERTS;
            ids[1] = (t * 5 + l + 1) % EXPERTS == ids[0] ? (ids[0] + 1) % EXPERTS
                                                         : (t * 5 + l + 1) % EXPERTS;
            df_cache_access_layer(c, l, ids, 2, slot, hit);
            for (int k = 0; k < 2; k++)
                if (slot[k] >= df_cache_n_slots(c) || (hit[k] && slot[k] < 0)) abort();
        }
        df_cache_token_end(c);
    }
    const df_cache_stats *st = df_cache_get_stats(c);
    if (st->hits + st->misses != st->accesses || st->accesses != 40 * LAYERS * 2) abort();
    int32_t top[LAYERS * EXPERTS];
    df_heat_top(df_cache_heat(c), LAYERS * EXPERTS, top);
    df_cache_free(c);
    df_heat_free(&h);
    return 0;
}
