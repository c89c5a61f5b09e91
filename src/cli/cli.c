/*
 * cli/cli.c - the options of run, logits, inspect, tokenize, serve and bench:
 * one table (each option's help is written once, whatever command lists it),
 * the sections of the product commands, and what they share around it
 * (engine options, token id lists, the draft's share of a RAM budget).
 */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define F(f) CLI_FIELD(cli_args, f)
#define A(dst) ((cli_args *)(dst))

/* ---- setters with more to them than the field ------------------------------------ */

/* The sampling options' ranges are checked here, naming the option (the
 * sampler checks the same and would name its own field). */
static bool unit_open_low(float x) { return x > 0 && x <= 1; }
static bool unit_open_high(float x) { return x >= 0 && x < 1; }

static int set_temp(const cli_opt *o, void *dst, const char *v) {
    A(dst)->temp_set = true;
    return cli_set_nonneg(o, dst, v);
}

static int set_top_p(const cli_opt *o, void *dst, const char *v) {
    A(dst)->top_p_set = true;
    return cli_set_float_if(o, dst, v, unit_open_low, "a number in (0, 1]");
}

static int set_min_p(const cli_opt *o, void *dst, const char *v) {
    return cli_set_float_if(o, dst, v, unit_open_high, "a number in [0, 1)");
}

static int set_top_k(const cli_opt *o, void *dst, const char *v) {
    A(dst)->top_k_set = true;
    return cli_set_int(o, dst, v);
}

static int set_max_new(const cli_opt *o, void *dst, const char *v) {
    A(dst)->max_new_set = true;
    return cli_set_int(o, dst, v);
}

static int set_seed(const cli_opt *o, void *dst, const char *v) {
    long x;
    cli_opt lo = *o;
    lo.off = 0;
    if (cli_set_long(&lo, &x, v)) return 1;
    A(dst)->sp.seed = (uint64_t)x;
    return 0;
}

static int set_teacher(const cli_opt *o, void *dst, const char *v) {
    A(dst)->teacher_set = true;
    return cli_set_long(o, dst, v);
}

static int set_sim_disk(const cli_opt *o, void *dst, const char *v) {
    if (cli_set_float(o, dst, v)) return 1;
    if (A(dst)->sim_disk <= 0) {
        cli_error("--sim-disk expects a bandwidth in GB/s above 0, got '%s'", v);
        return 1;
    }
    return 0;
}

static int set_nonempty(const cli_opt *o, void *dst, const char *v) {
    if (!*v) {
        cli_error("%s must not be empty", o->name);
        return 1;
    }
    return cli_set_str(o, dst, v);
}

/* A size, or 0 (with or without a unit): no RAM tier. */
static int set_pc_ram(const cli_opt *o, void *dst, const char *v) {
    uint64_t b;
    cli_opt lo = *o;
    lo.off = 0;
    char *end;
    double zero = strtod(v, &end);
    if (end != v && (v[0] == '0' || v[0] == '.') && zero == 0 && strspn(end, "kKmMgGtTiBb") == strlen(end)) {
        A(dst)->prompt_cache_ram = 0;
        return 0;
    }
    if (cli_set_size(&lo, &b, v)) return 1;
    A(dst)->prompt_cache_ram = (int64_t)(b > INT64_MAX ? INT64_MAX : b);
    return 0;
}

static int set_rank0_experts(const cli_opt *o, void *dst, const char *v) {
    (void)o;
    if (strcmp(v, "yes") && strcmp(v, "no")) {
        cli_error("--rank0-experts expects yes or no, got '%s'", v);
        return 1;
    }
    A(dst)->rank0_no_experts = !strcmp(v, "no");
    return 0;
}

/* ---- the table --------------------------------------------------------------------- */

const cli_opt CLI_OPTS[] = {
    /* model and engine */
    {"--model", "DIR", "Hugging Face checkpoint directory (config.json, *.safetensors,\n"
     "tokenizer.json)", cli_set_str, F(model), 0, 0},
    {"--threads", "N", "compute threads (1..256, default: all CPUs)", cli_set_int, F(threads), 1, 256},
    {"--isa", "PATH", "kernel path: auto, avx512, avx2, c", cli_set_str, F(isa), 0, 0},
    {"--ctx", "N", "context length to allocate: it holds the prompt and every new\n"
     "token, at most the model's maximum (default: min(model max,\n"
     "4096); run without --ram-budget grows it to fit the prompt and\n"
     "--max-new)", cli_set_int, F(ctx), 1, 1 << 24},
    {"--chunk", "N", "prompt rows evaluated together, layer by layer, so each expert\n"
     "is read once per chunk (1..65536, default 512; at most --ctx)", cli_set_int, F(chunk), 1, 65536},
    {"--experts", "DIRS", "stream routed experts from an expert pack (deltafin pack);\n"
     "comma-separated directories, one per drive, none empty. Without\n"
     "a budget the cache holds every expert, or what available memory\n"
     "allows", cli_set_str, F(experts), 0, 0},
    {"--ram-budget", "SIZE", "keep the whole process within SIZE (e.g. 8G): the expert cache\n"
     "gets what the always-active weights, the tokenizer and a --ctx\n"
     "session leave; without --experts, experts stream from the\n"
     "safetensors (page cache). run --stats: the estimate vs the peak",
     cli_set_size, F(ram_budget), 0, 0},
    {"--expert-cache", "SIZE", "size the expert cache directly instead of from --ram-budget", cli_set_size,
     F(expert_cache), 0, 0},
    {"--config-only", NULL, "inspect: from config.json alone (the tensors need not exist): sizes\n"
     "as shipped and, with --ram and --drive-bw, the expected decode speed", cli_set_true, F(config_only), 0, 0},
    {"--ram", "SIZE", "inspect --config-only: the machine's RAM", cli_set_size, F(ram), 0, 0},
    {"--drive-bw", "GB/S", "inspect --config-only: the drives' read bandwidth, all together", cli_set_nonneg,
     F(drive_bw), 0, 0},
    {"--policy", "P", "expert cache policy: deltafin (default) or lru", cli_set_str, F(policy), 0, 0},
    {"--prefetch", "MODE", "read predicted experts ahead of need: on (per layer the better\n"
     "of the router lookahead and the previous token's experts while\n"
     "its running recall pays), router, prev, off (default: on this\n"
     "project's test machine it has not paid yet; docs/prefetch.md)", cli_set_str, F(prefetch), 0, 0},
    {"--pin", "SIZE", "pinned tier: the hottest experts by the heat histogram kept next\n"
     "to the pack (experts.heat) are read at start-up and never evicted", cli_set_size, F(pin), 0, 0},
    {"--experts-by-rank", NULL, "under mpirun: rank 0 runs the model, every rank computes its\n"
     "share of the routed experts from its own expert source (its own\n"
     "--experts, \"{rank}\" replaced by its number; README: Several\n"
     "machines)", cli_set_true, F(experts_by_rank), 0, 0},
    {"--rank-timeout", "S", "--experts-by-rank: seconds rank 0 waits for a rank's answer\n"
     "before failing (default 60)", cli_set_positive, F(rank_timeout), 0, 0},
    {"--rank0-experts", "yes|no", "--experts-by-rank: whether rank 0 owns experts too (default yes)",
     set_rank0_experts, 0, 0, 0},
    {"--rank-bandwidth", "GB/S", "--experts-by-rank: this rank's drive bandwidth for the plan\n"
     "(default or 0: measured on its pack)", cli_set_nonneg, F(rank_bw), 0, 0},
    {"--prompt-cache", "DIR", "keep session states in DIR, keyed by the model and the tokens\n"
     "before them: a prompt that starts like an earlier one (also\n"
     "after a restart, or from another process) prefills only the\n"
     "rest, with the same output (README: Prompt cache)", set_nonempty, F(prompt_cache), 0, 0},
    {"--prompt-cache-size", "SIZE", "most bytes of files in the --prompt-cache directory (default\n"
     "4G); least recently used go first", cli_set_size, F(prompt_cache_size), 0, 0},
    {"--prompt-cache-every", "N", "store a long prompt's state every N positions too, besides its\n"
     "end (default 1024)", cli_set_int, F(prompt_cache_every), 1, 1 << 24},
    {"--prompt-cache-ram", "SIZE", "serve: recent states also kept in RAM, so that the next turn\n"
     "resumes without a disk read (default 256M; 0: none; counted in\n"
     "--ram-budget)", set_pc_ram, 0, 0, 0},
    /* run: prompt and chat */
    {"--prompt", "TEXT", "prompt text (the tokenizer's special tokens are recognised)", cli_set_str, F(prompt), 0,
     0},
    {"--prompt-tokens", "IDS", "prompt as comma-separated token ids instead", cli_set_str, F(prompt_tokens), 0, 0},
    {"--chat", NULL, "wrap the prompt (tokenize: --text) as a user turn in the model's\n"
     "chat template", cli_set_true, F(chat), 0, 0},
    {"--system", "TEXT", "system message (with --chat)", cli_set_str, F(system), 0, 0},
    {"--no-think", NULL, "chat: turn the chat template's thinking switch off (for a\n"
     "template that has one)", cli_set_false, F(think), 0, 0},
    {"--think", NULL, NULL, cli_set_true, F(think), 0, 0},
    /* sampling */
    {"--max-new", "N", "at most N new tokens (default 128); 0: no limit. Generation also\n"
     "ends at end-of-turn/EOS, or when the context is full (said on\n"
     "stderr); each is a normal end, exit status 0. serve: the default\n"
     "of a request without max_tokens (default: what the context holds)",
     set_max_new, F(max_new), 0, 1 << 24},
    {"--temp", "T", "temperature; 0 = greedy (default: generation_config.json, else\n"
     "run 0, serve 1; a request's own value wins)", set_temp, F(sp.temperature), 0, 0},
    {"--top-k", "K", "keep the K most likely tokens (0: all; default:\n"
     "generation_config.json)", set_top_k, F(sp.top_k), 0, INT_MAX},
    {"--top-p", "P", "nucleus sampling (1: off; default: generation_config.json; a\n"
     "request's own value wins)", set_top_p, F(sp.top_p), 0, 0},
    {"--min-p", "P", "drop tokens less likely than P times the most likely (0: off)", set_min_p,
     F(sp.min_p), 0, 0},
    {"--repeat-penalty", "R", "divide the logits of recent tokens by R (1: off)", cli_set_positive,
     F(sp.repeat_penalty), 0, 0},
    {"--repeat-last-n", "N", "the tokens --repeat-penalty looks back over (0: all)", cli_set_int,
     F(sp.repeat_last_n), 0, INT_MAX},
    {"--seed", "S", "random seed (same seed, same output)", set_seed, 0, 0, LONG_MAX},
    /* run: output and statistics */
    {"--print-ids", NULL, "print generated token ids instead of text", cli_set_true, F(print_ids), 0, 0},
    {"--stats", NULL, "per-token and summary statistics on stderr: tokens/s, expert\n"
     "bytes read, cache hits/misses, read wait vs compute, bandwidth", cli_set_true, F(stats), 0, 0},
    {"--events", "FILE", "the same statistics as JSON lines", cli_set_str, F(events), 0, 0},
    {"--io-bw", "GB/S", "measured device bandwidth: --stats then reports the I/O bound\n"
     "(bandwidth / bytes missed per token) and the fraction reached\n"
     "(0: none)", cli_set_nonneg, F(io_bw), 0, 0},
    /* speculative decoding */
    {"--draft", "DIR|lookup", "speculative decoding, same output as without: DIR is a draft\n"
     "checkpoint sharing the target's tokenizer (run in RAM), lookup\n"
     "continues earlier matches of the last tokens (no model). A gate\n"
     "measures cost and acceptance, picks the depth and turns drafting\n"
     "off when it does not pay; run --stats reports it. With sampling\n"
     "the output is the same as without --draft for the same seed (a\n"
     "draft is accepted when it is the token the sampler draws there)",
     cli_set_str, F(draft), 0, 0},
    {"--draft-k", "N", "most tokens drafted per pass (1..16, default 8)", cli_set_int, F(draft_k), 1, 16},
    {"--lookup-n", "N", "lookup: longest n-gram matched (1..16, default 3)", cli_set_int, F(lookup_n), 1, 16},
    {"--draft-rejection", NULL, "standard rejection sampling: the same distribution, higher\n"
     "acceptance for a draft model, but not the same sample", cli_set_true, F(draft_rejection), 0, 0},
    /* tokenize and logits */
    {"--text", "TEXT", "print the token ids of TEXT, space-separated", cli_set_str, F(text), 0, 0},
    {"--decode", "IDS", "print the text of comma-separated ids", cli_set_str, F(decode), 0, 0},
    {"--tokens", "IDS", "the token sequence, comma-separated ids", cli_set_str, F(tokens), 0, 0},
    {"--out", "FILE", "where the logits go: little-endian float32 [T][vocab]", cli_set_str, F(out), 0, 0},
    {"--batch", "N", "feed the tokens N at a time (the results must not depend on it)", cli_set_int, F(batch),
     1, 1 << 24},
    /* serve */
    {"--host", "ADDR", "address to bind (default 127.0.0.1)", cli_set_str, F(host), 0, 0},
    {"--port", "N", "TCP port (default 8080)", cli_set_int, F(port), 1, 65535},
    {"--queue", "N", "requests that may wait behind the running ones (default 8);\n"
     "beyond that the answer is 429 with Retry-After", cli_set_int, F(queue), 0, 4096},
    {"--api-key-file", "PATH", "require 'Authorization: Bearer KEY' (all but /health), KEY\n"
     "being the first line of PATH; without this option or\n"
     "--api-key, the environment variable DELTAFIN_API_KEY is the key\n"
     "if set", cli_set_str, F(api_key_file), 0, 0},
    {"--api-key", "KEY", "the same with KEY given here, where every local user can\n"
     "read it (ps, /proc): prefer the file or the environment", set_nonempty, F(api_key), 0, 0},
    {"--insecure-bind", NULL, "allow a non-loopback --host without an API key", cli_set_true, F(insecure_bind), 0,
     0},
    {"--max-body", "BYTES", "largest request body (default 1M); larger gets 413", cli_set_size, F(max_body), 0, 0},
    {"--request-timeout", "S", "a request (headers and body) must arrive whole within S\n"
     "seconds of connecting (default 30), else it is closed", cli_set_int, F(request_timeout), 1, 3600},
    {"--max-conns-per-ip", "N", "connections one client address may hold at once (default\n"
     "32; 256 in all); raise it behind a reverse proxy", cli_set_int, F(max_per_ip), 1, 256},
    /* batch */
    {"--input", "FILE", "the jobs: OpenAI Batch API input, one JSON object a line\n"
     "(custom_id, method POST, url /v1/chat/completions or\n"
     "/v1/completions, body)", cli_set_str, F(input), 0, 0},
    {"--output", "FILE", "the results, one JSON line per job (OpenAI Batch API output);\n"
     "jobs whose custom_id it already holds are skipped, so the same\n"
     "command started again finishes what an interrupted run left",
     cli_set_str, F(output), 0, 0},
    {"--parallel", "N", "requests (serve), jobs (batch) or sequences (bench)\n"
     "decoded together (1..64, default 4; serve: 1 with --draft):\n"
     "their rows share each forward pass, and each expert is read\n"
     "once for all of them; each has its own session (--ram-budget\n"
     "counts N); serve --draft lookup drafts for each (a draft\n"
     "model: --parallel 1 only)", cli_set_int, F(parallel), 1, 64},
    /* benchmark and test controls: `deltafin bench` only */
    {"--replay-routing", "TRACE", "MoE layers use the expert ids of the trace's next token\n"
     "(# moe-routing-trace v1; one trace token per evaluated row,\n"
     "wrapping around at the end) instead of the router's top-k. The\n"
     "router still runs; the weights are its own probabilities of those\n"
     "ids (renormalised like the model's top-k). Trace MoE\n"
     "layers/experts/top-k must match the model. The output is not the\n"
     "model's: --stats and --events mark it", cli_set_str, F(replay), 0, 0},
    {"--sim-disk", "GB/S", "hand expert reads over no earlier than a disk of this\n"
     "bandwidth, serving reads in order with no credit for idle time,\n"
     "would (needs --experts and a faster real disk; the bytes still\n"
     "come from the pack). Sets --io-bw's default", set_sim_disk, F(sim_disk), 0, 0},
    {"--prefetch-depth", "N", "MoE layers ahead the router lookahead runs (1..8, default 1)", cli_set_int,
     F(prefetch_depth), 1, 8},
    {"--prefetch-min-recall", "R", "the prefetch gate's recall threshold (default 0.5)", cli_set_share,
     F(prefetch_min_recall), 0, 0},
    {"--prefetch-min-precision", "P", "with --prefetch on, read a prediction only if at least\n"
     "this share of its rank's earlier uncached ones was used (0.5)", cli_set_share,
     F(prefetch_min_precision), 0, 0},
    {"--draft-fixed", "N", "always draft N tokens, no gate (needs --draft)", cli_set_int, F(draft_fixed), 1, 16},
    {"--teacher-force", "SEED", "feed seeded random tokens instead of the sampled ones, so\n"
     "routing cannot settle into a loop (0: off, the arm's default\n"
     "with --draft, whose drafts need the model's own tokens)", set_teacher, F(teacher_seed), 0, LONG_MAX},
    {"--random-prompt", "N", "a seeded random prompt of N tokens instead of --prompt\n"
     "(--prompt-seed S, default 1)", cli_set_int, F(random_prompt), 1, 1 << 24},
    {"--prompt-seed", "S", NULL, cli_set_long, F(prompt_seed), 0, LONG_MAX},
    {0},
};

const char CLI_BENCH_ONLY[] = "--replay-routing --sim-disk --prefetch-depth --prefetch-min-recall "
                              "--prefetch-min-precision --draft-fixed --teacher-force --random-prompt "
                              "--prompt-seed";

#define ENGINE_NAMES "--threads --isa --ctx --chunk --experts --ram-budget --expert-cache --policy --prefetch --pin"
#define PCACHE_NAMES "--prompt-cache --prompt-cache-size --prompt-cache-every"
#define SAMPLING_NAMES "--temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n"
#define DRAFT_NAMES "--draft --draft-k --lookup-n --draft-rejection"
#define RANK_SECTION {"experts by rank (mpirun)", "--experts-by-rank --rank-timeout --rank0-experts --rank-bandwidth"}

const cli_section CLI_RUN_SECTIONS[] = {
    {NULL, "--model --prompt --prompt-tokens --chat --system --no-think --think"},
    {"sampling", "--max-new " SAMPLING_NAMES " --seed"},
    {"engine", ENGINE_NAMES},
    {"prompt cache", PCACHE_NAMES},
    {"output", "--print-ids --stats --events --io-bw"},
    {"speculative decoding", DRAFT_NAMES},
    RANK_SECTION,
    {0},
};

const cli_section CLI_LOGITS_SECTIONS[] = {
    {NULL, "--model --tokens --out --batch"},
    {"engine", ENGINE_NAMES},
    RANK_SECTION,
    {0},
};

const cli_section CLI_SERVE_SECTIONS[] = {
    {NULL, "--model --host --port --parallel --queue --api-key-file --api-key --insecure-bind --max-body "
           "--request-timeout --max-conns-per-ip"},
    {"defaults of a request", "--max-new " SAMPLING_NAMES " --no-think --think"},
    {"engine", ENGINE_NAMES},
    {"prompt cache", PCACHE_NAMES " --prompt-cache-ram"},
    {"speculative decoding (every request)", DRAFT_NAMES},
    RANK_SECTION,
    {0},
};

const cli_section CLI_BATCH_SECTIONS[] = {
    {NULL, "--model --input --output --parallel"},
    {"defaults of a job", "--max-new " SAMPLING_NAMES " --seed --no-think --think"},
    {"engine", ENGINE_NAMES},
    {"prompt cache", PCACHE_NAMES},
    {"speculative decoding (every job; lookup only)", DRAFT_NAMES},
    RANK_SECTION,
    {0},
};

/* ---- shared around the table ------------------------------------------------------- */

void cli_args_init(cli_args *a) {
    memset(a, 0, sizeof *a);
    df_sampler_params_default(&a->sp);
    a->max_new = 128;
    a->think = true;
    a->host = "127.0.0.1";
    a->port = 8080;
    a->queue = 8;
    a->max_body = 1 << 20;
    a->request_timeout = 30;
    a->max_per_ip = 32;
    a->parallel = 0; /* serve: 4, or 1 with --draft */
    a->prompt_cache_ram = -1;
}

df_engine_opts cli_engine_opts(const cli_args *a) {
    if (a->pin && !a->experts) cli_die("--pin needs --experts (it pins the hottest experts of a pack)");
    return (df_engine_opts){.model_dir = a->model, .n_threads = a->threads, .isa = a->isa,
                            .experts = a->experts, .ram_budget = a->ram_budget, .context = a->ctx,
                            .expert_cache = a->expert_cache, .cache_policy = a->policy,
                            .pin_bytes = a->pin, .prefill_chunk = a->chunk, .prefetch = a->prefetch,
                            .describe_only = a->describe_only, .prompt_cache = a->prompt_cache,
                            .prompt_cache_size = a->prompt_cache_size,
                            .prompt_cache_every = a->prompt_cache_every,
                            .experts_by_rank = a->experts_by_rank, .rank_timeout_s = a->rank_timeout,
                            .rank0_no_experts = a->rank0_no_experts, .rank_bandwidth_gbs = a->rank_bw};
}

void cli_die_err(const df_error *e) {
    fprintf(stderr, "deltafin: %s\n", e->msg);
    exit(e->code == DF_ERR_NOMEM ? 1 : CLI_EXIT_BAD);
}

int32_t *cli_parse_ids(const char *flag, const char *s, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    /* ids separated by one comma or by white space; an empty entry ("1,,2",
     * "1,") is refused, not skipped */
    const char *p = s + strspn(s, " \n\t");
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && !strchr(", \n\t", *end)))
            cli_die("%s: '%s' is not a list of token ids", flag, s);
        if (k == cap) ids = realloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
        ids[k++] = (int32_t)v;
        p = end + strspn(end, " \n\t");
        if (*p == ',') {
            p++;
            p += strspn(p, " \n\t");
            if (!*p || *p == ',') cli_die("%s: '%s' has an empty entry", flag, s);
        }
    }
    if (!k) cli_die("%s: no token ids given", flag);
    *n = k;
    return ids;
}

int cli_reserve_draft(df_engine_opts *eo, const char *draft, int draft_k, char *what, size_t what_size,
                      df_error *err) {
    if (!draft || !eo->ram_budget) return DF_OK;
    df_spec_opts so = {.draft = draft, .k_max = draft_k, .isa = eo->isa};
    int rc = df_spec_draft_bytes(&so, 0, eo->context ? eo->context : 4096, &eo->reserve_bytes, err);
    if (rc) return rc;
    snprintf(what, what_size, "the draft %s", strcmp(draft, "lookup") ? draft : "(lookup)");
    eo->reserve_for = what;
    return DF_OK;
}

int cli_parallel_opts(const cli_args *a, int n, df_engine_opts *eo, char *what, size_t what_size, df_error *err) {
    *eo = cli_engine_opts(a);
    eo->sessions = n;
    int rc = cli_reserve_draft(eo, a->draft, a->draft_k, what, what_size, err);
    eo->reserve_bytes *= (uint64_t)n;
    return rc;
}

void cli_get_stats(const df_engine *e, const cli_dev *dev, cli_stats *o) {
    memset(o, 0, sizeof *o);
    df_engine_stats(e, &o->s);
    if (dev && dev->stats) dev->stats(e, &o->d);
}

/* The engine of run, logits and inspect: --model, the draft's share of a
 * budget, and a --ctx the model can hold. */
df_engine *cli_open_engine(const cli_args *a, const cli_dev *dev) {
    if (!a->model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    df_error err;
    df_engine_opts eo = cli_engine_opts(a);
    static char what[600];
    if (cli_reserve_draft(&eo, a->draft, a->draft_k, what, sizeof what, &err)) cli_die_err(&err);
    df_engine *e;
    if (dev && dev->open ? dev->open(&e, &eo, a, &err) : df_engine_open(&e, &eo, &err)) cli_die_err(&err);
    cli_serve_rank(e);
    int max = df_engine_info(e)->max_context;
    if (a->ctx > max) cli_die("--ctx %d exceeds the model's context of %d tokens", a->ctx, max);
    return e;
}

void cli_serve_rank(df_engine *e) {
    if (!df_engine_is_worker(e)) return;
    df_error err;
    int rc = df_engine_work(e, &err);
    df_engine_close(e);
    if (rc) cli_die_err(&err);
    exit(0);
}
