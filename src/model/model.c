/*
 * model.c - turns a checkpoint directory into a df_model: finds every tensor the
 * architecture needs, checks its dtype and shape against config.json (the error
 * names the tensor), widens the small norm vectors to F32 (exact), leaves the
 * matrices in their stored dtype inside the mapping, computes the rotary
 * frequencies, and counts always-active vs routed-expert bytes. For streaming
 * it also reads the always-active matrices into anonymous memory (still in
 * their stored dtype, byte for byte; see the last section).
 */
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- tensor lookup with shape checks ----------------------------------------- */

static int find(const df_model *m, const char *name, const df_tensor **out, df_error *err) {
    const df_tensor *t = df_st_find(m->st, name);
    if (!t)
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint",
                       df_st_file_path(m->st, 0), name);
    if (!df_dtype_computable(t->dtype))
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has dtype %s (supported: BF16, F16, F32)",
                       df_st_file_path(m->st, t->file), name, df_dtype_name(t->dtype));
    *out = t;
    return DF_OK;
}

static void shape_str(const df_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int get_matrix(const df_model *m, df_weight *w, const char *name, int rows, int cols,
                      df_error *err) {
    const df_tensor *t;
    int rc = find(m, name, &t, err);
    if (rc) return rc;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[128];
        shape_str(t, got, sizeof got);
        return df_fail(err, DF_ERR_SHAPE,
                       "%s: tensor '%s' has shape %s but config.json implies [%d,%d]",
                       df_st_file_path(m->st, t->file), name, got, rows, cols);
    }
    w->data = t->data;
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->t = t;
    return DF_OK;
}

static int get_vector(const df_model *m, float **out, const char *name, int n, df_error *err) {
    const df_tensor *t;
    int rc = find(m, name, &t, err);
    if (rc) return rc;
    if (t->ndim != 1 || t->shape[0] != n) {
        char got[128];
        shape_str(t, got, sizeof got);
        return df_fail(err, DF_ERR_SHAPE,
                       "%s: tensor '%s' has shape %s but config.json implies [%d]",
                       df_st_file_path(m->st, t->file), name, got, n);
    }
    *out = df_xmalloc(sizeof(float) * (size_t)n);
    df_to_f32(*out, t->data, t->dtype, (size_t)n);
    return DF_OK;
}

/* ---- rotary frequencies ---------------------------------------------------------
 * Follows Hugging Face's rope initialisation, which computes in float32: the
 * stored inv_freq values are what a transformers run uses, so we reproduce
 * them in float rather than in double. */

static double yarn_correction_dim(double rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static int init_rope(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    int dim = c->head_dim, half = dim / 2;
    float base = (float)c->rope_theta;
    m->inv_freq = df_xmalloc(sizeof(float) * (size_t)half);
    m->rope_attn_factor = 1.0f;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)dim;
        m->inv_freq[i] = 1.0f / powf(base, expo);
    }
    switch (c->rope_type) {
    case DF_ROPE_DEFAULT:
        break;
    case DF_ROPE_LINEAR:
        for (int i = 0; i < half; i++) m->inv_freq[i] /= (float)c->rope_factor;
        break;
    case DF_ROPE_YARN: {
        double factor = c->rope_factor;
        double orig = c->rope_original_max_position_embeddings > 0
                          ? c->rope_original_max_position_embeddings
                          : c->max_position_embeddings;
        double af = c->yarn_attention_factor;
        if (af <= 0) {
            if (c->yarn_mscale > 0 && c->yarn_mscale_all_dim > 0)
                af = yarn_get_mscale(factor, c->yarn_mscale) /
                     yarn_get_mscale(factor, c->yarn_mscale_all_dim);
            else
                af = yarn_get_mscale(factor, 1.0);
        }
        double low = yarn_correction_dim(c->yarn_beta_fast, dim, c->rope_theta, orig);
        double high = yarn_correction_dim(c->yarn_beta_slow, dim, c->rope_theta, orig);
        if (c->yarn_truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(base, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pos_freq;
            float inter = 1.0f / ((float)factor * pos_freq);
            float ramp = (float)(((float)i - (float)low) / (float)(high - low));
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            float extra_factor = 1.0f - ramp;
            m->inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
        }
        m->rope_attn_factor = (float)af;
        break;
    }
    case DF_ROPE_DYNAMIC:
        return df_fail(err, DF_ERR_UNSUPPORTED,
                       "config.json: rope_scaling type 'dynamic' is not supported: its "
                       "frequencies change with sequence length, so cached keys would "
                       "not stay valid");
    }
    return DF_OK;
}

/* ---- loading -------------------------------------------------------------------- */

static int load_layer(df_model *m, int li, df_error *err) {
    const df_config *c = &m->cfg;
    df_layer *L = &m->layers[li];
    char n[256];
    int rc, H = c->hidden_size, hd = c->head_dim;
    int qd = c->num_attention_heads * hd, kvd = c->num_key_value_heads * hd;
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if ((rc = get_vector(m, &L->attn_norm, NAME("model.layers.%d.input_layernorm.weight", li), H, err)) ||
        (rc = get_vector(m, &L->ffn_norm, NAME("model.layers.%d.post_attention_layernorm.weight", li), H, err)) ||
        (rc = get_vector(m, &L->q_norm, NAME("model.layers.%d.self_attn.q_norm.weight", li), hd, err)) ||
        (rc = get_vector(m, &L->k_norm, NAME("model.layers.%d.self_attn.k_norm.weight", li), hd, err)) ||
        (rc = get_matrix(m, &L->q, NAME("model.layers.%d.self_attn.q_proj.weight", li), qd, H, err)) ||
        (rc = get_matrix(m, &L->k, NAME("model.layers.%d.self_attn.k_proj.weight", li), kvd, H, err)) ||
        (rc = get_matrix(m, &L->v, NAME("model.layers.%d.self_attn.v_proj.weight", li), kvd, H, err)) ||
        (rc = get_matrix(m, &L->o, NAME("model.layers.%d.self_attn.o_proj.weight", li), H, qd, err)))
        return rc;
    if (c->attention_bias) {
        if ((rc = get_vector(m, &L->q_bias, NAME("model.layers.%d.self_attn.q_proj.bias", li), qd, err)) ||
            (rc = get_vector(m, &L->k_bias, NAME("model.layers.%d.self_attn.k_proj.bias", li), kvd, err)) ||
            (rc = get_vector(m, &L->v_bias, NAME("model.layers.%d.self_attn.v_proj.bias", li), kvd, err)))
            return rc;
        /* Qwen3's o_proj takes the same flag in transformers */
        if ((rc = get_vector(m, &L->o_bias, NAME("model.layers.%d.self_attn.o_proj.bias", li), H, err)))
            return rc;
    }
    L->is_moe = c->layer_is_moe[li];
    if (!L->is_moe) {
        int I = c->intermediate_size;
        if ((rc = get_matrix(m, &L->gate, NAME("model.layers.%d.mlp.gate_proj.weight", li), I, H, err)) ||
            (rc = get_matrix(m, &L->up, NAME("model.layers.%d.mlp.up_proj.weight", li), I, H, err)) ||
            (rc = get_matrix(m, &L->down, NAME("model.layers.%d.mlp.down_proj.weight", li), H, I, err)))
            return rc;
        return DF_OK;
    }
    int E = c->num_experts, I = c->moe_intermediate_size;
    if ((rc = get_matrix(m, &L->router, NAME("model.layers.%d.mlp.gate.weight", li), E, H, err)))
        return rc;
    L->experts = df_xcalloc((size_t)E, sizeof(df_expert));
    for (int e = 0; e < E; e++) {
        df_expert *x = &L->experts[e];
        if ((rc = get_matrix(m, &x->gate, NAME("model.layers.%d.mlp.experts.%d.gate_proj.weight", li, e), I, H, err)) ||
            (rc = get_matrix(m, &x->up, NAME("model.layers.%d.mlp.experts.%d.up_proj.weight", li, e), I, H, err)) ||
            (rc = get_matrix(m, &x->down, NAME("model.layers.%d.mlp.experts.%d.down_proj.weight", li, e), H, I, err)))
            return rc;
        m->bytes_experts += x->gate.t->nbytes + x->up.t->nbytes + x->down.t->nbytes;
    }
#undef NAME
    return DF_OK;
}

int df_model_load(df_model *m, const char *dir, df_error *err) {
    memset(m, 0, sizeof *m);
    int rc = df_config_load_dir(&m->cfg, dir, err);
    if (rc) return rc;
    if ((rc = df_st_open_dir(&m->st, dir, err))) return rc;
    const df_config *c = &m->cfg;
    for (size_t i = 0; i < df_st_count(m->st); i++) m->bytes_total += df_st_at(m->st, i)->nbytes;

    if ((rc = get_matrix(m, &m->embed, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, err)) ||
        (rc = get_vector(m, &m->final_norm, "model.norm.weight", c->hidden_size, err)))
        goto fail;
    if (c->tie_word_embeddings && !df_st_find(m->st, "lm_head.weight")) {
        m->lm_head = m->embed;
    } else if ((rc = get_matrix(m, &m->lm_head, "lm_head.weight", c->vocab_size, c->hidden_size, err))) {
        goto fail;
    }
    m->layers = df_xcalloc((size_t)c->num_hidden_layers, sizeof(df_layer));
    for (int li = 0; li < c->num_hidden_layers; li++)
        if ((rc = load_layer(m, li, err))) goto fail;
    if ((rc = init_rope(m, err))) goto fail;
    m->bytes_dense = m->bytes_total - m->bytes_experts;
    return DF_OK;
fail:
    df_model_free(m);
    return rc;
}

void df_model_free(df_model *m) {
    if (m->layers) {
        for (int li = 0; li < m->cfg.num_hidden_layers; li++) {
            df_layer *L = &m->layers[li];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_norm);
            free(L->k_norm);
            free(L->q_bias);
            free(L->k_bias);
            free(L->v_bias);
            free(L->o_bias);
            free(L->experts);
        }
        free(m->layers);
    }
    free(m->final_norm);
    free(m->inv_freq);
    if (m->ram) munmap(m->ram, m->ram_bytes);
    free(m->ram_of);
    if (m->st) df_st_close(m->st);
    memset(m, 0, sizeof *m);
}

/* ---- always-active matrices in anonymous memory ----------------------------------
 *
 * While experts stream, a decode step reads every always-active matrix once
 * (the LM head alone is 0.3-0.6 GB in the benchmark models), and reads them
 * through 4 KiB page mappings: a streamed checkpoint cannot be mapped with
 * 2 MiB pages, as a huge page of the file holding a small tensor would also
 * map (and charge to the RSS) the expert bytes next to it. Measured on the
 * engine core's benchmark model streamed from a simulated 0.6 GB/s disk, the
 * attention of all 8 layers took 16-25 ms per token from the mapping and
 * 7-10 ms from an anonymous copy on 2 MiB pages (8-9 ms with every expert
 * cached), and that time is spent while no expert read can be in flight. A copy read
 * with pread() never maps the file, so the RSS holds exactly the copy. */

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif

int df_model_dense_to_ram(df_model *m, df_error *err) {
    if (m->ram) return DF_OK;
    const df_config *c = &m->cfg;
    int L = c->num_hidden_layers, n = 0;
    df_weight **w = df_xmalloc(sizeof(df_weight *) * ((size_t)L * 7 + 2));
    w[n++] = &m->lm_head;
    if (m->lm_head.t == m->embed.t) w[n++] = &m->embed; /* tied: the head reads all of it */
    for (int li = 0; li < L; li++) {
        df_layer *l = &m->layers[li];
        w[n++] = &l->q;
        w[n++] = &l->k;
        w[n++] = &l->v;
        w[n++] = &l->o;
        if (l->is_moe) {
            w[n++] = &l->router;
        } else {
            w[n++] = &l->gate;
            w[n++] = &l->up;
            w[n++] = &l->down;
        }
    }
    size_t nt = df_st_count(m->st), total = 0;
    size_t *off = df_xmalloc(sizeof(size_t) * (nt ? nt : 1));
    for (size_t i = 0; i < nt; i++) off[i] = SIZE_MAX;
    for (int i = 0; i < n; i++) {
        size_t ti = df_st_index(m->st, w[i]->t);
        if (off[ti] != SIZE_MAX) continue;
        off[ti] = total;
        total += (w[i]->t->nbytes + 63) & ~(size_t)63;
    }
    size_t huge = (size_t)2 << 20, bytes = (total + huge - 1) & ~(huge - 1);
    uint8_t *ram = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (ram == MAP_FAILED) {
        free(w);
        free(off);
        return df_fail(err, DF_ERR_NOMEM, "cannot allocate %.1f MiB for the always-active weights",
                       (double)bytes / 1048576.0);
    }
    if (ram) madvise(ram, bytes, MADV_HUGEPAGE);
    int rc = DF_OK;
    for (size_t i = 0; i < nt && !rc; i++) {
        if (off[i] == SIZE_MAX) continue;
        const df_tensor *t = df_st_at(m->st, i);
        ssize_t got = df_pread_full(df_st_file_fd(m->st, t->file), ram + off[i], t->nbytes, t->file_offset);
        if (got != (ssize_t)t->nbytes)
            rc = df_fail(err, DF_ERR_IO, "%s: tensor '%s': %s", df_st_file_path(m->st, t->file), t->name,
                         got < 0 ? strerror(errno) : "unexpected end of file (truncated?)");
    }
    if (rc) {
        if (ram) munmap(ram, bytes);
        free(w);
        free(off);
        return rc;
    }
    m->ram_of = df_xcalloc(nt ? nt : 1, sizeof(void *));
    for (size_t i = 0; i < nt; i++)
        if (off[i] != SIZE_MAX) m->ram_of[i] = ram + off[i];
    for (int i = 0; i < n; i++) w[i]->data = m->ram_of[df_st_index(m->st, w[i]->t)];
    m->ram = ram;
    m->ram_bytes = bytes;
    free(w);
    free(off);
    return DF_OK;
}

const void *df_model_ram_copy(const df_model *m, const df_tensor *t) {
    return m->ram_of ? m->ram_of[df_st_index(m->st, t)] : NULL;
}
