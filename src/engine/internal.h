/*
 * engine/internal.h - what the engine's files share: the engine and session
 * objects behind deltafin.h, the memory plan the budget keeps, and the
 * functions one file of the room offers the others. Not seen outside
 * src/engine/.
 */
#ifndef DF_ENGINE_INTERNAL_H
#define DF_ENGINE_INTERNAL_H

#include "deltafin.h"
#include "engine/dev.h"
#include "engine/pcache.h"

#include "experts/store.h"
#include "experts/trace.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/generation.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define DF_DEFAULT_CHUNK 512

/* The memory the budget counts, and --stats reports next to the peak RSS:
 * measured at open, and computed for what comes later. */
typedef struct df_mem_plan {
    uint64_t resident;  /* RSS with the weights kept in RAM and the tokenizer in */
    uint64_t load_peak; /* VmHWM then: loading may peak above what stays */
    uint64_t session;   /* `sessions` sessions' KV caches at `context`, one set of work buffers */
    uint64_t slack;     /* what else comes (SLACK_*) */
    uint64_t reserve;   /* df_engine_opts.reserve_bytes (a draft model) */
    uint64_t available; /* the machine's available memory then */
    int context;
    int sessions;       /* df_engine_opts.sessions, at least 1 */
} df_mem_plan;

struct df_engine {
    df_model model;
    df_generation gen;    /* generation_config.json */
    df_tokenizer *tok;
    df_pool *pool;
    df_store *store;      /* NULL: experts used in place from the mapping */
    df_xsource *experts;  /* the store's source, or the resident one; NULL: dense */
    uint64_t ram_budget;
    int budget_ctx;       /* context the budget reserved room for */
    df_mem_plan plan;     /* all zero when nothing was sized (experts resident, no budget) */
    const char *cache_sizing; /* df_stats.cache_sizing */
    df_model_info info;
    int32_t stop_ids[16];
    int n_stop;
    /* the chat template: the family's, or the variant the checkpoint's
     * tokenizer_config.json shows (df_chat_template_for) */
    df_chat_template_fn chat;
    uint64_t tokens;
    double eval_s;
    double block_s[DF_BLK_N]; /* the forward passes' time per block (forward.h) */
    int chunk;            /* rows per forward pass */
    /* routing replay (df_engine_opts.replay_routing) */
    df_trace *replay;
    char *replay_path;
    int *replay_layer;    /* [layers] MoE ordinal of each model layer, -1 dense */
    uint64_t replay_next; /* trace token the next evaluated row uses */
    df_pcache *pcache;    /* the prompt cache, or NULL */
    /* experts by rank (ranks.c): the MPI run, or NULL; worker: this process
     * is not rank 0 (it holds no always-active weights in RAM) */
    struct df_dist *dist;
    bool worker;
    int pc_every;         /* prompt positions stored: multiples of this */
};

struct df_session {
    df_engine *eng;
    df_progress_fn progress;
    void *progress_user;
    df_seq *seq;
    df_fwd fwd;
    int max_ctx;
    int32_t *tokens;      /* [max_ctx]: the first seq->pos are the tokens it holds */
    uint64_t replay_base; /* trace token of row 0 of the pass in progress */
    /* df_session_replay_from: the trace token its next row uses, else the
     * engine's shared counter (replay_next) */
    bool replay_own;
    uint64_t replay_next;
};


/* ---- residency.c: the weights that stay in RAM mapped in ---------------------- */

/* Maps the weights' pages in (routed experts too unless they stream). */
void df_engine_prefault(const df_model *m, bool experts_too, const bool *done);
/* Resident weights on 2 MiB pages where the kernel can; then prefaulted, and the
 * FP8 matrices' maps made on the pool (routed experts' too). */
void df_engine_resident_weights(df_model *m, df_pool *pool);

/* ---- budget.c: memory plan, budget, expert cache --------------------------------- */

uint64_t df_engine_session_bytes_at(const df_model *m, int ctx, int chunk);
/* A model with nothing to stream: the budget must hold all of it. */
int df_engine_dense_budget(df_engine *e, const df_engine_opts *o, df_error *err);
/* Sizes the expert cache and opens the store (a pack, or the safetensors). */
int df_engine_setup_streaming(df_engine *e, const df_engine_opts *o, const df_engine_dev *dev, df_error *err);
/* The memory fields of df_stats. */
void df_engine_mem_stats(const df_engine *e, df_stats *o);

/* ---- pcache_session.c: the prompt cache ---------------------------------------------- */

/* Opens df_engine_opts.prompt_cache (the model's fingerprint first). */
int df_engine_setup_pcache(df_engine *e, const df_engine_opts *o, df_error *err);
/* The prompt cache's fields of df_stats. */
void df_engine_pcache_stats(const df_engine *e, df_stats *o);

/* ---- ranks.c: experts by rank (src/dist/) ------------------------------------------ */

/* MPI and this rank (opts->experts_by_rank), before the model opens; *experts
 * is opts->experts with "{rank}" replaced (malloc'ed, or NULL). */
int df_engine_ranks_init(df_engine *e, const df_engine_opts *o, char **experts, df_error *err);
/* The start-up exchange and the plan, once the expert source is open. */
int df_engine_ranks_start(df_engine *e, const df_engine_opts *o, const char *experts, df_error *err);
/* Rank 0 tells the workers to stop; MPI is finalized (NULL dist: nothing). */
void df_engine_close_ranks(df_engine *e);
/* Rank 0 with --rank0-experts no (budget.c): no expert store nor cache; the
 * always-active weights copied into RAM under a budget (as streaming does),
 * which must hold them and the sessions, with nothing for experts. */
int df_engine_no_experts_budget(df_engine *e, const df_engine_opts *o, df_error *err);
/* An error this rank met opening its checkpoint or expert source (a pack of
 * another model, say): "rank N on HOST: " before it when the run has several
 * ranks (mpirun names only the process). */
int df_engine_ranks_blame(const df_engine *e, int rc, df_error *err);
/* The fields of df_stats. */
void df_engine_ranks_stats(const df_engine *e, df_stats *o);

/* ---- replay.c: routing replay (benchmarks and tests) ------------------------------- */

int df_engine_setup_replay(df_engine *e, const char *path, df_error *err);
void df_engine_free_replay(df_engine *e);
/* The forward pass's routing hook; user is the session. */
void df_engine_replay_route(void *user, int layer, int row, int *ids);
/* The expert ids trace token `token` (wrapping around) gives model layer `layer`. */
void df_engine_replay_ids(const df_engine *e, uint64_t token, int layer, int *ids);

#endif
