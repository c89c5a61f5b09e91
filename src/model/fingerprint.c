/*
 * model/fingerprint.c - the model's fingerprint: 16 bytes that tell two
 * checkpoints apart (config.json, every tensor's name, dtype and shape,
 * samples of the bytes). The prompt cache keys its files by it
 * (engine/pcache_session.c); ranks of a run over several processes compare
 * it at start-up (src/dist/).
 */
#include "model/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

void df_fp_u64(XXH3_state_t *st, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_128bits_update(st, b, 8);
}

/* Three 64-byte samples of t (offset, bytes), read with pread: a touched page
 * of the mapping would stay in the RSS. */
int df_fp_tensor_samples(XXH3_state_t *st, const df_st *sf, const df_tensor *t, df_error *err) {
    uint64_t len = t->nbytes < 64 ? t->nbytes : 64;
    uint64_t offs[3] = {0, (t->nbytes / 2) & ~(uint64_t)63, t->nbytes - len};
    for (int s = 0; s < 3; s++) {
        uint8_t buf[64];
        if (offs[s] + len > t->nbytes) offs[s] = t->nbytes - len;
        ssize_t got = df_pread_full(df_st_file_fd(sf, t->file), buf, (size_t)len, t->file_offset + offs[s]);
        if (got != (ssize_t)len)
            return df_fail(err, DF_ERR_IO, "%s: tensor '%s': %s", df_st_file_path(sf, t->file), t->name,
                           got < 0 ? strerror(errno) : "unexpected end of file");
        df_fp_u64(st, offs[s]);
        XXH3_128bits_update(st, buf, (size_t)len);
    }
    return DF_OK;
}

/* XXH3-128 over config.json's bytes, every tensor's name, dtype and shape,
 * and samples of every always-active tensor's bytes and of some experts':
 * two checkpoints that differ only in their numbers (a fine-tune) differ
 * here, at the cost of a few small reads. */
int df_model_fingerprint(const df_model *m, const char *dir, uint8_t out[16], df_error *err) {
    char *path = df_path_join(dir, "config.json"), *cfg;
    size_t clen;
    int rc = df_read_file(path, &cfg, &clen, err);
    free(path);
    if (rc) return rc;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    static const char magic[] = "deltafin-prompt-cache-fingerprint v1\n";
    XXH3_128bits_update(&st, magic, sizeof magic - 1);
    df_fp_u64(&st, clen);
    XXH3_128bits_update(&st, cfg, clen);
    free(cfg);
    size_t n = df_st_count(m->st);
    for (size_t i = 0; i < n && !rc; i++) {
        const df_tensor *t = df_st_at(m->st, i);
        XXH3_128bits_update(&st, t->name, strlen(t->name) + 1);
        df_fp_u64(&st, (uint64_t)t->dtype);
        df_fp_u64(&st, (uint64_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) df_fp_u64(&st, (uint64_t)t->shape[d]);
        if (t->nbytes && (!m->is_expert[i] || i % 61 == 0)) rc = df_fp_tensor_samples(&st, m->st, t, err);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(h.high64 >> (8 * i)), out[8 + i] = (uint8_t)(h.low64 >> (8 * i));
    return rc;
}

