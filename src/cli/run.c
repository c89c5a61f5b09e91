/*
 * cli/run.c - `deltafin run` (generate text from a prompt or a chat turn),
 * `inspect`, `tokenize` and `logits`, over the public API (deltafin.h).
 * `deltafin bench` runs run and logits through cli_run and cli_logits with
 * its hooks (cli_dev): the benchmark controls, their statistics, and the
 * arm's output (no text, one JSON summary on stdout).
 */
#include "cli/cli.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char RUN_USAGE[] =
    "usage: deltafin run --model DIR (--prompt TEXT | --prompt-tokens IDS) [options]\n"
    "\n"
    "Generates a continuation and streams it to stdout. Benchmark and test controls\n"
    "(routing replay, a simulated disk, prefetch tuning, a fixed draft depth, random\n"
    "prompts, teacher forcing) are under `deltafin bench run`.\n";

static const cli_cmd RUN_CMD = {
    .usage = RUN_USAGE, .table = CLI_OPTS, .sections = {CLI_RUN_SECTIONS}, .bench_only = CLI_BENCH_ONLY,
    .bench_where = "deltafin bench run"};

/* "prefill: layer 12/48, 300/1024 tokens, 85.3 tok/s" redrawn in place on a
 * terminal while a long prompt is evaluated. */
typedef struct {
    double t0, last;
} progress_state;

static void show_progress(void *user, int layer, int n_layers, int rows_done, int rows_total) {
    progress_state *p = user;
    double now = df_now();
    bool end = rows_done == rows_total;
    if (now - p->last < 0.2 && !end) return;
    p->last = now;
    fprintf(stderr, "\rprefill: layer %d/%d, %d/%d tokens, %.1f tok/s   ", layer, n_layers, rows_done,
            rows_total, now > p->t0 ? rows_done / (now - p->t0) : 0.0);
    if (end) fprintf(stderr, "\r%70s\r", "");
}


/* One generated token to stdout: its id, or its text (stop tokens print
 * nothing); the benchmark arm prints no tokens, only its JSON line at the end. */
static void emit_token(const df_engine *e, df_text_stream *ts, int32_t t, bool first, bool print_ids) {
    char buf[4096];
    if (print_ids) {
        printf("%s%d", first ? "" : " ", t);
    } else if (!df_is_stop_token(e, t)) {
        size_t w = df_text_stream_push(e, ts, t, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
    }
}

/* The prompt's token ids (*n of them, at least one): --prompt-tokens,
 * --random-prompt or --prompt's text (a chat turn with --chat). */
static int32_t *run_prompt(const cli_args *o, df_engine *e, size_t *n) {
    int32_t *ids = NULL;
    df_error err;
    *n = 0;
    if (o->prompt_tokens) {
        int k;
        ids = cli_parse_ids("--prompt-tokens", o->prompt_tokens, &k);
        *n = (size_t)k;
    } else if (o->random_prompt) {
        *n = (size_t)o->random_prompt;
        ids = malloc(sizeof(int32_t) * *n);
        uint64_t r = (uint64_t)(o->prompt_seed ? o->prompt_seed : 1) * 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < *n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((r >> 33) % (uint64_t)df_engine_info(e)->vocab_size);
        }
    } else if (o->chat) {
        /* the prompt and system text are message content: special-token text in
         * them stays text */
        df_chat_msg msgs[2];
        int nm = 0;
        if (o->system) msgs[nm++] = (df_chat_msg){"system", o->system};
        msgs[nm++] = (df_chat_msg){"user", o->prompt};
        if (df_chat_tokenize(e, msgs, nm, 1, o->think, &ids, n, &err)) cli_die_err(&err);
    } else {
        if (df_tokenize(e, o->prompt, strlen(o->prompt), &ids, n, &err)) cli_die_err(&err);
    }
    if (*n == 0) cli_die("the prompt is empty");
    return ids;
}

/* The session's context for a prompt of n tokens; it holds the prompt and
 * every new token. --ctx is taken as given (open_engine checked it against the
 * model). Unset, it is min(model maximum, 4096), as a --ram-budget was sized
 * for, and without a budget grows up to the model's maximum to hold --max-new
 * tokens after a long prompt. */
static int run_context(const cli_args *o, const df_model_info *info, size_t n) {
    int max = info->max_context, ctx = o->ctx ? o->ctx : (max < 4096 ? max : 4096);
    if (!o->ctx && !o->ram_budget) {
        size_t want = n + (o->max_new ? (size_t)o->max_new : 1);
        if (want > (size_t)ctx) ctx = want < (size_t)max ? (int)want : max;
    }
    if (n < (size_t)ctx) return ctx;
    if (ctx < max || o->ctx)
        cli_die("the prompt of %zu tokens leaves no room for a new token in the %d-token context (--ctx)", n,
                ctx);
    cli_die("the prompt of %zu tokens leaves no room for a new token in the model's %d-token context", n, max);
}

/* What run's generation callbacks share: output, statistics, teacher forcing. */
typedef struct run_state {
    const cli_args *o;
    const cli_dev *dev;
    df_engine *e;
    FILE *ev;
    df_text_stream ts;
    cli_stats st0, prev, after_prefill;
    uint64_t tf;        /* teacher forcing's generator */
    int V;
    int produced;
    uint64_t io0;       /* storage bytes read when decoding began */
} run_state;

/* A pseudo-random token (bench: decode as a long answer would, whatever the
 * model says). */
static int32_t run_force(void *u, int index) {
    (void)index;
    run_state *r = u;
    r->tf = r->tf * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((r->tf >> 33) % (uint64_t)r->V);
}

static int run_token(void *u, int32_t t) {
    run_state *r = u;
    if (!(r->dev && r->dev->arm)) emit_token(r->e, &r->ts, t, r->produced++ == 0, r->o->print_ids);
    fflush(stdout);
    return 0;
}

static void run_prefilled(void *u, int rows, double secs) {
    run_state *r = u;
    cli_stats now;
    cli_get_stats(r->e, r->dev, &now);
    cli_report(r->ev, r->o->stats, "prefill", rows, &r->st0, &now, secs);
    r->prev = r->after_prefill = now;
    r->io0 = cli_storage_read_bytes();
}

static void run_step(void *u, int tokens, double secs) {
    run_state *r = u;
    cli_stats now;
    cli_get_stats(r->e, r->dev, &now);
    cli_report(r->ev, r->o->stats, "token", tokens, &r->prev, &now, secs);
    r->prev = now;
}


/* Checks across options, after parsing; the arm's defaults. */
static void run_check(cli_args *a, const cli_dev *dev) {
    if (dev && dev->arm) {
        if (!a->random_prompt && !a->prompt && !a->prompt_tokens) a->random_prompt = 512;
        if (!a->teacher_set && !a->draft) a->teacher_seed = 7; /* drafts need the model's own tokens */
        if (!a->max_new_set) a->max_new = 513; /* the first token comes from the prompt */
        a->print_ids = true;
    }
    if (a->sim_disk > 0 && a->io_bw <= 0) a->io_bw = a->sim_disk; /* the bound's bandwidth is known */
    if ((a->prompt != NULL) + (a->prompt_tokens != NULL) + (a->random_prompt > 0) != 1)
        cli_die(dev ? "give exactly one of --prompt, --prompt-tokens or --random-prompt"
                    : "give exactly one of --prompt or --prompt-tokens");
    if (a->chat && !a->prompt) cli_die("--chat needs --prompt");
    if (a->system && !a->chat) cli_die("--system needs --chat");
    if (!a->prompt_cache && (a->prompt_cache_size || a->prompt_cache_every))
        cli_die("--prompt-cache-size and --prompt-cache-every need --prompt-cache");
    if (!a->draft && (a->draft_k || a->lookup_n || a->draft_fixed || a->draft_rejection))
        cli_die(dev ? "--draft-k, --lookup-n, --draft-fixed and --draft-rejection need --draft"
                    : "--draft-k, --lookup-n and --draft-rejection need --draft");
    if (a->draft && a->teacher_seed) cli_die("--draft cannot be combined with --teacher-force");
    if (a->draft_fixed && a->draft_k && a->draft_fixed > a->draft_k) cli_die("--draft-fixed exceeds --draft-k");
}

/* The model authors' recommended sampling applies unless overridden. */
static df_sampler *run_sampler(cli_args *a, const df_model_info *info) {
    if (!a->temp_set && info->default_temperature >= 0) a->sp.temperature = info->default_temperature;
    if (!a->top_p_set && info->default_top_p > 0) a->sp.top_p = info->default_top_p;
    if (!a->top_k_set && info->default_top_k >= 0) a->sp.top_k = info->default_top_k;
    df_sampler *smp;
    df_error err;
    if (df_sampler_new(&smp, &a->sp, &err)) cli_die_err(&err);
    return smp;
}

static df_spec *run_spec(const cli_args *a, df_engine *e, const cli_dev *dev) {
    if (!a->draft) return NULL;
    df_spec_opts so = {.draft = a->draft, .k_max = a->draft_k ? a->draft_k : (a->draft_fixed > 8 ? a->draft_fixed : 0),
                       .lookup_n = a->lookup_n, .n_threads = a->threads, .isa = a->isa,
                       .rejection = a->draft_rejection};
    df_spec *sp;
    df_error err;
    if (df_spec_new(&sp, e, &so, &err)) cli_die_err(&err);
    if (dev && dev->spec_ready) dev->spec_ready(sp, a);
    return sp;
}

/* --stats and --events after generation (and the arm's JSON line). */
static void run_reports(const cli_args *a, const cli_dev *dev, run_state *rs, const df_generate_result *gr,
                        size_t n, df_spec *sp, uint64_t io_dec) {
    const df_model_info *info = df_engine_info(rs->e);
    const cli_stats *after_prefill = &rs->after_prefill, *last = &rs->prev;
    FILE *ev = rs->ev;
    if (a->stats || ev) {
        cli_report(ev, a->stats, "decode", gr->decoded, after_prefill, last, gr->decode_s);
        cli_summary(ev, a->stats, info, &rs->st0, after_prefill, last, n, gr->prefill_s, gr->decoded,
                    gr->decode_s, a->io_bw, a->ram_budget, io_dec);
        if (dev && dev->prefetch_report) dev->prefetch_report(ev, a->stats, rs->e, last);
        else cli_prefetch_report(ev, a->stats, last);
        cli_stats end; /* the prompt's states are stored after its first token: after the last step too */
        cli_get_stats(rs->e, dev, &end);
        cli_pcache_report(ev, a->stats, &end);
        if (sp && a->stats) df_spec_report(sp, stderr);
        if (sp && ev) cli_spec_events(ev, sp);
    }
    if (dev && dev->arm) {
        cli_summary(stdout, false, info, &rs->st0, after_prefill, last, n, gr->prefill_s, gr->decoded,
                    gr->decode_s, a->io_bw, a->ram_budget, io_dec);
        fflush(stdout);
    }
}

int cli_run(cli_args *a, const cli_dev *dev) {
    run_check(a, dev);
    df_engine *e = cli_open_engine(a, dev);
    const df_model_info *info = df_engine_info(e);
    df_error err;
    size_t n;
    int32_t *ids = run_prompt(a, e, &n);
    int ctx = run_context(a, info, n);
    df_session *s;
    if (df_session_new(&s, e, ctx, &err)) cli_die_err(&err);
    df_sampler *smp = run_sampler(a, info);
    FILE *ev = NULL;
    if (a->events && !(ev = fopen(a->events, "w"))) cli_die("%s: cannot create: %s", a->events, strerror(errno));
    df_spec *sp = run_spec(a, e, dev);
    run_state rs = {.o = a, .dev = dev, .e = e, .ev = ev,
                    .tf = (uint64_t)a->teacher_seed * 0x9E3779B97F4A7C15ull, .V = info->vocab_size};
    cli_get_stats(e, dev, &rs.st0);
    rs.prev = rs.st0;
    progress_state ps = {df_now(), df_now()};
    df_generate_opts go = {.sampler = smp, .spec = sp, .max_new = a->max_new,
                           .prefill_progress = isatty(2) && n > 64 ? show_progress : NULL, .progress_user = &ps,
                           .force = a->teacher_seed ? run_force : NULL, .on_token = run_token,
                           .on_prefill = run_prefilled, .on_step = run_step, .user = &rs};
    df_generate_result gr;
    if (df_generate(s, ids, (int)n, &go, &gr, &err)) cli_die_err(&err);
    uint64_t io_dec = cli_storage_read_bytes() - rs.io0;
    if (!a->print_ids) {
        char buf[64];
        size_t w = df_text_stream_flush(&rs.ts, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
    }
    if (!(dev && dev->arm)) printf("\n");
    fflush(stdout);
    if (gr.finish == DF_FINISH_CONTEXT)
        fprintf(stderr, "deltafin: %s of %d tokens is full after %d new token%s\n",
                ctx < info->max_context ? "the context (--ctx)" : "the model's context", ctx, gr.produced,
                gr.produced == 1 ? "" : "s");
    run_reports(a, dev, &rs, &gr, n, sp, io_dec);
    df_spec_free(sp);
    if (ev) {
        errno = 0;
        bool lost = ferror(ev);
        if (fclose(ev) != 0 || lost)
            cli_die("%s: writing the events failed: %s", a->events, strerror(errno ? errno : EIO));
    }
    free(ids);
    df_sampler_free(smp);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

int cli_run_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&RUN_CMD, &a, argc, argv);
    return rc ? (rc == CLI_HELP ? 0 : rc) : cli_run(&a, NULL);
}

/* ---- inspect, tokenize, logits ----------------------------------------------------- */

static const cli_section INSPECT_SECTIONS[] = {
    {NULL, "--model --threads --isa --experts --ram-budget --config-only --ram --drive-bw"}, {0}};
static const cli_cmd INSPECT_CMD = {
    .usage = "usage: deltafin inspect --model DIR\n\n"
             "Prints the config, the tensor inventory (routed experts summarised per layer)\n"
             "and byte counts: always-active weights vs routed experts.\n",
    .table = CLI_OPTS, .sections = {INSPECT_SECTIONS}, .bench_only = CLI_BENCH_ONLY,
    .bench_where = "deltafin bench run"};

int cli_inspect_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&INSPECT_CMD, &a, argc, argv);
    if (rc) return rc == CLI_HELP ? 0 : rc;
    if (a.config_only) {
        df_error err = {0};
        if (!a.model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
        if (df_inspect_config(a.model, a.ram, a.drive_bw, stdout, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 2;
        }
        return 0;
    }
    a.describe_only = true;
    df_engine *e = cli_open_engine(&a, NULL);
    df_engine_inspect(e, stdout);
    df_engine_close(e);
    return 0;
}

static const cli_section TOKENIZE_SECTIONS[] = {{NULL, "--model --text --decode --chat --system --no-think"},
                                                 {0}};
static const cli_cmd TOKENIZE_CMD = {
    .usage = "usage: deltafin tokenize --model DIR (--text TEXT | --decode IDS) [--chat [--system TEXT]]\n\n"
             "--text prints the token ids of TEXT, space-separated; --decode prints the text\n"
             "of comma-separated ids. With --chat, the ids are those of the conversation\n"
             "`deltafin run --chat` and the server would evaluate: TEXT as a user turn in the\n"
             "model's chat template, where special-token text is plain text.\n",
    .table = CLI_OPTS, .sections = {TOKENIZE_SECTIONS}};

static void decode_ids(df_engine *e, const char *list) {
    int n;
    int32_t *ids = cli_parse_ids("--decode", list, &n);
    for (int i = 0; i < n; i++) {
        const char *b;
        size_t l;
        if (df_token_bytes(e, ids[i], &b, &l)) cli_die("--decode: unknown token id %d", ids[i]);
        fwrite(b, 1, l, stdout);
    }
    printf("\n");
    free(ids);
}

int cli_tokenize_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&TOKENIZE_CMD, &a, argc, argv);
    if (rc) return rc == CLI_HELP ? 0 : rc;
    if (!a.text == !a.decode) cli_die("give exactly one of --text or --decode");
    if (a.chat && !a.text) cli_die("--chat needs --text");
    if (a.system && !a.chat) cli_die("--system needs --chat");
    df_engine *e = cli_open_engine(&a, NULL);
    df_error err;
    if (a.text) {
        int32_t *ids;
        size_t n;
        df_chat_msg msgs[2];
        int nm = 0;
        if (a.chat && a.system) msgs[nm++] = (df_chat_msg){"system", a.system};
        msgs[nm++] = (df_chat_msg){"user", a.text};
        if (a.chat ? df_chat_tokenize(e, msgs, nm, 1, a.think, &ids, &n, &err)
                   : df_tokenize(e, a.text, strlen(a.text), &ids, &n, &err))
            cli_die_err(&err);
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    } else {
        decode_ids(e, a.decode);
    }
    df_engine_close(e);
    return 0;
}

static const cli_cmd LOGITS_CMD = {
    .usage = "usage: deltafin logits --model DIR --tokens IDS --out FILE [--batch N] [options]\n\n"
             "Evaluates the token sequence from position 0 and writes the logits of every\n"
             "row to FILE as little-endian float32 [T][vocab]. --experts DIRS and --ram-budget\n"
             "SIZE stream the routed experts as in `deltafin run`. --ctx N (at least the\n"
             "number of tokens, at most the model's context) is the context a --ram-budget\n"
             "holds. Routing replay is under `deltafin bench logits`.\n",
    .table = CLI_OPTS, .sections = {CLI_LOGITS_SECTIONS}, .bench_only = CLI_BENCH_ONLY,
    .bench_where = "deltafin bench logits"};

int cli_logits(cli_args *a, const cli_dev *dev) {
    if (!a->tokens || !a->out) cli_die("--tokens and --out are required");
    int n;
    int32_t *ids = cli_parse_ids("--tokens", a->tokens, &n);
    if (!a->ctx) a->ctx = n;
    else if (a->ctx < n) cli_die("--ctx %d is less than the %d tokens of --tokens", a->ctx, n);
    df_engine *e = cli_open_engine(a, dev);
    const df_model_info *info = df_engine_info(e);
    if (n > info->max_context) cli_die("%d tokens exceed the model's context of %d", n, info->max_context);
    df_error err;
    df_session *s;
    if (df_session_new(&s, e, n, &err)) cli_die_err(&err);
    size_t V = (size_t)info->vocab_size;
    float *lg = malloc(sizeof(float) * V * (size_t)n);
    int step = a->batch ? a->batch : n;
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        if (df_session_eval(s, ids + i, k, lg + (size_t)i * V, 1, &err)) cli_die_err(&err);
    }
    FILE *f = fopen(a->out, "wb");
    if (!f) cli_die("%s: cannot create: %s", a->out, strerror(errno));
    errno = 0;
    if (fwrite(lg, sizeof(float), V * (size_t)n, f) != V * (size_t)n || fclose(f) != 0)
        cli_die("%s: write failed: %s", a->out, strerror(errno ? errno : EIO));
    free(lg);
    free(ids);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

int cli_logits_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&LOGITS_CMD, &a, argc, argv);
    return rc ? (rc == CLI_HELP ? 0 : rc) : cli_logits(&a, NULL);
}
