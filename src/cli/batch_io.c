/*
 * cli/batch_io.c - `deltafin batch`'s files: the input's lines checked into
 * jobs (the envelope here, the body by the server's own parser, which needs
 * no engine: server/request.h), and the output kept resumable: on start its
 * complete lines say which jobs are done and an incomplete last line is cut
 * off; each result line goes out in one write() and is fsync'ed before the
 * next, so a kill at any moment leaves whole lines only.
 */
#include "cli/batch.h"
#include "cli/cli.h"
#include "util/json_text.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* FNV-1a, then splitmix64's finalizer so that similar custom_ids get unlike ids. */
static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

const char *batch_job_key(const batch_job *j, char *buf, size_t n) {
    if (j->custom_id) return j->custom_id;
    snprintf(buf, n, "line %d", j->line);
    return buf;
}

static void envelope_error(batch_job *j, const char *fmt, const char *detail) {
    j->valid = false;
    j->status = 0;
    snprintf(j->message, sizeof j->message, fmt, detail ? detail : "");
}

/* The envelope of one line: custom_id, method, url, body; the body through
 * the server's parser. */
static void parse_line(batch_job *j, const char *text, size_t len) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    char buf[32];
    snprintf(buf, sizeof buf, "line %d", j->line);
    j->hash = fnv1a(buf, strlen(buf));
    if (!root) {
        envelope_error(j, "the line is not valid JSON: %s", df_json_error_text(&je));
        return;
    }
    if (!json_is_object(root)) {
        envelope_error(j, "the line is not a JSON object%s", NULL);
        goto out;
    }
    json_t *cid = json_object_get(root, "custom_id"), *method = json_object_get(root, "method"),
           *url = json_object_get(root, "url"), *body = json_object_get(root, "body");
    if (json_is_string(cid) && json_string_length(cid) > 0) {
        j->custom_id = df_xstrdup(json_string_value(cid));
        j->hash = fnv1a(j->custom_id, strlen(j->custom_id));
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "custom_id") && strcmp(key, "method") && strcmp(key, "url") && strcmp(key, "body")) {
            envelope_error(j, "unknown field '%.100s' (custom_id, method, url, body)", key);
            goto out;
        }
    }
    if (!j->custom_id) {
        envelope_error(j, "'custom_id' must be a non-empty string%s", NULL);
        goto out;
    }
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST")) {
        envelope_error(j, "'method' must be \"POST\"%s", NULL);
        goto out;
    }
    const char *u = json_is_string(url) ? json_string_value(url) : "";
    if (!strcmp(u, "/v1/chat/completions")) j->kind = SRV_CHAT;
    else if (!strcmp(u, "/v1/completions")) j->kind = SRV_COMPLETIONS;
    else {
        envelope_error(j, "'url' must be \"/v1/chat/completions\" or \"/v1/completions\"%s", NULL);
        goto out;
    }
    if (!json_is_object(body)) {
        envelope_error(j, "'body' must be a JSON object%s", NULL);
        goto out;
    }
    char *bs = json_dumps(body, JSON_COMPACT);
    srv_error e;
    int rc = bs ? srv_parse_request(j->kind, bs, strlen(bs), &j->req, &e) : -1;
    free(bs);
    if (rc) {
        j->status = 400;
        snprintf(j->message, sizeof j->message, "%s", bs ? e.message : "out of memory");
        snprintf(j->param, sizeof j->param, "%s", bs ? e.param : "");
    } else if (j->req.stream) {
        j->status = 400;
        snprintf(j->message, sizeof j->message, "stream is not supported in a batch");
        snprintf(j->param, sizeof j->param, "stream");
        srv_request_free(&j->req);
    } else {
        j->valid = true;
    }
out:
    json_decref(root);
}

static int by_custom_id(const void *a, const void *b) {
    const batch_job *x = *(batch_job *const *)a, *y = *(batch_job *const *)b;
    int c = strcmp(x->custom_id, y->custom_id);
    return c ? c : x->line - y->line;
}

/* Every job of a custom_id given more than once becomes one error line (the
 * first), so the output still holds each custom_id once. */
static void mark_duplicates(batch_input *in) {
    batch_job **v = df_xmalloc(sizeof *v * (size_t)(in->n ? in->n : 1));
    int n = 0;
    for (int i = 0; i < in->n; i++)
        if (in->jobs[i].custom_id) v[n++] = &in->jobs[i];
    qsort(v, (size_t)n, sizeof *v, by_custom_id);
    for (int i = 0; i < n;) {
        int k = i + 1;
        while (k < n && !strcmp(v[k]->custom_id, v[i]->custom_id)) k++;
        if (k - i > 1) {
            batch_job *first = v[i];
            if (first->valid) srv_request_free(&first->req);
            first->valid = false;
            first->status = 0;
            int off = snprintf(first->message, sizeof first->message, "custom_id '%.200s' is on lines %d",
                               first->custom_id, first->line);
            for (int d = i + 1; d < k; d++) {
                batch_job *dup = v[d];
                if (dup->valid) srv_request_free(&dup->req);
                dup->valid = false;
                dup->status = -1; /* no line of its own */
                if (off < (int)sizeof first->message - 40)
                    off += snprintf(first->message + off, sizeof first->message - (size_t)off, ", %d", dup->line);
            }
            if (off < (int)sizeof first->message - 40)
                snprintf(first->message + off, sizeof first->message - (size_t)off, ": each job needs its own");
        }
        i = k;
    }
    free(v);
}

void batch_read_input(const char *path, batch_input *in) {
    char *data;
    size_t len;
    df_error err;
    if (df_read_file(path, &data, &len, &err)) cli_die("--input: %s", err.msg);
    int cap = 64;
    in->jobs = df_xcalloc((size_t)cap, sizeof *in->jobs);
    in->n = 0;
    int line = 0;
    for (size_t at = 0; at < len;) {
        size_t end = at;
        while (end < len && data[end] != '\n') end++;
        line++;
        size_t n = end - at;
        if (n && data[at + n - 1] == '\r') n--;
        bool blank = true;
        for (size_t i = 0; i < n && blank; i++) blank = data[at + i] == ' ' || data[at + i] == '\t';
        if (!blank) {
            if (in->n == cap) {
                in->jobs = realloc(in->jobs, sizeof *in->jobs * (size_t)(cap *= 2));
                if (!in->jobs) cli_die("out of memory");
            }
            batch_job *j = &in->jobs[in->n++];
            memset(j, 0, sizeof *j);
            j->line = line;
            parse_line(j, data + at, n);
        }
        at = end + 1;
    }
    free(data);
    mark_duplicates(in);
}

void batch_free_input(batch_input *in) {
    for (int i = 0; i < in->n; i++) {
        if (in->jobs[i].valid) srv_request_free(&in->jobs[i].req);
        free(in->jobs[i].custom_id);
    }
    free(in->jobs);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void job_id(const batch_job *j, char *buf, size_t n) {
    snprintf(buf, n, "batch_req_%016llx", (unsigned long long)j->hash);
}

/* The keys of the output's complete lines: "c" + custom_id, or "i" + id for
 * a line without one. Cuts an incomplete last line off. */
static char **done_keys(int fd, const char *path, int *n_keys) {
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0) cli_die("--output %s: %s", path, strerror(errno));
    char *d = df_xmalloc((size_t)size + 1);
    size_t got = 0;
    while (got < (size_t)size) {
        ssize_t r = pread(fd, d + got, (size_t)size - got, (off_t)got);
        if (r <= 0) cli_die("--output %s: cannot read it: %s", path, r ? strerror(errno) : "cut short");
        got += (size_t)r;
    }
    size_t keep = got;
    while (keep > 0 && d[keep - 1] != '\n') keep--;
    if (keep < got && ftruncate(fd, (off_t)keep)) cli_die("--output %s: cannot cut its last line off: %s", path, strerror(errno));
    int cap = 64, n = 0, line = 0;
    char **keys = df_xmalloc(sizeof *keys * (size_t)cap);
    for (size_t at = 0; at < keep;) {
        size_t end = at;
        while (d[end] != '\n') end++;
        line++;
        json_error_t je;
        json_t *o = json_loadb(d + at, end - at, 0, &je);
        json_t *cid = json_object_get(o, "custom_id"), *id = json_object_get(o, "id");
        if (!json_is_object(o) || !(json_is_string(cid) || json_is_string(id))) {
            char why[200];
            snprintf(why, sizeof why, "%s", o ? "no custom_id or id" : je.text);
            json_decref(o);
            for (int i = 0; i < n; i++) free(keys[i]);
            free(keys), free(d);
            cli_die("--output %s: line %d is not a result line of deltafin batch (%s)", path, line, why);
        }
        const char *v = json_is_string(cid) ? json_string_value(cid) : json_string_value(id);
        char *k = df_xmalloc(strlen(v) + 2);
        k[0] = json_is_string(cid) ? 'c' : 'i';
        strcpy(k + 1, v);
        if (n == cap) keys = realloc(keys, sizeof *keys * (size_t)(cap *= 2));
        if (!keys) cli_die("out of memory");
        keys[n++] = k;
        json_decref(o);
        at = end + 1;
    }
    free(d);
    qsort(keys, (size_t)n, sizeof *keys, cmp_str);
    *n_keys = n;
    return keys;
}

int batch_open_output(const char *path, const batch_input *in, bool *done) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) cli_die("--output %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB))
        cli_die("--output %s: another process (deltafin batch?) is writing it", path);
    int n_keys;
    char **keys = done_keys(fd, path, &n_keys);
    for (int i = 0; i < in->n; i++) {
        const batch_job *j = &in->jobs[i];
        char k[600], id[64];
        job_id(j, id, sizeof id);
        snprintf(k, sizeof k, "%c%s", j->custom_id ? 'c' : 'i', j->custom_id ? j->custom_id : id);
        char *kp = k;
        done[i] = j->status == -1 || bsearch(&kp, keys, (size_t)n_keys, sizeof *keys, cmp_str) != NULL;
    }
    for (int i = 0; i < n_keys; i++) free(keys[i]);
    free(keys);
    if (lseek(fd, 0, SEEK_END) < 0) cli_die("--output %s: %s", path, strerror(errno));
    return fd;
}

/* A JSON string of s, or of a stand-in when s is not valid UTF-8 (an engine
 * message quoting a file name, say). */
static json_t *str_or(const char *s, const char *fallback) {
    json_t *v = json_string(s);
    return v ? v : json_string(fallback);
}

json_t *batch_error_body(const char *message, const char *param) {
    return json_pack("{s:{s:o,s:s,s:o,s:n}}", "error", "message", str_or(message, "invalid request"), "type",
                     "invalid_request_error", "param", param && *param ? str_or(param, "") : json_null(), "code");
}

void batch_write_result(int fd, const batch_job *j, int status, json_t *body, const char *message) {
    char id[64], rid[64];
    job_id(j, id, sizeof id);
    snprintf(rid, sizeof rid, "req_%016llx", (unsigned long long)j->hash);
    json_t *o = json_pack("{s:s,s:o}", "id", id, "custom_id", j->custom_id ? json_string(j->custom_id) : json_null());
    if (status) {
        json_object_set_new(o, "response", json_pack("{s:i,s:s,s:o}", "status_code", status, "request_id", rid, "body", body));
        json_object_set_new(o, "error", json_null());
    } else {
        char msg[800];
        snprintf(msg, sizeof msg, "line %d: %s", j->line, message);
        json_object_set_new(o, "response", json_null());
        json_object_set_new(o, "error", json_pack("{s:s,s:o}", "code", "invalid_request", "message",
                                                  str_or(msg, "invalid request")));
        json_decref(body);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) cli_die("out of memory");
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps's terminator becomes the line end: one write() */
    const char *p = s;
    size_t left = n + 1;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) cli_die("--output: cannot write a result line: %s", w ? strerror(errno) : "no room");
        p += w, left -= (size_t)w;
    }
    if (fsync(fd)) cli_die("--output: fsync: %s", strerror(errno));
    free(s);
}
