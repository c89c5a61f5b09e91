/*
 * quant.h - a checkpoint's quantization_config and the tensors it implies:
 * which format each Linear module's weight is shipped in, and that weight's
 * stored tensors (values, scales, shape) checked against its shape.
 *
 * Formats as shipped (ARCHITECTURES.md 1.3):
 *   fp8                 quant_method "fp8", e4m3 values `X.weight` with F32
 *                       `X.weight_scale_inv` per 128x128 block; every Linear
 *                       except lm_head and modules_to_not_convert.
 *   pack-quantized      compressed-tensors INT4: `X.weight_packed` I32
 *                       [out][in/8], `X.weight_scale` BF16 [out][in/32],
 *                       `X.weight_shape` [2] = [out, in].
 *   mxfp4-pack-quantized compressed-tensors MXFP4: `X.weight_packed` U8
 *                       [out][in/2], `X.weight_scale` U8 (E8M0) [out][in/32].
 * compressed-tensors picks a module's format from `config_groups` (targets:
 * "Linear", an exact module name, or "re:" + a regex matched from the start
 * of the module's name, as Python's re.match) unless `ignore` names it;
 * "mixed-precision" gives each group its own format. Anything else (static
 * or quantized activations, asymmetric schemes, other bit widths, group
 * sizes or block shapes) is refused with an error naming the field.
 */
#ifndef DF_QUANT_H
#define DF_QUANT_H

#include "kernels/kernels.h"
#include "model/safetensors.h"

#include <jansson.h>

typedef enum df_qkind { DF_Q_NONE = 0, DF_Q_FP8, DF_Q_INT4, DF_Q_MXFP4 } df_qkind;

typedef struct df_quant df_quant;

/* Parses a quantization_config object (qc; NULL: none, *out = NULL). `path`
 * and `field` ("quantization_config" or "text_config.quantization_config")
 * name it in errors. */
int df_quant_parse(df_quant **out, json_t *qc, const char *path, const char *field, df_error *err);
/* DIR/config.json's quantization_config (its text_config's, for a wrapper). */
int df_quant_load_dir(df_quant **out, const char *dir, df_error *err);
void df_quant_free(df_quant *q);
/* "fp8 e4m3 [128x128] ...": for inspect. "" for NULL. */
const char *df_quant_describe(const df_quant *q);
const char *df_qkind_name(df_qkind k);

/* The format the config gives module `module` (a tensor name without
 * ".weight"); linear: the module is an nn.Linear (a plain parameter, an
 * embedding, a norm is never quantized). Fails when several config groups
 * target it. */
int df_quant_kind(const df_quant *q, const char *module, bool linear, df_qkind *out, df_error *err);

/* Bytes of a [rows][cols] matrix stored as `kind` (BF16 when DF_Q_NONE),
 * its scales and shape companion included: sizes from a config alone. */
uint64_t df_quant_matrix_bytes(df_qkind kind, int rows, int cols);

/* A weight's stored tensors as the config says they are shipped. */
typedef struct df_qweight {
    df_qkind kind;
    df_wfmt fmt;
    const df_tensor *values; /* X.weight or X.weight_packed */
    const df_tensor *scale;  /* X.weight_scale_inv / X.weight_scale, or NULL */
    const df_tensor *shape;  /* X.weight_shape, or NULL */
} df_qweight;

/* Finds and checks the tensors of matrix `module` ([rows][cols]): dtypes,
 * the scale grid (ceil-divided), packed widths, weight_shape's values, and
 * that no tensor contradicts the config (an F8 or packed weight the config
 * does not name). Every error names the tensor. Scale values are not read:
 * df_quant_check_scales. */
int df_quant_bind(const df_st *st, const df_quant *q, const char *module, int rows, int cols, bool linear,
                  df_qweight *out, df_error *err);
/* Scales that are NaN (or not finite and positive, for F32): the error names the tensor. */
int df_quant_check_scales(const df_st *st, const df_tensor *scale, df_wfmt fmt, const void *data,
                          df_error *err);

#endif
