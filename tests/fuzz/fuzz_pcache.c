/*
 * fuzz_pcache.c - libFuzzer target for the prompt cache's file format
 * (src/engine/pcache.c): the input is a segment file without its key field's
 * meaning and without its trailing checksum, which the target fills in (the
 * key and checksum checks are test_pcache's; here the fuzzer should reach the
 * fields behind them). The file is named for the position its header gives,
 * over fixed token ids, for a cache whose model has a fixed fingerprint and a
 * two-layer layout (a KV cache of width 4, a recurrent state of 6 floats).
 * Reading it never crashes: it is refused (and removed) or accepted, and an
 * accepted segment's payload lies inside the file with the size the layout
 * gives for its positions.
 */
#include "engine/pcache.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define MAXQ 64

static df_pcache *pc;
static int32_t ids[MAXQ];
static const df_seq_layer_desc layout[2] = {{DF_LSTATE_KV, 4}, {DF_LSTATE_REC, 6}};

static char *dir;
static const char *outcome;

const char *df_fuzz_outcome(void) { return outcome; }

static void done(void) { /* before the driver removes its scratch directory */
    df_pcache_close(pc);
    rmdir(dir);
    free(dir);
}

static uint64_t payload_of(int from, int q) { return (uint64_t)(q - from) * 2 * 4 * sizeof(float) + 6 * sizeof(float); }

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size) {
    if (!pc) {
        uint8_t fp[16];
        for (int i = 0; i < 16; i++) fp[i] = (uint8_t)(i * 17);
        for (int i = 0; i < MAXQ; i++) ids[i] = i;
        df_error err;
        dir = df_xstrdup(df_fuzz_scratch("pc"));
        if (df_pcache_open(&pc, dir, 0, 0, fp, &err)) abort();
        atexit(done);
    }
    if (size < DF_PC_HEADER || size > 1 << 16) return 0;
    uint8_t *buf = malloc(size + 8);
    memcpy(buf, d, size);
    int q = (int)(buf[48] | buf[49] << 8) % MAXQ;
    if (q <= 0) q = 1;
    df_pc_key key = df_pcache_key(pc, ids, q);
    memcpy(buf + 32, key.b, 16);
    uint64_t sum = XXH3_64bits(buf, size);
    for (int i = 0; i < 8; i++) buf[size + i] = (uint8_t)(sum >> (8 * i));
    char name[80];
    static const char hex[] = "0123456789abcdef";
    int k = snprintf(name, sizeof name, "q%d-", q);
    for (int i = 0; i < 16; i++) name[k++] = hex[key.b[i] >> 4], name[k++] = hex[key.b[i] & 15];
    strcpy(name + k, ".dfpc");
    char *path = df_path_join(dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, size + 8, f) != size + 8 || fclose(f)) abort();
    free(buf);
    df_pc_head h;
    outcome = "header refused";
    if (df_pcache_head(pc, q, &key, &h)) {
        outcome = "file refused";
        if (h.q != (uint32_t)q || h.from >= h.q) abort();
        uint64_t want = payload_of((int)h.from, q);
        const df_pc_blob *b = df_pcache_get(pc, q, &key, ids, layout, 2, want);
        if (b) {
            outcome = h.from ? "accepted (a child)" : "accepted (a root)";
            if (b->payload < b->data || b->payload + want + 8 != b->data + b->size) abort();
            df_pcache_release(pc, b);
        } else if (access(path, F_OK) == 0) {
            abort(); /* refused but left in place */
        }
    }
    unlink(path);
    free(path);
    return 0;
}
