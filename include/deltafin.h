/*
 * deltafin.h - the public API of deltafin.
 *
 * The product API; benchmark and test controls are elsewhere (src/engine/dev.h).
 * Thread safety: an engine, its sessions and speculative decoders are used
 * from one thread at a time (evaluation drives the expert store, which has
 * one layer in flight); callers that evaluate from several threads serialise
 * those calls themselves (the server runs one worker). df_engine_info,
 * df_tokenize, df_token_bytes, df_is_stop_token, df_chat_render and
 * df_chat_tokenize only read the engine and may run on other threads at the
 * same time. A sampler and a df_text_stream belong to one thread at a time.
 *
 * Two objects: an engine (a loaded model: config, tokenizer, weights and, later,
 * its expert store) and sessions (one KV-cache timeline each, many per engine).
 * The CLI and the server use only this header. Every function that can fail
 * returns a df_status code and fills a df_error whose message names the file,
 * tensor or field at fault.
 */
#ifndef DELTAFIN_H
#define DELTAFIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum df_status {
    DF_OK = 0,
    DF_ERR_IO = 1,          /* missing, unreadable or truncated file */
    DF_ERR_FORMAT = 2,      /* malformed or hostile content */
    DF_ERR_UNSUPPORTED = 3, /* valid but not supported (architecture, dtype, option) */
    DF_ERR_SHAPE = 4,       /* tensor shape disagrees with the config */
    DF_ERR_NOMEM = 5,
    DF_ERR_ARG = 6,         /* bad argument from the caller */
    DF_ERR_CONTEXT = 7      /* the session's context is full */
} df_status;

typedef struct df_error {
    int code;
    char msg[1024];
} df_error;

typedef struct df_engine df_engine;
typedef struct df_session df_session;
typedef struct df_sampler df_sampler;

/* ---- engine ------------------------------------------------------------ */

typedef struct df_engine_opts {
    const char *model_dir; /* Hugging Face checkpoint directory */
    int n_threads;         /* 0 = number of online CPUs */
    const char *isa;       /* NULL/"auto", "avx512", "avx2" or "c": kernel path */
    /* Expert streaming. experts: comma-separated pack directories (one per
     * drive, none empty), or NULL. ram_budget: bytes the whole process may keep resident
     * (its peak RSS), 0 = none: a pack's cache then holds every expert, or
     * the available memory less an eighth (docs/budget.md). With a budget
     * and no pack, experts stream from the safetensors files (buffered reads
     * through the page cache). Without either, the whole checkpoint is used
     * in place (memory-mapped). Sizes may be anything up to UINT64_MAX: the
     * cache never holds more than every expert. */
    const char *experts;
    uint64_t ram_budget;
    int context;           /* context length sessions will use (for the budget);
                              0 = min(model maximum, 4096) */
    uint64_t expert_cache; /* bytes of expert cache slots, overriding what the
                              budget leaves (0 = derive from ram_budget) */
    int prefill_chunk;     /* rows evaluated together (layer by layer, each
                              expert read once per chunk); 0 = 512 */
    const char *cache_policy; /* "deltafin" (default) or "lru" */
    uint64_t pin_bytes;    /* pinned tier: hottest experts (persisted heat) read
                              in at start-up and never evicted */
    /* Read-ahead of streamed experts: "on" = per layer, the better of the
     * router lookahead and the previous token's experts while it predicts
     * well and a time gate finds it pays, else nothing; "router" or "prev"
     * force one predictor; NULL/"off": none (docs/prefetch.md). */
    const char *prefetch;
    /* Bytes the budget must also hold for something outside this engine that
     * the process keeps resident (a draft model: df_spec_draft_bytes), and
     * what it is, for the budget's error message. */
    uint64_t reserve_bytes;
    const char *reserve_for;
    /* 1: opened only to be described (inspect): weights used in place are
     * left mapped, not read into memory ahead of use. */
    int describe_only;
    /* Prompt cache (README "Prompt cache"): a directory of session states
     * keyed by this model and the tokens before them, so that a prompt
     * starting like an earlier one (in this process or another, before a
     * restart) prefills only the rest. NULL: none. prompt_cache_size: most
     * bytes of files there (0: 4 GiB; least recently used go first).
     * prompt_cache_ram: bytes of recent states also kept in RAM (0: none;
     * count them in reserve_bytes under a budget). prompt_cache_every: the
     * prompt positions stored, besides its end, are its multiples (0: 1024). */
    const char *prompt_cache;
    uint64_t prompt_cache_size;
    uint64_t prompt_cache_ram;
    int prompt_cache_every;
    /* Sessions that run at once (serve --parallel), for the budget: 0 or 1:
     * one session with its own work buffers; N > 1: N sessions' state, one
     * df_batcher's work buffers of prefill_chunk rows (df_eval_multi; the
     * sessions then allocate none), and N logits rows and samplers. */
    int sessions;
    /* Experts spread over the processes of an MPI run (README "Several
     * machines"), for `mpirun -n N`: 1: rank 0 runs the model (attention,
     * routers, LM head, sampling) and every rank owns a share of the routed
     * experts (by a weighted hash over (layer, expert), weights from each
     * rank's expert cache and drive bandwidth), each with its own expert
     * source from these options (`experts` may contain "{rank}", replaced by
     * the rank's number). Every rank opens the engine; a worker rank then
     * calls df_engine_work. 0: no MPI at all. rank_timeout_s: how long rank
     * 0 waits for a rank's answer before failing (0: 60 s).
     * rank0_no_experts: rank 0 owns none. rank_bandwidth_gbs: this rank's
     * drive bandwidth for the plan (0: measured on its pack). */
    int experts_by_rank;
    double rank_timeout_s;
    int rank0_no_experts;
    double rank_bandwidth_gbs;
} df_engine_opts;

typedef struct df_model_info {
    const char *architecture; /* "qwen3" or "qwen3_moe" */
    int vocab_size;
    int n_layers;
    int hidden_size;
    int max_context;
    int n_experts;        /* 0 for dense */
    int n_experts_active; /* top-k */
    uint64_t bytes_total;  /* all tensors */
    uint64_t bytes_dense;  /* always-active weights */
    uint64_t bytes_experts;/* routed experts */
    uint64_t bytes_active_per_token; /* weight bytes one decode step reads: dense
                                        (less the embedding table), LM head, top-k experts */
    const char *isa;       /* kernel path in use */
    int n_threads;
    /* generation_config.json sampling defaults; negative when unset */
    float default_temperature;
    float default_top_p;
    int default_top_k;
} df_model_info;

int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err);
/* Rank 0's close also tells the other ranks to stop (with experts_by_rank). */
void df_engine_close(df_engine *eng);
/* 1 when this process is a worker rank of an experts_by_rank run (not rank
 * 0): it evaluates nothing itself and serves rank 0 with df_engine_work. */
int df_engine_is_worker(const df_engine *eng);
/* A worker rank's loop: computes its experts for rank 0 until rank 0 closes
 * its engine. Then close the engine and exit 0. */
int df_engine_work(df_engine *eng, df_error *err);
/* Why a rank of an experts_by_rank run failed to answer (rank 0), NULL while
 * none has: every later evaluation fails, so a server stops (exit status 1). */
const char *df_engine_ranks_failed(const df_engine *eng);
const df_model_info *df_engine_info(const df_engine *eng);
/* Bytes a session of max_context positions allocates (KV cache and buffers). */
uint64_t df_engine_session_bytes(const df_engine *eng, int max_context);
/* Counters since the engine was opened (expert streaming fields are zero when
 * the experts are resident). */
typedef struct df_stats {
    uint64_t tokens;            /* rows evaluated */
    double eval_s;              /* wall time inside df_session_eval */
    double read_wait_s;         /* of which blocked waiting for expert reads */
    /* ... and spent in (the rest of eval_s is "other": embedding, residual
     * adds and mixing, the LM head, the session's own work): */
    double kda_s;               /* linear-attention (KDA) layers */
    double attn_s;              /* softmax attention: GQA or MLA */
    double ffn_s;               /* the MoE spine and dense FFN: norms, routers, shared experts,
                                   latent projections */
    double experts_s;           /* routed experts' compute (read_wait_s not included) */
    uint64_t expert_requests;   /* (layer, expert) uses */
    uint64_t expert_hits;
    uint64_t expert_misses;
    uint64_t expert_bytes_read;
    uint64_t expert_rereads;    /* checksum mismatches read again */
    int cache_slots;            /* expert slots in RAM */
    int pinned_experts;         /* read in at start-up from the persisted heat */
    uint64_t cache_bytes;
    const char *expert_source;  /* "resident", "pack" or "safetensors" */
    int direct_io;              /* pack read with O_DIRECT */
    const char *prefetch;       /* "off", "on", "router" or "prev" */
    uint64_t prefetch_reads;    /* records read on a prediction */
    uint64_t prefetch_hits;     /* misses whose read a prediction had started */
    uint64_t prefetch_bytes_used;
    uint64_t prefetch_bytes_wasted; /* read on a prediction the layer did not use */
    uint64_t prefetch_no_room;  /* predicted experts not read for lack of a free slot */
    /* Memory, as counted when the engine was opened (zero, NULL when nothing
     * was sized: experts resident and no budget). mem_estimate is the peak
     * RSS the engine expects: what it measured (weights kept in RAM,
     * tokenizer), one session at mem_context positions, slack, the reserve
     * and the expert slots; or the peak while loading, if that was higher.
     * mem_session counts mem_sessions sessions (df_engine_opts.sessions). */
    uint64_t ram_budget;        /* df_engine_opts.ram_budget, 0: none */
    uint64_t mem_estimate;
    uint64_t mem_resident, mem_load_peak, mem_session, mem_slack, mem_reserve;
    int mem_context, mem_sessions;
    const char *cache_sizing;   /* what set cache_bytes: "all experts fit", "--ram-budget",
                                   "--expert-cache" or "available memory" */
    uint64_t mem_available;     /* the machine's available memory then (MemAvailable) */
    /* Prompt cache (all zero without one): restores that found a cached
     * prefix, and that did not; positions restored; bytes of files read and
     * written; files removed to keep the directory under its size; segments
     * taken from the RAM tier and its bytes now; wall time restoring
     * (reading, checking, loading) and storing; 1 when a failed write (a
     * full disk) turned writing off. */
    uint64_t pcache_hits, pcache_misses, pcache_tokens;
    uint64_t pcache_bytes_read, pcache_bytes_written, pcache_evicted;
    uint64_t pcache_ram_hits, pcache_ram_bytes;
    double pcache_restore_s, pcache_store_s;
    int pcache_writes_off;
    /* Experts over several ranks (experts_by_rank; else zero): the ranks,
     * bytes and messages rank 0 sent to and received from the others, and
     * its time waiting on their answers (not in experts_s). */
    int ranks;
    uint64_t rank_bytes_sent, rank_bytes_received, rank_messages;
    double rank_wait_s;
    /* ... and the other ranks' expert storage, summed over them as of their
     * latest answer: bytes read, cache hits and misses (rank 0's own are the
     * expert_* fields above). */
    uint64_t rank_storage_bytes_read, rank_storage_hits, rank_storage_misses;
} df_stats;
void df_engine_stats(const df_engine *eng, df_stats *out);

/* Human-readable config, tensor inventory and byte counts. */
void df_engine_inspect(const df_engine *eng, FILE *out);
/* From DIR/config.json alone (no tensors needed): the always-active bytes,
 * the routed expert bytes per token, and the decode speed a machine with
 * `ram` bytes of RAM (0: not asked) and drives reading `drive_gbps` GB/s
 * could expect from those counts. */
int df_inspect_config(const char *dir, uint64_t ram, double drive_gbps, FILE *out, df_error *err);

/* ---- tokenizer and chat ------------------------------------------------ */

/* Encodes text as it is, for a prompt the caller writes in full: every added
 * token in it is recognised, control tokens included ("<|im_end|>" gives the
 * end-of-turn id). Never use it on text that others supply inside a prompt
 * (chat messages: df_chat_tokenize). *ids is malloc'ed. */
int df_tokenize(const df_engine *eng, const char *text, size_t len,
                int32_t **ids, size_t *n_ids, df_error *err);
/* The raw bytes a token stands for (not NUL-terminated, may be partial UTF-8). */
int df_token_bytes(const df_engine *eng, int32_t id, const char **bytes, size_t *len);
/* True for end-of-turn / generation_config EOS ids. */
int df_is_stop_token(const df_engine *eng, int32_t id);

/* Holds back incomplete UTF-8 so that a stream of tokens prints whole characters. */
typedef struct df_text_stream {
    unsigned char pending[8];
    int n_pending;
} df_text_stream;
/* Appends the printable part of token `id` to out (cap bytes, >= 16 + token length);
 * returns the number of bytes written. */
size_t df_text_stream_push(const df_engine *eng, df_text_stream *st, int32_t id,
                           char *out, size_t cap);
/* Flushes what is left (invalid trailing bytes become U+FFFD). */
size_t df_text_stream_flush(df_text_stream *st, char *out, size_t cap);

typedef struct df_chat_msg {
    const char *role; /* "system", "user", "assistant", "tool" */
    const char *content;
} df_chat_msg;

/* enable_thinking below: 0 off, anything else on. A template that also states
 * how hard to think (Kimi K3's thinking-effort system message) takes the effort
 * from it: DF_THINK_ON is that template's default (max for Kimi K3); the
 * others ask for one. Templates without an effort read them all as on. */
enum { DF_THINK_OFF = 0, DF_THINK_ON = 1, DF_THINK_LOW = 2, DF_THINK_HIGH = 3, DF_THINK_MAX = 4 };

/* The conversation through the model's chat template, as the prompt's token
 * ids (*ids malloc'ed). Special tokens (tokenizer.json "special": true, e.g.
 * <|im_start|>, <|im_end|>, <|endoftext|>) come from the template only: in
 * message content their text is encoded as ordinary text, so no message can
 * close its turn or open another. Non-special added tokens (Qwen3's <think>,
 * <tool_call>) are recognised in content too, as Hugging Face does. For
 * content without special-token text the ids are those of df_tokenize on
 * df_chat_render's text. */
int df_chat_tokenize(const df_engine *eng, const df_chat_msg *msgs, int n_msgs,
                     int add_generation_prompt, int enable_thinking,
                     int32_t **ids, size_t *n_ids, df_error *err);
/* Renders the model's chat template as text (*out malloc'ed), for display:
 * tokenizing it would turn special-token text in content into control tokens,
 * so prompts come from df_chat_tokenize. */
int df_chat_render(const df_engine *eng, const df_chat_msg *msgs, int n_msgs,
                   int add_generation_prompt, int enable_thinking,
                   char **out, df_error *err);

/* ---- sessions ---------------------------------------------------------- */

int df_session_new(df_session **out, df_engine *eng, int max_context, df_error *err);
void df_session_free(df_session *s);
int df_session_pos(const df_session *s);
df_engine *df_session_engine(const df_session *s);
/* The tokens the session holds: its first df_session_pos tokens, valid until
 * the next call that changes it. */
const int32_t *df_session_tokens(const df_session *s);
/* The most positions the session can hold (its max_context). */
int df_session_capacity(const df_session *s);
/* Returning to an earlier position (rejected drafts, prefix reuse). A model
 * whose state has one entry per position (a key/value or latent cache) can
 * return to any earlier position; a model with recurrent state only to the
 * positions it was asked to keep before evaluation passed them, and to 0.
 * df_session_keep asks for pos (at or beyond the current position; an
 * earlier one, whose state is gone, is ignored) to be kept;
 * df_session_rollback returns to pos or, when pos cannot be restored, to the
 * nearest earlier position that can, and returns the position it is at now
 * (<= pos), or -1 with err for a pos outside 0..df_session_pos. */
void df_session_keep(df_session *s, int pos);
int df_session_rollback(df_session *s, int pos, df_error *err);
/* How many positions the session keeps at once (INT_MAX when every position
 * can be returned to); beyond it, keeping one forgets the oldest kept but the
 * earliest position. */
int df_session_keep_limit(const df_session *s);
/* Called after every layer of a forward pass over `rows` rows, for progress
 * displays on long prompts. */
typedef void (*df_progress_fn)(void *user, int layer, int n_layers, int rows_done, int rows_total);
void df_session_set_progress(df_session *s, df_progress_fn fn, void *user);

/* The prompt cache (df_engine_opts.prompt_cache). df_generate uses it on
 * its own; these are for callers that evaluate prompts themselves.
 * df_prompt_cache_interval: the interval the engine was opened with, 0 when
 * it has no prompt cache. df_session_cache_interval: the positions of a
 * prompt stored besides its end are its multiples (the engine's interval,
 * or more for a model whose recurrent state, which every stored segment
 * carries whole, outweighs that many positions); 0 without a prompt cache.
 * df_session_cache_restore: the session must hold the first df_session_pos
 * tokens of prompt; restores the longest cached prefix of prompt[0..lim)
 * that is longer, if any (bit for bit the state a prefill would give), and
 * returns the position the session is at (-1 with err when it holds other
 * tokens). Files that do not verify are removed with a warning.
 * df_session_cache_store: stores the state after the session's first pos
 * tokens (pos <= df_session_pos; with recurrent state, its position or a
 * position kept with df_session_keep that it has passed); 1 when the cache
 * has it now, 0 when not. Never fails: a write error is a warning and turns
 * writing off. */
int df_prompt_cache_interval(const df_engine *eng);
int df_session_cache_interval(const df_session *s);
int df_session_cache_restore(df_session *s, const int32_t *prompt, int lim, df_error *err);
int df_session_cache_store(df_session *s, int pos);

/* Evaluates n tokens at the session's current position.
 * logits: NULL, or room for vocab_size floats (want_all_rows == 0: last row only)
 * or n * vocab_size floats (want_all_rows != 0). */
int df_session_eval(df_session *s, const int32_t *tokens, int n,
                    float *logits, int want_all_rows, df_error *err);

/* ---- several sessions at once --------------------------------------------- */

/* One forward pass over rows of many sessions: each session's rows are
 * appended to it as df_session_eval would, and a MoE layer runs (and, when
 * experts stream, reads) each expert its rows need once for all of them. A
 * row's logits are bit for bit those of its session evaluated alone. A
 * batcher holds the work buffers of one pass (df_batcher_bytes); its
 * sessions' own buffers are then never allocated unless df_session_eval is
 * called on them. Used from one thread at a time, like its engine. */
typedef struct df_batcher df_batcher;

typedef struct df_eval_item {
    df_session *session;   /* at most once per call */
    const int32_t *tokens; /* n >= 1 tokens at the session's current position */
    int n;
    float *logits;         /* NULL, or room for vocab_size floats (all_rows == 0:
                              the last row's) or n * vocab_size (all_rows != 0) */
    int all_rows;
} df_eval_item;

/* max_rows: rows per pass (0: the engine's prefill chunk); max_context: the
 * largest session context it will evaluate (0: the engine's context). */
int df_batcher_new(df_batcher **out, df_engine *eng, int max_rows, int max_context, df_error *err);
void df_batcher_free(df_batcher *b);
int df_batcher_max_rows(const df_batcher *b);
/* Bytes a batcher with these arguments allocates. */
uint64_t df_batcher_bytes(const df_engine *eng, int max_rows, int max_context);
/* Evaluates every item's tokens: passes of at most max_rows rows, filled
 * with the items' rows in item order (an item longer than a pass's room
 * continues in the next). On failure nothing of the failed pass is kept: each
 * session holds the rows of the passes before it (df_session_pos; a recurrent
 * state may go back to a kept position, as with df_session_eval). */
int df_eval_multi(df_batcher *b, const df_eval_item *items, int n_items, df_error *err);

/* ---- command-line helpers -------------------------------------------- */

/* Parses a byte size as users write it: "4000000", "512M", "8G", "1.5GiB"
 * (K/M/G/T are powers of 1024). Returns DF_OK, or DF_ERR_ARG naming `what`. */
int df_parse_size(const char *text, const char *what, uint64_t *bytes, df_error *err);

/* ---- sampling ---------------------------------------------------------- */

typedef struct df_sampler_params {
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off */
    int repeat_last_n;    /* window for the penalty, 0 = whole history */
    uint64_t seed;
} df_sampler_params;

void df_sampler_params_default(df_sampler_params *p);
int df_sampler_new(df_sampler **out, const df_sampler_params *p, df_error *err);
void df_sampler_free(df_sampler *s);
/* Picks a token from logits (modified in place). history: tokens so far. */
int32_t df_sampler_sample(df_sampler *s, float *logits, int vocab,
                          const int32_t *history, int n_history);
/* The distribution df_sampler_sample draws from for these logits and history
 * (same penalty, temperature, top-k/p, min-p; greedy: one-hot at the argmax):
 * probs gets vocab floats summing to 1. logits are modified in place as by
 * df_sampler_sample. Does not advance the random stream. Returns 0, or -1 for
 * bad arguments or when scratch memory cannot be had. */
int df_sampler_probs(df_sampler *s, float *logits, int vocab, const int32_t *history,
                     int n_history, float *probs);

/* ---- speculative decoding ----------------------------------------------- */

/* A drafter guesses a few tokens ahead; the target checks them all in one
 * batched pass and keeps the longest prefix it agrees with, plus its own next
 * token. The output is token for token that of plain decoding with the same
 * sampler (greedy, and sampling with the same seed); or, with opts.rejection,
 * standard rejection sampling: the target's distribution exactly, not the
 * same sample. An
 * economics gate measures what a verification pass costs against a plain step
 * and the acceptance rate, picks the depth and switches drafting off (probing
 * again later) when it does not pay. */
typedef struct df_spec df_spec;

typedef struct df_spec_opts {
    /* "lookup": prompt lookup (continue the latest earlier match of the last n
     * tokens); otherwise the directory of a draft checkpoint sharing the
     * target's tokenizer, evaluated fully in RAM with its own KV cache. */
    const char *draft;
    int k_max;        /* most drafted tokens per pass (1..16; 0 = 8) */
    int lookup_n;     /* lookup: longest n-gram to match (1..16; 0 = 3) */
    int n_threads;    /* draft model threads (0 = all CPUs) */
    const char *isa;  /* draft model kernel path (NULL = auto) */
    int rejection;    /* sampling: standard rejection sampling (accept d with
                         probability min(1, p(d)/q(d))) instead of the exact
                         default, which accepts d when it is the token the
                         plain sampler draws there */
} df_spec_opts;

/* The counters behind --stats. */
typedef struct df_spec_stats {
    uint64_t passes;         /* target passes while decoding */
    uint64_t verify_passes;  /* of which checked drafted tokens */
    uint64_t drafted, accepted;
    uint64_t tokens;         /* tokens produced */
    uint64_t spec_tokens;    /* of which by verification passes */
    uint64_t switched_off;   /* times the gate turned drafting off */
    int depth;               /* depth the gate would choose now (0 = off) */
    double mean_depth;       /* drafted tokens per verification pass */
    double acceptance;       /* gate's running estimate, per drafted token */
    double plain_s, verify_s;         /* wall time: mean plain step, verify pass */
    double plain_bytes, verify_bytes; /* expert bytes read: mean per plain step, per pass */
    double plain_time_s, spec_time_s; /* totals spent in plain steps / verify passes */
    double speedup;          /* measured: plain s/token over verify-pass s/token */
    double run_speedup;      /* measured: the whole decode against plain steps only
                                (tokens x mean plain step over the time of all passes) */
    uint64_t probes_declined; /* times a draft model's probe was not worth its catch-up */
    double draft_token_s;    /* drafter: mean seconds per drafted token (catch-up aside) */
    double row_cost;         /* gate: cost of one drafted token in plain steps (verify row + drafting) */
} df_spec_stats;

/* Called on every row of target (and draft) logits before the sampler sees it,
 * with the tokens that precede the row (e.g. the server's OpenAI penalties). */
typedef void (*df_logits_fn)(void *user, float *logits, int vocab, const int32_t *history,
                             int n_history);

int df_spec_new(df_spec **out, df_engine *target, const df_spec_opts *opts, df_error *err);
/* Bytes speculative decoding with opts keeps resident for a target of the
 * given vocabulary and a context of `context` tokens: a draft model's weights,
 * its KV cache and buffers, and the verification rows (vocab 0: a draft
 * model's own vocabulary, which must be the target's; for lookup, then only
 * the context copy). For the target's df_engine_opts.reserve_bytes, before
 * the target is opened (the draft is opened and closed to size it). */
int df_spec_draft_bytes(const df_spec_opts *opts, int vocab, int context, uint64_t *bytes, df_error *err);
void df_spec_free(df_spec *sp);
void df_spec_set_logits_hook(df_spec *sp, df_logits_fn fn, void *user);
/* One decoding step. s holds the keys/values of hist[0 .. n_hist-1): the last
 * token hist[n_hist-1] is not yet evaluated. Evaluates it (with any drafted
 * tokens), writes 1..max_out new tokens to out (*n_out), and leaves s holding
 * hist + out except the last new token. The session must have room for
 * position n_hist - 1. */
int df_spec_step(df_spec *sp, df_session *s, df_sampler *smp, const int32_t *hist, int n_hist,
                 int32_t *out, int max_out, int *n_out, df_error *err);
void df_spec_stats_get(const df_spec *sp, df_spec_stats *out);
/* Human-readable summary of the stats (for --stats). */
void df_spec_report(const df_spec *sp, FILE *out);

/* ---- generation ----------------------------------------------------------- */

/* The one generation loop `run` and the server use: the prompt's rows (the
 * ones the session does not already hold), the first token from the prompt's
 * logits, then plain or speculative steps until a stop token, max_new tokens,
 * a full context, the caller's stop or a cancellation. A speculative run's
 * tokens are those of the plain run (df_spec_step). */
typedef enum df_finish {
    DF_FINISH_STOP = 0,  /* an end-of-turn / EOS token (passed to on_token) */
    DF_FINISH_LENGTH,    /* max_new tokens */
    DF_FINISH_CONTEXT,   /* the session's context is full */
    DF_FINISH_CALLER,    /* on_token asked to stop */
    DF_FINISH_CANCELLED  /* cancelled() said so */
} df_finish;

typedef struct df_generate_opts {
    df_sampler *sampler;      /* required */
    df_spec *spec;            /* NULL: plain decoding */
    int max_new;              /* most new tokens; 0: until a stop token or the context is full */
    int prefill_chunk;        /* prompt rows per evaluation, with a cancellation check
                                 between them; 0: the whole prompt at once */
    int reuse_prefix;         /* keep the rows the session holds that the prompt starts with
                                 (at least the prompt's last token is evaluated again) */
    /* Every row of target (and draft) logits before it is sampled, with the
     * tokens before it (e.g. the server's OpenAI penalties). */
    df_logits_fn logits_hook;
    void *hook_user;
    df_progress_fn prefill_progress; /* during the prompt only (may be NULL) */
    void *progress_user;
    /* Teacher forcing (benchmarks, plain decoding only): the token placed at
     * new position `index` instead of the sampled one; stop tokens then end
     * nothing. NULL: off. */
    int32_t (*force)(void *user, int index);
    /* Each new token, in order; nonzero: stop after it (a stop string, ...). */
    int (*on_token)(void *user, int32_t token);
    void (*on_prefill)(void *user, int rows, double seconds);
    void (*on_step)(void *user, int tokens, double seconds); /* after each decode step */
    int (*cancelled)(void *user);   /* checked between prompt chunks and before each step */
    void *user;
} df_generate_opts;

typedef struct df_generate_result {
    int prompt_reused;   /* prompt tokens the session already held or restored */
    int prompt_cached;   /* of which restored from the prompt cache */
    int produced;        /* new tokens passed to on_token */
    int decoded;         /* of which decode steps produced (the first comes from the prompt) */
    df_finish finish;
    double prefill_s, decode_s; /* prefill_s: up to the prompt's logits, a restore included */
} df_generate_result;

/* Generates after prompt[0..n) (n >= 1). The session then holds the prompt
 * and every new token but the last. Fails on evaluation errors; the session
 * stays consistent (df_session_tokens) and may be used again. */
int df_generate(df_session *s, const int32_t *prompt, int n, const df_generate_opts *o,
                df_generate_result *res, df_error *err);

/* ---- generating for several requests at once -------------------------------- */

/* Requests that advance together: each step is one df_eval_multi over every
 * active request's rows (one decode row each; a joining request's prompt in
 * chunks, so it holds the others up by at most one chunk per step), then each
 * request samples with its own sampler and reports its tokens. Requests join
 * (df_batchgen_add) and leave (finished, cancelled) between steps. A
 * request's tokens are exactly those df_generate gives it alone with the same
 * sampler seed. With the engine's prompt cache a request restores at join
 * and stores as df_generate does. A request with a drafter (its own df_spec)
 * drafts as its gate decides; its rows to verify join the step's pass and it
 * keeps what df_spec_step would, so its tokens are still df_generate's. */
typedef struct df_batchgen df_batchgen;

/* When a request leaves: its result, and DF_OK or the evaluation error that
 * ended it (err then says what). Its session is the caller's again. */
typedef void (*df_done_fn)(void *user, const df_generate_result *res, int status, const df_error *err);

/* max_rows: rows per step (0: the engine's prefill chunk); max_context: the
 * largest session context a request brings (0: the engine's context). */
int df_batchgen_new(df_batchgen **out, df_engine *eng, int max_rows, int max_context, df_error *err);
void df_batchgen_free(df_batchgen *g); /* requests still in it are dropped unreported */
/* Adds a request after prompt[0..n) on session s, which it holds until it
 * leaves. From o: sampler (required), max_new, prefill_chunk (its prompt rows
 * per step; 0: what the step has room for), reuse_prefix, logits_hook,
 * force, on_token, on_prefill, on_step, cancelled (checked before each of its
 * steps), spec (NULL, or a drafter no other request in the batch holds; not
 * with force) and user (passed to all of them and to on_done).
 * prefill_progress must be NULL. The prompt is copied. */
int df_batchgen_add(df_batchgen *g, df_session *s, const int32_t *prompt, int n, const df_generate_opts *o,
                    df_done_fn on_done, df_error *err);
/* Requests not yet finished. */
int df_batchgen_active(const df_batchgen *g);
/* One step of every active request. Returns DF_OK (requests that finished
 * were reported), or an evaluation error, which ends the requests of that
 * step (each reported with it); the others go on. */
int df_batchgen_step(df_batchgen *g, df_error *err);

#ifdef __cplusplus
}
#endif
#endif
