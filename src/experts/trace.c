/*
 * trace.c - parsing and writing of MoE routing traces (format in trace.h).
 * The parser is strict: every malformed line is rejected with its line number and
 * the field at fault, because a silently mis-read trace would make every cache
 * figure derived from it meaningless.
 */
#include "experts/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAGIC "# moe-routing-trace v"

typedef struct {
    const char *name;
    int lineno;
    df_error *err;
} pctx;

static int perr(const pctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(const pctx *c, int code, const char *fmt, ...) {
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!c->lineno) return df_fail(c->err, code, "%s: %s", c->name, buf); /* the whole trace */
    return df_fail(c->err, code, "%s:%d: %s", c->name, c->lineno, buf);
}

/* Checked once the header is complete: at the first token line, or at the end
 * of a trace that has none (then with c->lineno 0). */
static int check_top_k(const pctx *c, const df_trace *t) {
    if (t->top_k <= t->n_experts) return DF_OK;
    return perr(c, DF_ERR_FORMAT, "header top_k = %d exceeds experts_per_layer = %d", t->top_k,
                t->n_experts);
}

static int is_sp(char ch) { return ch == ' ' || ch == '\t'; }

/* Parses a non-negative decimal integer at s[0..n), no sign, at most 9 digits. */
static int parse_uint(const char *s, size_t n, long *out) {
    if (n == 0 || n > 9) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Next whitespace-separated word of [*p, end); returns its length, 0 at end. */
static size_t next_word(const char **p, const char *end, const char **w) {
    const char *s = *p;
    while (s < end && is_sp(*s)) s++;
    const char *b = s;
    while (s < end && !is_sp(*s)) s++;
    *w = b;
    *p = s;
    return (size_t)(s - b);
}

static int set_dim(const pctx *c, const char *key, int *dst, const char *w, size_t n,
                   long max) {
    long v;
    if (parse_uint(w, n, &v) != 0 || v < 1 || v > max)
        return perr(c, DF_ERR_FORMAT, "header '%s' needs an integer in [1, %ld], got '%.*s'",
                    key, max, (int)(n > 40 ? 40 : n), w);
    if (*dst != 0 && *dst != (int)v)
        return perr(c, DF_ERR_FORMAT, "header '%s' given twice (%d, then %ld)", key, *dst, v);
    *dst = (int)v;
    return DF_OK;
}

/* A header comment (after the magic line, before the first token). */
static int parse_header_comment(const pctx *c, df_trace *t, const char *s, const char *end) {
    s++; /* '#' */
    const char *p = s, *w;
    size_t n = next_word(&p, end, &w);
    if (n == 6 && memcmp(w, "model:", 6) == 0) {
        while (p < end && is_sp(*p)) p++;
        const char *e = end;
        while (e > p && is_sp(e[-1])) e--;
        size_t len = (size_t)(e - p);
        if (len >= sizeof t->model) len = sizeof t->model - 1;
        /* Control characters become spaces, as the writer writes them: the name
         * is printed to terminals, and a trace written back reads the same. */
        size_t a = 0, b = 0;
        for (size_t i = 0; i < len; i++) {
            char ch = ((unsigned char)p[i] < 0x20 || p[i] == 0x7f) ? ' ' : p[i];
            if (ch != ' ' || b > 0) t->model[b++] = ch; /* leading blanks dropped */
            if (ch != ' ') a = b;                       /* trailing ones after a */
        }
        t->model[a] = 0;
        return DF_OK;
    }
    for (p = s; (n = next_word(&p, end, &w)) > 0;) {
        const char *vw;
        if (n == 11 && memcmp(w, "moe_layers:", 11) == 0) {
            size_t vn = next_word(&p, end, &vw);
            int rc = set_dim(c, "moe_layers", &t->n_layers, vw, vn, DF_TRACE_MAX_LAYERS);
            if (rc) return rc;
        } else if (n == 18 && memcmp(w, "experts_per_layer:", 18) == 0) {
            size_t vn = next_word(&p, end, &vw);
            int rc = set_dim(c, "experts_per_layer", &t->n_experts, vw, vn,
                             DF_TRACE_MAX_EXPERTS);
            if (rc) return rc;
        } else if (n == 6 && memcmp(w, "top_k:", 6) == 0) {
            size_t vn = next_word(&p, end, &vw);
            int rc = set_dim(c, "top_k", &t->top_k, vw, vn, DF_TRACE_MAX_TOPK);
            if (rc) return rc;
        } else if (n == 6 && memcmp(w, "(model", 6) == 0) {
            /* "(model layers A..B)": informational only, ignored if odd */
            const char *a;
            size_t an = next_word(&p, end, &a);
            if (an == 6 && memcmp(a, "layers", 6) == 0) {
                size_t rn = next_word(&p, end, &a);
                long v;
                size_t dig = 0;
                while (dig < rn && a[dig] >= '0' && a[dig] <= '9') dig++;
                if (parse_uint(a, dig, &v) == 0) t->first_layer = (int)v;
            }
        }
    }
    return DF_OK;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return -1;
        nc *= 2;
    }
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* One token line; appends n_layers * top_k ids. stamp/stamp_gen detect duplicates. */
static int parse_token_line(const pctx *c, df_trace *t, const char *s, const char *end,
                            uint16_t *dst, uint32_t *stamp, uint32_t *stamp_gen) {
    const char *p = s;
    int field = 0;
    for (;;) {
        while (p < end && is_sp(*p)) p++;
        if (p == end) break;
        if (field == t->n_layers)
            return perr(c, DF_ERR_FORMAT, "more than %d fields (one per MoE layer)",
                        t->n_layers);
        (*stamp_gen)++;
        int k = 0;
        for (;;) {
            const char *b = p;
            while (p < end && *p >= '0' && *p <= '9') p++;
            if (p == b) {
                if (p < end && !is_sp(*p) && *p != ',')
                    return perr(c, DF_ERR_FORMAT,
                                "field %d (MoE layer %d): unexpected character '%c' "
                                "(0x%02x)",
                                field + 1, field,
                                (*p >= 0x20 && *p < 0x7f) ? *p : '?', (unsigned char)*p);
                return perr(c, DF_ERR_FORMAT,
                            "field %d (MoE layer %d): empty expert id", field + 1, field);
            }
            long v;
            if (parse_uint(b, (size_t)(p - b), &v) != 0 || v >= t->n_experts)
                return perr(c, DF_ERR_FORMAT,
                            "field %d (MoE layer %d): expert id '%.*s' out of range "
                            "[0, %d)",
                            field + 1, field, (int)(p - b > 20 ? 20 : p - b), b,
                            t->n_experts);
            if (k == t->top_k)
                return perr(c, DF_ERR_FORMAT,
                            "field %d (MoE layer %d): more than top_k = %d expert ids",
                            field + 1, field, t->top_k);
            if (stamp[v] == *stamp_gen)
                return perr(c, DF_ERR_FORMAT,
                            "field %d (MoE layer %d): expert %ld selected twice", field + 1,
                            field, v);
            stamp[v] = *stamp_gen;
            dst[(size_t)field * (size_t)t->top_k + (size_t)k++] = (uint16_t)v;
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (p < end && !is_sp(*p))
                return perr(c, DF_ERR_FORMAT,
                            "field %d (MoE layer %d): unexpected character '%c' (0x%02x)",
                            field + 1, field, (*p >= 0x20 && *p < 0x7f) ? *p : '?',
                            (unsigned char)*p);
            break;
        }
        if (k != t->top_k)
            return perr(c, DF_ERR_FORMAT,
                        "field %d (MoE layer %d): %d expert ids, expected top_k = %d",
                        field + 1, field, k, t->top_k);
        field++;
    }
    if (field != t->n_layers)
        return perr(c, DF_ERR_FORMAT, "%d fields, expected %d (one per MoE layer)", field,
                    t->n_layers);
    return DF_OK;
}

/* Line 1: the magic and version 1. */
static int parse_magic(const pctx *c, const char *s, const char *end) {
    size_t ml = strlen(TRACE_MAGIC);
    if ((size_t)(end - s) < ml || memcmp(s, TRACE_MAGIC, ml) != 0)
        return perr(c, DF_ERR_FORMAT,
                    "not a routing trace: the first line must be "
                    "'# moe-routing-trace v1'");
    const char *v = s + ml, *ve = end;
    while (ve > v && is_sp(ve[-1])) ve--;
    if (ve - v != 1 || *v != '1')
        return perr(c, DF_ERR_UNSUPPORTED, "unsupported trace version '%.*s' (want 1)",
                    (int)(ve - v > 20 ? 20 : ve - v), v);
    return DF_OK;
}

/* What the parse carries from line to line. */
typedef struct pstate {
    size_t ids_cap, seq_cap;
    uint32_t *stamp, stamp_gen;
    int in_seq;
} pstate;

/* A token line at [q, end): its ids appended, a new sequence started after a blank. */
static int add_token(const pctx *c, df_trace *t, pstate *ps, const char *q, const char *end) {
    if (!ps->stamp) {
        if (!t->n_layers || !t->n_experts || !t->top_k)
            return perr(c, DF_ERR_FORMAT,
                        "token line before the header gave moe_layers, "
                        "experts_per_layer and top_k");
        int rc = check_top_k(c, t);
        if (rc) return rc;
        ps->stamp = calloc((size_t)t->n_experts, sizeof *ps->stamp);
        if (!ps->stamp) return perr(c, DF_ERR_NOMEM, "out of memory");
    }
    size_t per = (size_t)t->n_layers * (size_t)t->top_k;
    if (grow((void **)&t->ids, &ps->ids_cap, (size_t)(t->n_tokens + 1) * per, sizeof *t->ids) ||
        grow((void **)&t->seq_start, &ps->seq_cap, (size_t)t->n_seqs + 2, sizeof *t->seq_start))
        return perr(c, DF_ERR_NOMEM, "out of memory at token %d", t->n_tokens);
    if (t->n_tokens == 0x7ffffffe) return perr(c, DF_ERR_FORMAT, "too many tokens");
    int rc = parse_token_line(c, t, q, end, t->ids + (size_t)t->n_tokens * per, ps->stamp,
                              &ps->stamp_gen);
    if (rc) return rc;
    if (!ps->in_seq) t->seq_start[t->n_seqs++] = t->n_tokens;
    ps->in_seq = 1;
    t->n_tokens++;
    return DF_OK;
}

/* After the last line: the header complete, the sequence table closed. */
static int finish(const pctx *c, df_trace *t, pstate *ps, df_error *err) {
    if (!t->n_layers || !t->n_experts || !t->top_k)
        return df_fail(err, DF_ERR_FORMAT, "%s: header lacks moe_layers, experts_per_layer or top_k",
                       c->name);
    pctx whole = *c;
    whole.lineno = 0;
    int rc = check_top_k(&whole, t);
    if (rc) return rc;
    if (grow((void **)&t->seq_start, &ps->seq_cap, (size_t)t->n_seqs + 1, sizeof *t->seq_start))
        return df_fail(err, DF_ERR_NOMEM, "%s: out of memory", c->name);
    t->seq_start[t->n_seqs] = t->n_tokens;
    return DF_OK;
}

int df_trace_parse(df_trace *t, const char *text, size_t len, const char *name,
                   df_error *err) {
    memset(t, 0, sizeof *t);
    t->first_layer = -1;
    pctx c = {name ? name : "<trace>", 0, err};
    if (!text) return df_fail(err, DF_ERR_ARG, "%s: no trace text", c.name);

    pstate ps = {0};
    int rc = DF_OK;
    const char *s = text, *tend = text + len;
    while (s < tend || c.lineno == 0) {
        size_t rem = s < tend ? (size_t)(tend - s) : 0;
        const char *nl = memchr(s, '\n', rem);
        const char *end = nl ? nl : tend;
        const char *next = nl ? nl + 1 : tend;
        c.lineno++;
        if (end > s && end[-1] == '\r') end--;
        if (end > s && memchr(s, '\0', (size_t)(end - s))) {
            rc = perr(&c, DF_ERR_FORMAT, "NUL byte in a text trace");
            break;
        }
        if (c.lineno == 1) {
            if ((rc = parse_magic(&c, s, end))) break;
            s = next;
            continue;
        }
        const char *q = s;
        while (q < end && is_sp(*q)) q++;
        if (q == end) /* blank: ends the sequence */
            ps.in_seq = 0;
        else if (*q == '#')
            rc = t->n_tokens == 0 ? parse_header_comment(&c, t, q, end) : DF_OK;
        else
            rc = add_token(&c, t, &ps, q, end);
        if (rc) break;
        s = next;
        if (!nl) break;
    }
    if (!rc) rc = finish(&c, t, &ps, err);
    free(ps.stamp);
    if (rc) df_trace_free(t);
    return rc;
}

int df_trace_load(df_trace *t, const char *path, df_error *err) {
    memset(t, 0, sizeof *t);
    t->first_layer = -1;
    char *data;
    size_t len;
    int rc = df_read_file(path, &data, &len, err);
    if (rc) return rc;
    rc = df_trace_parse(t, data, len, path, err);
    free(data);
    return rc;
}

void df_trace_free(df_trace *t) {
    if (!t) return;
    free(t->ids);
    free(t->seq_start);
    memset(t, 0, sizeof *t);
    t->first_layer = -1;
}

/* ---- writer ------------------------------------------------------------- */

struct df_trace_writer {
    FILE *f;
    int owns;
    char *name;
    int n_layers, n_experts, top_k;
    int tokens_in_seq;
    uint32_t *stamp, stamp_gen;
};

static int wfail(df_trace_writer *w, df_error *err) {
    return df_fail(err, DF_ERR_IO, "%s: write failed: %s", w->name, strerror(errno));
}

int df_trace_writer_open_stream(df_trace_writer **out, FILE *f, const char *name,
                                const char *model, int n_layers, int first_layer,
                                int n_experts, int top_k, df_error *err) {
    *out = NULL;
    if (!f) return df_fail(err, DF_ERR_ARG, "trace writer: no stream");
    if (n_layers < 1 || n_layers > DF_TRACE_MAX_LAYERS || n_experts < 1 ||
        n_experts > DF_TRACE_MAX_EXPERTS || top_k < 1 || top_k > DF_TRACE_MAX_TOPK ||
        top_k > n_experts)
        return df_fail(err, DF_ERR_ARG,
                       "trace writer: bad shape layers=%d experts=%d top_k=%d", n_layers,
                       n_experts, top_k);
    df_trace_writer *w = df_xcalloc(1, sizeof *w);
    w->f = f;
    w->name = df_xstrdup(name ? name : "<trace>");
    w->n_layers = n_layers;
    w->n_experts = n_experts;
    w->top_k = top_k;
    w->stamp = df_xcalloc((size_t)n_experts, sizeof *w->stamp);
    /* the model name must stay on one header line */
    char m[256];
    size_t i = 0;
    for (const char *p = model ? model : ""; *p && i + 1 < sizeof m; p++)
        m[i++] = ((unsigned char)*p < 0x20 || *p == 0x7f) ? ' ' : *p;
    m[i] = 0;
    fprintf(f, "# moe-routing-trace v1\n");
    if (m[0]) fprintf(f, "# model: %s\n", m);
    if (first_layer >= 0)
        fprintf(f, "# moe_layers: %d (model layers %d..%d)  experts_per_layer: %d  top_k: %d\n",
                n_layers, first_layer, first_layer + n_layers - 1, n_experts, top_k);
    else
        fprintf(f, "# moe_layers: %d  experts_per_layer: %d  top_k: %d\n", n_layers,
                n_experts, top_k);
    fprintf(f, "# one line per token in sequence order; %d space-separated fields, one per "
               "MoE layer;\n# each field = the %d selected expert ids, comma-separated. A "
               "blank line separates sequences.\n",
            n_layers, top_k);
    if (ferror(f)) {
        int rc = wfail(w, err);
        free(w->stamp);
        free(w->name);
        free(w);
        return rc;
    }
    *out = w;
    return DF_OK;
}

int df_trace_writer_open(df_trace_writer **out, const char *path, const char *model,
                         int n_layers, int first_layer, int n_experts, int top_k,
                         df_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "w");
    if (!f) return df_fail(err, DF_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int rc = df_trace_writer_open_stream(out, f, path, model, n_layers, first_layer,
                                         n_experts, top_k, err);
    if (rc) {
        fclose(f);
        return rc;
    }
    (*out)->owns = 1;
    return DF_OK;
}

int df_trace_writer_token(df_trace_writer *w, const int32_t *ids, df_error *err) {
    for (int l = 0; l < w->n_layers; l++) {
        w->stamp_gen++;
        for (int k = 0; k < w->top_k; k++) {
            int32_t v = ids[l * w->top_k + k];
            if (v < 0 || v >= w->n_experts)
                return df_fail(err, DF_ERR_ARG, "%s: MoE layer %d: expert id %d out of [0, %d)",
                               w->name, l, (int)v, w->n_experts);
            if (w->stamp[v] == w->stamp_gen)
                return df_fail(err, DF_ERR_ARG, "%s: MoE layer %d: expert %d selected twice",
                               w->name, l, (int)v);
            w->stamp[v] = w->stamp_gen;
        }
    }
    char buf[16];
    for (int l = 0; l < w->n_layers; l++) {
        for (int k = 0; k < w->top_k; k++) {
            int n = snprintf(buf, sizeof buf, "%s%d", k ? "," : (l ? " " : ""),
                             (int)ids[l * w->top_k + k]);
            fwrite(buf, 1, (size_t)n, w->f);
        }
    }
    fputc('\n', w->f);
    w->tokens_in_seq++;
    return ferror(w->f) ? wfail(w, err) : DF_OK;
}

int df_trace_writer_end_sequence(df_trace_writer *w, df_error *err) {
    if (!w->tokens_in_seq) return DF_OK;
    w->tokens_in_seq = 0;
    fputc('\n', w->f);
    return ferror(w->f) ? wfail(w, err) : DF_OK;
}

int df_trace_writer_close(df_trace_writer *w, df_error *err) {
    if (!w) return DF_OK;
    int rc = DF_OK;
    if (fflush(w->f) != 0 || ferror(w->f)) rc = wfail(w, err);
    if (w->owns && fclose(w->f) != 0 && rc == DF_OK) rc = wfail(w, err);
    free(w->stamp);
    free(w->name);
    free(w);
    return rc;
}

int df_trace_write_file(const df_trace *t, const char *path, df_error *err) {
    df_trace_writer *w;
    int rc = df_trace_writer_open(&w, path, t->model[0] ? t->model : NULL, t->n_layers,
                                  t->first_layer, t->n_experts, t->top_k, err);
    if (rc) return rc;
    size_t per = (size_t)t->n_layers * (size_t)t->top_k;
    int32_t *row = df_xmalloc(per * sizeof *row);
    for (int s = 0; s < t->n_seqs && rc == DF_OK; s++) {
        for (int i = t->seq_start[s]; i < t->seq_start[s + 1] && rc == DF_OK; i++) {
            const uint16_t *src = t->ids + (size_t)i * per;
            for (size_t j = 0; j < per; j++) row[j] = src[j];
            rc = df_trace_writer_token(w, row, err);
        }
        if (rc == DF_OK) rc = df_trace_writer_end_sequence(w, err);
    }
    free(row);
    int rc2 = df_trace_writer_close(w, rc ? NULL : err);
    return rc ? rc : rc2;
}
