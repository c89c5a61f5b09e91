/*
 * engine/residency.c - the weights that stay in RAM, mapped in before the first token:
 * prefaulting (routed experts only when they do not stream) and 2 MiB
 * mappings for resident weights (why: docs/architecture.md, "Residency").
 * Tensors the forward pass never reads (MTP layers, a wrapper's vision
 * tower, rotary buffers) are never touched: DeepSeek-V3's MTP layer alone is
 * 11.6 GB, which would otherwise sit in the RSS and, under a budget, take the
 * expert cache's place.
 */
#include "engine/internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>


static bool is_expert_tensor(const df_model *m, const df_tensor *t) {
    return m->is_expert[df_st_index(m->st, t)];
}

/* Read by the forward pass: a routed expert's part or a tensor the family loaded. */
static bool is_read(const df_model *m, const df_tensor *t) {
    size_t i = df_st_index(m->st, t);
    return m->is_expert[i] || m->used[i];
}

/* The page-aligned range [*a, *a + *len) covering tensor t. */
static void tensor_pages(const df_tensor *t, long pg, uintptr_t *a, size_t *len) {
    *a = (uintptr_t)t->data & ~(uintptr_t)(pg - 1);
    *len = (size_t)((uintptr_t)t->data + t->nbytes - *a);
}

/* Maps the pages of the weights in now (page tables included), so that the
 * first forward pass does not pay a page fault per 4 KiB, and so that an RSS
 * measured next includes them. Routed experts are skipped when they stream,
 * and so are the tensors of files f with done[f] (already mapped in; done may
 * be NULL). */
void df_engine_prefault(const df_model *m, bool experts_too, const bool *done) {
    long pg = sysconf(_SC_PAGESIZE);
    /* Streaming: the expert bytes are read into the cache, never through this
     * mapping, but a 2 MiB folio of the page cache (a freshly written file is
     * held in those) that holds a small always-active tensor would be mapped
     * whole by one PMD when that tensor is touched, charging the experts'
     * bytes next to it to our RSS (test_budget.sh's 160 MiB arm was refused:
     * 170.7 MiB fixed). No huge mappings over expert tensors, nor over the
     * tensors never read (an MTP layer among the main ones: 2 MiB of it was
     * charged to the RSS in test_budget.sh). */
    for (size_t i = 0; !experts_too && i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (!t->nbytes || (is_read(m, t) && !is_expert_tensor(m, t))) continue;
        uintptr_t a;
        size_t len;
        tensor_pages(t, pg, &a, &len);
        df_advise_no_huge((void *)a, len);
    }
    for (size_t i = 0; i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (!t->nbytes || !is_read(m, t) || (!experts_too && is_expert_tensor(m, t)) ||
            (done && done[t->file]) || df_model_ram_copy(m, t))
            continue;
        df_prefault_read(t->data, t->nbytes);
    }
}

/* ---- 2 MiB mappings for resident weights ---------------------------------------- */

/* Resident weights want 2 MiB mappings (TLB misses cost about a third of the
 * read rate; docs/architecture.md, "Residency"): ask for huge pages, and where
 * a file is nonetheless mostly mapped by small pages, drop our mapping and its
 * page cache and read it back as 2 MiB folios, after a probe on one chunk
 * shows this kernel and file system can do it at all. */

typedef struct span { uintptr_t lo, hi; } span;

/* Page-aligned range covering the tensors of file f that the forward pass
 * reads ({0, 0} if none: a shard of MTP layers is left alone). */
static span file_span(const df_model *m, int f) {
    long pg = sysconf(_SC_PAGESIZE);
    span r = {UINTPTR_MAX, 0};
    for (size_t i = 0; i < df_st_count(m->st); i++) {
        const df_tensor *t = df_st_at(m->st, i);
        if (t->file != f || !t->nbytes || !is_read(m, t)) continue;
        uintptr_t a = (uintptr_t)t->data, b = a + t->nbytes;
        if (a < r.lo) r.lo = a;
        if (b > r.hi) r.hi = b;
    }
    if (r.hi == 0) return (span){0, 0};
    r.lo &= ~(uintptr_t)(pg - 1);
    r.hi = (r.hi + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    return r;
}

/* What smaps says of the mapping that contains span s: Rss and FilePmdMapped
 * (bytes), and the file offset of s.lo. False when it cannot tell (no /proc,
 * or a kernel without FilePmdMapped). */
typedef struct pmd_info { uint64_t rss, pmd, off; } pmd_info;

static bool span_pmd(span s, pmd_info *o) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512], perms[8];
    bool in = false, seen = false;
    memset(o, 0, sizeof *o);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        unsigned long long kb;
        if (sscanf(line, "%lx-%lx %7s %lx", &lo, &hi, perms, &off) == 4) {
            in = lo <= s.lo && s.hi <= hi;
            if (in) o->off = s.lo - lo + off;
            continue;
        }
        if (!in) continue;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) o->rss = kb << 10;
        else if (sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1) o->pmd = kb << 10, seen = true;
    }
    fclose(f);
    return seen;
}

#define HUGE_SZ ((uintptr_t)2 << 20)

/* Drops our mapping of [lo, hi) and the file's page cache there (pages that
 * another process maps stay), so the next touch reads it back in. */
static void drop_range(const df_model *m, int f, span s, uint64_t off, uintptr_t lo, uintptr_t hi) {
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* our page tables only */
    posix_fadvise(df_st_file_fd(m->st, f), (off_t)(off + (lo - s.lo)), (off_t)(hi - lo),
                  POSIX_FADV_DONTNEED);
}

/* Maps span s in, its whole 2 MiB chunks [c, ce) first. From s.lo up, the
 * readahead around the span's first pages (whose chunk the header read left in
 * small folios) went on into the next chunk in small folios too; that chunk
 * then never mapped by a PMD, so on a file of a few chunks (models/demo-moe)
 * the check below failed at every start and the whole file was dropped and
 * read back from storage each time. */
static bool populate_span(span s, uintptr_t c, uintptr_t ce) {
    bool ok = df_populate_read((void *)c, ce - c);
    ok &= df_populate_read((void *)s.lo, c - s.lo);
    ok &= df_populate_read((void *)ce, s.hi - ce);
    return ok;
}

/* Read back and still mostly in 4 KiB pages: the kernel found few free 2 MiB
 * blocks (a page cache full of other files). Decode then reads these weights
 * at about two thirds of the rate, or less (docs/benchmarks.md): say so once,
 * for files large enough to matter. */
static void warn_small_pages(const df_model *m, int f, span s, uintptr_t c, uintptr_t ce) {
    static bool warned;
    pmd_info r;
    if (warned || ce - c < ((uintptr_t)256 << 20) || !span_pmd(s, &r) || r.pmd >= (ce - c) / 2) return;
    warned = true;
    fprintf(stderr, "deltafin: warning: %s: only %.0f%% of the weights are mapped by 2 MiB pages (the "
            "kernel found few free 2 MiB blocks), which slows decode; freeing memory first (e.g. dropping "
            "the page cache) helps\n", df_st_file_path(m->st, f), 100.0 * (double)r.pmd / (double)(ce - c));
}

/* Sets done[f] for the files whose tensors it leaves mapped in: it has to
 * populate a file to see how the page cache maps it, and the prefault that
 * follows need not walk those pages again. It does not for a file too small
 * for a 2 MiB chunk, or one whose populate failed (an older kernel: the
 * prefault touches its pages, and no judging how it is mapped). A file is
 * "mostly" PMD-mapped when 90% of its whole chunks are: the partial ones at
 * either end never can be. */
static void huge_weights(const df_model *m, bool *done) {
    for (int f = 0; f < df_st_file_count(m->st); f++) {
        done[f] = false;
        span s = file_span(m, f);
        uintptr_t c = (s.lo + HUGE_SZ - 1) & ~(HUGE_SZ - 1); /* first whole 2 MiB chunk */
        uintptr_t ce = s.hi & ~(HUGE_SZ - 1);                /* end of the last one */
        if (s.hi <= s.lo || c + HUGE_SZ > s.hi) continue;
        df_advise_huge((void *)s.lo, s.hi - s.lo);
        done[f] = populate_span(s, c, ce);
        pmd_info a, b;
        if (!done[f] || !span_pmd(s, &a) || a.pmd >= (ce - c) / 10 * 9) continue;
        /* Probe one chunk: re-read as a huge page, is it mapped by a PMD now?
         * (Not without file THP in this kernel and file system: then the file
         * is left as it is, at the price of one 2 MiB read.) */
        drop_range(m, f, s, a.off, c, c + HUGE_SZ);
        done[f] = done[f] && df_populate_read((void *)c, HUGE_SZ);
        if (!span_pmd(s, &b) || b.pmd < a.pmd + HUGE_SZ) continue;
        drop_range(m, f, s, a.off, s.lo, s.hi);
        done[f] = populate_span(s, c, ce); /* read back, as huge folios now */
        warn_small_pages(m, f, s, c, ce);
    }
}


void df_engine_resident_weights(df_model *m, df_pool *pool) {
    bool *done = df_xcalloc((size_t)df_st_file_count(m->st) + 1, sizeof(bool));
    huge_weights(m, done);
    df_engine_prefault(m, true, done);
    free(done);
    df_model_fp8_maps(m, pool); /* once: a budget's plan may have made them */
    df_expert_fp8_maps(&m->experts, pool);
}
