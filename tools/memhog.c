/*
 * memhog.c - holds the page cache to a budget for the page-cache benchmark arm:
 * locks (mlock) all of the memory the system has available except LEAVE bytes,
 * so that the kernel can cache at most about LEAVE bytes of file data while a
 * benchmark runs next to it. Holds until SIGTERM/SIGINT.
 *
 *   memhog --leave BYTES [--max BYTES] [--ready FILE]
 *
 * Safety: it never locks more than --max (default: all but LEAVE), never leaves
 * less than 256 MiB for the rest of the system beyond LEAVE, and locks in 64 MiB
 * steps, re-reading MemAvailable, so a system that is busier than when it started
 * is not pushed into the OOM killer. Once it holds it prints (and writes to the
 * --ready file) "N S": bytes locked, and bytes short of the goal (what is still
 * available beyond LEAVE and the reserve; large when --max stopped it).
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
#define SYSTEM_RESERVE ((uint64_t)256 << 20)

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

static uint64_t parse_bytes(const char *flag, const char *v) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (errno || end == v || *end || x < 0) {
        fprintf(stderr, "memhog: %s expects a size such as 512M or 2G, got '%s'\n", flag, v);
        exit(2);
    }
    return (uint64_t)(x * (double)mul);
}

int main(int argc, char **argv) {
    uint64_t leave = 0, max = UINT64_MAX;
    const char *ready = NULL;
    bool have_leave = false;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "usage: memhog --leave BYTES [--max BYTES] [--ready FILE]\n");
            return 2;
        }
        if (!strcmp(argv[i], "--leave")) leave = parse_bytes(argv[i], argv[i + 1]), have_leave = true;
        else if (!strcmp(argv[i], "--max")) max = parse_bytes(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--ready")) ready = argv[i + 1];
        else {
            fprintf(stderr, "memhog: unknown option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!have_leave) {
        fprintf(stderr, "usage: memhog --leave BYTES [--max BYTES] [--ready FILE]\n");
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    uint64_t locked = 0;
    while (!stop && locked < max) {
        uint64_t avail = mem_available();
        if (avail <= leave + SYSTEM_RESERVE + STEP) break;
        uint64_t n = STEP < max - locked ? STEP : max - locked;
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) break;
        if (mlock(p, n) != 0) {
            fprintf(stderr, "memhog: mlock: %s (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK)\n",
                    strerror(errno));
            munmap(p, n);
            if (!locked) return 1;
            break;
        }
        locked += n;
    }
    uint64_t avail = mem_available(), goal = leave + SYSTEM_RESERVE + STEP;
    unsigned long long short_by = avail > goal ? (unsigned long long)(avail - goal) : 0;
    printf("%llu %llu\n", (unsigned long long)locked, short_by);
    fflush(stdout);
    if (ready) {
        /* written whole, then renamed, so a reader never sees half of it */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", ready);
        FILE *f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "%llu %llu\n", (unsigned long long)locked, short_by);
            if (fclose(f) == 0) rename(tmp, ready);
        }
    }
    while (!stop) pause();
    return 0; /* the mappings go with the process */
}
