/*
 * config_json.h - the typed field readers config.c and the families' own
 * config parsers share, so that every field of every family is checked the
 * same way and its error names the file and the field.
 *
 * Conventions: a JSON null counts as absent (HF writes "sliding_window": null
 * and the like). Integer fields accept JSON integers and integral reals
 * (1.0), and reject anything else with "field 'x' must be an integer".
 */
#ifndef DF_CONFIG_JSON_H
#define DF_CONFIG_JSON_H

#include "model/config.h"

#include <jansson.h>

/* Upper bounds far above any real model, low enough that products of two of
 * them (heads * head_dim, experts * size) stay far inside int64 and that
 * hidden/intermediate/vocab each fit an int. */
#define DF_CFG_MAX_VOCAB (1 << 24)
#define DF_CFG_MAX_HIDDEN (1 << 18)
#define DF_CFG_MAX_INTER (1 << 20)
#define DF_CFG_MAX_HEADS 1024
#define DF_CFG_MAX_HEAD_DIM 1024
#define DF_CFG_MAX_POS (1 << 26)
#define DF_CFG_MAX_EXPERTS 4096

typedef struct df_cfg_ctx {
    const char *path;
    const char *prefix; /* "" or "rope_scaling." for nested fields */
    df_error *err;
} df_cfg_ctx;

/* NULL when absent or null. */
json_t *df_cfg_field(json_t *obj, const char *key);
/* Integer in lo..hi; *present (may be NULL) tells whether it was given; a
 * required field that is absent is an error. */
int df_cfg_int(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, long long lo,
               long long hi, int *out, bool *present);
/* Finite number; `positive` demands > 0. */
int df_cfg_num(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, bool positive,
               double *out, bool *present);
int df_cfg_bool(const df_cfg_ctx *c, json_t *obj, const char *key, bool *out);
/* String; *out stays NULL when absent. */
int df_cfg_str(const df_cfg_ctx *c, json_t *obj, const char *key, bool required, const char **out);
/* A list of layer indices in 0..n_layers-1 into mark[] (mark[i] = true). */
int df_cfg_layer_list(const df_cfg_ctx *c, json_t *obj, const char *key, int n_layers, bool *mark);
/* Parses text as one JSON object (duplicate keys refused); NULL with *rc set. */
json_t *df_json_object(const char *json, size_t len, const char *path, df_error *err, int *rc);
/* bos_token_id / eos_token_id (an id, or a list of up to 8) of root into c. */
int df_config_ids(df_config *c, json_t *root, const df_cfg_ctx *p);
/* rope_scaling, or transformers v5's rope_parameters (with its rope_theta). */
int df_cfg_rope(df_config *cfg, json_t *root, const df_cfg_ctx *c);

#endif
