/*
 * sampler.c - token sampling: the public df_sampler API (deltafin.h).
 *
 * Owns the choice of the next token from a row of logits. The pipeline follows
 * the Hugging Face logits-warper order (which llama.cpp reproduces with its
 * penalties -> temp -> top_k -> top_p -> min_p chain):
 *
 *   1. repetition penalty: every DISTINCT token among the last repeat_last_n
 *      tokens of history (0 = all of it; ids outside [0, vocab) are ignored)
 *      gets logit > 0 ? logit / penalty : logit * penalty. Skipped when the
 *      penalty is 1. Applied in greedy mode too.
 *   2. temperature == 0: greedy argmax, ties -> lowest id, NaN counts as -inf.
 *      Everything below is skipped and the PRNG is not advanced.
 *   3. NaN becomes -inf and +inf becomes FLT_MAX (written back into logits,
 *      which otherwise leave here only penalized). If every logit is -inf the
 *      answer is id 0, as greedy would say.
 *   4. top-k (0 = off): the k best by (logit desc, id asc), found with a size-k
 *      heap in O(V log k) without sorting the vocabulary. Dividing by T > 0 does
 *      not change that order, so this is top-k of the scaled logits.
 *   5. temperature and softmax over the survivors: w = exp((l - max) / T) in
 *      double, i.e. softmax(l / T) with the max subtracted before the division,
 *      so a tiny T tends to greedy instead of overflowing. total = sum of w in
 *      id order; the max has w == 1 exactly, so p_max = 1 / total.
 *   6. top-p: in sorted order, keep the smallest prefix whose cumulative w is
 *      >= top_p * total (at least one token). top_p == 1 is off.
 *   7. min-p: keep tokens with p >= min_p * p_max, i.e. w >= min_p.
 *   8. renormalize and draw: u is a 53-bit uniform double in [0,1) from
 *      xoshiro256** (state seeded by splitmix64 from params.seed, one u per
 *      sampled token); r = u * W, where W is the kept mass (total when nothing
 *      was cut, else the sorted-order prefix sum), and the answer is the first
 *      kept token, in sorted order, whose cumulative w exceeds r.
 *
 * "Sorted order" is w desc, then logit desc (distinct logits whose exp
 * rounds to the same double keep their order, so top_k = 1 and a tiny top_p
 * agree with greedy exactly), then id asc. It is a total order, so any correct
 * sort gives the same sequence, and a seed reproduces on any machine whose libm
 * exp() returns the same doubles. exp() is not correctly rounded, so another
 * libm (or CPU-specific path) may differ by an ulp; that changes a draw only
 * when r falls within an ulp of a boundary.
 *
 * Speed at vocab 152k (2-core dev box, -O2): ~0.3 ms with top_k set, 1-4 ms
 * when the whole vocabulary takes part, ~0.2 ms greedy. Only a head of the sorted order is materialized - the
 * candidates with w >= t, where t is chosen so that the nucleus / the min-p set
 * / all but ~1e-4 of the mass lies in the head. The rest (the tail) is sorted
 * only if a scan actually walks past the head, so results are identical to a
 * full sort; t only decides how much work is done. Tokens with w == 0 are left
 * out altogether: they can neither be drawn nor move a cumulative sum. Sorting
 * is a stable LSD radix sort on the bits of w, with a comparison sort only for
 * runs of equal keys, as qsort over 150k items alone would cost tens of ms.
 *
 * If the scratch buffers cannot be allocated, df_sampler_sample falls back to
 * greedy without the penalty (it has no way to report an error). It returns -1
 * only for a NULL sampler/logits or vocab <= 0.
 */
#include "decode/sampler.h"
#include "util/util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

struct df_sampler {
    df_sampler_params p;
    uint64_t rng[4];

    /* scratch, grown to the largest vocab seen */
    int cap;
    double *w;      /* softmax weight per candidate position */
    int32_t *cand;  /* top-k heap / candidate ids */
    uint32_t *seen; /* per-id stamp for the distinct-token penalty */
    uint32_t epoch;
    struct cand_item *items, *items_tmp; /* sorted-order stream, radix buffer */
};

typedef struct cand_item {
    double w;
    float l;
    int32_t id;
} cand_item;

/* ---- PRNG --------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static double uniform01(uint64_t s[4]) {
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ---- params ------------------------------------------------------------- */

void df_sampler_params_default(df_sampler_params *p) {
    if (!p) return;
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

static int check_params(const df_sampler_params *p, df_error *err) {
    /* written so that NaN fails every test */
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return df_fail(err, DF_ERR_ARG,
                       "sampler: temperature must be finite and >= 0 (got %g)",
                       (double)p->temperature);
    if (p->top_k < 0)
        return df_fail(err, DF_ERR_ARG, "sampler: top_k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return df_fail(err, DF_ERR_ARG, "sampler: top_p must be in (0, 1] (got %g)",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return df_fail(err, DF_ERR_ARG, "sampler: min_p must be in [0, 1) (got %g)",
                       (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return df_fail(err, DF_ERR_ARG,
                       "sampler: repeat_penalty must be finite and > 0 (got %g)",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return df_fail(err, DF_ERR_ARG,
                       "sampler: repeat_last_n must be >= 0 (0 = whole history, got %d)",
                       p->repeat_last_n);
    return DF_OK;
}

int df_sampler_new(df_sampler **out, const df_sampler_params *p, df_error *err) {
    if (!out) return df_fail(err, DF_ERR_ARG, "sampler: out is NULL");
    *out = NULL;
    df_sampler_params def;
    if (!p) {
        df_sampler_params_default(&def);
        p = &def;
    }
    int rc = check_params(p, err);
    if (rc) return rc;
    df_sampler *s = calloc(1, sizeof *s);
    if (!s) return df_fail(err, DF_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return DF_OK;
}

void df_sampler_free(df_sampler *s) {
    if (!s) return;
    free(s->w);
    free(s->cand);
    free(s->seen);
    free(s->items);
    free(s->items_tmp);
    free(s);
}

static bool reserve(df_sampler *s, int n) {
    if (n <= s->cap) return true;
    size_t un = (size_t)n;
    double *w = realloc(s->w, un * sizeof *w);
    if (w) s->w = w;
    int32_t *c = realloc(s->cand, un * sizeof *c);
    if (c) s->cand = c;
    cand_item *it = realloc(s->items, un * sizeof *it);
    if (it) s->items = it;
    cand_item *it2 = realloc(s->items_tmp, un * sizeof *it2);
    if (it2) s->items_tmp = it2;
    /* the stamps must start clear; old ones stay valid under the current epoch */
    uint32_t *seen = realloc(s->seen, un * sizeof *seen);
    if (seen) {
        memset(seen + s->cap, 0, (un - (size_t)s->cap) * sizeof *seen);
        s->seen = seen;
    }
    if (!w || !c || !it || !it2 || !seen) return false;
    s->cap = n;
    return true;
}

/* ---- pipeline pieces ---------------------------------------------------- */

static void apply_penalty(df_sampler *s, float *logits, int vocab, const int32_t *history,
                          int n_history) {
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || !history || n_history <= 0) return;
    int start = 0;
    if (s->p.repeat_last_n > 0 && n_history > s->p.repeat_last_n)
        start = n_history - s->p.repeat_last_n;
    if (++s->epoch == 0) { /* wrapped: old stamps could alias the new epoch */
        memset(s->seen, 0, (size_t)s->cap * sizeof *s->seen);
        s->epoch = 1;
    }
    for (int i = start; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= vocab || s->seen[t] == s->epoch) continue;
        s->seen[t] = s->epoch;
        float l = logits[t];
        logits[t] = l > 0.0f ? l / pen : l * pen;
    }
}

static int32_t argmax(const float *logits, int vocab) {
    int32_t best = 0;
    float bl = -INFINITY;
    for (int i = 0; i < vocab; i++) /* strict > : ties keep the lowest id, NaN never wins */
        if (logits[i] > bl) {
            bl = logits[i];
            best = i;
        }
    return best;
}

/* heap order for top-k: a is worse than b (lower logit, or same logit and higher id) */
static inline bool worse(const float *l, int32_t a, int32_t b) {
    return l[a] < l[b] || (l[a] == l[b] && a > b);
}

static void heap_down(int32_t *h, int n, int i, const float *l) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && worse(l, h[c + 1], h[c])) c++;
        if (!worse(l, h[c], h[i])) return;
        int32_t t = h[c];
        h[c] = h[i];
        h[i] = t;
        i = c;
    }
}

/* The k best ids (root = worst of them) in O(V log k). */
static void select_top_k(const float *l, int vocab, int k, int32_t *h) {
    for (int i = 0; i < k; i++) h[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(h, k, i, l);
    for (int i = k; i < vocab; i++) {
        if (worse(l, h[0], i)) {
            h[0] = i;
            heap_down(h, k, 0, l);
        }
    }
}

static int cmp_id(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

static int cmp_item(const void *pa, const void *pb) {
    const cand_item *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* A radix key that orders like w descending: the top 32 bits below the sign of
 * the double (w >= 0, so its bits order like it), complemented. Items whose w
 * share these bits are put in order afterwards. */
static inline uint32_t item_key(const cand_item *it) {
    uint64_t u;
    memcpy(&u, &it->w, sizeof u);
    return ~(uint32_t)(u >> 31);
}

/* Sorts a[0..n) into sorted order. a must arrive in id order: the LSD radix sort
 * is stable, which leaves equal keys in id order, so only runs of equal keys
 * whose w or logits differ need the full comparison. qsort on 150k 16-byte items
 * costs tens of ms; this costs about one. */
static void sort_items(cand_item *a, cand_item *tmp, int n) {
    if (n < 256) {
        qsort(a, (size_t)n, sizeof *a, cmp_item);
        return;
    }
    enum { BITS = 11, NDIG = 3, RADIX = 1 << BITS };
    uint32_t hist[NDIG][RADIX];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < n; i++) {
        uint32_t k = item_key(&a[i]);
        for (int d = 0; d < NDIG; d++) hist[d][(k >> (d * BITS)) & (RADIX - 1)]++;
    }
    cand_item *src = a, *dst = tmp;
    for (int d = 0; d < NDIG; d++) {
        uint32_t *h = hist[d];
        int sh = d * BITS;
        if (h[(item_key(&src[0]) >> sh) & (RADIX - 1)] == (uint32_t)n)
            continue; /* every key has this digit */
        uint32_t sum = 0;
        for (int r = 0; r < RADIX; r++) {
            uint32_t c = h[r];
            h[r] = sum;
            sum += c;
        }
        for (int i = 0; i < n; i++) dst[h[(item_key(&src[i]) >> sh) & (RADIX - 1)]++] = src[i];
        cand_item *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
    for (int i = 0; i < n;) {
        uint32_t k = item_key(&a[i]);
        int j = i + 1;
        bool ordered = true;
        for (; j < n && item_key(&a[j]) == k; j++)
            if (cmp_item(&a[j - 1], &a[j]) > 0) ordered = false;
        if (!ordered) qsort(a + i, (size_t)(j - i), sizeof *a, cmp_item);
        i = j;
    }
}

/* The sorted-order stream over the candidates with w > 0 (zero weights can be
 * neither drawn nor move a cumulative sum, so their order never matters):
 * items[0..n_ready) starts as the sorted head (w >= t); the tail (0 < w < t) is
 * gathered and sorted behind it the first time a scan walks past the head. */
typedef struct stream {
    cand_item *items, *tmp;
    const double *w;
    const float *logits;
    const int32_t *cand; /* NULL: candidate j is id j */
    int n, n_ready;
    double t;
    bool has_tail;
} stream;

static void stream_gather(stream *st, bool head) {
    int k = st->n_ready;
    for (int j = 0; j < st->n; j++) {
        double w = st->w[j];
        if (w > 0.0 && (w >= st->t) == head) {
            int32_t id = st->cand ? st->cand[j] : j;
            st->items[k++] = (cand_item){w, st->logits[id], id};
        }
    }
    sort_items(st->items + st->n_ready, st->tmp, k - st->n_ready);
    st->n_ready = k;
}

static inline const cand_item *stream_at(stream *st, int i) {
    if (i >= st->n_ready && st->has_tail) {
        stream_gather(st, false);
        st->has_tail = false;
    }
    return &st->items[i];
}

/* Steps 5-7 over n candidates in id order (cand == NULL: ids 0..n-1) of sanitized
 * logits, at least one of them finite: leaves the sorted-order stream in *st and
 * says how many of its items are kept (*m) and their total weight (*mass). */
static void keep_set(df_sampler *s, const float *logits, const int32_t *cand, int n, stream *st,
                     int *m_out, double *mass_out) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        float l = logits[cand ? cand[j] : j];
        if (l > mx) mx = l;
    }
    double total = 0.0, temp = s->p.temperature;
    int n_pos = 0;
    for (int j = 0; j < n; j++) {
        double w = exp(((double)logits[cand ? cand[j] : j] - (double)mx) / temp);
        s->w[j] = w;
        total += w;
        n_pos += w > 0.0;
    }

    double top_p = s->p.top_p, min_p = s->p.min_p;
    *st = (stream){s->items, s->items_tmp, s->w, logits, cand, n, 0, 0.0, false};
    if (n > 1024) {
        /* Everything below t together weighs < n * t. Keep that under half of what
         * top-p cuts (so the nucleus lies in the head) and under 1e-4 of the mass
         * (so a draw rarely needs the tail); min-p never keeps anything below it. */
        double frac = top_p < 1.0 ? (1.0 - top_p) * 0.5 : 0.0;
        if (frac < 1e-4) frac = 1e-4;
        st->t = frac * total / n;
        if (min_p > st->t) st->t = min_p;
    }
    stream_gather(st, true);
    st->has_tail = st->n_ready < n_pos;

    /* keep items[0..m) of the sorted order; items[0] is the max, w == 1 */
    int m = n_pos;
    if (top_p < 1.0) {
        double target = top_p * total, cum = 0.0;
        for (int i = 0; i < n_pos; i++) {
            cum += stream_at(st, i)->w;
            if (cum >= target) {
                m = i + 1;
                break;
            }
        }
    }
    if (min_p > 0.0) {
        int i = 1;
        while (i < m) {
            if (i >= st->n_ready && st->t <= min_p) break; /* the tail is all below t */
            if (stream_at(st, i)->w < min_p) break;
            i++;
        }
        m = i;
    }

    double mass = total;
    if (m < n_pos) {
        mass = 0.0;
        for (int i = 0; i < m; i++) mass += st->items[i].w;
    }
    *m_out = m;
    *mass_out = mass;
}

/* Step 8: one draw from the kept set. */
static int32_t sample_candidates(df_sampler *s, const float *logits, const int32_t *cand,
                                 int n, const double *u) {
    stream st;
    int m;
    double mass;
    keep_set(s, logits, cand, n, &st, &m, &mass);
    double r = (u ? *u : uniform01(s->rng)) * mass, cum = 0.0;
    for (int i = 0; i < m; i++) {
        const cand_item *it = stream_at(&st, i);
        cum += it->w;
        if (r < cum) return it->id;
    }
    /* r rounded onto the very end of the mass: the last kept token */
    return st.items[m - 1].id;
}

/* NaN logits become -inf and +inf the largest float, so that every later step
 * is defined; returns the largest logit. */
static float sanitize(float *logits, int vocab) {
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float l = logits[i];
        if (isnan(l)) logits[i] = l = -INFINITY;
        else if (l > FLT_MAX) logits[i] = l = FLT_MAX;
        if (l > mx) mx = l;
    }
    return mx;
}

/* df_sampler_sample, drawing with *u instead of the next uniform when u is set. */
static int32_t sample_u(df_sampler *s, float *logits, int vocab, const int32_t *history,
                        int n_history, const double *u) {
    if (!s || !logits || vocab <= 0) return -1;
    bool penalize = s->p.repeat_penalty != 1.0f && history && n_history > 0;
    if (s->p.temperature == 0.0f && !penalize) return argmax(logits, vocab);
    if (!reserve(s, vocab)) return argmax(logits, vocab);
    apply_penalty(s, logits, vocab, history, n_history);
    if (s->p.temperature == 0.0f) return argmax(logits, vocab);

    float mx = sanitize(logits, vocab);
    if (mx == -INFINITY) return 0;

    if (s->p.top_k > 0 && s->p.top_k < vocab) {
        select_top_k(logits, vocab, s->p.top_k, s->cand);
        /* id order, so that sums do not depend on how the heap happened to lie */
        qsort(s->cand, (size_t)s->p.top_k, sizeof *s->cand, cmp_id);
        return sample_candidates(s, logits, s->cand, s->p.top_k, u);
    }
    return sample_candidates(s, logits, NULL, vocab, u);
}

int df_logits_check(const float *logits, int vocab, int n_tokens, df_error *err) {
    for (int i = 0; i < vocab; i++)
        if (isfinite(logits[i])) return DF_OK;
    return df_fail(err, DF_ERR_FORMAT, "the model's logits after %d tokens are all NaN or infinite: the "
                   "checkpoint holds NaN or Inf in a weight, a norm or a scale (deltafin logits writes them)",
                   n_tokens);
}

int32_t df_sampler_sample(df_sampler *s, float *logits, int vocab, const int32_t *history,
                          int n_history) {
    return sample_u(s, logits, vocab, history, n_history, NULL);
}

int32_t df_sampler_sample_at(df_sampler *s, float *logits, int vocab, const int32_t *history,
                             int n_history, int ahead) {
    if (!s || s->p.temperature == 0.0f) return sample_u(s, logits, vocab, history, n_history, NULL);
    uint64_t st[4];
    memcpy(st, s->rng, sizeof st);
    double u = 0.0;
    for (int i = 0; i <= ahead; i++) u = uniform01(st);
    return sample_u(s, logits, vocab, history, n_history, &u);
}


/* Steps 1-7 as df_sampler_sample takes them (same code), ending in the
 * probability of every id instead of a draw: what speculative verification
 * needs to accept or reject a drafted token without changing the distribution. */
int df_sampler_probs(df_sampler *s, float *logits, int vocab, const int32_t *history,
                     int n_history, float *probs) {
    if (!s || !logits || !probs || vocab <= 0) return -1;
    memset(probs, 0, (size_t)vocab * sizeof *probs);
    if (!reserve(s, vocab)) return -1;
    apply_penalty(s, logits, vocab, history, n_history);
    if (s->p.temperature == 0.0f) {
        probs[argmax(logits, vocab)] = 1.0f;
        return 0;
    }
    float mx = sanitize(logits, vocab);
    if (mx == -INFINITY) {
        probs[0] = 1.0f;
        return 0;
    }
    const int32_t *cand = NULL;
    int n = vocab;
    if (s->p.top_k > 0 && s->p.top_k < vocab) {
        select_top_k(logits, vocab, s->p.top_k, s->cand);
        qsort(s->cand, (size_t)s->p.top_k, sizeof *s->cand, cmp_id);
        cand = s->cand;
        n = s->p.top_k;
    }
    stream st;
    int m;
    double mass;
    keep_set(s, logits, cand, n, &st, &m, &mass);
    for (int i = 0; i < m; i++) {
        const cand_item *it = stream_at(&st, i);
        probs[it->id] = (float)(it->w / mass);
    }
    return 0;
}

double df_sampler_uniform(df_sampler *s) { return uniform01(s->rng); }

bool df_sampler_is_greedy(const df_sampler *s) { return s->p.temperature == 0.0f; }
