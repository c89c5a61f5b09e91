/*
 * pack_journal.c - the progress journal of an unfinished pack (one `progress`
 * file per directory): which records are durable and their checksums, so an
 * interrupted `deltafin pack` resumes where it stopped. Also the durable
 * file replacement the writer uses for the journal and the manifest.
 *
 * The journal only ever claims records whose bytes were fdatasync'ed before
 * it was (atomically) replaced; see pack_write.c for when that happens.
 */
#include "experts/pack_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

void pk_progress_free(pk_progress *pg) {
    free(pg->xxh3);
    free(pg->sxxh3);
    memset(pg, 0, sizeof *pg);
}

/* The scalar fields; false if one is missing or out of range. */
static bool progress_fields(pk_progress *pg, json_t *root) {
    long long v;
    const char *s = pk_jstr(root, "format");
    if (!s || strcmp(s, PROGRESS_FORMAT) != 0 ||
        !pk_jint(root, "version", PROGRESS_VERSION, PROGRESS_VERSION, &v) ||
        !pk_is_uuid(pk_jstr(root, "uuid")) || !pk_is_hex(pk_jstr(root, "fingerprint"), DF_PACK_FP_HEX))
        return false;
    snprintf(pg->uuid, sizeof pg->uuid, "%s", pk_jstr(root, "uuid"));
    snprintf(pg->fp, sizeof pg->fp, "%s", pk_jstr(root, "fingerprint"));
    if (!pk_jint(root, "stripes", 1, DF_PACK_MAX_STRIPES, &v)) return false;
    pg->stripes = (int)v;
    if (!pk_jint(root, "stripe", 0, pg->stripes - 1, &v)) return false;
    pg->stripe = (int)v;
    if (!pk_jint(root, "records_total", 1, INT32_MAX, &v)) return false;
    pg->total = (int)v;
    if (!pk_jint(root, "records_done", 0, pg->total, &v)) return false;
    pg->done = (int)v;
    return true;
}

/* The checksums of the records done. */
static bool progress_sums(pk_progress *pg, json_t *root) {
    json_t *a = json_object_get(root, "xxh3"), *b = json_object_get(root, "stripe_xxh3");
    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != (size_t)pg->done ||
        json_array_size(b) != (size_t)pg->done)
        return false;
    pg->xxh3 = df_xcalloc((size_t)pg->done + 1, sizeof *pg->xxh3);
    pg->sxxh3 = df_xcalloc((size_t)pg->done + 1, sizeof *pg->sxxh3);
    for (int i = 0; i < pg->done; i++)
        if (!pk_parse_hex64(json_string_value(json_array_get(a, (size_t)i)), &pg->xxh3[i]) ||
            !pk_parse_hex64(json_string_value(json_array_get(b, (size_t)i)), &pg->sxxh3[i]))
            return false;
    return true;
}

int pk_progress_load(pk_progress *pg, const char *dir, df_error *err) {
    memset(pg, 0, sizeof *pg);
    char *path = df_path_join(dir, PROGRESS_NAME);
    char *text;
    size_t len;
    df_error e2;
    int rc = df_read_file(path, &text, &len, &e2);
    free(path);
    if (rc) return df_fail(err, rc, "pack %s: %s", dir, e2.msg);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    bool ok = root && progress_fields(pg, root) && progress_sums(pg, root);
    json_decref(root);
    if (!ok) {
        pk_progress_free(pg);
        return df_fail(err, DF_ERR_FORMAT, "pack %s: the " PROGRESS_NAME " journal of an "
                       "unfinished pack is damaged; delete %s/" PROGRESS_NAME " and the "
                       ".partial files there to start over", dir, dir);
    }
    return DF_OK;
}

int pk_write_file_durable(const char *dir, const char *tmp_name, const char *name, const char *text,
                          size_t len) {
    char *tmp = df_path_join(dir, tmp_name), *fin = name ? df_path_join(dir, name) : NULL;
    int e = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) e = errno;
    if (!e) e = df_pwrite_full(fd, text, len, 0);
    if (!e && fsync(fd) != 0) e = errno;
    if (fd >= 0) close(fd);
    if (!e && fin && rename(tmp, fin) != 0) e = errno;
    if (!e) e = df_fsync_dir(dir);
    if (e && fd >= 0) unlink(tmp);
    free(tmp);
    free(fin);
    return e;
}

char *pk_progress_text(const char *uuid, const char *fp, int stripe, int stripes, int total, int done,
                       const uint64_t *xxh3, const uint64_t *sxxh3) {
    df_sbuf b = {0};
    df_sb_printf(&b,
                 "{\"format\": \"" PROGRESS_FORMAT "\", \"version\": %d, \"uuid\": \"%s\", "
                 "\"fingerprint\": \"%s\", \"stripe\": %d, \"stripes\": %d, "
                 "\"records_total\": %d, \"records_done\": %d,\n\"xxh3\": [",
                 PROGRESS_VERSION, uuid, fp, stripe, stripes, total, done);
    char h[17];
    for (int i = 0; i < done; i++) {
        pk_hex64(xxh3[i], h);
        df_sb_printf(&b, "%s\"%s\"", i ? "," : "", h);
    }
    df_sb_printf(&b, "],\n\"stripe_xxh3\": [");
    for (int i = 0; i < done; i++) {
        pk_hex64(sxxh3[i], h);
        df_sb_printf(&b, "%s\"%s\"", i ? "," : "", h);
    }
    df_sb_printf(&b, "]}\n");
    return b.s;
}
