/*
 * arch.c - the architecture table: one entry per config.json model_type, each
 * defined in its family's file. Adding a family adds a line here
 * (docs/architecture.md, "How to add an architecture"). Also the sums the
 * families' plans (inspect --config-only) share.
 */
#include "model/arch.h"

#include "model/quant.h"

#include <stdarg.h>
#include <stdio.h>

extern const df_arch df_arch_qwen3, df_arch_qwen3_moe;
extern const df_arch df_arch_deepseek_v2, df_arch_deepseek_v3, df_arch_kimi_k2;
extern const df_arch df_arch_kimi_linear, df_arch_kimi_k3;

static const df_arch *const TABLE[] = {&df_arch_qwen3, &df_arch_qwen3_moe, &df_arch_deepseek_v2, &df_arch_deepseek_v3,
                                       &df_arch_kimi_k2, &df_arch_kimi_linear, &df_arch_kimi_k3};

#define N_ARCH (sizeof TABLE / sizeof TABLE[0])

const df_arch *df_arch_find(const char *model_type) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (strcmp(TABLE[i]->model_type, model_type) == 0) return TABLE[i];
    return NULL;
}

void df_arch_names(char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_ARCH && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", TABLE[i]->model_type);
}

int df_plan_linear(df_plan_ctx *p, int rows, int cols, const char *fmt, ...) {
    char n[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n, sizeof n, fmt, ap);
    va_end(ap);
    df_qkind k = DF_Q_NONE;
    int rc = p->q ? df_quant_kind(p->q, n, true, &k, p->err) : DF_OK;
    if (!rc) p->bytes += df_quant_matrix_bytes(k, rows, cols);
    return rc;
}

int df_plan_swiglu(df_plan_ctx *p, int I, const char *fmt, ...) {
    char m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    int rc, H = p->c->hidden_size;
    if ((rc = df_plan_linear(p, I, H, "%s.gate_proj", m)) || (rc = df_plan_linear(p, I, H, "%s.up_proj", m)))
        return rc;
    return df_plan_linear(p, H, I, "%s.down_proj", m);
}

int df_plan_spine(df_plan_ctx *p) {
    const df_config *c = p->c;
    p->bytes += 2 * (uint64_t)c->vocab_size * (uint64_t)c->hidden_size + 2 * (uint64_t)c->hidden_size;
    if (c->tie_word_embeddings) return DF_OK;
    return df_plan_linear(p, c->vocab_size, c->hidden_size, "%slm_head", c->tensor_prefix);
}
