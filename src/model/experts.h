/*
 * experts.h - routed experts as the model layer sees them: how an expert is
 * laid out (its named parts, which are checkpoint tensors), the inventory of
 * every (layer, expert)'s tensors, and the expert source a MoE layer asks for
 * the experts its rows need.
 *
 * The source is an interface with two implementations: resident (here: the
 * checkpoint mapped in place) and streamed (experts/store.c, which reads them
 * into a RAM cache from a pack or the safetensors files). Read-ahead is an
 * optional hint behind it: a source that can prefetch says how many MoE
 * layers ahead it wants predictions, and the forward pass hands it the
 * experts a later layer's router picks on the current residual stream.
 * Nothing a source does changes a result: the MoE block combines expert
 * outputs per row in top-k slot order, whatever order experts arrive in.
 */
#ifndef DF_MODEL_EXPERTS_H
#define DF_MODEL_EXPERTS_H

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/quant.h"
#include "model/safetensors.h"

#define DF_EXPERT_MAX_PARTS 8
#define DF_EXPERT_MATS 3
enum { DF_XM_GATE = 0, DF_XM_UP = 1, DF_XM_DOWN = 2 };

/* An expert's tensors, named within the expert (the architecture prefixes
 * the layer and expert), and which of them make its matrices: the values
 * and, for a scaled format, the scales (-1: none) in format fmt. An
 * architecture's table entry gives the unquantized layout ("gate_proj.weight"
 * ...); the inventory derives the one the checkpoint ships from the
 * quantization_config ("gate_proj.weight_packed", "gate_proj.weight_scale"
 * ...). */
typedef struct df_expert_layout {
    int n_parts;
    const char *part[DF_EXPERT_MAX_PARTS]; /* e.g. "gate_proj.weight" */
    struct {
        int values, scale;
    } mat[DF_EXPERT_MATS];                 /* DF_XM_GATE, DF_XM_UP, DF_XM_DOWN */
    df_wfmt fmt[DF_EXPERT_MATS];           /* a scaled matrix's format (scale >= 0) */
    df_qkind kind[DF_EXPERT_MATS];
} df_expert_layout;

/* Every routed expert's tensors: xt[(layer * E + e) * n_parts + part], NULL
 * on layers without routed experts. */
typedef struct df_expert_inventory {
    const df_expert_layout *layout; /* the checkpoint's (owned by the inventory) */
    int n_layers, n_experts;
    const df_tensor **xt;
    /* xs[(layer * E + e) * DF_EXPERT_MATS + k]: matrix k's weight_shape (pack-
     * quantized experts carry one; checked at load, never read again), or
     * NULL; filled by df_model_check_experts (NULL until then) */
    const df_tensor **xs;
    uint64_t bytes;        /* all of them, as stored */
    /* Experts used in place (the resident source): each FP8 matrix's F16-form map
     * (kernels.h) at maps + map_at[(layer * E + e) * DF_EXPERT_MATS + k] (SIZE_MAX: not
     * FP8); both NULL until df_expert_fp8_maps */
    size_t *map_at;
    uint64_t *maps;
} df_expert_inventory;

/* Finds every routed expert's tensors by the architecture's naming (arch.h)
 * in the format quantization_config q (NULL: none) gives them (the first MoE
 * layer's expert 0 decides; every expert must agree: the family checks with
 * df_model_check_experts); the error names the first missing tensor. */
int df_expert_inventory_build(df_expert_inventory *inv, const df_config *c, const df_st *st,
                              const df_quant *q, df_error *err);
/* The module name of matrix k of expert e of layer l ("...experts.5.up_proj"). */
void df_expert_module(const df_config *c, int layer, int e, int k, char *name, size_t n);
void df_expert_inventory_free(df_expert_inventory *inv);
static inline const df_tensor *df_expert_part(const df_expert_inventory *inv, int layer, int e, int part) {
    return inv->xt[((size_t)layer * (size_t)inv->n_experts + (size_t)e) * (size_t)inv->layout->n_parts +
                   (size_t)part];
}
/* Scans the scales of expert (layer, e), whose part p lies at part_data[p]
 * (df_quant_check_scales: NaN, or not finite and positive): where its bytes
 * are read anyway (the pack writer; the resident source at open), since the
 * loader does not read every expert. The error names the tensor. */
int df_expert_check_scales(const df_expert_inventory *inv, const df_st *st, int layer, int e,
                           const void *const *part_data, df_error *err);
/* Every routed expert's scales, in place (resident experts). */
int df_expert_check_all_scales(const df_expert_inventory *inv, const df_st *st, df_error *err);
/* Matrix k's columns from its stored values tensor: packed INT4 holds eight
 * per I32 word, MXFP4 two per byte. */
static inline int df_expert_mat_cols(const df_expert_layout *xl, int k, const df_tensor *values) {
    int per = xl->kind[k] == DF_Q_INT4 ? 8 : xl->kind[k] == DF_Q_MXFP4 ? 2 : 1;
    return (int)values->shape[1] * per;
}
/* Bytes of one expert's parts as stored. */
uint64_t df_expert_bytes(const df_expert_inventory *inv, int layer, int e);

/* One expert's matrices as the kernels see them. */
typedef struct df_expert_w {
    df_wview mat[DF_EXPERT_MATS];
} df_expert_w;

/* Views of expert (layer, e) whose part p lies at part_data[p] (its bytes as
 * stored: in the mapping, a cache slot, ...). */
void df_expert_bind(const df_expert_inventory *inv, int layer, int e, const void *const *part_data,
                    df_expert_w *out);

/* ---- the expert source ---------------------------------------------------------- */

typedef struct df_xsource df_xsource;

typedef struct df_xsource_ops {
    /* A MoE layer needs these distinct experts. */
    int (*begin_layer)(df_xsource *s, int layer, const int *experts, int n, df_error *err);
    /* Up to cap of them that are ready (at least one; blocks until one is),
     * with views valid until the next call or end_layer; *n_out = 0 when all
     * were handed out. */
    int (*next)(df_xsource *s, int cap, int *ids, df_expert_w *w, int *n_out, df_error *err);
    void (*end_layer)(df_xsource *s);
    /* A forward pass over `rows` rows is complete. */
    void (*end_step)(df_xsource *s, int rows);
    /* Optional read-ahead hint (NULL: none). How many MoE layers ahead the
     * forward pass should predict this step (0: none), and a prediction: the
     * experts a later MoE layer's router picks on the current rows. */
    int (*lookahead_depth)(df_xsource *s);
    void (*predict)(df_xsource *s, int layer, const int *sel, int n_sel);
    void (*close)(df_xsource *s);
    /* Optional (NULL: every expert is computed here): a source whose experts
     * are partly computed by other processes (src/dist/). remote_begin gets a
     * MoE layer's T rows xin [T][H] and their top-k sel [T][K] before any
     * local work; it hands the slots it sends away to their owners and sets
     * them to -1 in sel, so that the local work skips them. remote_end, after
     * the local work (called even when that failed), waits for the owners and
     * files each slot's unweighted expert output into yslot [T][K][H]. */
    int (*remote_begin)(df_xsource *s, int layer, const float *xin, int *sel, int T, int K, int H,
                        df_error *err);
    int (*remote_end)(df_xsource *s, float *yslot, df_error *err);
} df_xsource_ops;

struct df_xsource {
    const df_xsource_ops *ops;
};

/* Experts used in place, from the tensors' own memory (the checkpoint's
 * mapping), with their FP8 matrices' maps when df_expert_fp8_maps made them. */
df_xsource *df_xsource_resident(const df_expert_inventory *inv);
/* Makes the F16-form maps of every FP8 expert matrix from its bytes in place (a bit
 * per 64 codes, a row's in whole 64-bit words), once, on the pool (NULL: this thread): for
 * the resident source, whose views then carry them (the one-token products read the
 * bit instead of testing the codes). Streamed experts have none: their products test
 * the codes, and their speed is the disk's. */
void df_expert_fp8_maps(df_expert_inventory *inv, df_pool *pool);

#endif
