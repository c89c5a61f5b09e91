/*
 * cli/batch.c - `deltafin batch`: a file of OpenAI Batch API jobs run
 * --parallel at a time through df_batchgen (their rows share each forward
 * pass, so each expert is read once for all of them), one result line per
 * job as each finishes (batch_io.c keeps the file resumable). A job's output
 * does not depend on what ran beside it: a job without a seed samples with
 * one derived from its custom_id, so a restarted run writes what an
 * uninterrupted one would have (but `created`). With --draft lookup each
 * slot drafts with its own df_spec inside the batch (the same output).
 * Progress on a terminal, a summary at the end, on stderr.
 */
#include "cli/batch.h"
#include "cli/cli.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const cli_cmd BATCH_CMD = {
    .usage = "usage: deltafin batch --model DIR --input JOBS.jsonl --output RESULTS.jsonl [options]\n"
             "\n"
             "Runs a file of OpenAI Batch API jobs (one JSON object a line: custom_id,\n"
             "method \"POST\", url \"/v1/chat/completions\" or \"/v1/completions\", body as the\n"
             "server takes it) and writes one result line per job (id, custom_id, response\n"
             "{status_code, request_id, body} or error), in the order they finish. Started\n"
             "again with the same arguments it skips the custom_ids the output holds: a\n"
             "killed run loses only the jobs it was running. A malformed line gets an error\n"
             "line. A job without a seed samples with one derived from its custom_id.\n",
    .table = CLI_OPTS, .sections = {CLI_BATCH_SECTIONS}};

typedef struct run run;

/* One running job. */
typedef struct slot {
    run *r;
    batch_job *job;
    df_session *s;
    df_sampler *smp;
    df_spec *spec; /* --draft lookup: the slot's drafter */
    int32_t *ids;
    int n_prompt;
    int cached; /* prompt tokens the session held or the prompt cache restored */
    char *text;
    size_t len, cap;
    df_text_stream ts;
    int produced;
    bool stopped, busy;
} slot;

struct run {
    cli_args *a;
    df_engine *eng;
    const df_model_info *info;
    df_batchgen *g;
    int fd, ctx, n_slots;
    char model_id[256];
    batch_input in;
    bool *done;
    int next, todo, finished, errors, failed, skipped;
    uint64_t gen_tokens;
    double t0, last_bar;
    int32_t *counts; /* penalties' scratch, zero between uses */
    slot *slots;
};

static void append(slot *q, const char *s, size_t n) {
    if (q->len + n + 1 > q->cap) {
        q->cap = (q->len + n + 1) * 2;
        q->text = realloc(q->text, q->cap);
        if (!q->text) cli_die("out of memory");
    }
    memcpy(q->text + q->len, s, n);
    q->len += n;
    q->text[q->len] = 0;
}

/* The earliest stop string in the text at or after `from`: the text ends
 * before it. */
static bool cut_stop(slot *q, size_t from) {
    const srv_request *rq = &q->job->req;
    long best = -1;
    for (int i = 0; i < rq->n_stop; i++) {
        size_t m = strlen(rq->stop[i]);
        if (q->len < from + m) continue;
        const char *p = memmem(q->text + from, q->len - from, rq->stop[i], m);
        if (p && (best < 0 || p - q->text < best)) best = p - q->text;
    }
    if (best < 0) return false;
    q->len = (size_t)best;
    q->text[q->len] = 0;
    return true;
}

static int on_token(void *u, int32_t t) {
    slot *q = u;
    q->produced++;
    q->r->gen_tokens++;
    if (df_is_stop_token(q->r->eng, t)) return 0; /* the generation ends with it, its text unsaid */
    const char *tb;
    size_t tl, before = q->len;
    if (df_token_bytes(q->r->eng, t, &tb, &tl)) return 0;
    char *buf = df_xmalloc(tl + 32);
    size_t m = df_text_stream_push(q->r->eng, &q->ts, t, buf, tl + 32);
    append(q, buf, m);
    free(buf);
    /* a stop string may begin in what came before this token */
    size_t longest = 0;
    for (int i = 0; i < q->job->req.n_stop; i++)
        if (strlen(q->job->req.stop[i]) > longest) longest = strlen(q->job->req.stop[i]);
    size_t from = before > longest ? before - longest : 0;
    return (q->stopped = cut_stop(q, from));
}

/* OpenAI presence/frequency penalties over the tokens generated before this row. */
static void penalties(void *u, float *logits, int vocab, const int32_t *hist, int nh) {
    (void)vocab;
    slot *q = u;
    const srv_request *rq = &q->job->req;
    int32_t *counts = q->r->counts;
    const int32_t *gen = hist + q->n_prompt;
    int n = nh - q->n_prompt;
    for (int i = 0; i < n; i++) counts[gen[i]]++;
    for (int i = 0; i < n; i++) {
        int32_t t = gen[i];
        if (!counts[t]) continue; /* applied once per distinct token */
        logits[t] -= (float)(rq->presence_penalty + rq->frequency_penalty * counts[t]);
        counts[t] = 0;
    }
}

static json_t *response_body(const slot *q, const char *finish) {
    const run *r = q->r;
    const batch_job *j = q->job;
    bool chat = j->kind == SRV_CHAT;
    char id[64];
    snprintf(id, sizeof id, "%s-%016llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)j->hash);
    json_t *choice =
        chat ? json_pack("{s:i,s:{s:s,s:s%},s:n,s:s}", "index", 0, "message", "role", "assistant", "content",
                         q->text ? q->text : "", q->len, "logprobs", "finish_reason", finish)
             : json_pack("{s:s%,s:i,s:n,s:s}", "text", q->text ? q->text : "", q->len, "index", 0, "logprobs",
                         "finish_reason", finish);
    return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:{s:i,s:i,s:i,s:{s:i}}}", "id", id, "object",
                     chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                     r->model_id, "choices", choice, "usage", "prompt_tokens", q->n_prompt, "completion_tokens",
                     q->produced, "total_tokens", q->n_prompt + q->produced, "prompt_tokens_details",
                     "cached_tokens", q->cached);
}

static void release(slot *q) {
    df_sampler_free(q->smp);
    free(q->ids);
    q->smp = NULL, q->ids = NULL;
    q->len = 0;
    q->busy = false;
}

static void on_done(void *u, const df_generate_result *res, int status, const df_error *err) {
    slot *q = u;
    run *r = q->r;
    if (status) {
        /* no line: started again, the job runs again */
        fprintf(stderr, "%sdeltafin: job '%s' (line %d) failed: %s\n", isatty(2) ? "\r\033[K" : "",
                q->job->custom_id, q->job->line, err->msg);
        r->failed++;
        release(q);
        return;
    }
    if (!q->stopped) {
        char buf[64];
        size_t before = q->len;
        append(q, buf, df_text_stream_flush(&q->ts, buf, sizeof buf));
        q->stopped = q->len > before && cut_stop(q, 0);
    }
    q->cached = res->prompt_reused;
    const char *finish = res->finish == DF_FINISH_STOP || q->stopped ? "stop" : "length";
    batch_write_result(r->fd, q->job, 200, response_body(q, finish), NULL);
    r->finished++;
    release(q);
}

/* The prompt's token ids, or a 400 line written and NULL. */
static int32_t *prompt_ids(run *r, batch_job *j, int *n_out) {
    const srv_request *rq = &j->req;
    int32_t *ids = NULL;
    size_t n = 0;
    df_error err;
    const char *param = j->kind == SRV_CHAT ? "messages" : "prompt";
    int rc;
    if (j->kind == SRV_CHAT) {
        df_chat_msg *m = df_xcalloc((size_t)rq->n_msgs, sizeof *m);
        for (int i = 0; i < rq->n_msgs; i++) m[i] = (df_chat_msg){rq->msgs[i].role, rq->msgs[i].content};
        rc = df_chat_tokenize(r->eng, m, rq->n_msgs, 1, rq->enable_thinking < 0 ? r->a->think : rq->enable_thinking,
                              &ids, &n, &err);
        free(m);
    } else if (rq->prompt) {
        rc = df_tokenize(r->eng, rq->prompt, strlen(rq->prompt), &ids, &n, &err);
    } else {
        ids = df_xmalloc(sizeof *ids * rq->n_prompt_ids);
        memcpy(ids, rq->prompt_ids, sizeof *ids * rq->n_prompt_ids);
        n = rq->n_prompt_ids, rc = DF_OK;
    }
    char msg[1100] = "";
    if (rc) snprintf(msg, sizeof msg, "%s", err.msg);
    else if (n == 0) snprintf(msg, sizeof msg, "the prompt is empty");
    else if (n >= (size_t)r->ctx)
        snprintf(msg, sizeof msg, "the prompt is %zu tokens; the context is %d tokens (--ctx), which leaves no "
                 "room for a new one", n, r->ctx);
    for (size_t i = 0; i < n && !*msg; i++)
        if (ids[i] < 0 || ids[i] >= r->info->vocab_size)
            snprintf(msg, sizeof msg, "the prompt's token %zu is id %d, outside the model's vocabulary (%d tokens)",
                     i, ids[i], r->info->vocab_size);
    if (*msg) {
        free(ids);
        batch_write_result(r->fd, j, 400, batch_error_body(msg, param), NULL);
        r->errors++;
        return NULL;
    }
    *n_out = (int)n;
    return ids;
}

/* The job's sampler: its own values, else batch's options, else generation_config.json's
 * (as the server does); its own seed, else one from its custom_id. */
static df_sampler *job_sampler(run *r, const batch_job *j) {
    const srv_request *rq = &j->req;
    const cli_args *a = r->a;
    df_sampler_params sp = a->sp;
    sp.temperature = rq->temperature_set ? (float)rq->temperature
                     : a->temp_set ? a->sp.temperature
                     : r->info->default_temperature >= 0 ? r->info->default_temperature : 1.0f;
    sp.top_p = rq->top_p_set ? (float)rq->top_p
               : a->top_p_set ? a->sp.top_p
               : r->info->default_top_p > 0 ? r->info->default_top_p : 1.0f;
    sp.top_k = a->top_k_set ? a->sp.top_k : r->info->default_top_k >= 0 ? r->info->default_top_k : 0;
    sp.seed = rq->seed_set ? rq->seed : a->sp.seed ^ j->hash;
    df_sampler *smp;
    df_error err;
    if (df_sampler_new(&smp, &sp, &err)) cli_die_err(&err);
    return smp;
}

/* Starts the next job that needs running on free slot q; false when none is left. */
static bool start_next(run *r, slot *q) {
    while (r->next < r->in.n) {
        int i = r->next++;
        batch_job *j = &r->in.jobs[i];
        if (r->done[i]) continue;
        if (!j->valid) {
            batch_write_result(r->fd, j, j->status, j->status ? batch_error_body(j->message, j->param) : NULL,
                               j->message);
            r->errors++;
            continue;
        }
        int n;
        int32_t *ids = prompt_ids(r, j, &n);
        if (!ids) continue;
        const srv_request *rq = &j->req;
        int room = r->ctx - n, def = r->a->max_new_set ? r->a->max_new : 0;
        int max_new = rq->max_tokens >= 0 ? rq->max_tokens : def > 0 && def < room ? def : room;
        if (max_new > room) {
            char msg[300];
            snprintf(msg, sizeof msg, "the prompt (%d tokens) plus max_tokens (%d) exceeds the context of %d tokens",
                     n, max_new, r->ctx);
            batch_write_result(r->fd, j, 400,
                               batch_error_body(msg, j->kind == SRV_CHAT ? "max_completion_tokens" : "max_tokens"),
                               NULL);
            r->errors++;
            free(ids);
            continue;
        }
        *q = (slot){.r = r, .job = j, .s = q->s, .smp = job_sampler(r, j), .spec = q->spec, .ids = ids,
                    .n_prompt = n, .text = q->text, .cap = q->cap, .busy = true};
        df_generate_opts go = {.sampler = q->smp, .spec = q->spec, .max_new = max_new, .reuse_prefix = 1, .on_token = on_token,
                               .user = q};
        if (rq->presence_penalty != 0 || rq->frequency_penalty != 0) go.logits_hook = penalties, go.hook_user = q;
        df_error err;
        if (df_batchgen_add(r->g, q->s, ids, n, &go, on_done, &err)) cli_die_err(&err);
        return true;
    }
    return false;
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) snprintf(buf, n, "--:--");
    else if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void progress(run *r, bool force) {
    double now = df_now();
    if (!isatty(2) || (!force && now - r->last_bar < 0.2)) return;
    r->last_bar = now;
    int done = r->finished + r->errors + r->failed, width = 24;
    double el = now - r->t0, tps = el > 0 ? (double)r->gen_tokens / el : 0;
    double eta = done > 0 ? el / done * (r->todo - done) : -1;
    char bar[32], e[32];
    int fill = r->todo ? width * done / r->todo : width;
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fmt_eta(e, sizeof e, eta);
    fprintf(stderr, "\r\033[K[%s] %d/%d jobs  %d running  %.1f tok/s  ETA %s", bar, done, r->todo,
            df_batchgen_active(r->g), tps, e);
}

static void summary(run *r, const df_stats *st) {
    double el = df_now() - r->t0;
    if (isatty(2)) fputs("\r\033[K", stderr);
    fprintf(stderr, "deltafin batch: %d job%s in %s: %d answered now, %d error line%s, %d already there",
            r->in.n, r->in.n == 1 ? "" : "s", r->a->input, r->finished, r->errors, r->errors == 1 ? "" : "s",
            r->skipped);
    if (r->failed) fprintf(stderr, ", %d failed (run again to retry them)", r->failed);
    fprintf(stderr, "\n  %llu tokens generated in %.1f s: %.1f tok/s with up to %d at once",
            (unsigned long long)r->gen_tokens, el, el > 0 ? (double)r->gen_tokens / el : 0, r->n_slots);
    if (st->expert_bytes_read && st->tokens)
        fprintf(stderr, "; expert bytes read %.3f MB per evaluated row, %.3f MB per generated token",
                (double)st->expert_bytes_read / 1e6 / (double)st->tokens,
                r->gen_tokens ? (double)st->expert_bytes_read / 1e6 / (double)r->gen_tokens : 0.0);
    fprintf(stderr, "\n");
}

static void run_jobs(run *r) {
    df_error err;
    for (;;) {
        for (int k = 0; k < r->n_slots; k++)
            if (!r->slots[k].busy) start_next(r, &r->slots[k]);
        if (!df_batchgen_active(r->g)) break;
        if (df_batchgen_step(r->g, &err)) { /* its jobs were reported failed; the others go on */
        }
        progress(r, false);
    }
}

/* The engine, sized as serve's (cli_parallel_opts): a --ram-budget holds n
 * sequences' state, one set of work buffers and a drafter per slot beside the
 * always-active weights; the expert cache gets what they leave. */
static df_engine *open_engine(const cli_args *a, int n) {
    if (!a->model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    df_engine_opts eo;
    df_error err;
    static char what[600];
    if (cli_parallel_opts(a, n, &eo, what, sizeof what, &err)) cli_die_err(&err);
    df_engine *e;
    if (df_engine_open(&e, &eo, &err)) cli_die_err(&err);
    cli_serve_rank(e);
    if (a->ctx > df_engine_info(e)->max_context)
        cli_die("--ctx %d exceeds the model's context of %d tokens", a->ctx, df_engine_info(e)->max_context);
    return e;
}

int cli_batch_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&BATCH_CMD, &a, argc, argv);
    if (rc) return rc == CLI_HELP ? 0 : rc;
    if (!a.parallel) a.parallel = 4;
    if (!a.model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    if (!a.input || !a.output) cli_die("--input FILE and --output FILE are required");
    if (!a.prompt_cache && (a.prompt_cache_size || a.prompt_cache_every))
        cli_die("--prompt-cache-size and --prompt-cache-every need --prompt-cache");
    if (a.ctx == 1) cli_die("--ctx expects an integer in 2..%d, got '1'", 1 << 24);
    if (!a.draft && (a.draft_k || a.lookup_n || a.draft_rejection))
        cli_die("--draft-k, --lookup-n and --draft-rejection need --draft");
    /* a draft model would be loaded once per slot */
    if (a.draft && strcmp(a.draft, "lookup") != 0)
        cli_die("batch: --draft takes lookup only (a draft model would be loaded once per --parallel slot)");
    run r = {.a = &a};
    /* Experts by rank: every rank opens the engine first, and only rank 0
     * goes on to the input and output (the workers serve it and exit). */
    if (a.experts_by_rank) r.eng = open_engine(&a, a.parallel);
    batch_read_input(a.input, &r.in);
    r.done = df_xcalloc((size_t)(r.in.n ? r.in.n : 1), sizeof *r.done);
    r.fd = batch_open_output(a.output, &r.in, r.done);
    for (int i = 0; i < r.in.n; i++) r.skipped += r.done[i] && r.in.jobs[i].status != -1, r.todo += !r.done[i];
    r.n_slots = a.parallel < r.todo ? a.parallel : r.todo > 0 ? r.todo : 1;
    if (!r.eng) r.eng = open_engine(&a, r.n_slots);
    r.info = df_engine_info(r.eng);
    r.ctx = a.ctx ? a.ctx : (r.info->max_context < 4096 ? r.info->max_context : 4096);
    snprintf(r.model_id, sizeof r.model_id, "%s", a.model); /* its last path element, as serve names it */
    for (size_t ml = strlen(r.model_id); ml > 1 && r.model_id[ml - 1] == '/';) r.model_id[--ml] = 0;
    const char *base = strrchr(r.model_id, '/');
    if (base && base[1]) memmove(r.model_id, base + 1, strlen(base + 1) + 1);
    df_error err;
    if (df_batchgen_new(&r.g, r.eng, 0, r.ctx, &err)) cli_die_err(&err);
    r.slots = df_xcalloc((size_t)r.n_slots, sizeof *r.slots);
    for (int k = 0; k < r.n_slots; k++)
        if (df_session_new(&r.slots[k].s, r.eng, r.ctx, &err)) cli_die_err(&err);
    df_spec_opts so = {.draft = a.draft, .k_max = a.draft_k, .lookup_n = a.lookup_n, .n_threads = a.threads,
                       .isa = a.isa, .rejection = a.draft_rejection};
    for (int k = 0; a.draft && k < r.n_slots; k++)
        if (df_spec_new(&r.slots[k].spec, r.eng, &so, &err)) cli_die_err(&err);
    r.counts = df_xcalloc((size_t)r.info->vocab_size, sizeof *r.counts);
    r.t0 = df_now();
    run_jobs(&r);
    df_stats st;
    df_engine_stats(r.eng, &st);
    summary(&r, &st);
    for (int k = 0; k < r.n_slots; k++)
        df_session_free(r.slots[k].s), df_spec_free(r.slots[k].spec), free(r.slots[k].text);
    free(r.slots);
    free(r.counts);
    df_batchgen_free(r.g);
    df_engine_close(r.eng);
    close(r.fd);
    batch_free_input(&r.in);
    free(r.done);
    return r.failed ? 1 : 0;
}
