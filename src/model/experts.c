/*
 * experts.c - the expert inventory (by the architecture's naming, in the
 * format the quantization_config ships experts in), binding an expert's stored
 * parts to kernel views, and the resident expert source.
 */
#include "model/experts.h"

#include "model/arch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layout the checkpoint ships: each matrix of the architecture's layout
 * ("gate_proj.weight") in the format the config gives it, decided on
 * (layer, expert 0). */
typedef struct owned_layout {
    df_expert_layout l;
    char names[DF_EXPERT_MAX_PARTS][48];
} owned_layout;

static int shipped_layout(df_expert_inventory *inv, const df_config *c, const df_quant *q, int layer,
                          df_error *err) {
    const df_expert_layout *base = c->arch->expert_layout;
    owned_layout *o = df_xcalloc(1, sizeof *o);
    inv->layout = &o->l;
    int np = 0;
    for (int k = 0; k < DF_EXPERT_MATS; k++) {
        char mod[256];
        df_expert_module(c, layer, 0, k, mod, sizeof mod);
        df_qkind kind;
        int rc = df_quant_kind(q, mod, true, &kind, err);
        if (rc) return rc;
        const char *vp = base->part[base->mat[k].values];
        int stem = (int)(strlen(vp) - strlen(".weight"));
        o->l.kind[k] = kind;
        o->l.mat[k].values = np;
        o->l.mat[k].scale = -1;
        snprintf(o->names[np++], 48, "%.*s%s", stem, vp, kind == DF_Q_INT4 || kind == DF_Q_MXFP4 ? ".weight_packed" : ".weight");
        if (kind == DF_Q_NONE) continue;
        o->l.fmt[k] = kind == DF_Q_FP8 ? df_wfmt_fp8_block() : kind == DF_Q_INT4 ? df_wfmt_int4_group() : df_wfmt_mxfp4();
        o->l.mat[k].scale = np;
        snprintf(o->names[np++], 48, "%.*s%s", stem, vp, kind == DF_Q_FP8 ? ".weight_scale_inv" : ".weight_scale");
    }
    o->l.n_parts = np;
    for (int p = 0; p < np; p++) o->l.part[p] = o->names[p];
    return DF_OK;
}

void df_expert_module(const df_config *c, int layer, int e, int k, char *name, size_t n) {
    const df_expert_layout *base = c->arch->expert_layout;
    char pre[200];
    c->arch->expert_prefix(c, layer, e, pre, sizeof pre);
    const char *vp = base->part[base->mat[k].values];
    snprintf(name, n, "%s%.*s", pre, (int)(strlen(vp) - strlen(".weight")), vp);
}

int df_expert_inventory_build(df_expert_inventory *inv, const df_config *c, const df_st *st,
                              const df_quant *q, df_error *err) {
    memset(inv, 0, sizeof *inv);
    inv->n_layers = c->num_hidden_layers;
    inv->n_experts = c->num_experts;
    if (!c->arch->expert_layout || c->num_experts <= 0) return DF_OK;
    int first = 0;
    while (first < c->num_hidden_layers && !c->layer_is_moe[first]) first++;
    if (first == c->num_hidden_layers) return DF_OK;
    int rc = shipped_layout(inv, c, q, first, err);
    if (rc) {
        df_expert_inventory_free(inv);
        return rc;
    }
    const df_expert_layout *xl = inv->layout;
    size_t n = (size_t)inv->n_layers * (size_t)inv->n_experts * (size_t)xl->n_parts;
    inv->xt = df_xcalloc(n ? n : 1, sizeof(const df_tensor *));
    char pre[200], name[256];
    for (int li = 0; li < inv->n_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        for (int e = 0; e < inv->n_experts; e++) {
            c->arch->expert_prefix(c, li, e, pre, sizeof pre);
            for (int p = 0; p < xl->n_parts; p++) {
                snprintf(name, sizeof name, "%s%s", pre, xl->part[p]);
                const df_tensor *t = df_st_find(st, name);
                if (!t) {
                    df_expert_inventory_free(inv);
                    return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint%s",
                                   df_st_where(st), name, q ? " (in the format its quantization_config gives it)" : "");
                }
                inv->xt[((size_t)li * (size_t)inv->n_experts + (size_t)e) * (size_t)xl->n_parts + (size_t)p] = t;
                inv->bytes += t->nbytes;
            }
        }
    }
    return DF_OK;
}

void df_expert_inventory_free(df_expert_inventory *inv) {
    free(inv->xt);
    free(inv->xs);
    free(inv->map_at);
    free(inv->maps);
    free((void *)inv->layout);
    memset(inv, 0, sizeof *inv);
}

uint64_t df_expert_bytes(const df_expert_inventory *inv, int layer, int e) {
    uint64_t b = 0;
    for (int p = 0; p < inv->layout->n_parts; p++) {
        const df_tensor *t = df_expert_part(inv, layer, e, p);
        if (t) b += t->nbytes;
    }
    return b;
}

int df_expert_check_scales(const df_expert_inventory *inv, const df_st *st, int layer, int e,
                           const void *const *part_data, df_error *err) {
    const df_expert_layout *xl = inv->layout;
    for (int k = 0; k < DF_EXPERT_MATS; k++) {
        int p = xl->mat[k].scale;
        if (p < 0) continue;
        int rc = df_quant_check_scales(st, df_expert_part(inv, layer, e, p), xl->fmt[k], part_data[p], err);
        if (rc) return rc;
    }
    return DF_OK;
}

/* Where expert (li, e)'s parts lie in place (the mapping); 0 on a layer without routed
 * experts. */
static int parts_in_place(const df_expert_inventory *inv, int li, int e, const void **data) {
    if (!df_expert_part(inv, li, e, 0)) return 0;
    for (int p = 0; p < inv->layout->n_parts; p++) data[p] = df_expert_part(inv, li, e, p)->data;
    return 1;
}

int df_expert_check_all_scales(const df_expert_inventory *inv, const df_st *st, df_error *err) {
    if (!inv->layout || !inv->xt) return DF_OK;
    const void *data[DF_EXPERT_MAX_PARTS];
    for (int li = 0; li < inv->n_layers; li++)
        for (int e = 0; e < inv->n_experts; e++) {
            if (!parts_in_place(inv, li, e, data)) break;
            int rc = df_expert_check_scales(inv, st, li, e, data, err);
            if (rc) return rc;
        }
    return DF_OK;
}

void df_expert_bind(const df_expert_inventory *inv, int layer, int e, const void *const *part_data,
                    df_expert_w *out) {
    const df_expert_layout *xl = inv->layout;
    for (int k = 0; k < DF_EXPERT_MATS; k++) {
        const df_tensor *t = df_expert_part(inv, layer, e, xl->mat[k].values);
        df_wview *v = &out->mat[k];
        /* shapes and formats were checked when the model was loaded */
        if (xl->mat[k].scale < 0)
            *v = df_wview_make(part_data[xl->mat[k].values], t->dtype, (int)t->shape[0], (int)t->shape[1]);
        else
            *v = df_wview_scaled(xl->fmt[k], part_data[xl->mat[k].values], part_data[xl->mat[k].scale],
                                 (int)t->shape[0], df_expert_mat_cols(xl, k, t));
    }
}

/* ---- the FP8 experts' maps ---------------------------------------------------------- */

/* Expert (li, e)'s views over its tensors in place; 0 on a layer without routed experts. */
static int bind_in_place(const df_expert_inventory *inv, int li, int e, df_expert_w *w) {
    const void *parts[DF_EXPERT_MAX_PARTS];
    if (!parts_in_place(inv, li, e, parts)) return 0;
    df_expert_bind(inv, li, e, parts, w);
    return 1;
}

/* Points expert (li, e)'s views at their maps (NULL where a matrix is not FP8). */
static void attach_maps(const df_expert_inventory *inv, int li, int e, df_expert_w *w) {
    const size_t *at = inv->map_at + ((size_t)li * (size_t)inv->n_experts + (size_t)e) * DF_EXPERT_MATS;
    for (int k = 0; k < DF_EXPERT_MATS; k++) w->mat[k].f16map = at[k] == SIZE_MAX ? NULL : inv->maps + at[k];
}

static void map_range(void *ctx, int begin, int end) {
    const df_expert_inventory *inv = ctx;
    for (int i = begin; i < end; i++) {
        df_expert_w w;
        if (!bind_in_place(inv, i / inv->n_experts, i % inv->n_experts, &w)) continue;
        attach_maps(inv, i / inv->n_experts, i % inv->n_experts, &w);
        for (int k = 0; k < DF_EXPERT_MATS; k++)
            if (w.mat[k].f16map) df_fp8_map_build((uint64_t *)w.mat[k].f16map, &w.mat[k]); /* inv->maps */
    }
}

void df_expert_fp8_maps(df_expert_inventory *inv, df_pool *pool) {
    if (inv->maps || !inv->layout || !inv->xt) return;
    int n = inv->n_layers * inv->n_experts;
    size_t nm = (size_t)n * DF_EXPERT_MATS, words = 0;
    size_t *at = df_xmalloc(sizeof(size_t) * (nm ? nm : 1));
    for (int i = 0; i < n; i++) { /* where each FP8 matrix's map goes */
        df_expert_w w;
        int here = bind_in_place(inv, i / inv->n_experts, i % inv->n_experts, &w);
        for (int k = 0; k < DF_EXPERT_MATS; k++) {
            size_t *a = &at[(size_t)i * DF_EXPERT_MATS + (size_t)k];
            *a = SIZE_MAX;
            if (!here || w.mat[k].fmt.elem != DF_EL_F8_E4M3) continue;
            *a = words;
            words += df_fp8_map_words(w.mat[k].cols) * (size_t)w.mat[k].rows;
        }
    }
    if (!words) {
        free(at);
        return;
    }
    inv->map_at = at;
    inv->maps = df_xmalloc(sizeof(uint64_t) * words);
    df_pool_for(pool, n, 1, map_range, inv);
}

/* ---- the resident source ---------------------------------------------------------- */

typedef struct resident {
    df_xsource base;
    const df_expert_inventory *inv;
    int layer;
    int *want;
    int n_want, n_handed;
} resident;

static int res_begin(df_xsource *s, int layer, const int *experts, int n, df_error *err) {
    (void)err;
    resident *r = (resident *)s;
    r->layer = layer;
    memcpy(r->want, experts, sizeof(int) * (size_t)n);
    r->n_want = n;
    r->n_handed = 0;
    return DF_OK;
}

static int res_next(df_xsource *s, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err) {
    (void)err;
    resident *r = (resident *)s;
    const df_expert_inventory *inv = r->inv;
    int n = 0;
    for (; n < cap && r->n_handed < r->n_want; n++) {
        int e = r->want[r->n_handed++];
        ids[n] = e;
        bind_in_place(inv, r->layer, e, &w[n]);
        if (inv->maps) attach_maps(inv, r->layer, e, &w[n]);
    }
    *n_out = n;
    return DF_OK;
}

static void res_end_layer(df_xsource *s) { ((resident *)s)->n_want = 0; }
static void res_end_step(df_xsource *s, int rows) { (void)s, (void)rows; }

static void res_close(df_xsource *s) {
    resident *r = (resident *)s;
    free(r->want);
    free(r);
}

static const df_xsource_ops RESIDENT_OPS = {res_begin, res_next, res_end_layer, res_end_step,
                                            NULL, NULL, res_close, NULL, NULL};

df_xsource *df_xsource_resident(const df_expert_inventory *inv) {
    resident *r = df_xcalloc(1, sizeof *r);
    r->base.ops = &RESIDENT_OPS;
    r->inv = inv;
    r->want = df_xmalloc(sizeof(int) * (size_t)(inv->n_experts > 0 ? inv->n_experts : 1));
    return &r->base;
}
