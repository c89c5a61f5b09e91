/*
 * cli/report.c - what `deltafin run --stats` prints on stderr and --events
 * writes as JSON lines: per-phase counters, the summary with the memory
 * estimate, the product's prefetch line and the speculative record. The
 * benchmark's additions (prediction quality, replayed routing, a simulated
 * disk) come in cli_stats.d, filled by `deltafin bench` only.
 */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

/* The number a line of a /proc file gives (fmt: the line with one %llu), 0 if none. */
static uint64_t proc_number(const char *path, const char *fmt) {
    FILE *f = fopen(path, "r");
    char line[256];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1) break;
    if (f) fclose(f);
    return (uint64_t)v;
}

static uint64_t peak_rss_bytes(void) { return proc_number("/proc/self/status", "VmHWM: %llu kB") * 1024; }

/* Bytes this process has made the kernel fetch from storage (/proc/self/io
 * read_bytes): page-cache misses and O_DIRECT reads alike, so the page-cache path's
 * real reads can be compared with the pack's. */
uint64_t cli_storage_read_bytes(void) { return proc_number("/proc/self/io", "read_bytes: %llu"); }

/* JSON string body of s (quotes, backslashes and control characters escaped). */
void cli_json_str(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

/* Events of replayed routing say so: their output is not the model's own. */
void cli_json_routing(FILE *f, const cli_stats *b) {
    if (b->d.sim_disk_bps > 0) fprintf(f, "\"sim_disk_gbs\":%.4f,", b->d.sim_disk_bps / 1e9);
    fprintf(f, "\"routing\":\"%s\"", b->d.replay_routing ? "replay" : "model");
    if (b->d.replay_routing) {
        fprintf(f, ",\"replay_trace\":\"");
        cli_json_str(f, b->d.replay_routing);
        fputc('"', f);
    }
}

/* Where the evaluation time between snapshots a and b went (df_stats' blocks;
 * `other` is what is left of eval_s). */
typedef struct split {
    double kda, attn, ffn, experts, wait, other, eval, ranks; /* ranks: waiting on other ranks */
} split;

static split split_of(const cli_stats *a, const cli_stats *b) {
    split s = {b->s.kda_s - a->s.kda_s, b->s.attn_s - a->s.attn_s, b->s.ffn_s - a->s.ffn_s,
               b->s.experts_s - a->s.experts_s, b->s.read_wait_s - a->s.read_wait_s, 0, b->s.eval_s - a->s.eval_s,
               b->s.rank_wait_s - a->s.rank_wait_s};
    double known = s.kda + s.attn + s.ffn + s.experts + s.wait + s.ranks;
    s.other = s.eval > known ? s.eval - known : 0.0;
    return s;
}

/* "  per token, decode (eval 12.3 ms): KDA 1.2 ms (10.0%), ..." on stderr */
static void split_text(const char *what, const split *s, int rows) {
    if (rows <= 0 || s->eval <= 0) return;
    const char *name[] = {"KDA", "attention", "MoE spine", "experts", "waiting on reads", "other"};
    double v[] = {s->kda, s->attn, s->ffn, s->experts, s->wait, s->other};
    fprintf(stderr, "  per token, %s (eval %.3f ms):", what, 1e3 * s->eval / rows);
    for (int i = 0; i < 6; i++)
        fprintf(stderr, "%s %s %.3f ms (%.1f%%)", i ? "," : "", name[i], 1e3 * v[i] / rows, 100.0 * v[i] / s->eval);
    if (s->ranks > 0)
        fprintf(stderr, ", waiting on ranks %.3f ms (%.1f%%)", 1e3 * s->ranks / rows, 100.0 * s->ranks / s->eval);
    fprintf(stderr, "\n");
}

/* Every rank's expert storage between a and b (rank 0's own and the others'
 * as of their latest answer): "dist_storage_bytes_read",... each with a comma. */
static void dist_storage_json(FILE *ev, const cli_stats *a, const cli_stats *b) {
    fprintf(ev, "\"dist_storage_bytes_read\":%llu,\"dist_storage_hits\":%llu,\"dist_storage_misses\":%llu,"
            "\"dist_workers_bytes_read\":%llu,",
            (unsigned long long)(b->s.expert_bytes_read - a->s.expert_bytes_read + b->s.rank_storage_bytes_read -
                                 a->s.rank_storage_bytes_read),
            (unsigned long long)(b->s.expert_hits - a->s.expert_hits + b->s.rank_storage_hits - a->s.rank_storage_hits),
            (unsigned long long)(b->s.expert_misses - a->s.expert_misses + b->s.rank_storage_misses -
                                 a->s.rank_storage_misses),
            (unsigned long long)(b->s.rank_storage_bytes_read - a->s.rank_storage_bytes_read));
}

/* "  ranks: 3; per decoded token sent ..., received ..., N messages, waiting ..." */
static void ranks_text(const cli_stats *a, const cli_stats *b, int n_dec) {
    if (b->s.ranks < 1 || n_dec <= 0) return;
    double n = n_dec;
    fprintf(stderr, "  experts by rank: %d ranks; per decoded token rank 0 sent %.1f kB, received %.1f kB in %.1f "
            "messages, waited %.3f ms on ranks\n", b->s.ranks,
            (double)(b->s.rank_bytes_sent - a->s.rank_bytes_sent) / 1e3 / n,
            (double)(b->s.rank_bytes_received - a->s.rank_bytes_received) / 1e3 / n,
            (double)(b->s.rank_messages - a->s.rank_messages) / n, 1e3 * (b->s.rank_wait_s - a->s.rank_wait_s) / n);
    fprintf(stderr, "  experts by rank: the other ranks read %.2f MB from storage (hits %llu misses %llu) as of "
            "their latest answer\n", (double)(b->s.rank_storage_bytes_read - a->s.rank_storage_bytes_read) / 1e6,
            (unsigned long long)(b->s.rank_storage_hits - a->s.rank_storage_hits),
            (unsigned long long)(b->s.rank_storage_misses - a->s.rank_storage_misses));
}

/* "PREFIXkda_s":..,... (seconds over the phase), each followed by a comma */
static void split_json(FILE *f, const char *prefix, const split *s) {
    fprintf(f, "\"%skda_s\":%.6f,\"%sattn_s\":%.6f,\"%sffn_s\":%.6f,\"%sexperts_s\":%.6f,\"%sother_s\":%.6f,",
            prefix, s->kda, prefix, s->attn, prefix, s->ffn, prefix, s->experts, prefix, s->other);
}

/* One line (stderr) and/or one JSON object (events) for `rows` rows evaluated
 * between counter snapshots a and b in `secs` of wall time. */
void cli_report(FILE *ev, bool text, const char *what, int rows, const cli_stats *a, const cli_stats *b,
                double secs) {
    uint64_t bytes = b->s.expert_bytes_read - a->s.expert_bytes_read;
    uint64_t hits = b->s.expert_hits - a->s.expert_hits, miss = b->s.expert_misses - a->s.expert_misses;
    uint64_t pf_hits = b->s.prefetch_hits - a->s.prefetch_hits;
    uint64_t pf_used = b->s.prefetch_bytes_used - a->s.prefetch_bytes_used;
    uint64_t pf_waste = b->s.prefetch_bytes_wasted - a->s.prefetch_bytes_wasted;
    double wait = b->s.read_wait_s - a->s.read_wait_s, compute = secs - wait;
    if (text && strcmp(what, "token") == 0)
        fprintf(stderr,
                "[%s] %.3f s (%.2f tok/s)  read %.1f MB at %.3f GB/s  hits %llu misses %llu "
                "(prefetched %llu)  wait %.3f s compute %.3f s\n",
                what, secs, secs > 0 ? rows / secs : 0.0, (double)bytes / 1e6,
                secs > 0 ? (double)bytes / secs / 1e9 : 0.0, (unsigned long long)hits,
                (unsigned long long)miss, (unsigned long long)pf_hits, wait, compute);
    uint64_t r_sent = b->s.rank_bytes_sent - a->s.rank_bytes_sent;
    uint64_t r_recv = b->s.rank_bytes_received - a->s.rank_bytes_received;
    uint64_t r_msgs = b->s.rank_messages - a->s.rank_messages;
    double r_wait = b->s.rank_wait_s - a->s.rank_wait_s;
    if (text && strcmp(what, "token") == 0 && b->s.ranks > 0)
        fprintf(stderr, "        ranks: sent %.1f kB received %.1f kB in %llu messages, waited %.3f ms\n",
                (double)r_sent / 1e3, (double)r_recv / 1e3, (unsigned long long)r_msgs, 1e3 * r_wait);
    split sp = split_of(a, b);
    if (text && strcmp(what, "prefill") == 0) split_text("prefill", &sp, rows);
    if (ev) {
        fprintf(ev,
                "{\"event\":\"%s\",\"rows\":%d,\"seconds\":%.6f,\"expert_bytes_read\":%llu,"
                "\"expert_hits\":%llu,\"expert_misses\":%llu,\"prefetch_hits\":%llu,"
                "\"prefetch_bytes_used\":%llu,\"prefetch_bytes_wasted\":%llu,"
                "\"read_wait_s\":%.6f,\"compute_s\":%.6f,\"read_bandwidth_gbs\":%.4f,",
                what, rows, secs, (unsigned long long)bytes, (unsigned long long)hits,
                (unsigned long long)miss, (unsigned long long)pf_hits, (unsigned long long)pf_used,
                (unsigned long long)pf_waste, wait, compute,
                secs > 0 ? (double)bytes / secs / 1e9 : 0.0);
        split_json(ev, "", &sp);
        if (b->s.ranks > 0) {
            fprintf(ev, "\"ranks\":%d,\"dist_bytes_sent\":%llu,\"dist_bytes_recv\":%llu,"
                    "\"dist_messages\":%llu,\"dist_wait_s\":%.6f,", b->s.ranks, (unsigned long long)r_sent,
                    (unsigned long long)r_recv, (unsigned long long)r_msgs, r_wait);
            dist_storage_json(ev, a, b);
        }
        cli_json_routing(ev, b);
        fprintf(ev, "}\n");
    }
}

/* Per MoE layer: what the prefetcher uses and how well its predictions did. */
static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* "512.0 MiB", "400.0 TiB": a budget may be anything from a few MiB up. */
static const char *size_str(char *buf, size_t n, uint64_t bytes) {
    static const char *unit[] = {"MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes / 1048576.0;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

/* --stats: the memory the engine counted next to what the process took, and
 * what set the expert cache's size. */
static void mem_report(const cli_stats *b) {
    char s1[32], s2[32], s3[32];
    double mib = 1048576.0;
    if (!b->s.mem_estimate) return;
    fprintf(stderr, "  memory: ");
    if (b->s.ram_budget) fprintf(stderr, "budget %s, ", size_str(s1, sizeof s1, b->s.ram_budget));
    fprintf(stderr, "estimated %s, peak RSS %s", size_str(s2, sizeof s2, b->s.mem_estimate),
            size_str(s3, sizeof s3, peak_rss_bytes()));
    if (!b->s.cache_sizing) fprintf(stderr, "\n");
    else if (!strcmp(b->s.cache_sizing, "all experts fit")) fprintf(stderr, "; expert cache: all experts fit\n");
    else if (!strcmp(b->s.cache_sizing, "available memory"))
        fprintf(stderr, "; expert cache sized to the available memory (%s)\n",
                size_str(s1, sizeof s1, b->s.mem_available));
    else fprintf(stderr, "; expert cache sized by %s\n", b->s.cache_sizing);
    fprintf(stderr, "    (estimate in MiB: resident at open %.1f, loading peak %.1f, session %.1f at %d tokens, "
            "slack %.1f, reserve %.1f, expert cache %.1f)\n", (double)b->s.mem_resident / mib,
            (double)b->s.mem_load_peak / mib, (double)b->s.mem_session / mib, b->s.mem_context,
            (double)b->s.mem_slack / mib, (double)b->s.mem_reserve / mib, (double)b->s.cache_bytes / mib);
}

/* The decode summary's figures, from the statistics before (a) and after (b). */
typedef struct summary_figs {
    double tps, per_tok, bw, bound, wait;
    uint64_t bytes, hits, miss, waste;
} summary_figs;

static summary_figs summary_figures(const cli_stats *a, const cli_stats *b, int n_dec, double dec_s,
                                    double io_bw) {
    summary_figs f;
    f.tps = n_dec && dec_s > 0 ? n_dec / dec_s : 0;
    f.bytes = b->s.expert_bytes_read - a->s.expert_bytes_read;
    f.hits = b->s.expert_hits - a->s.expert_hits;
    f.miss = b->s.expert_misses - a->s.expert_misses;
    f.waste = b->s.prefetch_bytes_wasted - a->s.prefetch_bytes_wasted;
    f.wait = b->s.read_wait_s - a->s.read_wait_s;
    /* Missed bytes are what the tokens needed and the cache did not hold; a
     * wrong prediction's read is waste, not need. */
    f.per_tok = n_dec ? (double)(f.bytes > f.waste ? f.bytes - f.waste : 0) / n_dec : 0;
    f.bw = dec_s > 0 ? (double)f.bytes / dec_s : 0;
    /* The I/O bound: tokens/s if every missed byte streamed at the measured
     * device bandwidth and nothing else took time. */
    f.bound = io_bw > 0 && f.per_tok > 0 ? io_bw * 1e9 / f.per_tok : 0;
    return f;
}

/* The summary as one JSON object; the prediction quality only under bench. */
static void summary_json(FILE *ev, const df_model_info *info, const cli_stats *st0, const cli_stats *a,
                         const cli_stats *b, const summary_figs *f, size_t n_prompt, double prefill_s, int n_dec,
                         double dec_s, double io_bw, uint64_t ram_budget, uint64_t storage_bytes) {
    double tps = f->tps, per_tok = f->per_tok, bw = f->bw, bound = f->bound, wait = f->wait;
    uint64_t bytes = f->bytes, hits = f->hits, miss = f->miss, waste = f->waste;
    fprintf(ev,
            "{\"event\":\"summary\",\"prompt_tokens\":%zu,\"prefill_s\":%.6f,\"decode_tokens\":%d,"
            "\"decode_s\":%.6f,\"tokens_per_s\":%.6f,\"expert_source\":\"%s\",\"cache_slots\":%d,"
            "\"expert_hits\":%llu,\"expert_misses\":%llu,\"expert_bytes_read\":%llu,"
            "\"bytes_missed_per_token\":%.1f,\"prefetch_bytes_wasted\":%llu,"
            "\"read_bandwidth_gbs\":%.4f,\"read_wait_s\":%.6f,\"prefetch\":\"%s\",",
            n_prompt, prefill_s, n_dec, dec_s, tps, b->s.expert_source, b->s.cache_slots,
            (unsigned long long)hits, (unsigned long long)miss, (unsigned long long)bytes, per_tok,
            (unsigned long long)waste, bw / 1e9, wait, b->s.prefetch ? b->s.prefetch : "off");
    if (b->d.on)
        fprintf(ev, "\"prefetch_recall\":%.4f,\"prefetch_precision\":%.4f,",
                ratio(b->d.prefetch_correct - a->d.prefetch_correct, b->d.prefetch_actual - a->d.prefetch_actual),
                ratio(b->d.prefetch_correct - a->d.prefetch_correct,
                      b->d.prefetch_predicted - a->d.prefetch_predicted));
    fprintf(ev,
            "\"io_bound_tokens_per_s\":%.6f,\"fraction_of_bound\":%.4f,\"peak_rss_bytes\":%llu,"
            "\"active_bytes_per_token\":%llu,\"eval_s\":%.6f,\"ttft_s\":%.6f,\"ram_budget\":%llu,"
            "\"cache_bytes\":%llu,\"expert_bytes\":%llu,\"io_bw_gbs\":%.4f,\"storage_bytes_read\":%llu,"
            "\"mem_estimate_bytes\":%llu,\"mem_resident_bytes\":%llu,\"mem_load_peak_bytes\":%llu,"
            "\"mem_session_bytes\":%llu,\"mem_slack_bytes\":%llu,\"mem_reserve_bytes\":%llu,"
            "\"mem_context\":%d,\"cache_sizing\":\"%s\",\"mem_available_bytes\":%llu,",
            bound, bound > 0 ? tps / bound : 0.0, (unsigned long long)peak_rss_bytes(),
            (unsigned long long)info->bytes_active_per_token, b->s.eval_s - a->s.eval_s, prefill_s,
            (unsigned long long)ram_budget, (unsigned long long)b->s.cache_bytes,
            (unsigned long long)info->bytes_experts, io_bw, (unsigned long long)storage_bytes,
            (unsigned long long)b->s.mem_estimate, (unsigned long long)b->s.mem_resident,
            (unsigned long long)b->s.mem_load_peak, (unsigned long long)b->s.mem_session,
            (unsigned long long)b->s.mem_slack, (unsigned long long)b->s.mem_reserve, b->s.mem_context,
            b->s.cache_sizing ? b->s.cache_sizing : "", (unsigned long long)b->s.mem_available);
    split dec = split_of(a, b), pre = split_of(st0, a);
    split_json(ev, "", &dec);
    split_json(ev, "prefill_", &pre);
    /* the prompt's expert uses ((layer, expert) per pass), misses and bytes read */
    fprintf(ev, "\"prefill_eval_s\":%.6f,\"prefill_read_wait_s\":%.6f,\"prefill_expert_requests\":%llu,"
            "\"prefill_expert_misses\":%llu,\"prefill_expert_bytes_read\":%llu,", pre.eval, pre.wait,
            (unsigned long long)(a->s.expert_requests - st0->s.expert_requests),
            (unsigned long long)(a->s.expert_misses - st0->s.expert_misses),
            (unsigned long long)(a->s.expert_bytes_read - st0->s.expert_bytes_read));
    /* experts by rank: rank 0's traffic and waits while decoding */
    if (b->s.ranks > 0) {
        fprintf(ev, "\"ranks\":%d,\"dist_bytes_sent\":%llu,\"dist_bytes_recv\":%llu,\"dist_messages\":%llu,"
                "\"dist_wait_s\":%.6f,", b->s.ranks, (unsigned long long)(b->s.rank_bytes_sent - a->s.rank_bytes_sent),
                (unsigned long long)(b->s.rank_bytes_received - a->s.rank_bytes_received),
                (unsigned long long)(b->s.rank_messages - a->s.rank_messages), b->s.rank_wait_s - a->s.rank_wait_s);
        dist_storage_json(ev, a, b);
    }
    cli_json_routing(ev, b);
    fprintf(ev, "}\n");
}

void cli_summary(FILE *ev, bool text, const df_model_info *info, const cli_stats *st0, const cli_stats *a,
                 const cli_stats *b, size_t n_prompt, double prefill_s, int n_dec, double dec_s, double io_bw,
                 uint64_t ram_budget, uint64_t storage_bytes) {
    summary_figs f = summary_figures(a, b, n_dec, dec_s, io_bw);
    double tps = f.tps, per_tok = f.per_tok, bw = f.bw, bound = f.bound, wait = f.wait;
    uint64_t bytes = f.bytes, hits = f.hits, miss = f.miss, waste = f.waste;
    if (text) {
        fprintf(stderr,
                "summary: prefill %zu tokens %.3f s (%.2f tok/s) | decode %d tokens %.3f s (%.3f tok/s)\n"
                "  experts: %s, cache %d slots (%.1f MiB, %d pinned); hits %llu misses %llu (hit rate %.1f%%)\n"
                "  read %.1f MB (%.2f MB/token missed, %.1f MB wasted) at %.3f GB/s; waiting on reads "
                "%.3f s (%.4f s/token), computing %.3f s\n",
                n_prompt, prefill_s, prefill_s > 0 ? (double)n_prompt / prefill_s : 0, n_dec, dec_s, tps,
                b->s.expert_source, b->s.cache_slots, (double)b->s.cache_bytes / 1048576.0,
                b->s.pinned_experts, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? 100.0 * (double)hits / (double)(hits + miss) : 0.0, (double)bytes / 1e6,
                per_tok / 1e6, (double)waste / 1e6, bw / 1e9, wait, n_dec ? wait / n_dec : 0.0,
                dec_s - wait);
        if (bound > 0)
            fprintf(stderr, "  I/O bound %.3f tok/s at %.3f GB/s %s: achieved %.2f of it\n", bound, io_bw,
                    b->d.sim_disk_bps > 0 ? "(simulated disk)" : "measured", tps / bound);
        split dec = split_of(a, b);
        split_text("decode", &dec, n_dec);
        ranks_text(a, b, n_dec);
        fprintf(stderr, "  active weights %.1f MB/token; peak RSS %.1f MiB; %s, %d threads\n",
                (double)info->bytes_active_per_token / 1e6, (double)peak_rss_bytes() / 1048576.0,
                info->isa, info->n_threads);
        mem_report(b);
        if (b->d.replay_routing)
            fprintf(stderr, "  routing REPLAYED from %s: not the model's own output\n", b->d.replay_routing);
    }
    if (ev)
        summary_json(ev, info, st0, a, b, &f, n_prompt, prefill_s, n_dec, dec_s, io_bw, ram_budget, storage_bytes);
}

/* The product's prefetch report: what df_stats counts (bench's replaces it
 * with prediction quality per layer). Nothing when the experts are resident. */
void cli_prefetch_report(FILE *ev, bool text, const cli_stats *st) {
    const df_stats *s = &st->s;
    if (!s->expert_source || !strcmp(s->expert_source, "resident")) return;
    if (text && strcmp(s->prefetch, "off") != 0)
        fprintf(stderr,
                "prefetch: %s; read ahead %llu experts, %.1f MB used, %.1f MB wasted, %llu not read "
                "(no free slot)\n",
                s->prefetch, (unsigned long long)s->prefetch_reads, (double)s->prefetch_bytes_used / 1e6,
                (double)s->prefetch_bytes_wasted / 1e6, (unsigned long long)s->prefetch_no_room);
    if (ev) {
        fprintf(ev,
                "{\"event\":\"prefetch\",\"mode\":\"%s\",\"reads\":%llu,\"hits\":%llu,\"bytes_used\":%llu,"
                "\"bytes_wasted\":%llu,\"no_room\":%llu,",
                s->prefetch, (unsigned long long)s->prefetch_reads, (unsigned long long)s->prefetch_hits,
                (unsigned long long)s->prefetch_bytes_used, (unsigned long long)s->prefetch_bytes_wasted,
                (unsigned long long)s->prefetch_no_room);
        cli_json_routing(ev, st);
        fprintf(ev, "}\n");
    }
}

void cli_pcache_report(FILE *ev, bool text, const cli_stats *st) {
    const df_stats *s = &st->s;
    if (!s->pcache_hits && !s->pcache_misses && !s->pcache_bytes_written && !s->pcache_writes_off) return;
    if (text)
        fprintf(stderr,
                "prompt cache: hits %llu misses %llu, %llu tokens restored; read %.3f MB (%llu from RAM) "
                "in %.3f s, written %.3f MB in %.3f s, %llu files evicted%s\n",
                (unsigned long long)s->pcache_hits, (unsigned long long)s->pcache_misses,
                (unsigned long long)s->pcache_tokens, (double)s->pcache_bytes_read / 1e6,
                (unsigned long long)s->pcache_ram_hits, s->pcache_restore_s, (double)s->pcache_bytes_written / 1e6,
                s->pcache_store_s, (unsigned long long)s->pcache_evicted,
                s->pcache_writes_off ? "; writing turned off" : "");
    if (ev)
        fprintf(ev,
                "{\"event\":\"prompt_cache\",\"hits\":%llu,\"misses\":%llu,\"tokens\":%llu,\"bytes_read\":%llu,"
                "\"ram_hits\":%llu,\"bytes_written\":%llu,\"evicted\":%llu,\"restore_s\":%.6f,\"store_s\":%.6f,"
                "\"writes_off\":%s}\n",
                (unsigned long long)s->pcache_hits, (unsigned long long)s->pcache_misses,
                (unsigned long long)s->pcache_tokens, (unsigned long long)s->pcache_bytes_read,
                (unsigned long long)s->pcache_ram_hits, (unsigned long long)s->pcache_bytes_written,
                (unsigned long long)s->pcache_evicted, s->pcache_restore_s, s->pcache_store_s,
                s->pcache_writes_off ? "true" : "false");
}

/* The speculative decoder's record as one JSON line. */
void cli_spec_events(FILE *ev, const df_spec *sp) {
    df_spec_stats ss;
    df_spec_stats_get(sp, &ss);
    fprintf(ev,
            "{\"event\":\"speculative\",\"passes\":%llu,\"verify_passes\":%llu,\"drafted\":%llu,"
            "\"accepted\":%llu,\"switched_off\":%llu,\"depth\":%d,\"mean_depth\":%.4f,"
            "\"plain_s\":%.6f,\"verify_s\":%.6f,\"plain_bytes\":%.1f,\"verify_bytes\":%.1f,"
            "\"speedup\":%.4f,\"run_speedup\":%.4f,\"probes_declined\":%llu,"
            "\"draft_token_s\":%.6f,\"row_cost\":%.4f}\n",
            (unsigned long long)ss.passes, (unsigned long long)ss.verify_passes,
            (unsigned long long)ss.drafted, (unsigned long long)ss.accepted,
            (unsigned long long)ss.switched_off, ss.depth, ss.mean_depth, ss.plain_s, ss.verify_s,
            ss.plain_bytes, ss.verify_bytes, ss.speedup, ss.run_speedup,
            (unsigned long long)ss.probes_declined, ss.draft_token_s, ss.row_cost);
}
