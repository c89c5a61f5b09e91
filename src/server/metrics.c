/*
 * server/metrics.c - the server's counters (requests by endpoint and status,
 * tokens, prefix reuse, the prompt cache, cancellations, the engine's and the drafter's
 * statistics as of the last generation, the batch's occupancy, the listener's closes) and their
 * Prometheus text for GET /metrics.
 */
#include "server/internal.h"

#include <stdio.h>
#include <stdlib.h>

const char *const SRV_EP_NAME[N_EP] = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health",
                                       "/metrics", "other"};
const int SRV_STATUSES[N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 500, 503};

void srv_count_request(int ep, int status) {
    int s = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (SRV_STATUSES[i] == status) s = i;
    g_srv.requests[ep][s]++;
}

/* The prompt cache's counters as of the last generation (under mu). */
static void pcache_metrics(FILE *f) {
    const df_stats *s = &g_srv.stats;
    if (!g_srv.prompt_cache) return;
    const struct { const char *name, *help; uint64_t v; } m[] = {
        {"hits", "Prompts whose longest cached prefix was restored from the prompt cache.", s->pcache_hits},
        {"misses", "Prompts the prompt cache had nothing for beyond what the session held.", s->pcache_misses},
        {"tokens_restored", "Prompt tokens restored from the prompt cache.", s->pcache_tokens},
        {"bytes_read", "Bytes of prompt cache files read.", s->pcache_bytes_read},
        {"bytes_written", "Bytes of prompt cache files written.", s->pcache_bytes_written},
        {"evicted", "Prompt cache files removed to keep the directory under its size.", s->pcache_evicted},
        {"ram_hits", "Prompt cache segments taken from RAM instead of disk.", s->pcache_ram_hits},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        fprintf(f, "# HELP deltafin_prompt_cache_%s_total %s\n# TYPE deltafin_prompt_cache_%s_total counter\n"
                   "deltafin_prompt_cache_%s_total %llu\n", m[i].name, m[i].help, m[i].name, m[i].name,
                (unsigned long long)m[i].v);
    fprintf(f, "# HELP deltafin_prompt_cache_ram_bytes Bytes of states the prompt cache keeps in RAM.\n"
               "# TYPE deltafin_prompt_cache_ram_bytes gauge\ndeltafin_prompt_cache_ram_bytes %llu\n"
               "# HELP deltafin_prompt_cache_writes_off 1 when a failed write (a full disk) turned writing off.\n"
               "# TYPE deltafin_prompt_cache_writes_off gauge\ndeltafin_prompt_cache_writes_off %d\n",
            (unsigned long long)s->pcache_ram_bytes, s->pcache_writes_off);
}

/* The batch (under mu): requests in it now, the most seen, and the steps by
 * how many requests they held (a histogram: le = 1, 2, ... parallel), with
 * their rows. With --parallel 1 a step is one generation's evaluation. */
static void batch_metrics(FILE *f) {
    int n = g_srv.cfg.parallel;
    fprintf(f, "# HELP deltafin_batch_parallel Requests the server decodes together (--parallel).\n"
               "# TYPE deltafin_batch_parallel gauge\ndeltafin_batch_parallel %d\n"
               "# HELP deltafin_batch_active Requests being generated now.\n"
               "# TYPE deltafin_batch_active gauge\ndeltafin_batch_active %d\n"
               "# HELP deltafin_batch_active_max The most requests generated together so far.\n"
               "# TYPE deltafin_batch_active_max gauge\ndeltafin_batch_active_max %d\n"
               "# HELP deltafin_batch_rows_total Rows (prompt and decode) the batch's steps evaluated.\n"
               "# TYPE deltafin_batch_rows_total counter\ndeltafin_batch_rows_total %llu\n"
               "# HELP deltafin_batch_requests_per_step Requests in each step of the batch.\n"
               "# TYPE deltafin_batch_requests_per_step histogram\n",
            n, g_srv.n_active, g_srv.max_active, (unsigned long long)g_srv.step_rows);
    uint64_t cum = 0, sum = 0;
    for (int k = 1; k <= n; k++) {
        cum += g_srv.step_hist[k];
        sum += (uint64_t)k * g_srv.step_hist[k];
        fprintf(f, "deltafin_batch_requests_per_step_bucket{le=\"%d\"} %llu\n", k, (unsigned long long)cum);
    }
    fprintf(f, "deltafin_batch_requests_per_step_bucket{le=\"+Inf\"} %llu\n"
               "deltafin_batch_requests_per_step_sum %llu\ndeltafin_batch_requests_per_step_count %llu\n",
            (unsigned long long)cum, (unsigned long long)sum, (unsigned long long)g_srv.steps);
}

char *srv_metrics_text(size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    pthread_mutex_lock(&g_srv.mu);
    fprintf(f, "# HELP deltafin_requests_total HTTP requests answered, by endpoint and status.\n"
               "# TYPE deltafin_requests_total counter\n");
    for (int e = 0; e < N_EP; e++)
        for (int s = 0; s <= N_STATUS; s++)
            if (g_srv.requests[e][s])
                fprintf(f, "deltafin_requests_total{endpoint=\"%s\",status=\"%s%d\"} %llu\n", SRV_EP_NAME[e],
                        s == N_STATUS ? "other" : "", s == N_STATUS ? 0 : SRV_STATUSES[s],
                        (unsigned long long)g_srv.requests[e][s]);
    fprintf(f,
            "# HELP deltafin_generated_tokens_total Tokens sampled.\n# TYPE deltafin_generated_tokens_total counter\n"
            "deltafin_generated_tokens_total %llu\n"
            "# HELP deltafin_prompt_tokens_total Prompt tokens of requests that ran.\n"
            "# TYPE deltafin_prompt_tokens_total counter\ndeltafin_prompt_tokens_total %llu\n"
            "# HELP deltafin_prompt_tokens_reused_total Prompt tokens whose KV cache was kept from the previous request.\n"
            "# TYPE deltafin_prompt_tokens_reused_total counter\ndeltafin_prompt_tokens_reused_total %llu\n"
            "# HELP deltafin_prompt_tokens_cached_total Prompt tokens not evaluated: kept from the previous request or "
            "restored from the prompt cache (usage.prompt_tokens_details.cached_tokens).\n"
            "# TYPE deltafin_prompt_tokens_cached_total counter\ndeltafin_prompt_tokens_cached_total %llu\n"
            "# HELP deltafin_last_tokens_per_second Decode speed of the last generation.\n"
            "# TYPE deltafin_last_tokens_per_second gauge\ndeltafin_last_tokens_per_second %.6f\n"
            "# HELP deltafin_requests_cancelled_total Generations or queued requests dropped because the client left.\n"
            "# TYPE deltafin_requests_cancelled_total counter\ndeltafin_requests_cancelled_total %llu\n"
            "# HELP deltafin_requests_rejected_total Requests refused with 429 (queue full).\n"
            "# TYPE deltafin_requests_rejected_total counter\ndeltafin_requests_rejected_total %llu\n"
            "# HELP deltafin_queue_length Requests waiting for a slot in the batch.\n"
            "# TYPE deltafin_queue_length gauge\ndeltafin_queue_length %d\n"
            "# HELP deltafin_busy Whether a generation is running (deltafin_batch_active > 0).\n# TYPE deltafin_busy gauge\ndeltafin_busy %d\n"
            "# HELP deltafin_expert_cache_hits_total Expert cache hits.\n"
            "# TYPE deltafin_expert_cache_hits_total counter\ndeltafin_expert_cache_hits_total %llu\n"
            "# HELP deltafin_expert_cache_misses_total Expert cache misses.\n"
            "# TYPE deltafin_expert_cache_misses_total counter\ndeltafin_expert_cache_misses_total %llu\n"
            "# HELP deltafin_expert_bytes_read_total Expert bytes read from storage.\n"
            "# TYPE deltafin_expert_bytes_read_total counter\ndeltafin_expert_bytes_read_total %llu\n",
            (unsigned long long)g_srv.gen_tokens, (unsigned long long)g_srv.prompt_tokens,
            (unsigned long long)g_srv.reused_tokens, (unsigned long long)g_srv.cached_tokens, g_srv.last_tps, (unsigned long long)g_srv.cancelled,
            (unsigned long long)g_srv.rejected_full, g_srv.n_waiting, g_srv.n_active > 0,
            (unsigned long long)g_srv.stats.expert_hits, (unsigned long long)g_srv.stats.expert_misses,
            (unsigned long long)g_srv.stats.expert_bytes_read);
    if (g_srv.specs)
        fprintf(f,
                "# HELP deltafin_spec_drafted_tokens_total Tokens proposed by the drafter and checked.\n"
                "# TYPE deltafin_spec_drafted_tokens_total counter\ndeltafin_spec_drafted_tokens_total %llu\n"
                "# HELP deltafin_spec_accepted_tokens_total Drafted tokens the target accepted.\n"
                "# TYPE deltafin_spec_accepted_tokens_total counter\ndeltafin_spec_accepted_tokens_total %llu\n"
                "# HELP deltafin_spec_verify_passes_total Target passes that checked drafted tokens.\n"
                "# TYPE deltafin_spec_verify_passes_total counter\ndeltafin_spec_verify_passes_total %llu\n"
                "# HELP deltafin_spec_depth Tokens the gate would draft now (0: drafting off).\n"
                "# TYPE deltafin_spec_depth gauge\ndeltafin_spec_depth %d\n",
                (unsigned long long)g_srv.spec_stats.drafted, (unsigned long long)g_srv.spec_stats.accepted,
                (unsigned long long)g_srv.spec_stats.verify_passes, g_srv.spec_stats.depth);
    pcache_metrics(f);
    batch_metrics(f);
    pthread_mutex_unlock(&g_srv.mu);
    srv_listener_stats ls;
    srv_listener_stats_get(g_srv.listener, &ls);
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
    return fclose(f) == 0 ? buf : (free(buf), NULL);
}

