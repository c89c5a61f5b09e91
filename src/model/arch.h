/*
 * arch.h - the architecture interface: everything that differs between model
 * families, behind one table entry per config.json model_type. The engine,
 * the expert store, the pack writer and the server dispatch through it and
 * never name a family.
 *
 * A family lives in one file, src/model/FAMILY.c, whose forward pass reads top
 * to bottom over the shared blocks (blocks.h); docs/architecture.md has the
 * checklist for adding one.
 */
#ifndef DF_ARCH_H
#define DF_ARCH_H

#include "model/forward.h"
#include "tokenizer/chat.h"

#include <jansson.h>
#include <stdio.h>

struct df_cfg_ctx;
struct df_quant;

/* A model's sizes from its config alone, as shipped (inspect --config-only):
 * always-active bytes, one routed expert's bytes, one sequence's fixed state
 * and its state per token. */
typedef struct df_plan {
    uint64_t active, expert, state_fixed, state_per_token;
} df_plan;

/* A family's plan sums bytes as shipped here (arch.c). */
typedef struct df_plan_ctx {
    const struct df_config *c;
    const struct df_quant *q;
    df_error *err;
    uint64_t bytes;
} df_plan_ctx;
/* + the nn.Linear named by fmt (a tensor name without ".weight"), [rows x
 * cols] in the format the quantization_config gives it (BF16 without one). */
int df_plan_linear(df_plan_ctx *p, int rows, int cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* + a SwiGLU's gate_proj and up_proj [I x hidden] and down_proj [hidden x I]
 * under the module fmt names (without a trailing '.'). */
int df_plan_swiglu(df_plan_ctx *p, int I, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* + the embedding, the final norm and the LM head (none when tied), BF16. */
int df_plan_spine(df_plan_ctx *p);

typedef struct df_arch {
    const char *model_type;          /* config.json's model_type */
    /* config.json: the family's fields (the shared ones are already in c;
     * config_json.h has the readers). Derives c->layer_is_moe. */
    int (*parse_config)(df_config *c, json_t *root, const struct df_cfg_ctx *p);
    /* Routed experts: their parts unquantized, and the prefix of expert e of
     * layer `layer`'s tensor names, which ends with a '.' (NULL layout: a
     * dense family). */
    const df_expert_layout *expert_layout;
    void (*expert_prefix)(const df_config *c, int layer, int e, char *name, size_t n);
    /* Finds, checks and keeps every tensor the forward pass uses (model.h's
     * helpers); m->fam is the family's. unload frees what load made. */
    int (*load)(df_model *m, df_error *err);
    void (*unload)(df_model *m);
    /* One sequence's state, and its bytes for a context of max_ctx. */
    int (*seq_new)(const df_model *m, int max_ctx, df_seq **out, df_error *err);
    uint64_t (*seq_bytes)(const df_model *m, int max_ctx);
    /* Work buffers for max_rows rows at once (a context of max_ctx), and the
     * bytes they and a forward pass allocate. */
    void *(*work_new)(const df_model *m, int max_rows, int max_ctx);
    void (*work_free)(void *work);
    uint64_t (*work_bytes)(const df_model *m, int max_rows, int max_ctx);
    int (*forward)(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err);
    /* Token strings that end an assistant turn, beyond generation_config's
     * EOS ids (NULL-terminated). */
    const char *const *stop_tokens;
    /* The chat template (tokenizer/chat.h): renders messages and says where
     * their content lies, which is tokenized as plain text. */
    df_chat_template_fn chat;
    /* The family's lines of `deltafin inspect`. */
    void (*inspect)(const df_model *m, FILE *f);
    /* Sizes from config.json and its quantization_config alone (NULL: the
     * family does not say). */
    int (*plan)(const df_config *c, const struct df_quant *q, df_plan *p, df_error *err);
} df_arch;

/* The entry for a model_type, or NULL. */
const df_arch *df_arch_find(const char *model_type);
/* "a, b, c": the supported model types, for error messages. */
void df_arch_names(char *buf, size_t n);

#endif
