/*
 * memhog.c - simulates a smaller machine for the benchmark suite: locks (mlock)
 * all of the memory the system has available except LEAVE bytes, so that the
 * engine under test, its page cache included, gets at most about LEAVE bytes.
 * The suite holds it for a whole section and moves LEAVE between arms, because
 * locking is slow on a VM (22 GB took 66 s, mostly the hypervisor's page
 * faults) while moving the line by a few hundred MiB takes a second.
 *
 *   memhog --leave BYTES [--max BYTES] [--reserve BYTES] [--ready FILE] [--control]
 *
 * With --control it reads one LEAVE (bytes, or 512M / 2G) per line from stdin,
 * locks more or unmaps chunks to meet it, reports, and exits at end of input;
 * without, it holds until SIGTERM/SIGINT.
 *
 * Safety: it never locks more than --max (default: all but LEAVE), leaves
 * --reserve (default 256 MiB) beyond LEAVE for the rest of the system, and locks
 * in 64 MiB steps re-reading MemAvailable, so a system that is busier than when
 * it started is not pushed into the OOM killer. After each change it prints (and
 * writes to the --ready file, whole) "N S": bytes locked, and bytes short of the
 * goal (what is still available beyond LEAVE and the reserve; large when --max
 * stopped it).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STEP ((uint64_t)64 << 20)

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

/* a size such as 512M or 2G; returns false on anything else */
static bool parse_size(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    while (*end == '\n' || *end == '\r' || *end == ' ') end++;
    if (errno || end == v || *end || x < 0) return false;
    *out = (uint64_t)(x * (double)mul);
    return true;
}

static uint64_t parse_bytes(const char *flag, const char *v) {
    uint64_t b;
    if (!parse_size(v, &b)) {
        fprintf(stderr, "memhog: %s expects a size such as 512M or 2G, got '%s'\n", flag, v);
        exit(2);
    }
    return b;
}

/* The locked chunks, newest last: shrinking unmaps from the end. */
static void **chunk;
static size_t n_chunks, cap_chunks;

/* Locks or releases 64 MiB chunks until about `leave` + `reserve` stays
 * available. Returns false when mlock is refused before anything is held. */
static bool adjust(uint64_t leave, uint64_t reserve, uint64_t max) {
    while (n_chunks && mem_available() < leave + reserve) {
        void *p = chunk[--n_chunks];
        munmap(p, STEP);
    }
    while (!stop && (uint64_t)(n_chunks + 1) * STEP <= max && mem_available() > leave + reserve + STEP) {
        if (n_chunks == cap_chunks) {
            size_t cap = cap_chunks ? 2 * cap_chunks : 256;
            void **c = realloc(chunk, cap * sizeof *c);
            if (!c) break;
            chunk = c, cap_chunks = cap;
        }
        void *p = mmap(NULL, STEP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) break;
        if (mlock(p, STEP) != 0) {
            fprintf(stderr, "memhog: mlock: %s (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK)\n",
                    strerror(errno));
            munmap(p, STEP);
            if (!n_chunks) return false;
            break;
        }
        chunk[n_chunks++] = p;
    }
    return true;
}

static void report(const char *ready, uint64_t leave, uint64_t reserve) {
    uint64_t avail = mem_available(), goal = leave + reserve + STEP;
    unsigned long long locked = (unsigned long long)n_chunks * STEP;
    unsigned long long short_by = avail > goal ? (unsigned long long)(avail - goal) : 0;
    printf("%llu %llu\n", locked, short_by);
    fflush(stdout);
    if (ready) {
        /* written whole, then renamed, so a reader never sees half of it */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", ready);
        FILE *f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "%llu %llu\n", locked, short_by);
            if (fclose(f) == 0) rename(tmp, ready);
        }
    }
}

static void usage(void) {
    fprintf(stderr, "usage: memhog --leave BYTES [--max BYTES] [--reserve BYTES] [--ready FILE] [--control]\n");
    exit(2);
}

int main(int argc, char **argv) {
    uint64_t leave = 0, max = UINT64_MAX, reserve = (uint64_t)256 << 20;
    const char *ready = NULL;
    bool have_leave = false, control = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--control")) {
            control = true;
            continue;
        }
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "--leave")) leave = parse_bytes(argv[i], argv[i + 1]), have_leave = true;
        else if (!strcmp(argv[i], "--max")) max = parse_bytes(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--reserve")) reserve = parse_bytes(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--ready")) ready = argv[i + 1];
        else {
            fprintf(stderr, "memhog: unknown option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!have_leave) usage();
    /* no SA_RESTART: a signal must end a blocking read of the control line */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (!adjust(leave, reserve, max)) return 1;
    report(ready, leave, reserve);
    if (!control) {
        while (!stop) pause();
        return 0; /* the mappings go with the process */
    }
    char line[128];
    while (!stop && fgets(line, sizeof line, stdin)) {
        if (!parse_size(line, &leave)) {
            fprintf(stderr, "memhog: control line is not a size: %s", line);
            continue;
        }
        if (!adjust(leave, reserve, max)) return 1;
        report(ready, leave, reserve);
    }
    return 0;
}
