/*
 * cli/serve.c - `deltafin serve`: its options (the server's own, the request
 * defaults, and run's engine and drafting options through the shared table),
 * the API key, the address to listen on, opening the engine and the drafter,
 * then the server (src/server). `deltafin bench serve` comes here through
 * cli_serve with its hooks.
 */
#include "cli/cli.h"
#include "server/server.h"
#include "util/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#define API_KEY_ENV "DELTAFIN_API_KEY"
#define DEFAULT_PC_RAM ((uint64_t)256 << 20) /* --prompt-cache-ram */

static const cli_cmd SERVE_CMD = {
    .usage = "usage: deltafin serve --model DIR [options]\n"
             "\n"
             "Serves the model over an OpenAI-compatible HTTP API (see docs/server.md):\n"
             "GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health,\n"
             "GET /metrics (Prometheus). Up to --parallel requests are decoded together;\n"
             "others queue.\n",
    .table = CLI_OPTS, .sections = {CLI_SERVE_SECTIONS}, .bench_only = CLI_BENCH_ONLY,
    .bench_where = "deltafin bench serve", .refused = "--replay-routing",
    .refused_why = "is for benchmarks and tests only: the server refuses it (its output would not be the "
                   "model's own)"};

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
static void resolve_api_key(cli_args *a) {
    if (a->api_key && a->api_key_file) cli_die("--api-key and --api-key-file both given: give the key once");
    if (a->api_key_file) {
        a->api_key = read_key_file(a->api_key_file);
    } else if (!a->api_key) {
        const char *env = getenv(API_KEY_ENV);
        if (env && !*env) cli_die("%s is set but empty: unset it, or set it to the key", API_KEY_ENV);
        a->api_key = env;
    }
}

static bool is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* --host and --port as a socket address; a public one needs an API key. */
static socklen_t listen_addr(const cli_args *a, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    const char *host = !strcmp(a->host, "localhost") ? "127.0.0.1" : a->host;
    socklen_t len;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)a->port);
        len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)a->port);
        len = sizeof *a6;
    } else {
        cli_die("--host expects an IPv4 or IPv6 address, got '%s'", a->host);
    }
    if (!is_loopback((struct sockaddr *)ss) && !a->api_key && !a->insecure_bind)
        cli_die("refusing to serve %s without an API key (--api-key-file, %s or --api-key; "
                "add --insecure-bind to do it anyway)", a->host, API_KEY_ENV);
    return len;
}

/* A start-up step failed: says why, and gives the exit status (1 out of
 * memory, else CLI_EXIT_BAD), as `deltafin run` does for the same errors. */
static int start_failed(const df_error *err) {
    fprintf(stderr, "deltafin: %s\n", err->msg);
    return err->code == DF_ERR_NOMEM ? 1 : CLI_EXIT_BAD;
}

static void free_specs(df_spec **specs, int n) {
    for (int i = 0; specs && i < n; i++) df_spec_free(specs[i]);
    free(specs);
}

/* The engine and a drafter per slot; nonzero: the exit status (said why). */
static int open_engine(const cli_args *a, const cli_dev *dev, df_engine **eng, df_spec ***specs) {
    df_engine_opts eo; /* each request in the batch has its own session, and a drafter per slot */
    df_error err;
    char what[600], both[700];
    if (cli_parallel_opts(a, a->parallel, &eo, what, sizeof what, &err)) return start_failed(&err);
    if (a->prompt_cache) { /* the RAM tier is part of what the budget holds */
        eo.prompt_cache_ram = a->prompt_cache_ram >= 0 ? (uint64_t)a->prompt_cache_ram : DEFAULT_PC_RAM;
        if (eo.ram_budget && eo.prompt_cache_ram) {
            snprintf(both, sizeof both, "%s%sthe prompt cache's RAM tier", eo.reserve_bytes ? what : "",
                     eo.reserve_bytes ? " and " : "");
            eo.reserve_bytes += eo.prompt_cache_ram;
            eo.reserve_for = both;
        }
    }
    if (dev && dev->open ? dev->open(eng, &eo, a, &err) : df_engine_open(eng, &eo, &err)) return start_failed(&err);
    cli_serve_rank(*eng); /* a worker rank of --experts-by-rank serves rank 0, not HTTP */
    int max = df_engine_info(*eng)->max_context;
    if (a->ctx > max) { /* as `deltafin run` does: a context the model cannot use */
        fprintf(stderr, "deltafin: --ctx %d exceeds the model's context of %d tokens\n", a->ctx, max);
        df_engine_close(*eng);
        return CLI_EXIT_BAD;
    }
    *specs = NULL;
    if (!a->draft) return 0;
    df_spec_opts so = {.draft = a->draft, .k_max = a->draft_k, .lookup_n = a->lookup_n, .n_threads = a->threads,
                       .isa = a->isa, .rejection = a->draft_rejection};
    if (a->draft_fixed && !a->draft_k) so.k_max = a->draft_fixed > 8 ? a->draft_fixed : 0;
    *specs = df_xcalloc((size_t)a->parallel, sizeof **specs);
    for (int i = 0; i < a->parallel; i++) {
        if (df_spec_new(&(*specs)[i], *eng, &so, &err)) {
            int rc = start_failed(&err); /* said before the engine's own close-time warnings */
            free_specs(*specs, a->parallel);
            *specs = NULL;
            df_engine_close(*eng);
            return rc;
        }
        if (dev && dev->spec_ready) dev->spec_ready((*specs)[i], a);
    }
    return 0;
}

int cli_serve(cli_args *a, const cli_dev *dev) {
    if (a->ctx == 1) cli_die("--ctx expects an integer in 2..%d, got '1'", 1 << 24);
    if (!a->draft && (a->draft_k || a->lookup_n || a->draft_fixed || a->draft_rejection))
        cli_die(dev ? "--draft-k, --lookup-n, --draft-fixed and --draft-rejection need --draft"
                    : "--draft-k, --lookup-n and --draft-rejection need --draft");
    if (!a->model) cli_die("--model DIR is required (a Hugging Face checkpoint directory)");
    /* every slot of a batch drafts with its own drafter: a draft model would
     * be loaded once per slot */
    if (a->draft && strcmp(a->draft, "lookup") != 0 && a->parallel > 1)
        cli_die("a draft model (--draft DIR) works with --parallel 1 only: each request in a batch would need its "
                "own copy of it (--draft lookup works with any --parallel)");
    if (!a->parallel) a->parallel = a->draft ? 1 : 4;
    if (!a->prompt_cache && (a->prompt_cache_size || a->prompt_cache_every || a->prompt_cache_ram >= 0))
        cli_die("--prompt-cache-size, --prompt-cache-every and --prompt-cache-ram need --prompt-cache");
    resolve_api_key(a);
    struct sockaddr_storage ss;
    socklen_t ss_len = listen_addr(a, &ss);
    df_engine *eng;
    df_spec **specs;
    int rc = open_engine(a, dev, &eng, &specs);
    if (rc) return rc;
    const df_model_info *info = df_engine_info(eng);
    char model_id[256];
    const char *base = strrchr(a->model, '/');
    base = base && base[1] ? base + 1 : a->model;
    snprintf(model_id, sizeof model_id, "%s", base);
    size_t ml = strlen(model_id);
    while (ml > 1 && model_id[ml - 1] == '/') model_id[--ml] = 0;
    srv_config cfg = {.addr = (struct sockaddr *)&ss, .addr_len = ss_len, .host = a->host, .port = a->port,
                      .api_key = a->api_key, .max_body = a->max_body, .queue = a->queue, .parallel = a->parallel,
                      .request_timeout = a->request_timeout, .max_per_ip = a->max_per_ip,
                      .ctx = a->ctx ? a->ctx : (info->max_context < 4096 ? info->max_context : 4096),
                      .model_id = model_id, .sp = a->sp, .temp_set = a->temp_set, .top_p_set = a->top_p_set,
                      .top_k_set = a->top_k_set, .max_new = a->max_new_set ? a->max_new : 0, .think = a->think};
    rc = srv_run(&cfg, eng, specs);
    free_specs(specs, a->parallel);
    df_engine_close(eng);
    return rc;
}

int cli_serve_main(int argc, char **argv) {
    cli_args a;
    cli_args_init(&a);
    int rc = cli_parse(&SERVE_CMD, &a, argc, argv);
    return rc ? (rc == CLI_HELP ? 0 : rc) : cli_serve(&a, NULL);
}
