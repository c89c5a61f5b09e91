/*
 * main.c - the deltafin command line. Parses arguments and drives the public API
 * (deltafin.h) only; no tensor internals here.
 *
 *   deltafin run       generate text from a prompt (or a chat turn)
 *   deltafin inspect   config, tensor inventory, byte counts
 *   deltafin tokenize  text -> ids, or --decode ids -> text
 *   deltafin logits    raw logits of a token sequence (for tests and tools)
 *   deltafin cache-sim replay a routing trace through the expert cache policies
 *
 * Exit codes: 0 success, 2 bad input or usage (the message names what is wrong),
 * 1 an unexpected runtime failure.
 */
#include "deltafin.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int df_cache_sim_main(int argc, char **argv);

#define EXIT_BAD 2

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deltafin: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(EXIT_BAD);
}

static void die_err(const df_error *e) {
    fprintf(stderr, "deltafin: %s\n", e->msg);
    exit(e->code == DF_ERR_NOMEM ? 1 : EXIT_BAD);
}

/* ---- option parsing ------------------------------------------------------------ */

typedef struct opts {
    const char *model, *prompt, *prompt_tokens, *system, *text, *decode, *tokens, *out, *isa;
    bool chat, think, print_ids, help;
    int max_new, threads, ctx, batch;
    df_sampler_params sp;
    bool temp_set, top_p_set, top_k_set;
} opts;

static long parse_long(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        die("%s expects an integer in %ld..%ld, got '%s'", flag, lo, hi, v);
    return x;
}

static float parse_float(const char *flag, const char *v) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || *end || end == v || !isfinite(x)) die("%s expects a number, got '%s'", flag, v);
    return x;
}

/* Comma- or space-separated token ids. */
static int32_t *parse_ids(const char *flag, const char *s, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX)
            die("%s: '%s' is not a list of token ids", flag, s);
        if (k == cap) ids = realloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
        ids[k++] = (int32_t)v;
        p = end;
    }
    if (!k) die("%s: no token ids given", flag);
    *n = k;
    return ids;
}

static void parse(opts *o, int argc, char **argv, const char *allowed) {
    memset(o, 0, sizeof *o);
    df_sampler_params_default(&o->sp);
    o->max_new = 128;
    o->think = true;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { o->help = true; continue; }
        if (strncmp(a, "--", 2) != 0) die("unexpected argument '%s' (see --help)", a);
        /* check the flag is one this command takes */
        char key[64];
        snprintf(key, sizeof key, " %s ", a);
        if (!strstr(allowed, key)) die("unknown option '%s' for this command (see --help)", a);
        bool is_flag = !strcmp(a, "--chat") || !strcmp(a, "--print-ids") ||
                       !strcmp(a, "--no-think") || !strcmp(a, "--think");
        if (is_flag) {
            if (!strcmp(a, "--chat")) o->chat = true;
            else if (!strcmp(a, "--print-ids")) o->print_ids = true;
            else if (!strcmp(a, "--no-think")) o->think = false;
            else o->think = true;
            continue;
        }
        if (i + 1 >= argc) die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-tokens")) o->prompt_tokens = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--decode")) o->decode = v;
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--isa")) o->isa = v;
        else if (!strcmp(a, "--max-new")) o->max_new = (int)parse_long(a, v, 0, 1 << 24);
        else if (!strcmp(a, "--threads")) o->threads = (int)parse_long(a, v, 1, 256);
        else if (!strcmp(a, "--ctx")) o->ctx = (int)parse_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--batch")) o->batch = (int)parse_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--temp")) { o->sp.temperature = parse_float(a, v); o->temp_set = true; }
        else if (!strcmp(a, "--top-p")) { o->sp.top_p = parse_float(a, v); o->top_p_set = true; }
        else if (!strcmp(a, "--top-k")) { o->sp.top_k = (int)parse_long(a, v, 0, INT_MAX); o->top_k_set = true; }
        else if (!strcmp(a, "--min-p")) o->sp.min_p = parse_float(a, v);
        else if (!strcmp(a, "--repeat-penalty")) o->sp.repeat_penalty = parse_float(a, v);
        else if (!strcmp(a, "--repeat-last-n")) o->sp.repeat_last_n = (int)parse_long(a, v, 0, INT_MAX);
        else if (!strcmp(a, "--seed")) o->sp.seed = (uint64_t)parse_long(a, v, 0, LONG_MAX);
        else die("unknown option '%s' (see --help)", a);
    }
}

static df_engine *open_engine(const opts *o) {
    if (!o->model) die("--model DIR is required (a Hugging Face checkpoint directory)");
    df_engine_opts eo = {.model_dir = o->model, .n_threads = o->threads, .isa = o->isa};
    df_engine *e;
    df_error err;
    if (df_engine_open(&e, &eo, &err)) die_err(&err);
    return e;
}

/* ---- run ------------------------------------------------------------------------- */

static const char RUN_HELP[] =
    "usage: deltafin run --model DIR (--prompt TEXT | --prompt-tokens IDS) [options]\n"
    "\n"
    "Generates a continuation and streams it to stdout.\n"
    "  --model DIR          Hugging Face checkpoint directory (config.json, *.safetensors,\n"
    "                       tokenizer.json)\n"
    "  --prompt TEXT        prompt text (special tokens such as <|im_start|> are recognised)\n"
    "  --prompt-tokens IDS  prompt as comma-separated token ids instead\n"
    "  --chat               wrap the prompt as a user turn in the model's chat template\n"
    "  --system TEXT        system message (with --chat)\n"
    "  --no-think           chat: disable thinking (Qwen3 enable_thinking=false)\n"
    "  --max-new N          at most N new tokens (default 128); stops early at end-of-turn/EOS\n"
    "  --temp T             temperature; 0 = greedy (default: generation_config.json, else 0)\n"
    "  --top-k K --top-p P --min-p P --repeat-penalty R --repeat-last-n N\n"
    "  --seed S             random seed (same seed, same output)\n"
    "  --threads N          compute threads (default: all CPUs)\n"
    "  --ctx N              context length to allocate (default: min(model max, 4096))\n"
    "  --isa PATH           kernel path: auto, avx512, avx2, c\n"
    "  --print-ids          print generated token ids instead of text\n";

static int cmd_run(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv,
          " --model --prompt --prompt-tokens --chat --system --no-think --think --max-new --temp"
          " --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed --threads --ctx --isa"
          " --print-ids ");
    if (o.help) { fputs(RUN_HELP, stdout); return 0; }
    if (!o.prompt == !o.prompt_tokens) die("give exactly one of --prompt or --prompt-tokens");
    if (o.chat && !o.prompt) die("--chat needs --prompt");
    df_engine *e = open_engine(&o);
    const df_model_info *info = df_engine_info(e);
    df_error err;

    int32_t *ids = NULL;
    size_t n = 0;
    if (o.prompt_tokens) {
        int k;
        ids = parse_ids("--prompt-tokens", o.prompt_tokens, &k);
        n = (size_t)k;
    } else {
        char *text = NULL;
        if (o.chat) {
            df_chat_msg msgs[2];
            int nm = 0;
            if (o.system) msgs[nm++] = (df_chat_msg){"system", o.system};
            msgs[nm++] = (df_chat_msg){"user", o.prompt};
            if (df_chat_render(e, msgs, nm, 1, o.think, &text, &err)) die_err(&err);
        }
        const char *p = text ? text : o.prompt;
        if (df_tokenize(e, p, strlen(p), &ids, &n, &err)) die_err(&err);
        free(text);
    }
    if (n == 0) die("the prompt is empty");

    int ctx = o.ctx ? o.ctx : (info->max_context < 4096 ? info->max_context : 4096);
    if ((size_t)ctx < n + 1) ctx = (int)n + 1;
    if (ctx > info->max_context)
        die("prompt of %zu tokens does not fit the model's %d-token context", n, info->max_context);
    df_session *s;
    if (df_session_new(&s, e, ctx, &err)) die_err(&err);
    /* The model authors' recommended sampling applies unless overridden. */
    if (!o.temp_set && info->default_temperature >= 0) o.sp.temperature = info->default_temperature;
    if (!o.top_p_set && info->default_top_p > 0) o.sp.top_p = info->default_top_p;
    if (!o.top_k_set && info->default_top_k >= 0) o.sp.top_k = info->default_top_k;
    df_sampler *smp;
    if (df_sampler_new(&smp, &o.sp, &err)) die_err(&err);

    int V = info->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (n + (size_t)o.max_new + 1));
    memcpy(hist, ids, n * sizeof(int32_t));
    size_t nh = n;
    if (df_session_eval(s, ids, (int)n, logits, 0, &err)) die_err(&err);
    df_text_stream ts = {0};
    char buf[4096];
    for (int step = 0; step < o.max_new; step++) {
        int32_t t = df_sampler_sample(smp, logits, V, hist, (int)nh);
        hist[nh++] = t;
        if (o.print_ids) {
            printf("%s%d", step ? " " : "", t);
        } else if (!df_is_stop_token(e, t)) {
            size_t w = df_text_stream_push(e, &ts, t, buf, sizeof buf);
            fwrite(buf, 1, w, stdout);
        }
        fflush(stdout);
        if (df_is_stop_token(e, t)) break;
        if (step + 1 == o.max_new) break;
        if (df_session_pos(s) + 1 > ctx) {
            fprintf(stderr, "\ndeltafin: context of %d tokens is full\n", ctx);
            break;
        }
        if (df_session_eval(s, &t, 1, logits, 0, &err)) die_err(&err);
    }
    if (!o.print_ids) {
        size_t w = df_text_stream_flush(&ts, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
    }
    printf("\n");
    free(hist);
    free(logits);
    free(ids);
    df_sampler_free(smp);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

/* ---- inspect, tokenize, logits ----------------------------------------------------- */

static int cmd_inspect(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --threads --isa ");
    if (o.help) {
        puts("usage: deltafin inspect --model DIR\n\n"
             "Prints the config, the tensor inventory (routed experts summarised per layer)\n"
             "and byte counts: always-active weights vs routed experts.");
        return 0;
    }
    df_engine *e = open_engine(&o);
    df_engine_inspect(e, stdout);
    df_engine_close(e);
    return 0;
}

static int cmd_tokenize(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --text --decode ");
    if (o.help) {
        puts("usage: deltafin tokenize --model DIR (--text TEXT | --decode IDS)\n\n"
             "--text prints the token ids of TEXT, space-separated; --decode prints the text\n"
             "of comma-separated ids.");
        return 0;
    }
    if (!o.text == !o.decode) die("give exactly one of --text or --decode");
    df_engine *e = open_engine(&o);
    df_error err;
    if (o.text) {
        int32_t *ids;
        size_t n;
        if (df_tokenize(e, o.text, strlen(o.text), &ids, &n, &err)) die_err(&err);
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    } else {
        int n;
        int32_t *ids = parse_ids("--decode", o.decode, &n);
        for (int i = 0; i < n; i++) {
            const char *b;
            size_t l;
            if (df_token_bytes(e, ids[i], &b, &l)) die("--decode: unknown token id %d", ids[i]);
            fwrite(b, 1, l, stdout);
        }
        printf("\n");
        free(ids);
    }
    df_engine_close(e);
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    opts o;
    parse(&o, argc, argv, " --model --tokens --out --threads --isa --batch ");
    if (o.help) {
        puts("usage: deltafin logits --model DIR --tokens IDS --out FILE [--batch N] [--threads N]\n\n"
             "Evaluates the token sequence from position 0 and writes the logits of every\n"
             "row to FILE as little-endian float32 [T][vocab]. --batch N feeds the tokens N\n"
             "at a time (the results must not depend on it).");
        return 0;
    }
    if (!o.tokens || !o.out) die("--tokens and --out are required");
    int n;
    int32_t *ids = parse_ids("--tokens", o.tokens, &n);
    df_engine *e = open_engine(&o);
    const df_model_info *info = df_engine_info(e);
    if (n > info->max_context) die("%d tokens exceed the model's context of %d", n, info->max_context);
    df_error err;
    df_session *s;
    if (df_session_new(&s, e, n, &err)) die_err(&err);
    size_t V = (size_t)info->vocab_size;
    float *lg = malloc(sizeof(float) * V * (size_t)n);
    int step = o.batch ? o.batch : n;
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        if (df_session_eval(s, ids + i, k, lg + (size_t)i * V, 1, &err)) die_err(&err);
    }
    FILE *f = fopen(o.out, "wb");
    if (!f) die("%s: cannot create: %s", o.out, strerror(errno));
    if (fwrite(lg, sizeof(float), V * (size_t)n, f) != V * (size_t)n || fclose(f) != 0)
        die("%s: write failed", o.out);
    free(lg);
    free(ids);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}

/* ---- dispatch ---------------------------------------------------------------------- */

static const char MAIN_HELP[] =
    "usage: deltafin COMMAND [options]    (deltafin COMMAND --help for details)\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt\n"
    "  inspect    print a checkpoint's config, tensors and byte counts\n"
    "  tokenize   text to token ids and back\n"
    "  logits     write the logits of a token sequence to a file\n"
    "  cache-sim  replay a routing trace through the expert cache policies\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(MAIN_HELP, stdout);
        return argc < 2 ? EXIT_BAD : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(cmd, "cache-sim")) return df_cache_sim_main(argc - 2, argv + 2);
    die("unknown command '%s' (see deltafin --help)", cmd);
}
