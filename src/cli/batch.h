/*
 * cli/batch.h - what `deltafin batch`'s two files share: a job of the input
 * file (batch_io.c reads and checks the lines, keeps the output file
 * resumable and writes result lines; batch.c runs the jobs together).
 */
#ifndef DF_CLI_BATCH_H
#define DF_CLI_BATCH_H

#include "server/request.h"

#include <jansson.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct batch_job {
    int line;          /* 1-based line of the input */
    char *custom_id;   /* NULL: the line had none */
    uint64_t hash;     /* of custom_id (or of the line number): the ids written and the default seed */
    bool valid;        /* the request parsed: run it */
    int kind;          /* SRV_CHAT or SRV_COMPLETIONS */
    srv_request req;
    /* not valid: why, as an error line (status 0) or a 400 response */
    int status;
    char message[700];
    char param[64];
} batch_job;

typedef struct batch_input {
    batch_job *jobs;
    int n;
} batch_input;

/* Reads and checks every line of path (blank lines skipped); dies only when
 * the file cannot be read. Duplicated custom_ids become one error job each. */
void batch_read_input(const char *path, batch_input *in);
void batch_free_input(batch_input *in);

/* The output file, opened for appending after its complete lines (a trailing
 * incomplete line, left by a kill, is cut off). done[i] is set for every job
 * whose custom_id (or, for a line without one, id) the file holds. */
int batch_open_output(const char *path, const batch_input *in, bool *done);

/* The key of a job in the output: its custom_id, else "line N". */
const char *batch_job_key(const batch_job *j, char *buf, size_t n);

/* One result line: written whole with a single write() and fsync'ed, so a
 * kill leaves only complete lines. body: the response body (stolen) for
 * status_code 200 or 400; with status 0, message is the line's error. */
void batch_write_result(int fd, const batch_job *j, int status, json_t *body, const char *message);

/* The error body of a 400 response, as the server's. */
json_t *batch_error_body(const char *message, const char *param);

#endif
