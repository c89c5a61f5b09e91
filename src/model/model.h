/*
 * model.h - a loaded checkpoint, whatever its architecture: the config, the
 * mapped safetensors files, the weights every family has (embedding, final
 * norm, LM head), the routed-expert inventory, and the family's own layers
 * (opaque here: its file in src/model/ owns them).
 *
 * The loader helpers below are what a family's load function uses to find
 * its tensors: each checks the dtype (the formats the kernels compute) and
 * the shape against config.json, and the error names the tensor. Matrices
 * stay in their stored format inside the mapping; the ones every token reads
 * are registered so that, while experts stream, they can be read into
 * anonymous memory (df_model_dense_to_ram) byte for byte.
 */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/experts.h"
#include "model/quant.h"
#include "model/safetensors.h"

/* A weight matrix: the kernels' view and the tensors it came from (its
 * values, and its scale grid when the format is scaled). */
typedef struct df_weight {
    df_wview v;
    const df_tensor *t;
    const df_tensor *ts; /* NULL: unscaled */
} df_weight;

typedef struct df_model {
    df_config cfg;
    df_st *st;
    df_quant *quant;   /* config.json's quantization_config, or NULL */
    df_weight embed;   /* [V][H] */
    df_weight lm_head; /* [V][H], == embed when tied */
    float *final_norm; /* [H] */
    void *fam;         /* the family's layers (arch->load / arch->unload) */
    df_expert_inventory experts;
    bool *is_expert;   /* [df_st_count]: a routed expert's tensor */
    bool *used;        /* [df_st_count]: a tensor the forward pass reads (experts included) */
    /* dense: the always-active tensors the forward pass reads; unused: what
     * it never reads (MTP layers, a wrapper's vision tower, rotary buffers) */
    uint64_t bytes_total, bytes_dense, bytes_experts, bytes_unused;
    int n_unused;
    /* the always-active matrices every token reads (df_model_matrix with active) */
    df_weight **active;
    int n_active, cap_active;
    /* Always-active matrices read into anonymous memory (df_model_dense_to_ram),
     * or NULL: the weights then point into the file mapping. */
    void *ram;
    size_t ram_bytes;
    const void **ram_of; /* [df_st_count]: a tensor's copy, or NULL */
    uint64_t *fp8_maps;  /* the always-active FP8 matrices' F16-form maps (df_model_fp8_maps) */
} df_model;

/* Loads dir's config.json and safetensors and the family's tensors. */
int df_model_load(df_model *m, const char *dir, df_error *err);
void df_model_free(df_model *m);
/* Reads the registered always-active matrices (attention, routers, dense MLPs,
 * the LM head; the embedding table only when the LM head is tied to it) out of
 * the checkpoint into one anonymous region advised for 2 MiB pages, and points
 * the weights there. For streaming, where the file cannot be mapped with
 * 2 MiB pages (the expert tensors between them would be charged to the RSS). */
int df_model_dense_to_ram(df_model *m, df_error *err);
/* The in-RAM copy of tensor t, or NULL if it is used from the mapping. */
const void *df_model_ram_copy(const df_model *m, const df_tensor *t);
/* Makes the F16-form maps (kernels.h) of the always-active FP8 matrices, once, on the
 * pool (NULL: this thread), and points their views at them: 1/512 of their bytes.
 * Without them the products test the codes on every call (the same results, 5-10 %
 * slower in L2 on Zen 4). */
void df_model_fp8_maps(df_model *m, df_pool *pool);

/* The model's fingerprint (fingerprint.c): XXH3-128 over dir's config.json,
 * every tensor's name, dtype and shape, and samples of the always-active
 * tensors' bytes and some experts' (read with pread, never through the
 * mapping). The error names the file. */
int df_model_fingerprint(const df_model *m, const char *dir, uint8_t out[16], df_error *err);
/* The fingerprints' pieces, shared with the pack's (experts/pack_format.c):
 * v as 8 little-endian bytes, and three 64-byte samples of tensor t (offset,
 * then bytes) read with pread, never through the mapping (a touched page
 * would stay in the RSS). */
struct XXH3_state_s;
void df_fp_u64(struct XXH3_state_s *st, uint64_t v);
int df_fp_tensor_samples(struct XXH3_state_s *st, const df_st *sf, const df_tensor *t, df_error *err);

/* ---- loader helpers for the families ------------------------------------------ */

/* The weight `name` ("....weight") of a Linear module, of shape
 * [rows][cols], in the format quantization_config gives it (its companion
 * tensors checked: model/quant.h); active: every token reads it (an
 * always-active matrix to keep in RAM while experts stream). */
int df_model_matrix(df_model *m, df_weight *w, const char *name, int rows, int cols, bool active,
                    df_error *err);
/* A matrix that is a plain parameter, never quantized (an embedding table,
 * DeepSeek's router): BF16, F16 or F32. */
int df_model_param(df_model *m, df_weight *w, const char *name, int rows, int cols, bool active,
                   df_error *err);
/* Vector `name` of n elements, widened to a malloc'ed F32 copy (exact). */
int df_model_vector(df_model *m, float **out, const char *name, int n, df_error *err);
/* A parameter tensor of exactly `shape` (ndim dimensions), widened to a
 * malloc'ed F32 copy (exact): convolution kernels, per-head constants. */
int df_model_array(df_model *m, float **out, const char *name, int ndim, const int64_t *shape, df_error *err);
/* Checks every routed expert against the shapes the family expects: matrix k
 * (DF_XM_GATE, DF_XM_UP, DF_XM_DOWN) of every expert is [rows[k]][cols[k]],
 * in the inventory's format with its companion tensors as model/quant.h says. */
int df_model_check_experts(df_model *m, const int *rows, const int *cols, df_error *err);

#endif
