/*
 * cli/bench_multi.c - `deltafin bench --parallel N`: the benchmark arm with N
 * sequences decoded together (bench/suite.sh's concurrency section). Each
 * sequence has its own seeded random prompt and its own teacher-forced
 * tokens; the prompts are prefilled in one df_eval_multi, then every decode
 * step is one df_eval_multi holding one row of each sequence, so a MoE layer
 * reads each expert once for all the rows routed to it. With
 * --replay-routing each sequence replays its own stretch of the trace
 * (sequence i from token i x (prompt + decode) on: df_session_replay_from),
 * as unrelated requests would route, not neighbouring tokens side by side. The arm's JSON summary (cli_summary) counts
 * the decode of all sequences (tokens_per_s is the aggregate) and adds the
 * per-sequence speed and the expert bytes read per decoded token.
 */
#include "cli/cli.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

/* The LCG of run.c's random prompt and teacher forcing. */
static int32_t next_token(uint64_t *r, int V) {
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((*r >> 33) % (uint64_t)V);
}

/* One JSON line: cli_summary's, with the concurrency fields added before its
 * closing brace. */
static void arm_json(const df_model_info *info, const cli_stats *st0, const cli_stats *a, const cli_stats *b,
                     size_t n_prompt, double prefill_s, int n, int steps, double dec_s, double io_bw,
                     uint64_t ram_budget, uint64_t io_dec) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) cli_die("out of memory");
    int n_dec = n * steps;
    cli_summary(m, false, info, st0, a, b, n_prompt, prefill_s, n_dec, dec_s, io_bw, ram_budget, io_dec);
    fclose(m);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '}')) buf[--len] = 0;
    double tps = dec_s > 0 ? n_dec / dec_s : 0;
    uint64_t xb = b->s.expert_bytes_read - a->s.expert_bytes_read;
    printf("%s,\"parallel\":%d,\"steps\":%d,\"tokens_per_s_per_seq\":%.6f,\"expert_bytes_per_token\":%.1f}\n",
           buf, n, steps, tps / n, n_dec ? (double)xb / n_dec : 0.0);
    fflush(stdout);
    free(buf);
}

int cli_bench_parallel(cli_args *a, const cli_dev *dev) {
    int n = a->parallel;
    if (!a->random_prompt) a->random_prompt = 512;
    if (!a->teacher_set) a->teacher_seed = 7;
    if (!a->max_new_set) a->max_new = 513; /* the first token comes from the prompt */
    if (a->prompt || a->prompt_tokens) cli_die("--parallel takes --random-prompt N (each sequence its own)");
    if (a->draft) cli_die("--parallel cannot be combined with --draft");
    if (a->teacher_seed == 0) cli_die("--parallel decodes teacher forced: --teacher-force must not be 0");
    if (a->ram_budget && n > 1) cli_die("--parallel with --ram-budget: size the cache with --expert-cache");
    if (a->sim_disk > 0 && a->io_bw <= 0) a->io_bw = a->sim_disk;
    df_engine *e = cli_open_engine(a, dev);
    const df_model_info *info = df_engine_info(e);
    int plen = a->random_prompt, steps = a->max_new - 1, V = info->vocab_size;
    int ctx = a->ctx ? a->ctx : plen + a->max_new + 1;
    if (steps < 1) cli_die("--parallel needs --max-new of at least 2");
    if (plen + a->max_new >= ctx) cli_die("--ctx %d holds no prompt of %d plus %d new tokens", ctx, plen, a->max_new);
    df_error err;
    df_batcher *bt;
    if (df_batcher_new(&bt, e, 0, ctx, &err)) cli_die_err(&err);
    df_session **s = calloc((size_t)n, sizeof *s);
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)n * (size_t)plen), *toks = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t *tf = malloc(sizeof(uint64_t) * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
    df_eval_item *items = calloc((size_t)n, sizeof *items);
    if (!s || !prompts || !toks || !tf || !logits || !items) cli_die("out of memory");
    for (int i = 0; i < n; i++) {
        if (df_session_new(&s[i], e, ctx, &err)) cli_die_err(&err);
        if (a->replay && dev && dev->replay_from) dev->replay_from(s[i], (uint64_t)i * (uint64_t)(plen + steps));
        /* sequence 0's prompt and tokens are those of the one-sequence arm */
        uint64_t r = (uint64_t)((a->prompt_seed ? a->prompt_seed : 1) + i) * 0x9E3779B97F4A7C15ull;
        for (int k = 0; k < plen; k++) prompts[(size_t)i * plen + k] = next_token(&r, V);
        tf[i] = (uint64_t)(a->teacher_seed + i) * 0x9E3779B97F4A7C15ull;
        items[i] = (df_eval_item){.session = s[i], .tokens = prompts + (size_t)i * plen, .n = plen,
                                  .logits = logits + (size_t)i * V};
    }
    cli_stats st0, mid, end;
    cli_get_stats(e, dev, &st0);
    double t0 = df_now();
    if (df_eval_multi(bt, items, n, &err)) cli_die_err(&err);
    double t1 = df_now();
    cli_get_stats(e, dev, &mid);
    uint64_t io1 = cli_storage_read_bytes();
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < n; i++) {
            toks[i] = next_token(&tf[i], V);
            items[i].tokens = &toks[i], items[i].n = 1;
        }
        if (df_eval_multi(bt, items, n, &err)) cli_die_err(&err);
    }
    double t2 = df_now();
    cli_get_stats(e, dev, &end);
    uint64_t io_dec = cli_storage_read_bytes() - io1;
    if (a->stats) /* the text summary on stderr; stdout holds the JSON line */
        cli_summary(NULL, true, info, &st0, &mid, &end, (size_t)plen * n, t1 - t0, n * steps, t2 - t1, a->io_bw,
                    a->ram_budget, io_dec);
    arm_json(info, &st0, &mid, &end, (size_t)plen * n, t1 - t0, n, steps, t2 - t1, a->io_bw, a->ram_budget, io_dec);
    for (int i = 0; i < n; i++) df_session_free(s[i]);
    free(s), free(prompts), free(toks), free(tf), free(logits), free(items);
    df_batcher_free(bt);
    df_engine_close(e);
    return 0;
}
