/*
 * engine/inspect.c - `deltafin inspect`: the shared config lines, the family's
 * own (arch->inspect), the tensor inventory with routed experts summarised
 * per layer, and the byte counts.
 */
#include "engine/internal.h"

#include <stdio.h>
#include <stdlib.h>

/* "model.layers.3.mlp.experts.*": the name of layer li's experts up to where
 * expert ids differ in it (the architecture's naming, whatever it is). */
static void expert_group_name(const df_config *c, int li, char *out, size_t n) {
    char a[256], b[256];
    c->arch->expert_prefix(c, li, 0, a, sizeof a);
    c->arch->expert_prefix(c, li, c->num_experts > 1 ? 1 : 0, b, sizeof b);
    size_t k = 0, dot = 0;
    while (a[k] && a[k] == b[k]) {
        if (a[k] == '.') dot = k + 1;
        k++;
    }
    if (!a[k]) dot = strlen(a); /* one expert: the whole name */
    snprintf(out, n, "%.*s*", (int)dot, a);
}

static void print_expert_group(const df_config *c, FILE *f, int li, int count, uint64_t bytes) {
    char b[32], name[300];
    df_fmt_bytes_iec(b, sizeof b, bytes);
    expert_group_name(c, li, name, sizeof name);
    fprintf(f, "  %s  %d tensors  %s\n", name, count, b);
}

/* Every tensor; routed experts are summarised per layer: a 235B model has
 * tens of thousands of them. */
static void inspect_tensors(const df_model *m, FILE *f) {
    const df_config *c = &m->cfg;
    size_t nt = df_st_count(m->st);
    int *xlayer = df_xcalloc(nt ? nt : 1, sizeof(int));
    for (int li = 0; m->experts.xt && li < c->num_hidden_layers; li++)
        for (int e = 0; c->layer_is_moe[li] && e < c->num_experts; e++)
            for (int p = 0; p < m->experts.layout->n_parts; p++)
                xlayer[df_st_index(m->st, df_expert_part(&m->experts, li, e, p))] = li;
    for (int li = 0; m->experts.xs && li < c->num_hidden_layers; li++) /* packed experts' shapes */
        for (int i = 0; i < c->num_experts * DF_EXPERT_MATS; i++) {
            const df_tensor *t = m->experts.xs[(size_t)li * (size_t)c->num_experts * DF_EXPERT_MATS + (size_t)i];
            if (t) xlayer[df_st_index(m->st, t)] = li;
        }
    uint64_t per_layer_bytes = 0;
    int per_layer_count = 0, cur_layer = -1;
    for (size_t i = 0; i < nt; i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (m->is_expert[i]) {
            if (xlayer[i] != cur_layer && per_layer_count) {
                print_expert_group(c, f, cur_layer, per_layer_count, per_layer_bytes);
                per_layer_bytes = 0;
                per_layer_count = 0;
            }
            cur_layer = xlayer[i];
            per_layer_bytes += t->nbytes;
            per_layer_count++;
            continue;
        }
        char shp[96];
        size_t o = 0;
        for (int d = 0; d < t->ndim; d++)
            o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%lld", d ? "x" : "", (long long)t->shape[d]);
        if (!t->ndim) snprintf(shp, sizeof shp, "scalar");
        fprintf(f, "  %-56s %-5s %-14s %12llu%s\n", t->name, df_dtype_name(t->dtype), shp,
                (unsigned long long)t->nbytes, m->used[i] ? "" : "  not used");
    }
    if (per_layer_count) print_expert_group(c, f, cur_layer, per_layer_count, per_layer_bytes);
    free(xlayer);
}

/* The formats the weights are shipped in: the config's quantization, the
 * routed experts' matrices, the always-active bytes per stored dtype. */
static void inspect_formats(const df_model *m, FILE *f) {
    fprintf(f, "weights               %s\n", m->quant ? df_quant_describe(m->quant) : "unquantized");
    const df_expert_layout *xl = m->experts.layout;
    if (xl && m->experts.xt) {
        int li = 0;
        while (!m->cfg.layer_is_moe[li]) li++;
        static const char *const mat[] = {"gate", "up", "down"};
        fprintf(f, "expert formats       ");
        uint64_t bf16 = 0;
        for (int k = 0; k < DF_EXPERT_MATS; k++) {
            const df_tensor *t = df_expert_part(&m->experts, li, 0, xl->mat[k].values);
            df_wfmt w = xl->fmt[k];
            if (xl->mat[k].scale < 0) df_wfmt_of_dtype(t->dtype, &w);
            bf16 += 2 * (uint64_t)t->shape[0] * (uint64_t)df_expert_mat_cols(xl, k, t);
            fprintf(f, " %s %s%s", mat[k], df_wfmt_name(w), k < DF_EXPERT_MATS - 1 ? "," : "");
        }
        char a[32], b[32];
        df_fmt_bytes_iec(a, sizeof a, df_expert_bytes(&m->experts, li, 0));
        df_fmt_bytes_iec(b, sizeof b, bf16);
        fprintf(f, "; %s per expert as shipped (%s in BF16)\n", a, b);
    }
    uint64_t by[DF_DT_COUNT] = {0};
    size_t nt = df_st_count(m->st);
    for (size_t i = 0; i < nt; i++)
        if (m->used[i] && !m->is_expert[i]) by[df_st_at(m->st, i)->dtype] += df_st_at(m->st, i)->nbytes;
    fprintf(f, "always-active dtypes ");
    for (int d = 0; d < DF_DT_COUNT; d++) {
        if (!by[d]) continue;
        char a[32];
        df_fmt_bytes_iec(a, sizeof a, by[d]);
        fprintf(f, " %s %s", df_dtype_name((df_dtype)d), a);
    }
    fprintf(f, "\n");
}

void df_engine_inspect(const df_engine *e, FILE *f) {
    const df_config *c = &e->model.cfg;
    const df_model *m = &e->model;
    fprintf(f, "architecture          %s\n", e->info.architecture);
    fprintf(f, "vocab_size            %d\n", c->vocab_size);
    fprintf(f, "hidden_size           %d\n", c->hidden_size);
    fprintf(f, "layers                %d\n", c->num_hidden_layers);
    c->arch->inspect(m, f);
    fprintf(f, "stop tokens          ");
    for (int i = 0; i < e->n_stop; i++) fprintf(f, " %d", e->stop_ids[i]);
    fprintf(f, "\nchat template         %s\n", df_chat_template_name(e->chat));
    fprintf(f, "kernels               %s, %d threads\n", e->info.isa, e->info.n_threads);
    inspect_formats(m, f);
    fprintf(f, "\ntensors (%zu in %d file%s):\n", df_st_count(m->st), df_st_file_count(m->st),
            df_st_file_count(m->st) == 1 ? "" : "s");
    inspect_tensors(m, f);
    char a[32], d[32], x[32];
    df_fmt_bytes_iec(a, sizeof a, m->bytes_total);
    df_fmt_bytes_iec(d, sizeof d, m->bytes_dense);
    df_fmt_bytes_iec(x, sizeof x, m->bytes_experts);
    fprintf(f, "\nbytes: total %s (%llu), always-active %s (%llu), routed experts %s (%llu)\n", a,
            (unsigned long long)m->bytes_total, d, (unsigned long long)m->bytes_dense, x,
            (unsigned long long)m->bytes_experts);
    if (m->n_unused) {
        df_fmt_bytes_iec(x, sizeof x, m->bytes_unused);
        fprintf(f, "not used: %d tensor%s, %s (%llu): MTP layers, vision tower, rotary buffers and the like\n",
                m->n_unused, m->n_unused == 1 ? "" : "s", x, (unsigned long long)m->bytes_unused);
    }
}


/* ---- from config.json alone ---------------------------------------------------------------- */

static void line_bytes(FILE *f, const char *what, uint64_t b) {
    char s[32];
    df_fmt_bytes_iec(s, sizeof s, b);
    if (b >= 1000000000ULL) fprintf(f, "%-21s %s (%.1f GB)\n", what, s, (double)b / 1e9);
    else fprintf(f, "%-21s %s (%llu B)\n", what, s, (unsigned long long)b);
}

/* The expected decode speed: experts are read from the drives except the
 * share a cache of what RAM leaves holds. Routing is taken as uniform (each
 * expert as likely as another), so the cache's hit rate is its share of all
 * experts: real routing is skewed and does better, so this is a floor. */
static void plan_speed(FILE *f, const df_config *c, const df_plan *p, uint64_t ram, double gbps) {
    int moe = df_config_moe_layers(c);
    uint64_t routed = (uint64_t)c->num_experts * (uint64_t)moe * p->expert;
    uint64_t per_token = (uint64_t)c->num_experts_per_tok * (uint64_t)moe * p->expert;
    const int ctx = 4096;
    uint64_t state = p->state_fixed + (uint64_t)ctx * p->state_per_token, margin = (uint64_t)2 << 30;
    if (!ram) return;
    if (ram < p->active + state + margin) {
        fprintf(f, "expected              does not fit: the always-active weights, a %d-token sequence and 2 GiB "
                   "of working memory need more than --ram\n", ctx);
        return;
    }
    uint64_t cache = ram - p->active - state - margin;
    double hit = routed ? (double)cache / (double)routed : 1.0;
    if (hit > 1.0) hit = 1.0;
    double missed = (1.0 - hit) * (double)per_token;
    line_bytes(f, "expert cache", cache < routed ? cache : routed);
    fprintf(f, "cache hit rate        %.1f%% (uniform routing: a floor; real routing is skewed)\n", 100.0 * hit);
    line_bytes(f, "missed per token", (uint64_t)missed);
    if (gbps <= 0) return;
    if (missed <= 0) fprintf(f, "expected              every expert in RAM: decode is bound by memory, not drives\n");
    else fprintf(f, "expected              %.3f tokens/s at %.2f GB/s (drive bound: bandwidth / bytes missed)\n",
                 gbps * 1e9 / missed, gbps);
}

int df_inspect_config(const char *dir, uint64_t ram, double gbps, FILE *f, df_error *err) {
    df_config c;
    df_quant *q = NULL;
    int rc = df_config_load_dir(&c, dir, err);
    if (rc || (rc = df_quant_load_dir(&q, dir, err))) return rc;
    df_plan p = {0};
    if (!c.arch->plan) {
        df_quant_free(q);
        return df_fail(err, DF_ERR_UNSUPPORTED, "%s: inspect --config-only does not know the sizes of model_type "
                       "'%s' (open the checkpoint instead)", dir, c.model_type);
    }
    if ((rc = c.arch->plan(&c, q, &p, err))) {
        df_quant_free(q);
        return rc;
    }
    int moe = df_config_moe_layers(&c);
    fprintf(f, "architecture          %s\n", c.model_type);
    fprintf(f, "weights               %s\n", q ? df_quant_describe(q) : "unquantized");
    line_bytes(f, "always-active", p.active);
    line_bytes(f, "one routed expert", p.expert);
    line_bytes(f, "routed experts", (uint64_t)c.num_experts * (uint64_t)moe * p.expert);
    char what[64];
    snprintf(what, sizeof what, "expert bytes/token"); /* the worst case: every expert distinct */
    line_bytes(f, what, (uint64_t)c.num_experts_per_tok * (uint64_t)moe * p.expert);
    fprintf(f, "                      (%d experts x %d MoE layers)\n", c.num_experts_per_tok, moe);
    line_bytes(f, "state per sequence", p.state_fixed);
    fprintf(f, "state per token       %llu B\n", (unsigned long long)p.state_per_token);
    plan_speed(f, &c, &p, ram, gbps);
    df_quant_free(q);
    return DF_OK;
}
