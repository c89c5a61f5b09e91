/*
 * pool.c - the thread pool behind df_pool_for: persistent workers, the caller is
 * thread 0, work is split into contiguous `align`-ed ranges, one per thread.
 *
 * The engine calls df_pool_for thousands of times per token, so dispatch must
 * cost about a microsecond, not a futex round trip: a job is published by bumping
 * a generation counter that idle workers spin on for a while (PAUSE loop) before
 * they fall asleep on a futex; the caller likewise spins for completion before
 * sleeping. The sleep paths use the classic "announce, re-check, wait" handshake
 * with sequentially consistent atomics so that no wake-up is lost.
 *
 * Calls from several outside threads are serialised by a mutex; a df_pool_for
 * made from inside a running job (nesting) runs inline on the calling thread.
 */
#include "kernels/kernels.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* How long an idle thread keeps spinning before it sleeps. Long enough to
 * bridge the serial gaps between matmuls of one token, short enough that an
 * idle engine stops burning CPU almost at once. */
#define SPIN_NS_WORKER 200000L
#define SPIN_NS_CALLER 2000000L

struct worker {
    struct df_pool *pool;
    int index;
};

struct df_pool {
    int n;              /* threads including the caller */
    int n_started;      /* workers actually running (n - 1 unless creation failed) */
    pthread_t *threads;
    struct worker *workers;
    pthread_mutex_t call_mu;

    /* job description: written by the caller before `gen` is released */
    void (*fn)(void *ctx, int begin, int end);
    void *ctx;
    int total, align;

    _Alignas(64) _Atomic uint32_t gen;     /* futex word, bumped per job */
    _Atomic int sleepers;                   /* workers asleep (or about to be) on gen */
    _Atomic int stop;
    _Alignas(64) _Atomic uint32_t done;    /* futex word: workers finished this job */
    _Atomic int caller_sleeping;
};

static _Thread_local const struct df_pool *tl_running;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

#ifdef __linux__
static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
/* Without futexes the sleep degrades to short naps; correctness is unchanged
 * because every wait re-checks its condition. */
static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    (void)addr, (void)val;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}
static void futex_wake(_Atomic uint32_t *addr) { (void)addr; }
#endif

/* Range of thread i: whole `align` chunks, the first (chunks % n) threads get
 * one more, so ranges are contiguous, ordered and cover [0, total). */
static void range_of(int total, int align, int n, int i, int *b, int *e) {
    long chunks = ((long)total + align - 1) / align;
    long base = chunks / n, rem = chunks % n;
    long c0 = i * base + (i < rem ? i : rem);
    long c1 = c0 + base + (i < rem ? 1 : 0);
    long lo = c0 * align, hi = c1 * align;
    *b = (int)(lo < total ? lo : total);
    *e = (int)(hi < total ? hi : total);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct df_pool *p = w->pool;
    tl_running = p;
    uint32_t seen = atomic_load_explicit(&p->gen, memory_order_acquire);
    for (;;) {
        uint32_t g;
        long t0 = 0;
        for (unsigned spin = 0;; spin++) {
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen) break;
            if ((spin & 255) == 255) {
                long t = now_ns();
                if (!t0) {
                    t0 = t;
                } else if (t - t0 > SPIN_NS_WORKER) {
                    atomic_fetch_add(&p->sleepers, 1);
                    g = atomic_load(&p->gen);
                    if (g == seen) futex_wait(&p->gen, seen);
                    atomic_fetch_sub(&p->sleepers, 1);
                    t0 = 0;
                    continue;
                }
            }
            cpu_relax();
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        int b, e;
        range_of(p->total, p->align, p->n, w->index, &b, &e);
        if (b < e) p->fn(p->ctx, b, e);
        atomic_fetch_add(&p->done, 1);
        if (atomic_load(&p->caller_sleeping)) futex_wake(&p->done);
    }
    return NULL;
}

df_pool *df_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 1024) n_threads = 1024;
    struct df_pool *p = df_xcalloc(1, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->call_mu, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->caller_sleeping, 0);
    if (n_threads > 1) {
        p->threads = df_xcalloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = df_xcalloc((size_t)n_threads - 1, sizeof *p->workers);
        for (int i = 1; i < n_threads; i++) {
            p->workers[i - 1] = (struct worker){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1]) != 0)
                break;
            p->n_started++;
        }
        /* Fewer threads than asked (resource limits) still works, just slower. */
        p->n = p->n_started + 1;
    }
    return p;
}

void df_pool_free(df_pool *p) {
    if (!p) return;
    if (p->n_started) {
        pthread_mutex_lock(&p->call_mu);
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        atomic_fetch_add(&p->gen, 1);
        futex_wake(&p->gen);
        pthread_mutex_unlock(&p->call_mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_mutex_destroy(&p->call_mu);
    free(p->threads);
    free(p->workers);
    free(p);
}

int df_pool_size(const df_pool *p) { return p ? p->n : 1; }

void df_pool_for(df_pool *p, int n, int align, void (*fn)(void *ctx, int begin, int end),
                 void *ctx) {
    if (n <= 0) return;
    if (align < 1) align = 1;
    /* Serial cases: no workers, a nested call, or everything fits in thread 0's
     * first chunk (then waking workers only costs time). */
    if (!p || p->n == 1 || tl_running || n <= align) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->call_mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->align = align;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the job, orders vs sleepers */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen);

    int b, e;
    range_of(n, align, p->n, 0, &b, &e);
    tl_running = p;
    if (b < e) fn(ctx, b, e);
    tl_running = NULL;

    uint32_t want = (uint32_t)(p->n - 1);
    long t0 = 0;
    for (unsigned spin = 0;; spin++) {
        uint32_t d = atomic_load_explicit(&p->done, memory_order_acquire);
        if (d == want) break;
        if ((spin & 255) == 255) {
            long t = now_ns();
            if (!t0) {
                t0 = t;
            } else if (t - t0 > SPIN_NS_CALLER) {
                atomic_store(&p->caller_sleeping, 1);
                d = atomic_load(&p->done);
                if (d != want) futex_wait(&p->done, d);
                atomic_store(&p->caller_sleeping, 0);
                continue;
            }
        }
        cpu_relax();
    }
    pthread_mutex_unlock(&p->call_mu);
}
