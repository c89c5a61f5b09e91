/*
 * generation.h - generation_config.json: the model authors' sampling defaults
 * and the end-of-sequence ids that override config.json's. Used by the engine
 * to fill df_model_info and the stop tokens; the architecture never sees it.
 */
#ifndef DF_GENERATION_H
#define DF_GENERATION_H

#include "model/config.h"

typedef struct df_generation {
    int bos_token_id;        /* -1 if none (config.json's when the file has none) */
    int eos_token_ids[8];
    int n_eos_token_ids;
    double temperature;      /* < 0 if unset */
    double top_p;
    int top_k;
} df_generation;

/* The defaults a config implies (its token ids, no sampling defaults). */
void df_generation_init(df_generation *g, const df_config *c);
/* Applies generation_config.json text (NULL json: no such file). Ids are
 * checked against c's vocabulary. */
int df_generation_parse(df_generation *g, const df_config *c, const char *json, size_t len,
                        const char *path, df_error *err);
/* df_generation_init, then DIR/generation_config.json if present. */
int df_generation_load_dir(df_generation *g, const df_config *c, const char *dir, df_error *err);

#endif
