/*
 * server.c - `deltafin serve`: an OpenAI-compatible HTTP server (docs/server.md).
 *
 * Owns: the HTTP side (libmicrohttpd, one thread per connection), the bounded
 * request queue, the single model worker thread and its one session, prompt-
 * prefix reuse, stop strings, OpenAI penalties, SSE framing and /metrics.
 * Request bodies are parsed and validated in request.c (no engine needed).
 * Uses only the public API (deltafin.h).
 *
 * Threads: connection threads parse, enqueue and then block on their job's
 * condition variable, polling their socket between waits so that a client that
 * goes away cancels its job (queued: removed; running: the worker sees the flag
 * between tokens). The worker owns the engine, the session and the sampler; the
 * only state shared with connection threads is under S.mu.
 */
#include "server/server.h"

#include "deltafin.h"
#include "engine/dev.h" /* FIXME(front ends): dev controls move to bench */
#include "cli/args.h"
#include "server/listener.h"
#include "server/request.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_MS 20 /* how often a waiting connection looks at its socket */
#define PREFILL_CHUNK 256 /* prompt rows per eval, so cancellation is seen during long prefills */
#define MAX_CONNS 256     /* connections held at once */
#define API_KEY_ENV "DELTAFIN_API_KEY"

/* ---- options ---------------------------------------------------------------- */

typedef struct srv_opts {
    const char *model, *experts, *isa, *policy, *host, *api_key, *api_key_file, *prefetch, *draft;
    uint64_t ram_budget, pin, expert_cache, max_body;
    int threads, ctx, port, queue, prefetch_depth, draft_k, lookup_n, draft_fixed;
    int request_timeout, max_per_ip;
    bool insecure_bind, draft_rejection;
} srv_opts;

static const char SERVE_HELP[] =
    "usage: deltafin serve --model DIR [options]\n"
    "\n"
    "Serves the model over an OpenAI-compatible HTTP API (see docs/server.md):\n"
    "GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health,\n"
    "GET /metrics (Prometheus). One generation runs at a time; others queue.\n"
    "  --model DIR          Hugging Face checkpoint directory\n"
    "  --host ADDR          address to bind (default 127.0.0.1)\n"
    "  --port N             TCP port (default 8080)\n"
    "  --queue N            requests that may wait behind the running one (default 8);\n"
    "                       beyond that the answer is 429 with Retry-After\n"
    "  --api-key-file PATH  require 'Authorization: Bearer KEY' (all but /health), KEY\n"
    "                       being the first line of PATH; without this option or\n"
    "                       --api-key, the environment variable " API_KEY_ENV " is the key\n"
    "                       if set\n"
    "  --api-key KEY        the same with KEY given here, where every local user can\n"
    "                       read it (ps, /proc): prefer the file or the environment\n"
    "  --insecure-bind      allow a non-loopback --host without an API key\n"
    "  --max-body BYTES     largest request body (default 1M); larger gets 413\n"
    "  --request-timeout S  a request (headers and body) must arrive whole within S\n"
    "                       seconds of connecting (default 30), else it is closed\n"
    "  --max-conns-per-ip N connections one client address may hold at once (default\n"
    "                       32; 256 in all); raise it behind a reverse proxy\n"
    "  --ctx N              context length of the session: a request's prompt and\n"
    "                       max_tokens must fit (2..model max, default: min(model max, 4096))\n"
    "  --threads N          compute threads (1..256, default: all CPUs)\n"
    "  --isa PATH           kernel path: auto, avx512, avx2, c\n"
    "  --experts DIRS       stream routed experts from an expert pack\n"
    "  --ram-budget SIZE    keep the whole process within SIZE (e.g. 8G)\n"
    "  --expert-cache SIZE  size the expert cache directly\n"
    "  --policy P           expert cache policy: deltafin (default) or lru\n"
    "  --prefetch MODE      expert read-ahead: off (default), on, router, prev\n"
    "  --prefetch-depth N   MoE layers ahead the router lookahead runs (1..8)\n"
    "  --pin SIZE           pinned tier of hottest experts read at start-up\n"
    "  --draft DIR|lookup   speculative decoding for every request, same output as\n"
    "                       without (greedy; sampling: same distribution): a draft\n"
    "                       checkpoint sharing the tokenizer, or prompt lookup\n"
    "  --draft-k N          most tokens drafted per pass (1..16, default 8)\n"
    "  --lookup-n N         lookup: longest n-gram matched (1..16, default 3)\n"
    "  --draft-fixed N      measurement and tests: always draft N tokens, no gate\n"
    "  --draft-rejection    sampling: standard rejection sampling (the same distribution,\n"
    "                       higher acceptance for a draft model, but not the same sample\n"
    "                       for a seed as without --draft)\n";

/* The first line of the key file, without its line end. Read once at start-up. */
static const char *read_key_file(const char *path) {
    static char key[4096];
    FILE *f = fopen(path, "r");
    if (!f) cli_die("--api-key-file: cannot open '%s': %s", path, strerror(errno));
    errno = 0;
    size_t n = fgets(key, sizeof key, f) ? strlen(key) : 0;
    int err = ferror(f) ? errno : 0;
    bool whole = n < sizeof key - 1 || key[n - 1] == '\n' || feof(f);
    fclose(f);
    if (err) cli_die("--api-key-file: cannot read '%s': %s", path, strerror(err));
    if (!whole) cli_die("--api-key-file: the first line of '%s' is longer than %zu bytes", path, sizeof key - 2);
    if (n && key[n - 1] == '\n') key[--n] = 0;
    if (n && key[n - 1] == '\r') key[--n] = 0;
    if (!n) cli_die("--api-key-file: the first line of '%s' is empty (it should hold the key)", path);
    return key;
}

/* --api-key-file, else --api-key, else the environment (on the command line the
 * key is visible to every local user). */
static void resolve_api_key(srv_opts *o) {
    if (o->api_key && o->api_key_file) cli_die("--api-key and --api-key-file both given: give the key once");
    if (o->api_key_file) {
        o->api_key = read_key_file(o->api_key_file);
    } else if (!o->api_key) {
        const char *env = getenv(API_KEY_ENV);
        if (env && !*env) cli_die("%s is set but empty: unset it, or set it to the key", API_KEY_ENV);
        o->api_key = env;
    }
}

static void parse_opts(srv_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->queue = 8;
    o->max_body = 1 << 20;
    o->request_timeout = 30;
    o->max_per_ip = 32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(SERVE_HELP, stdout);
            exit(0);
        }
        if (!strcmp(a, "--insecure-bind")) { o->insecure_bind = true; continue; }
        if (!strcmp(a, "--draft-rejection")) { o->draft_rejection = true; continue; }
        if (strncmp(a, "--", 2) != 0) cli_die("unexpected argument '%s' (see --help)", a);
        /* Replayed routing makes output that is not the model's: never served. */
        if (!strcmp(a, "--replay-routing"))
            cli_die("--replay-routing is for benchmarks and tests only: the server refuses it "
                "(its output would not be the model's own)");
        static const char *const known[] = {"--model", "--host", "--port", "--queue", "--api-key",
                                            "--api-key-file", "--request-timeout", "--max-conns-per-ip",
                                            "--max-body", "--ctx", "--threads", "--isa", "--experts",
                                            "--ram-budget", "--expert-cache", "--policy", "--pin",
                                            "--prefetch", "--prefetch-depth",
                                            "--draft", "--draft-k", "--lookup-n", "--draft-fixed", NULL};
        bool ok = false;
        for (int k = 0; known[k]; k++) ok |= !strcmp(a, known[k]);
        if (!ok) cli_die("unknown option '%s' for this command (see --help)", a);
        if (i + 1 >= argc) cli_die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--port")) o->port = (int)cli_long(a, v, 1, 65535);
        else if (!strcmp(a, "--queue")) o->queue = (int)cli_long(a, v, 0, 4096);
        else if (!strcmp(a, "--api-key")) {
            if (!*v) cli_die("--api-key must not be empty");
            o->api_key = v;
        } else if (!strcmp(a, "--api-key-file")) o->api_key_file = v;
        else if (!strcmp(a, "--request-timeout")) o->request_timeout = (int)cli_long(a, v, 1, 3600);
        else if (!strcmp(a, "--max-conns-per-ip")) o->max_per_ip = (int)cli_long(a, v, 1, MAX_CONNS);
        else if (!strcmp(a, "--max-body")) o->max_body = cli_size(a, v);
        else if (!strcmp(a, "--ctx")) o->ctx = (int)cli_long(a, v, 2, 1 << 24);
        else if (!strcmp(a, "--threads")) o->threads = (int)cli_long(a, v, 1, 256);
        else if (!strcmp(a, "--isa")) o->isa = v;
        else if (!strcmp(a, "--experts")) o->experts = v;
        else if (!strcmp(a, "--ram-budget")) o->ram_budget = cli_size(a, v);
        else if (!strcmp(a, "--expert-cache")) o->expert_cache = cli_size(a, v);
        else if (!strcmp(a, "--policy")) o->policy = v;
        else if (!strcmp(a, "--pin")) o->pin = cli_size(a, v);
        else if (!strcmp(a, "--prefetch")) o->prefetch = v;
        else if (!strcmp(a, "--prefetch-depth")) o->prefetch_depth = (int)cli_long(a, v, 1, 8);
        else if (!strcmp(a, "--draft")) o->draft = v;
        else if (!strcmp(a, "--draft-k")) o->draft_k = (int)cli_long(a, v, 1, 16);
        else if (!strcmp(a, "--lookup-n")) o->lookup_n = (int)cli_long(a, v, 1, 16);
        else if (!strcmp(a, "--draft-fixed")) o->draft_fixed = (int)cli_long(a, v, 1, 16);
    }
    if (!o->draft && (o->draft_k || o->lookup_n || o->draft_fixed || o->draft_rejection))
        cli_die("--draft-k, --lookup-n, --draft-fixed and --draft-rejection need --draft");
    if (!o->model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    resolve_api_key(o);
}

/* ---- shared state ------------------------------------------------------------ */

enum job_state { J_QUEUED, J_RUNNING, J_STARTED, J_DONE, J_FAILED, J_DROPPED };

typedef struct job {
    srv_request req;
    pthread_cond_t cv;
    enum job_state state;
    atomic_bool cancel;
    int refs; /* connection + worker */
    struct job *next;
    char id[48];
    long long created;
    /* failure before the response started */
    int status;
    char *err_body;
    /* SSE bytes not yet sent */
    char *out;
    size_t out_len, out_cap, out_off;
    /* the final result (non-streaming) */
    char *text;
    size_t text_len;
    int prompt_tokens, completion_tokens;
    const char *finish;
} job;

enum { EP_MODELS, EP_COMPLETIONS, EP_CHAT, EP_HEALTH, EP_METRICS, EP_OTHER, N_EP };
static const char *const EP_NAME[N_EP] = {"/v1/models", "/v1/completions", "/v1/chat/completions",
                                          "/health", "/metrics", "other"};
static const int STATUSES[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUS ((int)(sizeof STATUSES / sizeof STATUSES[0]))

static struct {
    srv_opts o;
    df_engine *eng;
    df_spec *spec; /* NULL without --draft; used by the worker only */
    srv_listener *listener;
    const df_model_info *info;
    char model_id[256];
    int ctx;
    long long started;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    job *head, *tail;
    int n_waiting;
    bool running, stopping;
    job *current;       /* the job the worker is running, or NULL */

    /* metrics (under mu) */
    uint64_t requests[N_EP][N_STATUS + 1];
    uint64_t gen_tokens, prompt_tokens, reused_tokens, cancelled, rejected_full;
    double last_tps;
    df_stats stats;
    df_spec_stats spec_stats;
} S;

static long long now_unix(void) { return (long long)time(NULL); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void job_release(job *j) { /* under S.mu */
    if (--j->refs) return;
    srv_request_free(&j->req);
    pthread_cond_destroy(&j->cv);
    free(j->err_body);
    free(j->out);
    free(j->text);
    free(j);
}

/* Grows *buf to hold len + add + 1 bytes. */
static bool reserve(char **buf, size_t *cap, size_t len, size_t add) {
    if (len + add + 1 <= *cap) return true;
    size_t nc = *cap ? *cap : 256;
    while (nc < len + add + 1) nc *= 2;
    char *p = realloc(*buf, nc);
    if (!p) return false;
    *buf = p;
    *cap = nc;
    return true;
}

/* ---- the worker ---------------------------------------------------------------- */

typedef struct worker {
    df_session *sess;
    int32_t *counts; /* scratch: per-token count among generated tokens (penalties) */
    char *text;      /* generated text this request */
    size_t text_len, text_cap;
} worker;

static void job_fail(job *j, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void job_fail(job *j, int status, const char *param, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *body = srv_error_json(msg, status >= 500 ? "server_error" : "invalid_request_error", param);
    pthread_mutex_lock(&S.mu);
    if (j->state == J_STARTED && j->req.stream) {
        /* headers already went out: the error travels as an SSE event */
        size_t n = body ? strlen(body) : 0;
        if (body && reserve(&j->out, &j->out_cap, j->out_len, n + 16)) {
            j->out_len += (size_t)sprintf(j->out + j->out_len, "data: %s\n\n", body);
        }
        free(body);
        j->finish = NULL;
        j->state = J_DONE;
    } else {
        j->status = status;
        j->err_body = body;
        j->state = J_FAILED;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&S.mu);
}

/* Appends one SSE event holding obj (stolen) to the job's output. */
static void push_event(job *j, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    pthread_mutex_lock(&S.mu);
    size_t n = s ? strlen(s) : 0;
    if (s && reserve(&j->out, &j->out_cap, j->out_len, n + 8)) {
        memcpy(j->out + j->out_len, "data: ", 6);
        memcpy(j->out + j->out_len + 6, s, n);
        memcpy(j->out + j->out_len + 6 + n, "\n\n", 2);
        j->out_len += n + 8;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&S.mu);
    free(s);
}

static json_t *chunk_base(const job *j) {
    bool chat = j->req.kind == SRV_CHAT;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", S.model_id);
    if (j->req.include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* A streamed piece of text (finish == NULL) or the final chunk. */
static void push_chunk(job *j, const char *txt, size_t n, const char *finish, bool role) {
    json_t *o = chunk_base(j), *choice;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (j->req.kind == SRV_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (txt) json_object_set_new(delta, "content", json_stringn(txt, n));
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs", "finish_reason", fin);
    } else {
        choice = json_pack("{s:s%,s:i,s:n,s:o}", "text", txt ? txt : "", txt ? n : 0, "index", 0, "logprobs",
                           "finish_reason", fin);
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    push_event(j, o);
}

static json_t *usage_obj(int p, int c) {
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", p, "completion_tokens", c, "total_tokens", p + c);
}

static bool job_cancelled(job *j) { return atomic_load(&j->cancel); }

/* Emits generated text [from, to) of w->text: streamed at once, or kept for the
 * final response. */
static void emit(worker *w, job *j, size_t from, size_t to) {
    if (to > from && j->req.stream) push_chunk(j, w->text + from, to - from, NULL, false);
}

/* Earliest stop-string match starting at or after `from`; -1 if none. */
static long find_stop(const worker *w, const srv_request *r, size_t from) {
    long best = -1;
    for (int i = 0; i < r->n_stop; i++) {
        size_t m = strlen(r->stop[i]);
        if (w->text_len < from + m) continue;
        const char *p = memmem(w->text + from, w->text_len - from, r->stop[i], m);
        if (p && (best < 0 || p - w->text < best)) best = p - w->text;
    }
    return best;
}

/* Bytes at the end of the text that could begin a stop string: they are held
 * back until the next token decides. */
static size_t holdback(const worker *w, const srv_request *r, size_t from) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t m = strlen(r->stop[i]);
        for (size_t h = m - 1; h > hold; h--) {
            if (h > w->text_len - from) continue;
            if (!memcmp(w->text + w->text_len - h, r->stop[i], h)) {
                hold = h;
                break;
            }
        }
    }
    return hold;
}

static bool append_text(worker *w, const char *s, size_t n) {
    if (!reserve(&w->text, &w->text_cap, w->text_len, n)) return false;
    memcpy(w->text + w->text_len, s, n);
    w->text_len += n;
    w->text[w->text_len] = 0;
    return true;
}

/* Turns the request into prompt token ids; on failure the job has failed. */
static int32_t *prompt_ids(job *j, size_t *n_out) {
    const srv_request *r = &j->req;
    df_error err;
    int32_t *ids = NULL;
    size_t n = 0;
    if (r->kind == SRV_CHAT) {
        df_chat_msg *m = calloc((size_t)r->n_msgs, sizeof *m);
        if (!m) {
            job_fail(j, 500, NULL, "out of memory");
            return NULL;
        }
        for (int i = 0; i < r->n_msgs; i++) m[i] = (df_chat_msg){r->msgs[i].role, r->msgs[i].content};
        /* special tokens only from the template (docs/server.md, "Special tokens") */
        int rc = df_chat_tokenize(S.eng, m, r->n_msgs, 1, r->enable_thinking < 0 ? 1 : r->enable_thinking,
                                  &ids, &n, &err);
        free(m);
        if (rc) {
            job_fail(j, 400, "messages", "%s", err.msg);
            return NULL;
        }
    } else if (r->prompt) {
        if (df_tokenize(S.eng, r->prompt, strlen(r->prompt), &ids, &n, &err)) {
            job_fail(j, 400, "prompt", "%s", err.msg);
            return NULL;
        }
    } else {
        for (size_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= S.info->vocab_size) {
                job_fail(j, 400, "prompt", "prompt[%zu] = %d is outside the vocabulary (%d tokens)", i,
                         r->prompt_ids[i], S.info->vocab_size);
                return NULL;
            }
        ids = malloc(r->n_prompt_ids * sizeof *ids);
        if (!ids) {
            job_fail(j, 500, NULL, "out of memory");
            return NULL;
        }
        memcpy(ids, r->prompt_ids, r->n_prompt_ids * sizeof *ids);
        n = r->n_prompt_ids;
    }
    *n_out = n;
    return ids;
}

/* OpenAI presence/frequency penalties over the generated tokens gen[0..n),
 * once per distinct token; counts is all zero before and after. */
static void apply_penalties(const srv_request *r, int32_t *counts, float *logits, const int32_t *gen, int n) {
    if (r->presence_penalty == 0 && r->frequency_penalty == 0) return;
    for (int i = 0; i < n; i++) counts[gen[i]]++;
    for (int i = 0; i < n; i++) {
        int32_t t = gen[i];
        if (counts[t] == 0) continue; /* already applied for this id */
        logits[t] -= (float)(r->presence_penalty + r->frequency_penalty * counts[t]);
        counts[t] = 0;
    }
}

/* The same penalties on every row speculative decoding looks at: the row's
 * history past the prompt is what would have been generated before it. */
typedef struct penalty_ctx {
    const srv_request *r;
    int32_t *counts;
    int n_prompt;
} penalty_ctx;

static void penalty_hook(void *user, float *logits, int vocab, const int32_t *history, int n_history) {
    (void)vocab;
    penalty_ctx *pc = user;
    if (n_history > pc->n_prompt)
        apply_penalties(pc->r, pc->counts, logits, history + pc->n_prompt, n_history - pc->n_prompt);
}

/* Generation state of one request. */
typedef struct gen_state {
    df_text_stream ts;
    size_t emitted;
    int produced;
    bool stopped, failed;
    const char *finish;
} gen_state;

/* Takes one generated token: stop token, text, stop strings, streaming.
 * Returns false when generation ends with it. */
static bool take_token(worker *w, job *j, gen_state *g, int32_t t) {
    const srv_request *r = &j->req;
    char buf[4096];
    g->produced++;
    if (df_is_stop_token(S.eng, t)) {
        g->finish = "stop";
        return false;
    }
    const char *tb;
    size_t tl;
    if (df_token_bytes(S.eng, t, &tb, &tl) == 0 && tl + 16 <= sizeof buf) {
        size_t m = df_text_stream_push(S.eng, &g->ts, t, buf, sizeof buf);
        if (!append_text(w, buf, m)) {
            g->failed = true;
            job_fail(j, 500, NULL, "out of memory");
            return false;
        }
    }
    long at = find_stop(w, r, g->emitted);
    if (at >= 0) {
        emit(w, j, g->emitted, (size_t)at);
        g->emitted = w->text_len = (size_t)at;
        g->stopped = true;
        g->finish = "stop";
        return false;
    }
    size_t safe = w->text_len - holdback(w, r, g->emitted);
    emit(w, j, g->emitted, safe);
    g->emitted = safe;
    return true;
}

/* df_generate's callbacks for one request. */
typedef struct job_ctx {
    worker *w;
    job *j;
    gen_state *g;
} job_ctx;

static int job_token(void *u, int32_t t) {
    job_ctx *c = u;
    return !take_token(c->w, c->j, c->g, t);
}

static int job_gen_cancelled(void *u) { return job_cancelled(((job_ctx *)u)->j); }

static void run_job(worker *w, job *j) {
    const srv_request *r = &j->req;
    const char *pparam = r->kind == SRV_CHAT ? "messages" : "prompt";
    size_t n;
    int32_t *ids = prompt_ids(j, &n);
    if (!ids) return;
    if (n == 0) {
        free(ids);
        job_fail(j, 400, pparam, "the prompt is empty");
        return;
    }
    if (n >= (size_t)S.ctx) {
        free(ids);
        job_fail(j, 400, pparam, "the prompt is %zu tokens; the context is %d tokens", n, S.ctx);
        return;
    }
    int max_new = r->max_tokens < 0 ? S.ctx - (int)n : r->max_tokens;
    if ((size_t)max_new + n > (size_t)S.ctx) {
        free(ids);
        job_fail(j, 400, r->kind == SRV_CHAT ? "max_completion_tokens" : "max_tokens",
                 "the prompt (%zu tokens) plus max_tokens (%d) exceeds the context of %d tokens", n, max_new,
                 S.ctx);
        return;
    }

    df_sampler_params sp;
    df_sampler_params_default(&sp);
    /* Unset temperature / top_p take generation_config.json, as `deltafin run` does. */
    sp.temperature = r->temperature_set ? (float)r->temperature
                     : S.info->default_temperature >= 0 ? S.info->default_temperature : 1.0f;
    sp.top_p = r->top_p_set ? (float)r->top_p : S.info->default_top_p > 0 ? S.info->default_top_p : 1.0f;
    sp.top_k = S.info->default_top_k >= 0 ? S.info->default_top_k : 0;
    sp.seed = r->seed_set ? r->seed : ((uint64_t)time(NULL) << 20) ^ (uint64_t)(now_s() * 1e9);
    df_sampler *smp;
    df_error err;
    if (df_sampler_new(&smp, &sp, &err)) {
        free(ids);
        job_fail(j, 400, NULL, "%s", err.msg);
        return;
    }

    pthread_mutex_lock(&S.mu);
    j->state = J_STARTED;
    j->prompt_tokens = (int)n;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&S.mu);
    if (r->stream && r->kind == SRV_CHAT) push_chunk(j, "", 0, NULL, true);

    /* Prompt-prefix reuse: df_generate keeps the rows the session holds that
     * the new prompt starts with (always evaluating at least its last token:
     * with --draft too, the first token is drawn from its logits). */
    gen_state g = {.finish = "length"};
    w->text_len = 0;
    penalty_ctx pc = {r, w->counts, (int)n};
    job_ctx jc = {w, j, &g};
    df_generate_opts go = {.sampler = smp, .spec = S.spec, .max_new = max_new, .prefill_chunk = PREFILL_CHUNK,
                           .reuse_prefix = 1, .on_token = job_token, .cancelled = job_gen_cancelled, .user = &jc};
    if (r->presence_penalty != 0 || r->frequency_penalty != 0) go.logits_hook = penalty_hook, go.hook_user = &pc;
    df_generate_result gr;
    if (df_generate(w->sess, ids, (int)n, &go, &gr, &err)) {
        g.failed = true;
        job_fail(j, 500, NULL, "%s", err.msg);
    }
    pthread_mutex_lock(&S.mu);
    S.reused_tokens += (uint64_t)gr.prompt_reused;
    S.prompt_tokens += n;
    pthread_mutex_unlock(&S.mu);
    int evals = gr.decoded;
    double dt = gr.decode_s;
    bool failed = g.failed;
    int produced = g.produced;
    const char *finish = g.finish;
    if (!failed && !g.stopped) {
        char buf[64];
        size_t m = df_text_stream_flush(&g.ts, buf, sizeof buf);
        append_text(w, buf, m);
        long at = find_stop(w, r, g.emitted);
        if (at >= 0) {
            w->text_len = (size_t)at;
            finish = "stop";
        }
        emit(w, j, g.emitted, w->text_len);
    }
    bool cancelled = job_cancelled(j);

    df_stats st;
    df_engine_stats(S.eng, &st);
    df_spec_stats sst = {0};
    if (S.spec) df_spec_stats_get(S.spec, &sst);
    pthread_mutex_lock(&S.mu);
    S.stats = st;
    S.spec_stats = sst;
    S.gen_tokens += (uint64_t)produced;
    if (evals > 0 && dt > 0) S.last_tps = produced / dt;
    if (cancelled) S.cancelled++;
    pthread_mutex_unlock(&S.mu);

    if (!failed) {
        if (r->stream && !cancelled) {
            push_chunk(j, r->kind == SRV_CHAT ? NULL : "", 0, finish, false);
            if (r->include_usage) {
                json_t *o = chunk_base(j);
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", usage_obj((int)n, produced));
                push_event(j, o);
            }
        }
        pthread_mutex_lock(&S.mu);
        if (r->stream && reserve(&j->out, &j->out_cap, j->out_len, 14)) {
            memcpy(j->out + j->out_len, "data: [DONE]\n\n", 14);
            j->out_len += 14;
        }
        if (!r->stream) {
            j->text = malloc(w->text_len + 1);
            if (j->text) {
                memcpy(j->text, w->text, w->text_len);
                j->text[w->text_len] = 0;
                j->text_len = w->text_len;
            }
        }
        j->completion_tokens = produced;
        j->finish = finish;
        j->state = J_DONE;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&S.mu);
    }
    df_sampler_free(smp);
    free(ids);
}

static void *worker_main(void *arg) {
    (void)arg;
    worker w = {0};
    df_error err;
    if (df_session_new(&w.sess, S.eng, S.ctx, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    w.counts = calloc((size_t)S.info->vocab_size, sizeof(int32_t));
    if (!w.counts) {
        fprintf(stderr, "deltafin: out of memory\n");
        exit(1);
    }
    pthread_mutex_lock(&S.mu);
    for (;;) {
        while (!S.head && !S.stopping) pthread_cond_wait(&S.work_cv, &S.mu);
        if (S.stopping) break;
        job *j = S.head;
        S.head = j->next;
        if (!S.head) S.tail = NULL;
        S.n_waiting--;
        j->state = J_RUNNING;
        S.running = true;
        S.current = j;
        pthread_mutex_unlock(&S.mu);
        run_job(&w, j);
        pthread_mutex_lock(&S.mu);
        S.running = false;
        S.current = NULL;
        job_release(j);
    }
    pthread_mutex_unlock(&S.mu);
    df_session_free(w.sess);
    free(w.counts);
    free(w.text);
    return NULL;
}

/* ---- HTTP ----------------------------------------------------------------------- */

typedef struct conn {
    int ep;
    int status;
    char *body;
    size_t body_len, body_cap;
    bool too_big;
    bool http11; /* an interim 1xx response may be sent (HTTP/1.0 has none) */
    bool probed; /* the client finished sending and was sent one (peer_gone) */
    struct MHD_Connection *mc;
} conn;

static int ep_of(const char *url) {
    for (int i = 0; i < EP_OTHER; i++)
        if (!strcmp(url, EP_NAME[i])) return i;
    return EP_OTHER;
}

/* Queues (and releases) a response. Connection: close: one request per
 * connection, so that every request passes the listener's checks (listener.h). */
static enum MHD_Result queue(conn *c, int status, struct MHD_Response *r) {
    MHD_add_response_header(r, "Connection", "close");
    c->status = status;
    enum MHD_Result rc = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_buf(conn *c, int status, const char *ctype, const char *body, size_t len,
                                const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return queue(c, status, r);
}

static enum MHD_Result send_json(conn *c, int status, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) return MHD_NO;
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), NULL);
    free(s);
    return rc;
}

static enum MHD_Result send_error(conn *c, int status, const char *type, const char *param, const char *msg,
                                  const char *retry_after) {
    char *s = srv_error_json(msg, type, param);
    if (!s) return MHD_NO;
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), retry_after);
    free(s);
    return rc;
}

/* Whether the client is gone. Its end of sending (FIN) does not say: a client
 * that half-closes after its request (shutdown(SHUT_WR), nc -N) still reads the
 * answer, while one that closed its socket answers the next bytes sent to it
 * with a reset, which poll then reports. A response being sent provides such
 * bytes; before one starts, `probe` (when not NULL) sends an interim
 * "100 Continue" once after the FIN, which HTTP/1.1 clients must accept and
 * skip. An HTTP/1.0 client that half-closed cannot be told from one that left
 * until the response is sent, so it is answered. */
static bool peer_gone(struct MHD_Connection *mc, conn *probe) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    int fd = ci->connect_fd;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    bool fin = (p.revents & POLLRDHUP) || k == 0;
    if (fin && probe && probe->http11 && !probe->probed) {
        /* the connection's thread is here, in the handler: nothing else writes */
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        probe->probed = true;
        if (send(fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) return true;
    }
    return false;
}

static void timed_wait(pthread_cond_t *cv) { /* under S.mu */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, &S.mu, &ts);
}

/* Gives up a job from the connection side: out of the queue if still there,
 * otherwise the worker stops at its next token. Under S.mu. */
static void abandon(job *j) {
    atomic_store(&j->cancel, true);
    if (j->state == J_QUEUED) {
        job **pp = &S.head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (S.tail == j) S.tail = prev;
            S.n_waiting--;
            S.cancelled++;
            j->state = J_DROPPED;
            job_release(j); /* the worker's reference */
        }
    }
}

/* The streaming response's own context: MHD may destroy the response after the
 * connection's conn is gone, so the reader does not point into it. */
typedef struct sse_ctx {
    job *j;
    struct MHD_Connection *mc;
} sse_ctx;

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_ctx *c = cls;
    job *j = c->j;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        if (j->out_off < j->out_len) {
            size_t k = j->out_len - j->out_off;
            if (k > max) k = max;
            memcpy(buf, j->out + j->out_off, k);
            j->out_off += k;
            pthread_mutex_unlock(&S.mu);
            return (ssize_t)k;
        }
        if (j->state == J_DONE || j->state == J_FAILED) {
            pthread_mutex_unlock(&S.mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (S.stopping) break;
        timed_wait(&j->cv);
        pthread_mutex_unlock(&S.mu);
        bool gone = peer_gone(c->mc, NULL);
        pthread_mutex_lock(&S.mu);
        if (gone) break;
    }
    abandon(j);
    pthread_mutex_unlock(&S.mu);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
    sse_ctx *c = cls;
    pthread_mutex_lock(&S.mu);
    if (c->j->state != J_DONE && c->j->state != J_FAILED) abandon(c->j);
    job_release(c->j);
    pthread_mutex_unlock(&S.mu);
    free(c);
}

static json_t *final_response(const job *j) {
    bool chat = j->req.kind == SRV_CHAT;
    json_t *choice;
    if (chat)
        choice = json_pack("{s:i,s:{s:s,s:s%},s:n,s:s}", "index", 0, "message", "role", "assistant", "content",
                           j->text ? j->text : "", j->text ? j->text_len : 0, "logprobs", "finish_reason",
                           j->finish);
    else
        choice = json_pack("{s:s%,s:i,s:n,s:s}", "text", j->text ? j->text : "", j->text ? j->text_len : 0,
                           "index", 0, "logprobs", "finish_reason", j->finish);
    return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", j->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)j->created, "model", S.model_id, "choices", choice, "usage",
                     usage_obj(j->prompt_tokens, j->completion_tokens));
}

static enum MHD_Result handle_generate(conn *c) {
    srv_error e;
    job *j = calloc(1, sizeof *j);
    if (!j) return send_error(c, 500, "server_error", NULL, "out of memory", NULL);
    if (srv_parse_request(c->ep == EP_CHAT ? SRV_CHAT : SRV_COMPLETIONS, c->body ? c->body : "", c->body_len,
                          &j->req, &e)) {
        free(j);
        return send_error(c, 400, "invalid_request_error", e.param, e.message, NULL);
    }
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->created = now_unix();
    static atomic_ullong seq;
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", c->ep == EP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)S.started, (unsigned long long)atomic_fetch_add(&seq, 1));
    pthread_mutex_lock(&S.mu);
    if (S.n_waiting >= S.o.queue && (S.running || S.head)) {
        S.rejected_full++;
        j->refs = 1;
        job_release(j);
        pthread_mutex_unlock(&S.mu);
        return send_error(c, 429, "rate_limit_error", NULL, "the server is busy: the request queue is full",
                          "1");
    }
    if (S.tail) S.tail->next = j;
    else S.head = j;
    S.tail = j;
    S.n_waiting++;
    pthread_cond_signal(&S.work_cv);
    /* wait until the response can start (streaming) or is complete */
    for (;;) {
        enum job_state st = j->state;
        if (st == J_FAILED || st == J_DONE || (st == J_STARTED && j->req.stream)) break;
        if (S.stopping) {
            abandon(j);
            job_release(j);
            pthread_mutex_unlock(&S.mu);
            return MHD_NO;
        }
        timed_wait(&j->cv);
        pthread_mutex_unlock(&S.mu);
        bool gone = peer_gone(c->mc, c);
        pthread_mutex_lock(&S.mu);
        if (gone) {
            abandon(j);
            job_release(j);
            pthread_mutex_unlock(&S.mu);
            return MHD_NO;
        }
    }
    if (j->state == J_FAILED) {
        int status = j->status;
        char *body = j->err_body;
        j->err_body = NULL;
        job_release(j);
        pthread_mutex_unlock(&S.mu);
        enum MHD_Result rc = send_buf(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2, NULL);
        free(body);
        return rc;
    }
    if (!j->req.stream) {
        json_t *o = final_response(j);
        job_release(j);
        pthread_mutex_unlock(&S.mu);
        return send_json(c, 200, o);
    }
    pthread_mutex_unlock(&S.mu);
    sse_ctx *sc = malloc(sizeof *sc);
    struct MHD_Response *r = NULL;
    if (sc) {
        *sc = (sse_ctx){j, c->mc}; /* the reader takes over the connection's reference */
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, sc, sse_free);
    }
    if (!r) {
        if (sc) sse_free(sc);
        else {
            pthread_mutex_lock(&S.mu);
            abandon(j);
            job_release(j);
            pthread_mutex_unlock(&S.mu);
        }
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return queue(c, 200, r);
}

static enum MHD_Result handle_models(conn *c) {
    return send_json(c, 200, json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", S.model_id,
                                       "object", "model", "created", (json_int_t)S.started, "owned_by",
                                       "deltafin"));
}

static enum MHD_Result handle_metrics(conn *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return send_error(c, 500, "server_error", NULL, "out of memory", NULL);
    pthread_mutex_lock(&S.mu);
    fprintf(f, "# HELP deltafin_requests_total HTTP requests answered, by endpoint and status.\n"
               "# TYPE deltafin_requests_total counter\n");
    for (int e = 0; e < N_EP; e++)
        for (int s = 0; s <= N_STATUS; s++)
            if (S.requests[e][s])
                fprintf(f, "deltafin_requests_total{endpoint=\"%s\",status=\"%s%d\"} %llu\n", EP_NAME[e],
                        s == N_STATUS ? "other" : "", s == N_STATUS ? 0 : STATUSES[s],
                        (unsigned long long)S.requests[e][s]);
    fprintf(f,
            "# HELP deltafin_generated_tokens_total Tokens sampled.\n# TYPE deltafin_generated_tokens_total counter\n"
            "deltafin_generated_tokens_total %llu\n"
            "# HELP deltafin_prompt_tokens_total Prompt tokens of requests that ran.\n"
            "# TYPE deltafin_prompt_tokens_total counter\ndeltafin_prompt_tokens_total %llu\n"
            "# HELP deltafin_prompt_tokens_reused_total Prompt tokens whose KV cache was kept from the previous request.\n"
            "# TYPE deltafin_prompt_tokens_reused_total counter\ndeltafin_prompt_tokens_reused_total %llu\n"
            "# HELP deltafin_last_tokens_per_second Decode speed of the last generation.\n"
            "# TYPE deltafin_last_tokens_per_second gauge\ndeltafin_last_tokens_per_second %.6f\n"
            "# HELP deltafin_requests_cancelled_total Generations or queued requests dropped because the client left.\n"
            "# TYPE deltafin_requests_cancelled_total counter\ndeltafin_requests_cancelled_total %llu\n"
            "# HELP deltafin_requests_rejected_total Requests refused with 429 (queue full).\n"
            "# TYPE deltafin_requests_rejected_total counter\ndeltafin_requests_rejected_total %llu\n"
            "# HELP deltafin_queue_length Requests waiting behind the running one.\n"
            "# TYPE deltafin_queue_length gauge\ndeltafin_queue_length %d\n"
            "# HELP deltafin_busy Whether a generation is running.\n# TYPE deltafin_busy gauge\ndeltafin_busy %d\n"
            "# HELP deltafin_expert_cache_hits_total Expert cache hits.\n"
            "# TYPE deltafin_expert_cache_hits_total counter\ndeltafin_expert_cache_hits_total %llu\n"
            "# HELP deltafin_expert_cache_misses_total Expert cache misses.\n"
            "# TYPE deltafin_expert_cache_misses_total counter\ndeltafin_expert_cache_misses_total %llu\n"
            "# HELP deltafin_expert_bytes_read_total Expert bytes read from storage.\n"
            "# TYPE deltafin_expert_bytes_read_total counter\ndeltafin_expert_bytes_read_total %llu\n",
            (unsigned long long)S.gen_tokens, (unsigned long long)S.prompt_tokens,
            (unsigned long long)S.reused_tokens, S.last_tps, (unsigned long long)S.cancelled,
            (unsigned long long)S.rejected_full, S.n_waiting, S.running ? 1 : 0,
            (unsigned long long)S.stats.expert_hits, (unsigned long long)S.stats.expert_misses,
            (unsigned long long)S.stats.expert_bytes_read);
    if (S.spec)
        fprintf(f,
                "# HELP deltafin_spec_drafted_tokens_total Tokens proposed by the drafter and checked.\n"
                "# TYPE deltafin_spec_drafted_tokens_total counter\ndeltafin_spec_drafted_tokens_total %llu\n"
                "# HELP deltafin_spec_accepted_tokens_total Drafted tokens the target accepted.\n"
                "# TYPE deltafin_spec_accepted_tokens_total counter\ndeltafin_spec_accepted_tokens_total %llu\n"
                "# HELP deltafin_spec_verify_passes_total Target passes that checked drafted tokens.\n"
                "# TYPE deltafin_spec_verify_passes_total counter\ndeltafin_spec_verify_passes_total %llu\n"
                "# HELP deltafin_spec_depth Tokens the gate would draft now (0: drafting off).\n"
                "# TYPE deltafin_spec_depth gauge\ndeltafin_spec_depth %d\n",
                (unsigned long long)S.spec_stats.drafted, (unsigned long long)S.spec_stats.accepted,
                (unsigned long long)S.spec_stats.verify_passes, S.spec_stats.depth);
    pthread_mutex_unlock(&S.mu);
    srv_listener_stats ls;
    srv_listener_stats_get(S.listener, &ls);
    fprintf(f,
            "# HELP deltafin_connections_closed_total Connections the listener closed: a refused request "
            "head (400, 431, 501), a request not whole in time, over the per-address or overall limit.\n"
            "# TYPE deltafin_connections_closed_total counter\n"
            "deltafin_connections_closed_total{reason=\"bad_head\"} %llu\n"
            "deltafin_connections_closed_total{reason=\"request_timeout\"} %llu\n"
            "deltafin_connections_closed_total{reason=\"per_address_limit\"} %llu\n"
            "deltafin_connections_closed_total{reason=\"connection_limit\"} %llu\n",
            (unsigned long long)ls.bad_head, (unsigned long long)ls.deadline, (unsigned long long)ls.per_addr,
            (unsigned long long)ls.full);
    fclose(f);
    enum MHD_Result rc = send_buf(c, 200, "text/plain; version=0.0.4", buf, len, NULL);
    free(buf);
    return rc;
}

/* Constant time in the key's content: every byte of the longer is examined. */
static bool key_ok(const char *auth) {
    static const char pre[] = "Bearer ";
    if (!auth || strncmp(auth, pre, sizeof pre - 1)) return false;
    const char *got = auth + sizeof pre - 1, *want = S.o.api_key;
    size_t gl = strlen(got), wl = strlen(want), n = gl > wl ? gl : wl;
    unsigned char diff = gl != wl;
    for (size_t i = 0; i < n; i++) {
        unsigned char a = i < gl ? (unsigned char)got[i] : 0, b = i < wl ? (unsigned char)want[i] : 0;
        diff |= a ^ b;
    }
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)cls;
    conn *c = *ctx;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->mc = mc;
        c->ep = ep_of(url);
        c->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        *ctx = c;
        if (S.o.api_key && c->ep != EP_HEALTH &&
            !key_ok(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization")))
            return send_error(c, 401, "invalid_request_error", NULL, "invalid or missing API key", NULL);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S.o.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %llu bytes", (unsigned long long)S.o.max_body);
            return send_error(c, 413, "invalid_request_error", NULL, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->status) return MHD_YES; /* answered already (401/413): discard */
        if (c->too_big || c->body_len + n > S.o.max_body) {
            c->too_big = true;
            free(c->body);
            c->body = NULL;
            c->body_len = c->body_cap = 0;
            return MHD_YES;
        }
        if (!reserve(&c->body, &c->body_cap, c->body_len, n)) return MHD_NO;
        memcpy(c->body + c->body_len, upload, n);
        c->body_len += n;
        return MHD_YES;
    }
    srv_listener_arrived(mc); /* the whole request is in: no deadline while it is answered */
    if (c->status) return MHD_YES; /* answered early (401/413) */
    if (c->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %llu bytes", (unsigned long long)S.o.max_body);
        return send_error(c, 413, "invalid_request_error", NULL, msg, NULL);
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    switch (c->ep) {
    case EP_HEALTH:
        if (!get) break;
        return send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    case EP_MODELS:
        if (!get) break;
        return handle_models(c);
    case EP_METRICS:
        if (!get) break;
        return handle_metrics(c);
    case EP_COMPLETIONS:
    case EP_CHAT:
        if (!post) break;
        return handle_generate(c);
    default:
        return send_error(c, 404, "invalid_request_error", NULL, "no such endpoint", NULL);
    }
    return send_error(c, 405, "invalid_request_error", NULL, "method not allowed on this endpoint", NULL);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)mc;
    (void)toe;
    conn *c = *ctx;
    if (!c) return;
    int s = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (STATUSES[i] == c->status) s = i;
    pthread_mutex_lock(&S.mu);
    if (c->status) S.requests[c->ep][s]++;
    pthread_mutex_unlock(&S.mu);
    free(c->body);
    free(c);
    *ctx = NULL;
}

/* ---- start-up ------------------------------------------------------------------- */

static bool is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* A start-up step failed: says why, and gives the exit status (1 out of
 * memory, else CLI_EXIT_BAD), as `deltafin run` does for the same errors. */
static int start_failed(const df_error *err) {
    fprintf(stderr, "deltafin: %s\n", err->msg);
    return err->code == DF_ERR_NOMEM ? 1 : CLI_EXIT_BAD;
}

/* Tells the worker to stop, cancelling queued and running requests. */
static void stop_requests(void) {
    pthread_mutex_lock(&S.mu);
    S.stopping = true;
    for (job *j = S.head; j; j = j->next) atomic_store(&j->cancel, true);
    /* the running one too: it is off the queue, and a long generation would
     * otherwise hold the process up to its max_tokens */
    if (S.current) atomic_store(&S.current->cancel, true);
    pthread_cond_broadcast(&S.work_cv);
    pthread_mutex_unlock(&S.mu);
}

/* Listens on sa (listener.c) and answers (libmicrohttpd) until SIGINT or
 * SIGTERM (in *set), then stops every request. Returns the exit status. */
static int serve(const struct sockaddr *sa, socklen_t sa_len, sigset_t *set) {
    const srv_opts *o = &S.o;
    srv_listener_opts lo = {.addr = sa, .addr_len = sa_len, .max_conns = MAX_CONNS,
                            .max_per_addr = o->max_per_ip, .request_timeout = o->request_timeout};
    if (srv_listener_open(&S.listener, &lo)) {
        fprintf(stderr, "deltafin: cannot listen on %s port %d: %s\n", o->host, o->port, strerror(errno));
        stop_requests();
        return 1;
    }
    /* the listener accepts and hands connections over (MHD_add_connection needs the ITC) */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, &on_request, NULL, MHD_OPTION_NOTIFY_COMPLETED, &on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, &srv_listener_notify, S.listener, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNS, MHD_OPTION_END);
    if (!d || srv_listener_start(S.listener, d)) {
        fprintf(stderr, "deltafin: cannot start the HTTP server (libmicrohttpd or a thread)\n");
        if (d) MHD_stop_daemon(d);
        srv_listener_free(S.listener);
        stop_requests();
        return 1;
    }
    fprintf(stderr, "deltafin serve: %s on http://%s:%d (context %d, queue %d%s)\n", S.model_id, o->host, o->port,
            S.ctx, o->queue, o->api_key ? ", API key required" : "");

    sigdelset(set, SIGPIPE);
    int sig = 0;
    sigwait(set, &sig);
    fprintf(stderr, "deltafin serve: stopping (signal %d)\n", sig);
    stop_requests();
    srv_listener_stop(S.listener);
    MHD_stop_daemon(d); /* it notifies the listener of each close */
    srv_listener_free(S.listener);
    return 0;
}

int df_serve_main(int argc, char **argv) {
    srv_opts *o = &S.o;
    parse_opts(o, argc, argv);

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    socklen_t ss_len;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
        ss_len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        ss_len = sizeof *a6;
    } else {
        cli_die("--host expects an IPv4 or IPv6 address, got '%s'", o->host);
    }
    if (!is_loopback((struct sockaddr *)&ss) && !o->api_key && !o->insecure_bind)
        cli_die("refusing to serve %s without an API key (--api-key-file, %s or --api-key; "
                "add --insecure-bind to do it anyway)", o->host, API_KEY_ENV);

    df_engine_opts eo = {.model_dir = o->model, .n_threads = o->threads, .isa = o->isa, .experts = o->experts,
                         .ram_budget = o->ram_budget, .context = o->ctx, .expert_cache = o->expert_cache,
                         .cache_policy = o->policy, .pin_bytes = o->pin, .prefetch = o->prefetch};
    df_engine_dev dev = {.prefetch_depth = o->prefetch_depth};
    df_error err;
    char what[600];
    if (cli_reserve_draft(&eo, o->draft, o->draft_k, what, sizeof what, &err)) return start_failed(&err);
    if (df_engine_open_dev(&S.eng, &eo, &dev, &err)) return start_failed(&err);
    S.info = df_engine_info(S.eng);
    if (o->ctx > S.info->max_context) { /* as `deltafin run` does: a context the model cannot use */
        fprintf(stderr, "deltafin: --ctx %d exceeds the model's context of %d tokens\n", o->ctx,
                S.info->max_context);
        df_engine_close(S.eng);
        return CLI_EXIT_BAD;
    }
    if (o->draft) {
        df_spec_opts so = {.draft = o->draft, .k_max = o->draft_k, .lookup_n = o->lookup_n,
                           .n_threads = o->threads, .isa = o->isa, .rejection = o->draft_rejection};
        if (o->draft_fixed && !o->draft_k) so.k_max = o->draft_fixed > 8 ? o->draft_fixed : 0;
        int rc0 = df_spec_new(&S.spec, S.eng, &so, &err);
        if (!rc0) df_spec_set_fixed_depth(S.spec, o->draft_fixed);
        if (rc0) {
            int rc = start_failed(&err); /* said before the engine's own close-time warnings */
            df_engine_close(S.eng);
            return rc;
        }
    }
    S.ctx = o->ctx ? o->ctx : (S.info->max_context < 4096 ? S.info->max_context : 4096);
    const char *base = strrchr(o->model, '/');
    base = base && base[1] ? base + 1 : o->model;
    snprintf(S.model_id, sizeof S.model_id, "%s", base);
    size_t ml = strlen(S.model_id);
    while (ml > 1 && S.model_id[ml - 1] == '/') S.model_id[--ml] = 0;
    S.started = now_unix();
    df_engine_stats(S.eng, &S.stats);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.work_cv, NULL);

    /* Threads started from here on inherit the mask: only sigwait below sees
     * SIGINT/SIGTERM, and SIGPIPE from a vanished client is never delivered. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    pthread_t wt;
    if (pthread_create(&wt, NULL, worker_main, NULL)) cli_die("cannot start the worker thread");
    int rc = serve((struct sockaddr *)&ss, ss_len, &set);
    pthread_join(wt, NULL);
    /* jobs the worker never took (connections are gone, so only its refs remain) */
    while (S.head) {
        job *j = S.head;
        S.head = j->next;
        job_release(j);
    }
    df_spec_free(S.spec);
    df_engine_close(S.eng);
    pthread_cond_destroy(&S.work_cv);
    pthread_mutex_destroy(&S.mu);
    return rc;
}
