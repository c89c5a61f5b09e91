/*
 * engine/engine.c - the public API's engine (deltafin.h, and engine/dev.h for
 * benchmark controls): opening a checkpoint (model, generation config,
 * tokenizer, the budget and the expert source, thread pool), what it says
 * about itself (df_model_info, df_stats) and closing it. The other files of
 * this room: budget.c, residency.c, session.c, text.c, inspect.c, replay.c,
 * pcache.c and pcache_session.c (the prompt cache).
 */
#include "engine/internal.h"

#include "experts/prefetch.h"

#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

static void add_stop(df_engine *e, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < e->n_stop; i++)
        if (e->stop_ids[i] == id) return;
    if (e->n_stop < (int)(sizeof e->stop_ids / sizeof e->stop_ids[0])) e->stop_ids[e->n_stop++] = id;
}

static int check_experts(const char *list, df_error *err) {
    if (!list) return DF_OK;
    if (!list[strspn(list, ",")])
        return df_fail(err, DF_ERR_ARG,
                       "--experts '%s' names no directory: give the expert pack's directories, "
                       "comma-separated", list);
    const char *p = list;
    for (int i = 1;; i++) {
        size_t len = strcspn(p, ",");
        if (!len) return df_fail(err, DF_ERR_ARG, "--experts '%s': directory %d of the list is empty", list, i);
        if (!p[len]) return DF_OK;
        p += len + 1;
    }
}

/* The kernel path and thread count the options ask for. */
static int pick_isa_threads(const df_engine_opts *opts, df_isa *isa, int *nt, df_error *err) {
    *isa = df_isa_detect();
    if (opts->isa && *opts->isa) {
        int want = df_isa_from_name(opts->isa);
        if (want < 0)
            return df_fail(err, DF_ERR_ARG, "unknown kernel path '%s' (use auto, avx512, avx2 or c)",
                           opts->isa);
        if (df_isa_set((df_isa)want) != 0)
            return df_fail(err, DF_ERR_UNSUPPORTED, "this CPU cannot run the '%s' kernel path",
                           opts->isa);
        *isa = (df_isa)want;
    } else {
        df_isa_set(*isa);
    }
    *nt = opts->n_threads;
    if (*nt <= 0) *nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (*nt < 1) *nt = 1;
    if (*nt > 256) return df_fail(err, DF_ERR_ARG, "--threads %d is out of range (1..256)", *nt);
    if (opts->prefill_chunk < 0 || opts->prefill_chunk > 65536)
        return df_fail(err, DF_ERR_ARG, "prefill chunk %d is out of range (1..65536)", opts->prefill_chunk);
    return DF_OK;
}

typedef struct {
    df_isa isa;
    int nt;
} isa_nt;

/* The model, its generation config and its tokenizer; on failure nothing is kept. */
static int load_checkpoint(df_engine *e, const char *dir, df_error *err) {
    int rc = df_model_load(&e->model, dir, err);
    if (rc == DF_OK && (rc = df_generation_load_dir(&e->gen, &e->model.cfg, dir, err)))
        df_model_free(&e->model);
    if (rc) return rc;
    rc = df_tokenizer_load_dir(&e->tok, dir, err);
    /* Parsing a 151k-token tokenizer.json keeps 20 MiB and frees 75-90 MiB
     * of JSON nodes. Handed back to the kernel now, those pages do not sit
     * under the weights copied into RAM next, where they made the loading
     * peak (232 MiB instead of 173 on a 2-layer checkpoint with that vocabulary). */
    malloc_trim(0);
    if (rc) df_model_free(&e->model);
    return rc;
}

/* Where routed experts come from: streamed under a budget or from a pack, or
 * resident. The routing replay is set up first, so that the budget counts
 * the trace in what is resident. */
static int setup_experts(df_engine *e, const df_engine_opts *opts, const df_engine_dev *dev, df_error *err) {
    const df_config *c = &e->model.cfg;
    int rc;
    if (dev && dev->replay_routing && (rc = df_engine_setup_replay(e, dev->replay_routing, err))) return rc;
    if (e->dist && !e->worker && opts->rank0_no_experts && c->num_experts > 0) {
        /* rank 0 owns no expert: no store, no cache, no expert page read */
        if ((rc = df_engine_no_experts_budget(e, opts, err))) {
            df_engine_free_replay(e);
            return rc;
        }
        e->experts = df_xsource_resident(&e->model.experts);
        return DF_OK;
    }
    bool have_pack = opts->experts && *opts->experts;
    double sim_disk = dev ? dev->sim_disk_bps : 0;
    if (have_pack || opts->ram_budget || opts->expert_cache || sim_disk > 0) {
        /* a dense model has nothing to stream: the budget must hold all of it.
         * A simulated disk paces pack reads only: streaming from the
         * safetensors, the page cache is the expert cache and most reads
         * never reach a disk. */
        if (sim_disk > 0 && (!have_pack || c->num_experts <= 0))
            rc = df_fail(err, DF_ERR_ARG, "a simulated disk needs a pack of the model's experts (--experts)");
        else
            rc = c->num_experts <= 0 && !opts->experts
                     ? (opts->ram_budget ? df_engine_dense_budget(e, opts, err) : DF_OK)
                     : df_engine_setup_streaming(e, opts, dev, err);
        if (rc) {
            df_engine_free_replay(e);
            return rc;
        }
    }
    /* resident experts are all read from the mapping anyway: their scales are
     * checked once here (streamed ones where the pack writer copies them) */
    bool in_place = opts->describe_only || e->worker; /* a worker reads no always-active weight */
    if (!e->store && !opts->describe_only && c->num_experts > 0 &&
        (rc = df_expert_check_all_scales(&e->model.experts, e->model.st, err))) {
        df_engine_free_replay(e);
        return rc;
    }
    if (!e->store && !in_place) df_engine_resident_weights(&e->model, e->pool);
    if (!e->experts && c->num_experts > 0) e->experts = df_xsource_resident(&e->model.experts);
    return DF_OK;
}

static void fill_info(df_engine *e, df_isa isa, int nt) {
    const df_model *m = &e->model;
    const df_config *c = &m->cfg;
    df_model_info *in = &e->info;
    in->architecture = c->model_type;
    in->vocab_size = c->vocab_size;
    in->n_layers = c->num_hidden_layers;
    in->hidden_size = c->hidden_size;
    in->max_context = c->max_position_embeddings;
    in->n_experts = c->num_experts;
    in->n_experts_active = c->num_experts_per_tok;
    in->bytes_total = m->bytes_total;
    in->bytes_dense = m->bytes_dense;
    in->bytes_experts = m->bytes_experts;
    uint64_t emb = m->embed.t->nbytes, act = m->bytes_dense - emb;
    if (m->lm_head.t == m->embed.t) act += emb; /* tied: the LM head reads it all */
    for (int li = 0; li < c->num_hidden_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        act += (uint64_t)c->num_experts_per_tok * df_expert_bytes(&m->experts, li, 0);
    }
    in->bytes_active_per_token = act;
    in->isa = df_isa_name(isa);
    in->n_threads = nt;
    in->default_temperature = (float)e->gen.temperature;
    in->default_top_p = (float)e->gen.top_p;
    in->default_top_k = e->gen.top_k;
}

/* What df_engine_open_dev does after the checkpoint is loaded: the thread pool (first:
 * the FP8 maps are made on it), the expert source, the ranks, the prompt cache. */
static int open_rest(df_engine *e, const df_engine_opts *opts, const df_engine_dev *dev, isa_nt in,
                     const char *experts, df_error *err) {
    df_engine_opts o = *opts;
    o.experts = experts;
    e->pool = df_pool_new(in.nt);
    int rc = setup_experts(e, &o, dev, err);
    if (rc) return df_engine_ranks_blame(e, rc, err);
    const df_config *c = &e->model.cfg;
    for (int i = 0; i < e->gen.n_eos_token_ids; i++) add_stop(e, e->gen.eos_token_ids[i]);
    for (const char *const *st = c->arch->stop_tokens; st && *st; st++)
        add_stop(e, df_tokenizer_find(e->tok, *st));
    e->chat = df_chat_template_for_tokenizer(c->arch->chat, e->tok);
    fill_info(e, in.isa, in.nt);
    if (e->dist && (rc = df_engine_ranks_start(e, &o, experts, err))) return rc;
    return e->worker ? DF_OK : df_engine_setup_pcache(e, &o, err);
}

int df_engine_open_dev(df_engine **out, const df_engine_opts *opts, const df_engine_dev *dev, df_error *err) {
    *out = NULL;
    if (!opts || !opts->model_dir) return df_fail(err, DF_ERR_ARG, "no model directory given");
    int rc = check_experts(opts->experts, err);
    if (rc) return rc;
    isa_nt in = {(df_isa)0, 0};
    if ((rc = pick_isa_threads(opts, &in.isa, &in.nt, err))) return rc;
    df_engine *e = df_xcalloc(1, sizeof *e);
    e->chunk = opts->prefill_chunk ? opts->prefill_chunk : DF_DEFAULT_CHUNK;
    char *experts = NULL;
    if (opts->experts_by_rank && (rc = df_engine_ranks_init(e, opts, &experts, err))) {
        free(e);
        return rc;
    }
    if ((rc = load_checkpoint(e, opts->model_dir, err))) {
        df_engine_ranks_blame(e, rc, err);
        df_engine_close_ranks(e);
        free(experts);
        free(e);
        return rc;
    }
    rc = open_rest(e, opts, dev, in, experts ? experts : opts->experts, err);
    free(experts);
    if (rc) {
        df_engine_close(e);
        return rc;
    }
    *out = e;
    return DF_OK;
}

int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err) {
    return df_engine_open_dev(out, opts, NULL, err);
}

void df_engine_close(df_engine *e) {
    if (!e) return;
    if (e->experts) e->experts->ops->close(e->experts); /* the store's closes the store */
    df_engine_free_replay(e);
    df_engine_close_ranks(e); /* rank 0 tells the workers to stop */
    df_pcache_close(e->pcache);
    df_pool_free(e->pool);
    df_tokenizer_free(e->tok);
    df_model_free(&e->model);
    free(e);
}

uint64_t df_engine_session_bytes(const df_engine *e, int max_ctx) {
    const df_config *c = &e->model.cfg;
    if (max_ctx <= 0 || max_ctx > c->max_position_embeddings) max_ctx = c->max_position_embeddings;
    return df_engine_session_bytes_at(&e->model, max_ctx, e->chunk);
}

const df_model_info *df_engine_info(const df_engine *e) { return &e->info; }

void df_engine_stats(const df_engine *e, df_stats *o) {
    memset(o, 0, sizeof *o);
    o->tokens = e->tokens;
    o->eval_s = e->eval_s;
    o->expert_source = "resident";
    o->kda_s = e->block_s[DF_BLK_KDA];
    o->attn_s = e->block_s[DF_BLK_ATTN];
    o->ffn_s = e->block_s[DF_BLK_FFN];
    o->experts_s = e->block_s[DF_BLK_EXPERTS];
    df_engine_mem_stats(e, o);
    df_engine_pcache_stats(e, o);
    df_engine_ranks_stats(e, o);
    o->experts_s = o->experts_s > o->rank_wait_s ? o->experts_s - o->rank_wait_s : 0.0; /* waits on ranks */
    if (!e->store) return;
    df_store_stats s = df_store_get_stats(e->store);
    o->read_wait_s = s.wait_s;
    /* the experts' block waits on reads inside it: that is read_wait_s */
    o->experts_s = o->experts_s > s.wait_s ? o->experts_s - s.wait_s : 0.0;
    o->expert_requests = s.requests;
    o->expert_hits = s.hits;
    o->expert_misses = s.misses;
    o->expert_bytes_read = s.bytes_read;
    o->expert_rereads = s.rereads;
    o->cache_slots = df_store_slots(e->store);
    o->pinned_experts = df_store_pinned(e->store);
    o->cache_bytes = (uint64_t)df_store_slots(e->store) * df_store_slot_bytes(e->store);
    o->expert_source = df_store_source(e->store);
    o->direct_io = df_store_direct(e->store);
    o->prefetch = df_store_prefetch_mode(e->store);
    o->prefetch_reads = s.prefetch_reads;
    o->prefetch_hits = s.prefetch_hits;
    o->prefetch_bytes_used = s.prefetch_bytes_used;
    o->prefetch_bytes_wasted = s.prefetch_bytes_wasted;
    o->prefetch_no_room = s.prefetch_no_room;
}

void df_engine_dev_stats(const df_engine *e, df_dev_stats *o) {
    memset(o, 0, sizeof *o);
    o->replay_routing = e->replay_path;
    if (!e->store) return;
    o->sim_disk_bps = df_store_sim_disk(e->store);
    o->prefetch_depth = df_store_prefetch_depth(e->store);
    o->prefetch_gate = df_store_prefetch_gate(e->store, &o->prefetch_speedup);
    int n_moe = df_store_moe_layers(e->store);
    for (int l = 0; l < n_moe; l++) {
        df_pf_layer_stats pl;
        df_store_prefetch_layer(e->store, l, &pl);
        o->prefetch_predicted += pl.predicted;
        o->prefetch_correct += pl.correct;
        o->prefetch_actual += pl.actual;
    }
}

int df_engine_prefetch_layers(const df_engine *e, df_prefetch_layer *out, int cap) {
    if (!e->store) return 0;
    int n = 0;
    for (int li = 0; li < e->model.cfg.num_hidden_layers; li++) {
        if (!e->model.cfg.layer_is_moe[li]) continue;
        if (n < cap) {
            df_pf_layer_stats st;
            df_store_prefetch_layer(e->store, n, &st);
            out[n] = (df_prefetch_layer){.layer = li, .using = df_pf_choice_name(st.choice),
                                         .recall_router = st.recall_router, .recall_prev = st.recall_prev,
                                         .precision_first = st.precision_first,
                                         .precision_prev = st.precision_prev, .ranks_read = st.ranks_read,
                                         .predicted = st.predicted, .correct = st.correct,
                                         .actual = st.actual};
        }
        n++;
    }
    return n;
}

