/*
 * server/jobs.c - the server's requests from queue to last byte: the bounded
 * queue, a request slot (its session, prompt-prefix reuse through
 * df_generate or df_batchgen), stop strings, OpenAI penalties and SSE
 * framing of the output; the worker, which runs one generation at a time
 * with --parallel 1 and hands over to batch.c otherwise. Each slot has its
 * own drafter with --draft. See internal.h for the threads.
 */
#include "server/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define PREFILL_CHUNK 256 /* prompt rows per eval, so cancellation is seen during long prefills */
#define WAIT_SLICE_MS 20  /* how often a waiting connection looks at its socket */

void srv_job_release(job *j) { /* under g_srv.mu */
    if (--j->refs) return;
    srv_request_free(&j->req);
    pthread_cond_destroy(&j->cv);
    free(j->err_body);
    free(j->out);
    free(j->text);
    free(j);
}

bool srv_reserve(char **buf, size_t *cap, size_t len, size_t add) {
    if (len + add + 1 <= *cap) return true;
    size_t nc = *cap ? *cap : 256;
    while (nc < len + add + 1) nc *= 2;
    char *p = realloc(*buf, nc);
    if (!p) return false;
    *buf = p;
    *cap = nc;
    return true;
}

/* ---- a request in a slot ------------------------------------------------------- */

typedef srv_slot worker;

static void job_fail(job *j, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void job_fail(job *j, int status, const char *param, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *body = srv_error_json(msg, status >= 500 ? "server_error" : "invalid_request_error", param);
    pthread_mutex_lock(&g_srv.mu);
    if (j->state == J_STARTED && j->req.stream) {
        /* headers already went out: the error travels as an SSE event */
        size_t n = body ? strlen(body) : 0;
        if (body && srv_reserve(&j->out, &j->out_cap, j->out_len, n + 16)) {
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
    pthread_mutex_unlock(&g_srv.mu);
}

/* Appends one SSE event holding obj (stolen) to the job's output. */
static void push_event(job *j, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    pthread_mutex_lock(&g_srv.mu);
    size_t n = s ? strlen(s) : 0;
    if (s && srv_reserve(&j->out, &j->out_cap, j->out_len, n + 8)) {
        memcpy(j->out + j->out_len, "data: ", 6);
        memcpy(j->out + j->out_len + 6, s, n);
        memcpy(j->out + j->out_len + 6 + n, "\n\n", 2);
        j->out_len += n + 8;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&g_srv.mu);
    free(s);
}

static json_t *chunk_base(const job *j) {
    bool chat = j->req.kind == SRV_CHAT;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", g_srv.cfg.model_id);
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

json_t *srv_usage_obj(int p, int c, int cached) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", p, "completion_tokens", c, "total_tokens", p + c,
                     "prompt_tokens_details", "cached_tokens", cached);
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
    if (!srv_reserve(&w->text, &w->text_cap, w->text_len, n)) return false;
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
        int rc = df_chat_tokenize(g_srv.eng, m, r->n_msgs, 1, r->enable_thinking < 0 ? g_srv.cfg.think : r->enable_thinking,
                                  &ids, &n, &err);
        free(m);
        if (rc) {
            job_fail(j, 400, "messages", "%s", err.msg);
            return NULL;
        }
    } else if (r->prompt) {
        if (df_tokenize(g_srv.eng, r->prompt, strlen(r->prompt), &ids, &n, &err)) {
            job_fail(j, 400, "prompt", "%s", err.msg);
            return NULL;
        }
        /* a tokenizer may name more ids than the model has rows for (a special
         * token past the embedding): the client's input, not the server's fault */
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= g_srv.info->vocab_size) {
                job_fail(j, 400, "prompt", "the prompt's token %zu is id %d, outside the model's vocabulary (%d tokens)",
                         i, ids[i], g_srv.info->vocab_size);
                free(ids);
                return NULL;
            }
    } else {
        for (size_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= g_srv.info->vocab_size) {
                job_fail(j, 400, "prompt", "prompt[%zu] = %d is outside the vocabulary (%d tokens)", i,
                         r->prompt_ids[i], g_srv.info->vocab_size);
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
static void penalty_hook(void *user, float *logits, int vocab, const int32_t *history, int n_history) {
    (void)vocab;
    srv_slot *s = user;
    if (n_history > (int)s->n)
        apply_penalties(&s->j->req, s->counts, logits, history + s->n, n_history - (int)s->n);
}

typedef srv_gen gen_state;

/* Takes one generated token: stop token, text, stop strings, streaming.
 * Returns false when generation ends with it. */
static bool take_token(worker *w, job *j, gen_state *g, int32_t t) {
    const srv_request *r = &j->req;
    char buf[4096];
    g->produced++;
    if (df_is_stop_token(g_srv.eng, t)) {
        g->finish = "stop";
        return false;
    }
    const char *tb;
    size_t tl;
    if (df_token_bytes(g_srv.eng, t, &tb, &tl) == 0 && tl + 16 <= sizeof buf) {
        size_t m = df_text_stream_push(g_srv.eng, &g->ts, t, buf, sizeof buf);
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

/* The generation's callbacks for one request (user: its slot). */
static int job_token(void *u, int32_t t) {
    srv_slot *s = u;
    return !take_token(s, s->j, &s->g, t);
}

static int job_gen_cancelled(void *u) { return job_cancelled(((srv_slot *)u)->j); }

int32_t *srv_job_prompt(job *j, size_t *n_out, int *max_new_out) {
    const srv_request *r = &j->req;
    const char *pparam = r->kind == SRV_CHAT ? "messages" : "prompt";
    int ctx = g_srv.cfg.ctx;
    size_t n;
    int32_t *ids = prompt_ids(j, &n);
    if (!ids) return NULL;
    if (n == 0) {
        free(ids);
        job_fail(j, 400, pparam, "the prompt is empty");
        return NULL;
    }
    if (n >= (size_t)ctx) {
        free(ids);
        job_fail(j, 400, pparam, "the prompt is %zu tokens; the context is %d tokens, which leaves no room for a "
                 "new one", n, ctx);
        return NULL;
    }
    int room = ctx - (int)n, def = g_srv.cfg.max_new;
    int max_new = r->max_tokens >= 0 ? r->max_tokens : def > 0 && def < room ? def : room;
    if ((size_t)max_new + n > (size_t)ctx) {
        free(ids);
        job_fail(j, 400, r->kind == SRV_CHAT ? "max_completion_tokens" : "max_tokens",
                 "the prompt (%zu tokens) plus max_tokens (%d) exceeds the context of %d tokens", n, max_new, ctx);
        return NULL;
    }
    *n_out = n;
    *max_new_out = max_new;
    return ids;
}

/* The request's sampler: its own values, else the server's defaults (serve's
 * options), else generation_config.json's, as `deltafin run` does. */
static df_sampler *job_sampler(job *j) {
    const srv_request *r = &j->req;
    const srv_config *c = &g_srv.cfg;
    const df_model_info *info = g_srv.info;
    df_sampler_params sp = c->sp;
    sp.temperature = r->temperature_set ? (float)r->temperature
                     : c->temp_set ? c->sp.temperature
                     : info->default_temperature >= 0 ? info->default_temperature : 1.0f;
    sp.top_p = r->top_p_set ? (float)r->top_p
               : c->top_p_set ? c->sp.top_p
               : info->default_top_p > 0 ? info->default_top_p : 1.0f;
    sp.top_k = c->top_k_set ? c->sp.top_k : info->default_top_k >= 0 ? info->default_top_k : 0;
    sp.seed = r->seed_set ? r->seed : ((uint64_t)time(NULL) << 20) ^ (uint64_t)(df_now() * 1e9);
    df_sampler *smp;
    df_error err;
    if (df_sampler_new(&smp, &sp, &err)) {
        job_fail(j, 400, NULL, "%s", err.msg);
        return NULL;
    }
    return smp;
}

/* After generation: the text held back for stop strings, the counters, the
 * final chunk or the whole response, and the job done. */
static void job_finish(worker *w, job *j, gen_state *g, const df_generate_result *gr, size_t n) {
    const srv_request *r = &j->req;
    const char *finish = g->finish;
    if (!g->failed && !g->stopped) {
        char buf[64];
        size_t m = df_text_stream_flush(&g->ts, buf, sizeof buf);
        append_text(w, buf, m);
        long at = find_stop(w, r, g->emitted);
        if (at >= 0) {
            w->text_len = (size_t)at;
            finish = "stop";
        }
        emit(w, j, g->emitted, w->text_len);
    }
    bool cancelled = job_cancelled(j);
    df_stats st;
    df_engine_stats(g_srv.eng, &st);
    df_spec_stats sst = {0}; /* the slots' drafters together */
    for (int i = 0; g_srv.specs && i < g_srv.cfg.parallel; i++) {
        df_spec_stats one;
        df_spec_stats_get(g_srv.specs[i], &one);
        sst.drafted += one.drafted, sst.accepted += one.accepted, sst.verify_passes += one.verify_passes;
        if (one.depth > sst.depth) sst.depth = one.depth;
    }
    pthread_mutex_lock(&g_srv.mu);
    g_srv.stats = st;
    g_srv.spec_stats = sst;
    g_srv.gen_tokens += (uint64_t)g->produced;
    if (gr->decoded > 0 && gr->decode_s > 0) g_srv.last_tps = g->produced / gr->decode_s;
    if (cancelled) g_srv.cancelled++;
    pthread_mutex_unlock(&g_srv.mu);
    if (g->failed) return;
    if (r->stream && !cancelled) {
        push_chunk(j, r->kind == SRV_CHAT ? NULL : "", 0, finish, false);
        if (r->include_usage) {
            json_t *o = chunk_base(j);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", srv_usage_obj((int)n, g->produced, gr->prompt_reused));
            push_event(j, o);
        }
    }
    pthread_mutex_lock(&g_srv.mu);
    if (r->stream && srv_reserve(&j->out, &j->out_cap, j->out_len, 14)) {
        memcpy(j->out + j->out_len, "data: [DONE]\n\n", 14);
        j->out_len += 14;
    }
    if (!r->stream && (j->text = malloc(w->text_len + 1))) {
        memcpy(j->text, w->text, w->text_len);
        j->text[w->text_len] = 0;
        j->text_len = w->text_len;
    }
    j->completion_tokens = g->produced;
    j->cached_tokens = gr->prompt_reused;
    j->finish = finish;
    j->state = J_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&g_srv.mu);
}

bool srv_job_begin(srv_slot *s, job *j, int32_t *ids, size_t n, int max_new) {
    const srv_request *r = &j->req;
    df_sampler *smp = job_sampler(j);
    if (!smp) {
        free(ids);
        return false;
    }
    pthread_mutex_lock(&g_srv.mu);
    j->state = J_STARTED;
    j->prompt_tokens = (int)n;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&g_srv.mu);
    if (r->stream && r->kind == SRV_CHAT) push_chunk(j, "", 0, NULL, true);
    s->j = j;
    s->ids = ids;
    s->n = n;
    s->smp = smp;
    s->g = (gen_state){.finish = "length"};
    s->text_len = 0;
    /* Prompt-prefix reuse: the generation keeps the rows the session holds
     * that the new prompt starts with (always evaluating at least its last
     * token: with --draft too, the first token is drawn from its logits), and
     * with --prompt-cache restores a longer cached prefix (from the RAM tier,
     * or from disk), storing the new states as it goes. */
    s->go = (df_generate_opts){.sampler = smp, .spec = g_srv.specs ? g_srv.specs[s->idx] : NULL,
                               .max_new = max_new, .prefill_chunk = PREFILL_CHUNK, .reuse_prefix = 1, .on_token = job_token,
                               .cancelled = job_gen_cancelled, .user = s};
    if (r->presence_penalty != 0 || r->frequency_penalty != 0) s->go.logits_hook = penalty_hook, s->go.hook_user = s;
    return true;
}

void srv_job_end(srv_slot *s, const df_generate_result *gr, int status, const df_error *err) {
    job *j = s->j;
    if (status) {
        s->g.failed = true;
        job_fail(j, 500, NULL, "%s", err ? err->msg : "generation failed");
    }
    pthread_mutex_lock(&g_srv.mu);
    g_srv.reused_tokens += (uint64_t)(gr->prompt_reused - gr->prompt_cached);
    g_srv.cached_tokens += (uint64_t)gr->prompt_reused;
    g_srv.prompt_tokens += s->n;
    pthread_mutex_unlock(&g_srv.mu);
    job_finish(s, j, &s->g, gr, s->n);
    df_sampler_free(s->smp);
    free(s->ids);
    s->smp = NULL;
    s->ids = NULL;
    s->j = NULL;
}

/* The batch metrics with --parallel 1: the prompt is one step of its rows,
 * a decode step one of the tokens it produced. */
static void count_step(int rows) {
    pthread_mutex_lock(&g_srv.mu);
    g_srv.steps++;
    g_srv.step_hist[1]++;
    g_srv.step_rows += (uint64_t)rows;
    pthread_mutex_unlock(&g_srv.mu);
}

static void on_prefill(void *u, int rows, double s) {
    (void)u, (void)s;
    count_step(rows);
}

static void on_step(void *u, int tokens, double s) {
    (void)u, (void)s;
    count_step(tokens);
}

/* --parallel 1: one generation at a time through df_generate (with the
 * drafter, if any). */
static void run_job(srv_slot *s, job *j) {
    size_t n;
    int max_new;
    int32_t *ids = srv_job_prompt(j, &n, &max_new);
    if (!ids || !srv_job_begin(s, j, ids, n, max_new)) return;
    s->go.on_prefill = on_prefill;
    s->go.on_step = on_step;
    df_generate_result gr = {0};
    df_error err;
    int rc = df_generate(s->sess, s->ids, (int)n, &s->go, &gr, &err);
    srv_job_end(s, &gr, rc, &err);
}

bool srv_slot_init(srv_slot *s) {
    df_error err;
    memset(s, 0, sizeof *s);
    if (df_session_new(&s->sess, g_srv.eng, g_srv.cfg.ctx, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return false;
    }
    s->counts = calloc((size_t)g_srv.info->vocab_size, sizeof(int32_t));
    if (!s->counts) {
        fprintf(stderr, "deltafin: out of memory\n");
        return false;
    }
    return true;
}

void srv_slot_free(srv_slot *s) {
    df_session_free(s->sess);
    free(s->counts);
    free(s->text);
}

void *srv_worker_main(void *arg) {
    (void)arg;
    if (g_srv.cfg.parallel > 1) {
        srv_batch_worker();
        return NULL;
    }
    srv_slot w;
    if (!srv_slot_init(&w)) exit(1);
    pthread_mutex_lock(&g_srv.mu);
    for (;;) {
        while (!g_srv.head && !g_srv.stopping) pthread_cond_wait(&g_srv.work_cv, &g_srv.mu);
        if (g_srv.stopping) break;
        job *j = g_srv.head;
        g_srv.head = j->next;
        if (!g_srv.head) g_srv.tail = NULL;
        g_srv.n_waiting--;
        j->state = J_RUNNING;
        g_srv.n_active = 1;
        g_srv.active[0] = j;
        if (g_srv.max_active < 1) g_srv.max_active = 1;
        pthread_mutex_unlock(&g_srv.mu);
        run_job(&w, j);
        srv_check_ranks();
        pthread_mutex_lock(&g_srv.mu);
        g_srv.n_active = 0;
        g_srv.active[0] = NULL;
        srv_job_release(j);
    }
    pthread_mutex_unlock(&g_srv.mu);
    srv_slot_free(&w);
    return NULL;
}

/* A rank of an --experts-by-rank run failed: every later request would fail
 * too, so the server stops itself (serve then returns 1). Not under mu. */
void srv_check_ranks(void) {
    const char *why = df_engine_ranks_failed(g_srv.eng);
    if (!why || g_srv.ranks_failed) return;
    g_srv.ranks_failed = true;
    fprintf(stderr, "deltafin serve: stopping: %s\n", why);
    /* the failed requests' answers (500, the error) go out first */
    struct timespec grace = {0, 300 * 1000000L};
    nanosleep(&grace, NULL);
    kill(getpid(), SIGTERM); /* what serve() waits for */
}

void srv_timed_wait(pthread_cond_t *cv) { /* under g_srv.mu */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, &g_srv.mu, &ts);
}

/* Gives up a job from the connection side: out of the queue if still there,
 * otherwise the worker stops at its next token. Under g_srv.mu. */
void srv_abandon(job *j) {
    atomic_store(&j->cancel, true);
    if (j->state == J_QUEUED) {
        job **pp = &g_srv.head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (g_srv.tail == j) g_srv.tail = prev;
            g_srv.n_waiting--;
            g_srv.cancelled++;
            j->state = J_DROPPED;
            srv_job_release(j); /* the worker's reference */
        }
    }
}

/* Tells the worker to stop, cancelling queued and running requests. */
void srv_stop_requests(void) {
    pthread_mutex_lock(&g_srv.mu);
    g_srv.stopping = true;
    for (job *j = g_srv.head; j; j = j->next) atomic_store(&j->cancel, true);
    /* the running ones too: they are off the queue, and a long generation
     * would otherwise hold the process up to its max_tokens */
    srv_cancel_active();
    pthread_cond_broadcast(&g_srv.work_cv);
    pthread_mutex_unlock(&g_srv.mu);
}


void srv_cancel_active(void) {
    if (!g_srv.active) return;
    for (int i = 0; i < g_srv.cfg.parallel; i++)
        if (g_srv.active[i]) atomic_store(&g_srv.active[i]->cancel, true);
}

/* Room: --queue waiting, and as many again as slots are free (the worker
 * takes queued jobs into free slots between steps). */
bool srv_enqueue(job *j) {
    if (g_srv.n_waiting >= g_srv.cfg.queue + (g_srv.cfg.parallel - g_srv.n_active)) return false;
    if (g_srv.tail) g_srv.tail->next = j;
    else g_srv.head = j;
    g_srv.tail = j;
    g_srv.n_waiting++;
    pthread_cond_signal(&g_srv.work_cv);
    return true;
}
