/*
 * encode.c - byte-level BPE's encoder over the tables of tokenizer.c
 * (tok_impl.h): normalizers (utf8proc), added-token matching, pre-tokenizing
 * by the regexes, the BPE merge loop, plain spans and tiktoken's cutting.
 *
 * The encode pipeline follows HF tokenizers' order so results match it exactly:
 *   1. added tokens with normalized=false are cut out of the raw text
 *      (leftmost-longest, lstrip/rstrip honoured);
 *   2. each remaining piece is normalized, then cut by normalized=true added tokens;
 *   3. the pre-tokenizer steps split each piece (Split regexes, ByteLevel);
 *   4. every pre-token is merged by BPE (ignore_merges: a pre-token that is itself
 *      in the vocab maps straight to its id).
 * Plain spans (df_tokenizer_encode_spans, used for chat message content) switch
 * off special added tokens in steps 1-2 inside them; everything else runs over
 * the whole text as one string, so ids change only where special-token text
 * lies in a span. Encoding spans separately would not do: a pre-tokenizer whose
 * pattern groups runs of newlines joins "\n" + "\n\n" across the edge of
 * "user\n" and content into one token.
 * The tables hold raw bytes (vocab strings are converted out of the byte-level
 * alphabet once at load), so encoding never maps characters.
 *
 * Text that is not valid UTF-8 cannot be normalized or fed to a UTF-8 regex; such
 * byte runs bypass steps 2-3 and go to BPE as their own pre-tokens, so encoding
 * never fails on it and decoding still gives the bytes back.
 *
 * A loaded tokenizer is read-only: all per-call state lives in enc_ctx, so one
 * tokenizer may be used from several threads at once.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_impl.h"

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct enc_ctx {
    const df_tokenizer *t;
    df_error *err;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    /* BPE scratch, grown to the longest pre-token seen */
    int32_t *sym, *nxt, *prv;
    uint64_t *heap;
    size_t scap;
    /* Special added tokens are plain text inside these spans of the input (sorted,
     * non-empty); raw pieces are located in the input by their offset from text. */
    const char *text;
    const df_text_span *plain;
    size_t n_plain;
    bool norm_special; /* the piece being normalized may match special tokens */
    bool norm_in_text; /* normalizing left it unchanged: it still lies in text */
    bool all_plain;    /* DF_TOK_PLAIN_ALL: no added token at all inside plain spans */
} enc_ctx;

/* Index of the first plain span ending after offset off (n_plain: none). */
static size_t plain_after(const enc_ctx *c, size_t off) {
    size_t lo = 0, hi = c->n_plain;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->plain[mid].off + c->plain[mid].len > off) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Longest special token that may start at input offset off: none inside a plain
 * span, and none reaching into the next one. */
static size_t special_room(const enc_ctx *c, size_t off) {
    if (c->n_plain == 0) return SIZE_MAX;
    size_t k = plain_after(c, off);
    if (k == c->n_plain) return SIZE_MAX;
    return c->plain[k].off <= off ? 0 : c->plain[k].off - off;
}

static bool overlaps_plain(const enc_ctx *c, size_t off, size_t n) {
    size_t k = plain_after(c, off);
    return k < c->n_plain && c->plain[k].off < off + n;
}

static void emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 256;
        c->ids = df_xrealloc(c->ids, c->cap * sizeof *c->ids);
    }
    c->ids[c->n++] = id;
}

/* Min-heap of (rank << 32 | position): lowest rank first, leftmost on ties, the
 * order HF's Word::merge_all uses. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        if (l + 1 < m && h[l + 1] < h[l]) l++;
        if (h[l] >= v) break;
        h[i] = h[l];
        i = l;
    }
    if (m) h[i] = v;
    return top;
}

static void push_pair(enc_ctx *c, size_t *hn, int32_t pos) {
    int32_t r = c->nxt[pos];
    uint32_t rank;
    int32_t id;
    if (r >= 0 && merge_get(c->t, c->sym[pos], c->sym[r], &rank, &id))
        heap_push(c->heap, hn, (uint64_t)rank << 32 | (uint32_t)pos);
}

static int bpe_word(enc_ctx *c, const unsigned char *p, size_t n) {
    const df_tokenizer *t = c->t;
    if (n == 0) return DF_OK;
    if (n == 1) {
        emit(c, t->byte_id[p[0]]);
        return DF_OK;
    }
    if (t->ignore_merges) {
        int32_t id = vmap_get(t, p, n);
        if (id >= 0) {
            emit(c, id);
            return DF_OK;
        }
    }
    if (n > INT32_MAX)
        return df_fail(c->err, DF_ERR_ARG, "%s: pre-token of %zu bytes is too long", t->path, n);
    if (n > c->scap) {
        size_t cap = n < 64 ? 64 : n;
        c->sym = df_xrealloc(c->sym, cap * sizeof *c->sym);
        c->nxt = df_xrealloc(c->nxt, cap * sizeof *c->nxt);
        c->prv = df_xrealloc(c->prv, cap * sizeof *c->prv);
        /* Each merge pushes at most two entries: n initial + 2 per merge. */
        c->heap = df_xrealloc(c->heap, 3 * cap * sizeof *c->heap);
        c->scap = cap;
    }
    int32_t *sym = c->sym, *nxt = c->nxt, *prv = c->prv;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[p[i]];
        nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prv[i] = (int32_t)i - 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(c, &hn, (int32_t)i);
    while (hn) {
        uint64_t top = heap_pop(c->heap, &hn);
        int32_t pos = (int32_t)(uint32_t)top, r = nxt[pos];
        uint32_t rank;
        int32_t id;
        /* Stale entries: the left symbol died or either side changed. Ranks are
         * unique per pair, so an equal rank means the very same pair. */
        if (sym[pos] < 0 || r < 0 || !merge_get(t, sym[pos], sym[r], &rank, &id) ||
            rank != (uint32_t)(top >> 32))
            continue;
        sym[pos] = id;
        sym[r] = -1;
        nxt[pos] = nxt[r];
        if (nxt[r] >= 0) prv[nxt[r]] = pos;
        if (prv[pos] >= 0) push_pair(c, &hn, prv[pos]);
        push_pair(c, &hn, pos);
    }
    for (int32_t i = 0; i >= 0; i = nxt[i]) emit(c, sym[i]);
    return DF_OK;
}

static int pretok(enc_ctx *c, const char *p, size_t n, int k);

static int regex_split(enc_ctx *c, const pt_step *st, const char *p, size_t n, int k) {
    size_t pos = 0, prev = 0;
    while (pos < n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             c->md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return df_fail(c->err, DF_ERR_UNSUPPORTED, "%s: pre-tokenizer regex failed: %s",
                           c->t->path, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* empty match: step one character, like find_iter */
            if (s >= n) break;
            size_t adv = utf8_char((const unsigned char *)p + s, n - s);
            pos = s + (adv ? adv : 1);
            continue;
        }
        int r = DF_OK;
        if (s > prev) r = pretok(c, p + prev, s - prev, k + 1);
        if (!r && st->behavior == BEH_ISOLATED) r = pretok(c, p + s, e - s, k + 1);
        if (r) return r;
        prev = pos = e;
    }
    return prev < n ? pretok(c, p + prev, n - prev, k + 1) : DF_OK;
}

static int pretok(enc_ctx *c, const char *p, size_t n, int k) {
    const df_tokenizer *t = c->t;
    if (n == 0) return DF_OK;
    if (k == t->n_steps) return bpe_word(c, (const unsigned char *)p, n);
    const pt_step *st = &t->steps[k];
    if (st->bytelevel && st->add_prefix_space && p[0] != ' ') {
        char *q = df_xmalloc(n + 1);
        q[0] = ' ';
        memcpy(q + 1, p, n);
        int rc = st->re ? regex_split(c, st, q, n + 1, k) : pretok(c, q, n + 1, k + 1);
        free(q);
        return rc;
    }
    return st->re ? regex_split(c, st, p, n, k) : pretok(c, p, n, k + 1);
}

/* Normalizes valid UTF-8; *out is NULL when the text is unchanged. */
int df_tok_normalize(const df_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n,
                     df_error *err) {
    *out = NULL;
    *out_n = n;
    char *cur = NULL;
    for (int i = 0; i < t->n_norms && n > 0; i++) {
        const unsigned char *src = cur ? (unsigned char *)cur : (const unsigned char *)s;
        /* Fast paths: ASCII is invariant under every normal form; every code point
         * below U+0300 is NFC_Quick_Check=Yes and none combines with what precedes it
         * (UTF-8 lead bytes >= 0xCC start U+0300 and up). */
        unsigned char lim = t->norms[i] == NORM_NFC ? 0xCC : 0x80;
        size_t j = 0;
        while (j < n && src[j] < lim) j++;
        if (j == n) continue;
        utf8proc_option_t opt = UTF8PROC_STABLE;
        switch (t->norms[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map(src, (utf8proc_ssize_t)n, &dst, opt);
        if (r < 0) {
            free(cur);
            return df_fail(err, r == UTF8PROC_ERROR_NOMEM ? DF_ERR_NOMEM : DF_ERR_ARG,
                           "%s: normalizer: %s", t->path, utf8proc_errmsg(r));
        }
        free(cur);
        cur = (char *)dst;
        n = (size_t)r;
    }
    *out = cur;
    *out_n = n;
    return DF_OK;
}

typedef int (*seg_fn)(enc_ctx *c, const char *p, size_t n);

/* Cuts added tokens out of p (leftmost-longest) and hands the rest to fn. A
 * special token is cut only where plain spans allow it (see enc_ctx); where they
 * do not, the longest other token that matches there is taken, or none. */
static int split_added(enc_ctx *c, const trie *tr, const char *p, size_t n, seg_fn fn) {
    if (tr->n == 0) return fn(c, p, n);
    const unsigned char *u = (const unsigned char *)p;
    /* p lies in the input (not normalized, or unchanged by it) */
    bool raw = tr == &c->t->tr_raw || c->norm_in_text;
    size_t cur = 0, i = 0;
    while (i < n) {
        if (!tr->first[u[i]]) {
            i++;
            continue;
        }
        size_t mlen = 0;
        size_t room = raw ? special_room(c, (size_t)(p - c->text) + i)
                          : c->norm_special ? SIZE_MAX : 0;
        int32_t tok = trie_longest(tr, c->t->added, c->all_plain, u + i, n - i, room, &mlen);
        if (tok < 0) {
            i++;
            continue;
        }
        const added_tok *a = &c->t->added[tok];
        size_t s = i, e = i + mlen, w;
        if (a->lstrip)
            while (s > cur && (w = ws_back(u + cur, s - cur))) s -= w;
        if (a->rstrip)
            while (e < n && (w = ws_fwd(u + e, n - e))) e += w;
        if (s > cur) {
            int rc = fn(c, p + cur, s - cur);
            if (rc) return rc;
        }
        emit(c, a->id);
        cur = i = e;
    }
    return cur < n ? fn(c, p + cur, n - cur) : DF_OK;
}

static int seg_pretok(enc_ctx *c, const char *p, size_t n) { return pretok(c, p, n, 0); }

static int seg_valid(enc_ctx *c, const char *p, size_t n) {
    /* Normalizing moves offsets, so a piece that touches a plain span matches no
     * normalized special token anywhere (tokenizers mark them normalized: false). */
    c->norm_special = !overlaps_plain(c, (size_t)(p - c->text), n);
    char *nrm;
    size_t nn;
    int rc = df_tok_normalize(c->t, p, n, &nrm, &nn, c->err);
    if (rc) return rc;
    /* Unchanged text keeps its offsets, so spans can be honoured token by token.
     * Only for DF_TOK_PLAIN_ALL, whose templates' role markers may be normalized
     * added tokens (DeepSeek-V3); the default keeps its whole-piece rule. */
    c->norm_in_text = nrm == NULL && c->all_plain;
    rc = split_added(c, &c->t->tr_norm, nrm ? nrm : p, nn, seg_pretok);
    c->norm_in_text = false;
    free(nrm);
    return rc;
}

static int seg_raw(enc_ctx *c, const char *p, size_t n) {
    const unsigned char *u = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        size_t v = utf8_valid_prefix(u + i, n - i);
        if (v) {
            int rc = seg_valid(c, p + i, v);
            if (rc) return rc;
            i += v;
        }
        size_t j = i;
        while (j < n && !utf8_char(u + j, n - j)) j++;
        if (j > i) {
            int rc = bpe_word(c, u + i, j - i);
            if (rc) return rc;
            i = j;
        }
    }
    return DF_OK;
}

/* Plain spans must be sorted, apart and inside the text; the non-empty ones are
 * copied to *out (malloc'ed, NULL when there are none). */
static int check_spans(const df_text_span *sp, size_t n_sp, size_t len, df_text_span **out,
                       size_t *n_out, df_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!sp && n_sp)
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_encode_spans: plain: NULL with %zu spans",
                       n_sp);
    size_t end = 0;
    for (size_t i = 0; i < n_sp; i++) {
        if (sp[i].off < end || sp[i].off > len || sp[i].len > len - sp[i].off) {
            free(*out);
            *out = NULL;
            *n_out = 0;
            return df_fail(err, DF_ERR_ARG,
                           "df_tokenizer_encode_spans: plain[%zu] (offset %zu, %zu bytes) is %s",
                           i, sp[i].off, sp[i].len,
                           sp[i].off < end ? "out of order or overlaps the one before"
                                           : "not inside the text");
        }
        end = sp[i].off + sp[i].len;
        if (sp[i].len == 0) continue;
        if (!*out) *out = df_xmalloc(n_sp * sizeof **out);
        (*out)[(*n_out)++] = sp[i];
    }
    return DF_OK;
}

int df_tokenizer_encode(const df_tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *n, df_error *err) {
    return df_tokenizer_encode_plain(t, text, len, NULL, 0, 0, ids, n, err);
}

int df_tokenizer_encode_spans(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, int32_t **ids,
                              size_t *n, df_error *err) {
    return df_tokenizer_encode_plain(t, text, len, plain, n_plain, 0, ids, n, err);
}

/* tiktoken's Python wrappers (Llama 3's and Kimi's tokenizer classes) cut the
 * text into slices and runs before tiktoken sees it, specials included: a token
 * never spans a cut. */
static int encode_tiktoken(enc_ctx *c, const char *text, size_t len) {
    size_t off = 0, left = DF_TIKTOKEN_SLICE;
    while (off < len) {
        if (left == 0) left = DF_TIKTOKEN_SLICE;
        size_t chars;
        size_t k = df_tok_tiktoken_cut((const unsigned char *)text + off, len - off, left, &chars);
        left -= chars;
        int rc = split_added(c, &c->t->tr_raw, text + off, k, seg_raw);
        if (rc) return rc;
        off += k;
    }
    return DF_OK;
}

int df_tokenizer_encode_plain(const df_tokenizer *t, const char *text, size_t len,
                              const df_text_span *plain, size_t n_plain, unsigned flags,
                              int32_t **ids, size_t *n, df_error *err) {
    if (!t || !ids || !n || (!text && len))
        return df_fail(err, DF_ERR_ARG, "df_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    enc_ctx c = {.t = t, .err = err, .text = text, .all_plain = flags & DF_TOK_PLAIN_ALL};
    df_text_span *sp;
    int rc = check_spans(plain, n_plain, len, &sp, &c.n_plain, err);
    if (rc) return rc;
    c.plain = sp;
    if (len) {
        c.md = pcre2_match_data_create(1, NULL);
        c.mctx = pcre2_match_context_create(NULL);
        c.js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!c.md || !c.mctx) {
            rc = df_fail(err, DF_ERR_NOMEM, "%s: out of memory for regex matching", t->path);
            goto out;
        }
        if (c.js) pcre2_jit_stack_assign(c.mctx, NULL, c.js);
        rc = t->tiktoken ? encode_tiktoken(&c, text, len)
                         : split_added(&c, &t->tr_raw, text, len, seg_raw);
    }
out:
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.js);
    free(c.sym);
    free(c.nxt);
    free(c.prv);
    free(c.heap);
    free(sp);
    if (rc) {
        free(c.ids);
        return rc;
    }
    *ids = c.ids ? c.ids : df_xmalloc(sizeof(int32_t));
    *n = c.n;
    return DF_OK;
}
