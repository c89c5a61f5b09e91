/*
 * model.c - turns a checkpoint directory into a df_model: the config, the
 * mapped safetensors files, the routed-expert inventory, and the tensors every
 * family has (embedding, final norm, LM head); the family's load does the rest
 * with the helpers here, which check every tensor's dtype and shape against
 * config.json (the error names the tensor), widen the small norm vectors to
 * F32 (exact) and leave the matrices in their stored format inside the
 * mapping. It counts always-active vs routed-expert bytes, and for streaming
 * reads the always-active matrices into anonymous memory (still in their
 * stored format, byte for byte; see the last section).
 */
#include "model/model.h"

#include "model/arch.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- tensor lookup with shape checks ----------------------------------------- */

static void shape_str(const df_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int find(df_model *m, const char *name, const df_tensor **out, df_error *err) {
    const df_tensor *t = df_st_find(m->st, name);
    if (!t)
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint",
                       df_st_where(m->st), name);
    if (!df_dtype_computable(t->dtype))
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: BF16, F16, F32)",
                       df_st_file_path(m->st, t->file), t->name, df_dtype_name(t->dtype));
    m->used[df_st_index(m->st, t)] = true;
    *out = t;
    return DF_OK;
}

static void mark(df_model *m, const df_qweight *q) {
    m->used[df_st_index(m->st, q->values)] = true;
    if (q->scale) m->used[df_st_index(m->st, q->scale)] = true;
    if (q->shape) m->used[df_st_index(m->st, q->shape)] = true;
}

static int bind(df_model *m, df_weight *w, const char *name, int rows, int cols, bool active, bool linear,
                df_error *err) {
    size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight") != 0)
        return df_fail(err, DF_ERR_ARG, "internal: matrix name '%s' does not end in .weight", name);
    char mod[320];
    snprintf(mod, sizeof mod, "%.*s", (int)(n - 7), name);
    df_qweight q;
    int rc = df_quant_bind(m->st, linear ? m->quant : NULL, mod, rows, cols, linear, &q, err);
    if (rc) return rc;
    if (q.scale && (rc = df_quant_check_scales(m->st, q.scale, q.fmt, q.scale->data, err))) return rc;
    mark(m, &q);
    w->v = df_wview_scaled(q.fmt, q.values->data, q.scale ? q.scale->data : NULL, rows, cols);
    w->t = q.values;
    w->ts = q.scale;
    if (active) {
        if (m->n_active == m->cap_active) {
            m->cap_active = m->cap_active ? 2 * m->cap_active : 64;
            m->active = df_xrealloc(m->active, sizeof(df_weight *) * (size_t)m->cap_active);
        }
        m->active[m->n_active++] = w;
    }
    return DF_OK;
}

int df_model_matrix(df_model *m, df_weight *w, const char *name, int rows, int cols, bool active,
                    df_error *err) {
    return bind(m, w, name, rows, cols, active, true, err);
}

int df_model_param(df_model *m, df_weight *w, const char *name, int rows, int cols, bool active,
                   df_error *err) {
    return bind(m, w, name, rows, cols, active, false, err);
}

int df_model_vector(df_model *m, float **out, const char *name, int n, df_error *err) {
    const df_tensor *t = NULL;
    int rc = find(m, name, &t, err);
    if (rc) return rc;
    if (t->ndim != 1 || t->shape[0] != n) {
        char got[128];
        shape_str(t, got, sizeof got);
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' has shape %s but config.json implies [%d]",
                       df_st_file_path(m->st, t->file), name, got, n);
    }
    *out = df_xmalloc(sizeof(float) * (size_t)n);
    df_to_f32(*out, t->data, t->dtype, (size_t)n);
    return DF_OK;
}

int df_model_array(df_model *m, float **out, const char *name, int ndim, const int64_t *shape, df_error *err) {
    const df_tensor *t = NULL;
    int rc = find(m, name, &t, err);
    if (rc) return rc;
    bool ok = t->ndim == ndim;
    size_t n = 1;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i], n *= (size_t)shape[i];
    if (!ok) {
        char got[128], want[128];
        size_t o = 0;
        shape_str(t, got, sizeof got);
        o += (size_t)snprintf(want + o, sizeof want - o, "[");
        for (int i = 0; i < ndim && o < sizeof want; i++)
            o += (size_t)snprintf(want + o, sizeof want - o, "%s%lld", i ? "," : "", (long long)shape[i]);
        if (o < sizeof want) snprintf(want + o, sizeof want - o, "]");
        return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' has shape %s but config.json implies %s",
                       df_st_file_path(m->st, t->file), name, got, want);
    }
    *out = df_xmalloc(sizeof(float) * (n ? n : 1));
    df_to_f32(*out, t->data, t->dtype, n);
    return DF_OK;
}

int df_model_check_experts(df_model *m, const int *rows, const int *cols, df_error *err) {
    df_expert_inventory *inv = &m->experts;
    const df_expert_layout *xl = inv->layout;
    for (int li = 0; xl && li < inv->n_layers; li++) {
        if (!m->cfg.layer_is_moe[li]) continue;
        for (int e = 0; e < inv->n_experts; e++)
            for (int k = 0; k < DF_EXPERT_MATS; k++) {
                char mod[320];
                df_expert_module(&m->cfg, li, e, k, mod, sizeof mod);
                df_qweight q;
                int rc = df_quant_bind(m->st, m->quant, mod, rows[k], cols[k], true, &q, err);
                if (rc) return rc;
                if (q.kind != xl->kind[k])
                    return df_fail(err, DF_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, but the first MoE layer's "
                                   "expert 0 is %s: every routed expert must be in one format",
                                   df_st_file_path(m->st, q.values->file), q.values->name,
                                   df_qkind_name(q.kind), df_qkind_name(xl->kind[k]));
                if (!q.shape) continue;
                m->used[df_st_index(m->st, q.shape)] = true;
                if (!inv->xs)
                    inv->xs = df_xcalloc((size_t)inv->n_layers * (size_t)inv->n_experts * DF_EXPERT_MATS,
                                         sizeof(const df_tensor *));
                inv->xs[((size_t)li * (size_t)inv->n_experts + (size_t)e) * DF_EXPERT_MATS + (size_t)k] = q.shape;
            }
    }
    return DF_OK;
}

/* ---- loading -------------------------------------------------------------------- */

static int load_common(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    const char *pre = c->tensor_prefix;
    char embed[96], norm[96], head[96];
    snprintf(embed, sizeof embed, "%smodel.embed_tokens.weight", pre);
    snprintf(norm, sizeof norm, "%smodel.norm.weight", pre);
    snprintf(head, sizeof head, "%slm_head.weight", pre);
    bool tied = c->tie_word_embeddings && !df_st_find(m->st, head);
    int rc;
    /* tied: the head reads all of the table every token */
    if ((rc = df_model_param(m, &m->embed, embed, c->vocab_size, c->hidden_size, tied, err)) ||
        (rc = df_model_vector(m, &m->final_norm, norm, c->hidden_size, err)))
        return rc;
    if (tied) {
        m->lm_head = m->embed;
        return DF_OK;
    }
    return df_model_matrix(m, &m->lm_head, head, c->vocab_size, c->hidden_size, true, err);
}

int df_model_load(df_model *m, const char *dir, df_error *err) {
    memset(m, 0, sizeof *m);
    int rc = df_config_load_dir(&m->cfg, dir, err);
    if (rc) return rc;
    if ((rc = df_st_open_dir(&m->st, dir, err))) return rc;
    if ((rc = df_quant_load_dir(&m->quant, dir, err))) goto fail;
    const df_config *c = &m->cfg;
    size_t nt = df_st_count(m->st);
    for (size_t i = 0; i < nt; i++) m->bytes_total += df_st_at(m->st, i)->nbytes;
    m->used = df_xcalloc(nt ? nt : 1, sizeof(bool));
    if ((rc = load_common(m, err)) || (rc = df_expert_inventory_build(&m->experts, c, m->st, m->quant, err)) ||
        (rc = c->arch->load(m, err)))
        goto fail;
    m->is_expert = df_xcalloc(nt ? nt : 1, sizeof(bool));
    for (int li = 0; m->experts.xt && li < m->experts.n_layers; li++)
        for (int e = 0; c->layer_is_moe[li] && e < m->experts.n_experts; e++)
            for (int p = 0; p < m->experts.layout->n_parts; p++)
                m->is_expert[df_st_index(m->st, df_expert_part(&m->experts, li, e, p))] = true;
    /* pack-quantized experts' weight_shape tensors: checked at load, never read
     * by the forward pass; listed with the experts */
    size_t nxs = m->experts.xs ? (size_t)m->experts.n_layers * (size_t)m->experts.n_experts * DF_EXPERT_MATS : 0;
    for (size_t i = 0; i < nxs; i++)
        if (m->experts.xs[i]) m->is_expert[df_st_index(m->st, m->experts.xs[i])] = true;
    m->bytes_experts = m->experts.bytes;
    for (size_t i = 0; i < nt; i++) {
        uint64_t b = df_st_at(m->st, i)->nbytes;
        if (m->is_expert[i]) continue;
        if (m->used[i]) m->bytes_dense += b;
        else m->bytes_unused += b, m->n_unused++;
    }
    return DF_OK;
fail:
    df_model_free(m);
    return rc;
}

void df_model_free(df_model *m) {
    if (m->cfg.arch && m->fam) m->cfg.arch->unload(m);
    df_expert_inventory_free(&m->experts);
    free(m->final_norm);
    free(m->active);
    free(m->is_expert);
    free(m->used);
    if (m->ram) munmap(m->ram, m->ram_bytes);
    free(m->ram_of);
    free(m->fp8_maps);
    if (m->st) df_st_close(m->st);
    df_quant_free(m->quant);
    memset(m, 0, sizeof *m);
}

typedef struct map_job {
    df_wview **v; /* the FP8 matrices, each once */
} map_job;

static void map_range(void *ctx, int begin, int end) {
    map_job *j = ctx;
    for (int i = begin; i < end; i++) df_fp8_map_build((uint64_t *)j->v[i]->f16map, j->v[i]);
}

void df_model_fp8_maps(df_model *m, df_pool *pool) {
    if (m->fp8_maps) return;
    size_t words = 0, o = 0;
    for (int i = 0; i < m->n_active; i++) {
        const df_wview *v = &m->active[i]->v;
        if (v->fmt.elem == DF_EL_F8_E4M3) words += df_fp8_map_words(v->cols) * (size_t)v->rows;
    }
    if (!words) return;
    m->fp8_maps = df_xmalloc(sizeof(uint64_t) * words);
    map_job j = {df_xmalloc(sizeof(df_wview *) * (size_t)m->n_active)};
    int n = 0;
    for (int i = 0; i < m->n_active; i++) {
        df_wview *v = &m->active[i]->v;
        if (v->fmt.elem != DF_EL_F8_E4M3 || v->f16map) continue; /* one registered twice */
        v->f16map = m->fp8_maps + o;
        o += df_fp8_map_words(v->cols) * (size_t)v->rows;
        j.v[n++] = v;
    }
    df_pool_for(pool, n, 1, map_range, &j);
    free(j.v);
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

int df_model_dense_to_ram(df_model *m, df_error *err) {
    if (m->ram) return DF_OK;
    df_weight **w = m->active;
    int n = m->n_active;
    size_t nt = df_st_count(m->st), total = 0;
    size_t *off = df_xmalloc(sizeof(size_t) * (nt ? nt : 1));
    for (size_t i = 0; i < nt; i++) off[i] = SIZE_MAX;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < 2; s++) { /* the values, then the scale grid */
            const df_tensor *t = s ? w[i]->ts : w[i]->t;
            if (!t) continue;
            size_t ti = df_st_index(m->st, t);
            if (off[ti] != SIZE_MAX) continue;
            off[ti] = total;
            total += (t->nbytes + 63) & ~(size_t)63;
        }
    size_t huge = (size_t)2 << 20, bytes = (total + huge - 1) & ~(huge - 1);
    uint8_t *ram = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (ram == MAP_FAILED) {
        free(off);
        return df_fail(err, DF_ERR_NOMEM, "cannot allocate %.1f MiB for the always-active weights",
                       (double)bytes / 1048576.0);
    }
    if (ram) df_advise_huge(ram, bytes);
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
        free(off);
        return rc;
    }
    m->ram_of = df_xcalloc(nt ? nt : 1, sizeof(void *));
    for (size_t i = 0; i < nt; i++)
        if (off[i] != SIZE_MAX) m->ram_of[i] = ram + off[i];
    for (int i = 0; i < n; i++) {
        w[i]->v.data = m->ram_of[df_st_index(m->st, w[i]->t)];
        if (w[i]->ts) w[i]->v.scale = m->ram_of[df_st_index(m->st, w[i]->ts)];
    }
    if (m->lm_head.t == m->embed.t) m->lm_head.v = m->embed.v;
    m->ram = ram;
    m->ram_bytes = bytes;
    free(off);
    return DF_OK;
}

const void *df_model_ram_copy(const df_model *m, const df_tensor *t) {
    return m->ram_of ? m->ram_of[df_st_index(m->st, t)] : NULL;
}
