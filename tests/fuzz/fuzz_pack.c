/*
 * fuzz_pack.c - libFuzzer target for expert-pack manifests (src/experts/pack_format.c),
 * through `deltafin pack --verify`'s entry point. The input is written as a pack
 * directory's manifest.json next to an experts.bin of zeros (data_bytes long when
 * the input says so and that is at most 4 MiB, else 64 KiB), and the pack is
 * verified: every outcome must be an error naming the pack directory (a
 * malformed manifest, a wrong file size, a record whose checksum does not match
 * the zeros, a stripe set that is incomplete) and nothing may crash, leak or read
 * outside what the manifest was allowed to describe.
 */
#include "experts/pack.h"
#include "fuzz.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char outcome[120];

const char *df_fuzz_outcome(void) { return outcome; }

static const char *const DICT[] = {
    "\"format\"", "\"deltafin-pack\"", "\"version\"", "\"uuid\"", "\"stripe\"", "\"stripes\"",
    "\"align\"", "4096", "\"fingerprint\"", "\"model\"", "\"num_hidden_layers\"",
    "\"num_experts\"", "\"data_file\"", "\"experts.bin\"", "\"data_bytes\"", "\"records\"",
    "\"BF16\"", "\"F32\"", "\"F16\"", "\"F8_E4M3\"", "\"ffffffffffffffff\"", "[48, 96]",
    "9223372036854775807", "4503599627370495", "-1", "0", "\"parts\"", "\"gate_proj.weight\"",
    "[[\"up_proj.weight\", \"BF16\", [48, 96], 9216]]", "2", "1",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static void write_file(const char *path, const uint8_t *d, size_t n, long long size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    if (fclose(f)) abort();
    if (size >= 0 && truncate(path, size)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size) {
    const char *manifest = df_fuzz_scratch("manifest.json"), *data = df_fuzz_scratch("experts.bin");
    char dir[96]; /* the scratch directory is the pack directory */
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(manifest, '/') - manifest), manifest);
    long long bytes = 65536;
    json_t *root = json_loadb((const char *)d, size, 0, NULL);
    json_t *db = root ? json_object_get(root, "data_bytes") : NULL;
    if (json_is_integer(db) && json_integer_value(db) >= 0 && json_integer_value(db) <= (4 << 20))
        bytes = json_integer_value(db);
    json_decref(root);
    write_file(manifest, d, size, -1);
    write_file(data, NULL, 0, bytes);
    const char *dirs[1] = {dir};
    df_error err = {0};
    int rc = df_pack_verify(dirs, 1, &err);
    if (rc == DF_OK) abort(); /* zeros never match a record's checksum */
    if (err.code != rc || !strstr(err.msg, dir)) abort();
    /* the directory, numbers and quoted values vary; the complaint does not */
    const char *m = strstr(err.msg, dir) + strlen(dir);
    const char *end = strstr(m, " near"); /* jansson's: where, and what it found */
    if (!end) end = strstr(m, " (line");
    char head[16];
    snprintf(head, sizeof head, "%d ", rc);
    df_fuzz_describe(outcome, sizeof outcome, head, m, end ? (size_t)(end - m) : strlen(m), 0);
    return 0;
}
