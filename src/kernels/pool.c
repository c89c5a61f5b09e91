/*
 * pool.c - the thread pool behind df_pool_for: persistent workers, the caller is
 * thread 0, work is split into contiguous `align`-ed ranges, several per thread.
 *
 * The engine calls df_pool_for thousands of times per token, so dispatch must
 * cost about a microsecond, not a futex round trip: a job is published by bumping
 * a generation counter that idle workers spin on for a while before they fall
 * asleep on a futex; the caller likewise spins for completion before sleeping.
 * The sleep paths use the "announce, re-check, wait" handshake with sequentially
 * consistent atomics, so no wake-up is lost.
 *
 * The ranges ("slots", up to SLOTS_PER_THREAD per thread) are claimed, not
 * assigned: whoever comes first takes the next unclaimed slot, the caller
 * included. Several per thread balance cores that run at different speeds (a
 * laptop's performance and efficiency cores, a VM's vCPU sharing its core): a
 * fast core takes more slots instead of waiting for a slow one. Which thread
 * runs a range never changes its result, so the split is free to vary. When a
 * worker is not running at that moment (descheduled on a busy machine, or
 * still waking from its futex), the caller runs that worker's ranges itself
 * instead of waiting a scheduler time slice for it. A claim is a CAS on a
 * (generation, slot count, next slot) word, so a worker that wakes late for an
 * old job can never claim its slots, nor one of this job by another job's
 * count; the job fields are atomics so such a late reader is not a data race
 * either.
 *
 * Calls from several outside threads are serialised by a mutex; a df_pool_for
 * made from inside a running job (nesting) runs inline on the calling thread.
 */
#include "kernels/kernels.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* How long an idle thread keeps spinning before it sleeps: long enough to
 * bridge the serial gaps between the matmuls of a token, short enough that an
 * idle engine stops burning CPU almost at once. After the first SPIN_NS_PURE
 * the spinner also calls sched_yield, so that on an oversubscribed machine the
 * thread it waits for can run on its core. */
#define SPIN_NS_PURE 20000L
#define SPIN_NS_WORKER 200000L
#define SPIN_NS_CALLER 1000000L

/* Slots per thread and job (by default): with 4, two threads wait for each
 * other at most an eighth of a job, and the claims (one CAS each) stay far
 * below the work. */
#define SLOTS_PER_THREAD 4

typedef void (*task_fn)(void *ctx, int begin, int end);

struct worker {
    struct df_pool *pool;
    int index;
};

struct df_pool {
    int n;         /* threads including the caller */
    int per_thread; /* slots per thread and job, at most */
    int n_started; /* workers running */
    pthread_t *threads;
    struct worker *workers;
    pthread_mutex_t call_mu;
    uint32_t next_gen; /* caller side only, under call_mu */

    /* job description, written before `state` is released */
    _Atomic(task_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int total, align;

    /* gen << 32 | slots << 16 | slots claimed: the slot count travels with the
     * claims, so a claim made with another job's count cannot succeed */
    _Alignas(64) _Atomic uint64_t state;
    _Alignas(64) _Atomic uint32_t gen;   /* futex word for sleeping workers */
    _Atomic int sleepers;
    _Atomic int stop;
    _Alignas(64) _Atomic uint32_t done;  /* futex word: slots finished */
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
/* Without futexes the sleep degrades to short naps; every wait re-checks its
 * condition, so correctness is unchanged. */
static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    (void)addr, (void)val;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}
static void futex_wake(_Atomic uint32_t *addr) { (void)addr; }
#endif

/* Spin-then-sleep until *word != val. `sleepers`/`flag`: the counter or flag
 * the waking side checks before its futex_wake. */
static void wait_change(_Atomic uint32_t *word, uint32_t val, _Atomic int *sleepers,
                        long spin_ns) {
    long t0 = 0;
    for (unsigned spin = 1;; spin++) {
        if (atomic_load_explicit(word, memory_order_acquire) != val) return;
        if ((spin & 127) == 0) {
            long t = now_ns();
            if (!t0) {
                t0 = t;
            } else if (t - t0 > spin_ns) {
                atomic_fetch_add(sleepers, 1);
                if (atomic_load(word) == val) futex_wait(word, val);
                atomic_fetch_sub(sleepers, 1);
                t0 = 0;
                continue;
            } else if (t - t0 > SPIN_NS_PURE) {
                sched_yield();
                continue;
            }
        }
        cpu_relax();
    }
}

/* Range of slot i: whole `align` chunks, the first (chunks % n) slots get one
 * more, so the ranges are contiguous, ordered and cover [0, total). */
static void range_of(int total, int align, int n, int i, int *b, int *e) {
    long chunks = ((long)total + align - 1) / align;
    long base = chunks / n, rem = chunks % n;
    long c0 = i * base + (i < rem ? i : rem);
    long c1 = c0 + base + (i < rem ? 1 : 0);
    long lo = c0 * align, hi = c1 * align;
    *b = (int)(lo < total ? lo : total);
    *e = (int)(hi < total ? hi : total);
}

/* Claims and runs slots of job `g` until none is left; returns slots run. */
static int run_slots(struct df_pool *p, uint32_t g) {
    int ran = 0;
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        int slots = (int)(s >> 16 & 0xffff), c = (int)(s & 0xffff);
        if ((uint32_t)(s >> 32) != g || c >= slots) return ran;
        /* read before the claim; a successful claim proves they belong to job g */
        task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        int total = atomic_load_explicit(&p->total, memory_order_relaxed);
        int align = atomic_load_explicit(&p->align, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int b, e;
        range_of(total, align, slots, c, &b, &e);
        if (b < e) fn(ctx, b, e);
        ran++;
        uint32_t d = atomic_fetch_add(&p->done, 1) + 1;
        if (d == (uint32_t)slots && atomic_load(&p->caller_sleeping)) futex_wake(&p->done);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct df_pool *p = w->pool;
    tl_running = p;
    uint32_t seen = 0; /* gen was 0 when the pool was made */
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers, SPIN_NS_WORKER);
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_slots(p, seen);
    }
    return NULL;
}

df_pool *df_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 1024) n_threads = 1024;
    struct df_pool *p = df_xcalloc(1, sizeof *p);
    p->n = n_threads;
    p->per_thread = SLOTS_PER_THREAD;
    pthread_mutex_init(&p->call_mu, NULL);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->total, 0);
    atomic_init(&p->align, 1);
    atomic_init(&p->state, 0);
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
        /* Fewer threads than asked (resource limits) still works. */
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

void df_pool_set_slots(df_pool *p, int per_thread) {
    if (!p) return;
    pthread_mutex_lock(&p->call_mu);
    p->per_thread = per_thread < 1 ? 1 : per_thread > 64 ? 64 : per_thread;
    pthread_mutex_unlock(&p->call_mu);
}

void df_pool_for(df_pool *p, int n, int align, void (*fn)(void *ctx, int begin, int end),
                 void *ctx) {
    if (n <= 0) return;
    if (align < 1) align = 1;
    /* Serial cases: no workers, a nested call, or all of it fits in one chunk. */
    if (!p || p->n == 1 || tl_running || n <= align) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->call_mu);
    uint32_t g = ++p->next_gen;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->total, n, memory_order_relaxed);
    atomic_store_explicit(&p->align, align, memory_order_relaxed);
    long chunks = ((long)n + align - 1) / align, most = (long)p->n * p->per_thread;
    if (most > 0xffff) most = 0xffff;
    int slots = (int)(chunks < most ? chunks : most);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->state, (uint64_t)g << 32 | (uint64_t)slots << 16, memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: orders against `sleepers` below */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen);

    tl_running = p;
    run_slots(p, g);
    tl_running = NULL;

    /* wait for slots that workers claimed and are still running */
    for (;;) {
        uint32_t d = atomic_load_explicit(&p->done, memory_order_acquire);
        if (d == (uint32_t)slots) break;
        wait_change(&p->done, d, &p->caller_sleeping, SPIN_NS_CALLER);
    }
    pthread_mutex_unlock(&p->call_mu);
}
