/*
 * experts.c - the expert inventory (by the architecture's naming), binding an
 * expert's stored parts to kernel views, and the resident expert source.
 */
#include "model/experts.h"

#include "model/arch.h"

#include <stdlib.h>

int df_expert_inventory_build(df_expert_inventory *inv, const df_config *c, const df_st *st,
                              df_error *err) {
    memset(inv, 0, sizeof *inv);
    const df_expert_layout *xl = c->arch->expert_layout;
    inv->layout = xl;
    inv->n_layers = c->num_hidden_layers;
    inv->n_experts = c->num_experts;
    if (!xl || c->num_experts <= 0) return DF_OK;
    size_t n = (size_t)inv->n_layers * (size_t)inv->n_experts * (size_t)xl->n_parts;
    inv->xt = df_xcalloc(n ? n : 1, sizeof(const df_tensor *));
    char name[256];
    for (int li = 0; li < inv->n_layers; li++) {
        if (!c->layer_is_moe[li]) continue;
        for (int e = 0; e < inv->n_experts; e++)
            for (int p = 0; p < xl->n_parts; p++) {
                c->arch->expert_tensor(c, li, e, p, name, sizeof name);
                const df_tensor *t = df_st_find(st, name);
                if (!t) {
                    df_expert_inventory_free(inv);
                    return df_fail(err, DF_ERR_SHAPE, "%s: tensor '%s' is missing from the checkpoint",
                                   df_st_where(st), name);
                }
                inv->xt[((size_t)li * (size_t)inv->n_experts + (size_t)e) * (size_t)xl->n_parts + (size_t)p] = t;
                inv->bytes += t->nbytes;
            }
    }
    return DF_OK;
}

void df_expert_inventory_free(df_expert_inventory *inv) {
    free(inv->xt);
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

void df_expert_bind(const df_expert_inventory *inv, int layer, int e, const void *const *part_data,
                    df_expert_w *out) {
    const df_expert_layout *xl = inv->layout;
    for (int k = 0; k < DF_EXPERT_MATS; k++) {
        const df_tensor *t = df_expert_part(inv, layer, e, xl->mat[k].values);
        df_wview *v = &out->mat[k];
        /* shapes and formats were checked when the model was loaded */
        *v = df_wview_make(part_data[xl->mat[k].values], t->dtype, (int)t->shape[0], (int)t->shape[1]);
        if (xl->mat[k].scale >= 0) v->scale = part_data[xl->mat[k].scale];
    }
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
    const void *parts[DF_EXPERT_MAX_PARTS];
    int n = 0;
    for (; n < cap && r->n_handed < r->n_want; n++) {
        int e = r->want[r->n_handed++];
        for (int p = 0; p < r->inv->layout->n_parts; p++)
            parts[p] = df_expert_part(r->inv, r->layer, e, p)->data;
        ids[n] = e;
        df_expert_bind(r->inv, r->layer, e, parts, &w[n]);
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
                                            NULL, NULL, res_close};

df_xsource *df_xsource_resident(const df_expert_inventory *inv) {
    resident *r = df_xcalloc(1, sizeof *r);
    r->base.ops = &RESIDENT_OPS;
    r->inv = inv;
    r->want = df_xmalloc(sizeof(int) * (size_t)(inv->n_experts > 0 ? inv->n_experts : 1));
    return &r->base;
}
