/*
 * generation.c - reads generation_config.json (generation.h): token ids with
 * config.json's checks, and the sampling defaults (temperature >= 0,
 * top_p in (0, 1], top_k >= 0). The output is only written on success.
 */
#include "model/generation.h"

#include "model/config_json.h"

#include <stdlib.h>
#include <unistd.h>

void df_generation_init(df_generation *g, const df_config *c) {
    memset(g, 0, sizeof *g);
    g->bos_token_id = c->bos_token_id;
    memcpy(g->eos_token_ids, c->eos_token_ids, sizeof g->eos_token_ids);
    g->n_eos_token_ids = c->n_eos_token_ids;
    g->temperature = -1;
    g->top_p = -1;
    g->top_k = -1;
}

int df_generation_parse(df_generation *out, const df_config *cfg, const char *json, size_t len,
                        const char *path, df_error *err) {
    if (!path) path = "generation_config.json";
    if (!out || !cfg) return df_fail(err, DF_ERR_ARG, "%s: df_generation_parse: bad arguments", path);
    if (!json) return DF_OK; /* no generation_config.json: config.json's ids stand */
    int rc;
    json_t *root = df_json_object(json, len, path, err, &rc);
    if (!root) return rc;
    df_config *c = df_xmalloc(sizeof *c); /* the ids are read as config.json's are */
    *c = *cfg;
    c->bos_token_id = out->bos_token_id;
    memcpy(c->eos_token_ids, out->eos_token_ids, sizeof c->eos_token_ids);
    c->n_eos_token_ids = out->n_eos_token_ids;
    df_generation g = *out;
    df_cfg_ctx p = {path, "", err};
    rc = df_config_ids(c, root, &p);
    double t = 0, tp = 1;
    bool have_t = false, have_tp = false;
    if (!rc) rc = df_cfg_num(&p, root, "temperature", false, false, &t, &have_t);
    if (!rc && have_t && t < 0)
        rc = df_fail(err, DF_ERR_FORMAT, "%s: field 'temperature' must not be negative (got %g)",
                     path, t);
    if (!rc && have_t) g.temperature = t;
    if (!rc) rc = df_cfg_num(&p, root, "top_p", false, true, &tp, &have_tp);
    if (!rc && have_tp && tp > 1)
        rc = df_fail(err, DF_ERR_FORMAT, "%s: field 'top_p' must be at most 1 (got %g)", path, tp);
    if (!rc && have_tp) g.top_p = tp;
    if (!rc) rc = df_cfg_int(&p, root, "top_k", false, 0, 1 << 30, &g.top_k, NULL);
    json_decref(root);
    if (rc == DF_OK) {
        g.bos_token_id = c->bos_token_id;
        memcpy(g.eos_token_ids, c->eos_token_ids, sizeof g.eos_token_ids);
        g.n_eos_token_ids = c->n_eos_token_ids;
        *out = g;
    }
    free(c);
    return rc;
}

int df_generation_load_dir(df_generation *g, const df_config *c, const char *dir, df_error *err) {
    df_generation tmp;
    df_generation_init(&tmp, c);
    char *path = df_path_join(dir, "generation_config.json");
    int rc = DF_OK;
    if (access(path, F_OK) == 0) {
        char *text;
        size_t len;
        rc = df_read_file(path, &text, &len, err);
        if (rc == DF_OK) {
            rc = df_generation_parse(&tmp, c, text, len, path, err);
            free(text);
        }
    }
    free(path);
    if (rc == DF_OK) *g = tmp;
    return rc;
}
