/*
 * arch.c - the architecture table: one entry per config.json model_type, each
 * defined in its family's file. Adding a family adds a line here
 * (docs/architecture.md, "How to add an architecture").
 */
#include "model/arch.h"

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
