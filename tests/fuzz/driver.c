/*
 * driver.c - a standalone main for the libFuzzer-style targets in
 * tests/fuzz/fuzz_*.c, so that they run under gcc with ASan/UBSan and no
 * extra toolchain (with clang, build a target with -fsanitize=fuzzer instead
 * and leave this file out).
 *
 *   fuzz_x [-t SECONDS] [-n MAX_ITERS] [-s SEED] [-m MAX_LEN] [CORPUS_DIR|FILE...]
 *
 * Runs every seed, then mutates for a bounded time (default 10 s) from a fixed,
 * settable seed so a run is reproducible. Mutations: bit flips, byte sets,
 * interesting integers (also over the 8-byte little-endian length safetensors
 * starts with), insert/delete/duplicate, splices between corpus entries, and
 * JSON-aware edits (numbers replaced by boundary values, dictionary tokens).
 *
 * Cheap guidance without coverage instrumentation: a target may define
 * df_fuzz_outcome() returning a description of what the last input did (its
 * error message); an input whose normalised outcome is new joins the corpus.
 *
 * A sanitizer report aborts the process; the death callback first writes the
 * input to crash-SEED-EXEC.bin (in $FUZZ_ARTIFACT_DIR or the current directory)
 * so `fuzz_x crash-....bin` replays it. An input running longer than 10 s is
 * treated the same way (timeout-...). FUZZ_PRINT_OUTCOMES=1 prints each input
 * that adds an outcome (to check that the guidance is not flooded by values).
 */
#include "fuzz.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Optional hooks a target may define. */
const char *df_fuzz_outcome(void) __attribute__((weak));
const char *const *df_fuzz_dict(size_t *n) __attribute__((weak));
void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

/* ---- corpus -------------------------------------------------------------- */

typedef struct unit {
    uint8_t *d;
    size_t n;
} unit;

static unit *corpus;
static size_t n_corpus, cap_corpus, n_seeds;
#define MAX_CORPUS 4096

static void corpus_add(const uint8_t *d, size_t n, uint64_t *rng);

/* ---- rng (splitmix64 seeding xorshift64*) ------------------------------- */

static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static size_t below(uint64_t *s, size_t n) { return n ? (size_t)(rnd(s) % n) : 0; }

/* ---- crash artifacts ----------------------------------------------------- */

static const uint8_t *volatile cur_data;
static volatile size_t cur_size;
static uint64_t seed_arg = 0x5eed;
static volatile uint64_t execs;
static const char *prog = "fuzz";

static void write_artifact(const char *kind) {
    char path[600];
    const char *dir = getenv("FUZZ_ARTIFACT_DIR");
    snprintf(path, sizeof path, "%s/%s-%llx-%llu.bin", dir ? dir : ".", kind,
             (unsigned long long)seed_arg, (unsigned long long)execs);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        const uint8_t *d = cur_data;
        size_t n = cur_size, o = 0;
        while (d && o < n) {
            ssize_t w = write(fd, d + o, n - o);
            if (w <= 0) break;
            o += (size_t)w;
        }
        close(fd);
    }
    char msg[800];
    int m = snprintf(msg, sizeof msg, "%s: %s input (%zu bytes) written to %s\n", prog, kind,
                     (size_t)cur_size, path);
    if (m > 0) (void)!write(2, msg, (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
}

static void on_death(void) {
    if (cur_data) write_artifact("crash");
}

static void on_signal(int sig) {
    if (cur_data) write_artifact("crash");
    signal(sig, SIG_DFL);
    raise(sig);
}

static uint64_t last_alarm_execs = (uint64_t)-1;
static void on_alarm(int sig) {
    (void)sig;
    if (cur_data && execs == last_alarm_execs) {
        write_artifact("timeout");
        _exit(70);
    }
    last_alarm_execs = execs;
    alarm(10);
}

/* Runs one input from an exactly-sized heap copy, so ASan sees any overread. */
static void run_one(const uint8_t *d, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (!c) abort();
    if (n) memcpy(c, d, n);
    cur_data = c;
    cur_size = n;
    LLVMFuzzerTestOneInput(c, n);
    cur_data = NULL;
    free(c);
    execs++;
}

/* ---- scratch files -------------------------------------------------------- */

#define MAX_SCRATCH 8
static char scratch_dir[32], scratch_path[MAX_SCRATCH][96];
static int n_scratch;

static void scratch_remove(void) {
    for (int i = 0; i < n_scratch; i++) unlink(scratch_path[i]);
    rmdir(scratch_dir);
}

const char *df_fuzz_scratch(const char *name) {
    if (!scratch_dir[0]) {
        snprintf(scratch_dir, sizeof scratch_dir, "/tmp/df_fuzz.XXXXXX");
        if (!mkdtemp(scratch_dir)) abort();
        atexit(scratch_remove);
    }
    for (int i = 0; i < n_scratch; i++)
        if (strcmp(strrchr(scratch_path[i], '/') + 1, name) == 0) return scratch_path[i];
    if (n_scratch == MAX_SCRATCH || strchr(name, '/')) abort();
    snprintf(scratch_path[n_scratch], sizeof scratch_path[0], "%s/%s", scratch_dir, name);
    return scratch_path[n_scratch++];
}

/* ---- outcome text ------------------------------------------------------------ */

void df_fuzz_describe(char *out, size_t cap, const char *head, const char *msg, size_t len,
                      char quote) {
    size_t o = (size_t)snprintf(out, cap, "%s", head);
    if (o >= cap) o = cap - 1;
    const char *q0 = quote ? memchr(msg, quote, len) : NULL, *q1 = q0;
    for (const char *p = q0; p && p < msg + len; p++)
        if (*p == quote) q1 = p;
    bool in_num = false;
    for (const char *p = msg; p < msg + len && o + 1 < cap && o < 60; p++) {
        if (q0 && p >= q0 && p <= q1) continue;
        bool num = (*p >= '0' && *p <= '9') || (in_num && *p && strchr(".eE+-xXabcdefABCDEF", *p));
        if (!(num && in_num)) out[o++] = num || (unsigned char)*p < 0x20 ? '#' : *p;
        in_num = num;
    }
    out[o] = 0;
}

/* ---- outcome features ---------------------------------------------------- */

static uint64_t *features;
static size_t n_features;
#define FEATURE_CAP (1u << 16)

/* Hash of one outcome line with numbers, quoted names, parenthesised details
 * and JSON-parser context ("near ...") removed, so that only the kind of
 * result counts, not the particular values. */
static uint64_t outcome_hash(const char **sp) {
    const char *s = *sp;
    uint64_t h = 1469598103934665603ull;
    int in_quote = 0;
    while (*s && *s != '\n') {
        if (!in_quote && strncmp(s, " near ", 6) == 0) {
            /* jansson's context quotes input: skip to the last "(" of the line */
            const char *e = s, *paren = NULL;
            while (*e && *e != '\n') {
                if (*e == '(') paren = e;
                e++;
            }
            s = paren ? paren : e;
            continue;
        }
        if (!in_quote && *s == '(') {
            while (*s && *s != ')' && *s != '\n') s++;
            continue;
        }
        /* Names may hold quotes themselves: one closes only before a
         * delimiter, as in "tensor 'a'b': ...". */
        if (*s == '\'' && (!in_quote || strchr(" :,)]\n", s[1]))) {
            in_quote = !in_quote;
            s++;
            continue;
        }
        if (!in_quote && s[0] == '0' && s[1] == 'x') {
            s += 2;
            while ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F'))
                s++;
            continue;
        }
        if (!in_quote && !(*s >= '0' && *s <= '9')) h = (h ^ (uint8_t)*s) * 1099511628211ull;
        s++;
    }
    *sp = *s ? s + 1 : s;
    return h ? h : 1;
}

/* True if any line of the target's outcome is new. */
static int new_feature(void) {
    if (!df_fuzz_outcome) return 0;
    const char *s = df_fuzz_outcome();
    if (!s) return 0;
    int fresh = 0;
    while (*s && n_features * 2 < FEATURE_CAP) {
        uint64_t h = outcome_hash(&s);
        size_t i = (size_t)(h & (FEATURE_CAP - 1));
        while (features[i] && features[i] != h) i = (i + 1) & (FEATURE_CAP - 1);
        if (features[i]) continue;
        features[i] = h;
        n_features++;
        fresh = 1;
    }
    if (fresh && getenv("FUZZ_PRINT_OUTCOMES"))
        fprintf(stderr, "new outcome: %s\n", df_fuzz_outcome());
    return fresh;
}

static void corpus_add(const uint8_t *d, size_t n, uint64_t *rng) {
    if (n_corpus == MAX_CORPUS) { /* full: replace a non-seed entry */
        size_t i = n_seeds + below(rng, n_corpus - n_seeds);
        if (i >= n_corpus) return;
        free(corpus[i].d);
        corpus[i].d = malloc(n ? n : 1);
        if (!corpus[i].d) abort();
        memcpy(corpus[i].d, d, n);
        corpus[i].n = n;
        return;
    }
    if (n_corpus == cap_corpus) {
        cap_corpus = cap_corpus ? cap_corpus * 2 : 64;
        corpus = realloc(corpus, cap_corpus * sizeof *corpus);
        if (!corpus) abort();
    }
    corpus[n_corpus].d = malloc(n ? n : 1);
    if (!corpus[n_corpus].d) abort();
    if (n) memcpy(corpus[n_corpus].d, d, n);
    corpus[n_corpus].n = n;
    n_corpus++;
}

static int load_file(const char *path, uint64_t *rng, size_t max_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t *b = malloc(max_len ? max_len : 1);
    if (!b) abort();
    size_t n = fread(b, 1, max_len, f);
    fclose(f);
    corpus_add(b, n, rng);
    free(b);
    return 0;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_path(const char *path, uint64_t *rng, size_t max_len) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: cannot read %s\n", prog, path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        if (load_file(path, rng, max_len) != 0) {
            fprintf(stderr, "%s: cannot read %s\n", prog, path);
            exit(2);
        }
        return;
    }
    DIR *dir = opendir(path);
    if (!dir) return;
    char **names = NULL;
    size_t nn = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (nn + 1) * sizeof *names);
        if (!names) abort();
        names[nn++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(names, nn, sizeof *names, name_cmp); /* reproducible order */
    for (size_t i = 0; i < nn; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) load_file(p, rng, max_len);
        free(names[i]);
    }
    free(names);
}

/* ---- mutation ------------------------------------------------------------ */

static const char *const GENERIC_DICT[] = {
    "null", "true", "false", "{}", "[]", "\"\"", ",", ":", "{", "}", "[", "]", "\"",
    "0", "-1", "1.5", "1e308", "1e999", "-0", "9223372036854775807", "9223372036854775808",
    "18446744073709551615", "4294967296", "2147483648", "\"\\u0000\"", "\"\\ud800\"",
    "\"\\\\\"", "\xff", "\xc3\xa9",
};

static const char *const NUMBERS[] = {
    "0", "1", "-1", "2", "7", "8", "9", "255", "256", "513", "65535", "65536", "2147483647",
    "2147483648", "-2147483648", "4294967295", "4294967296", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "18446744073709551615", "1e308",
    "1e-308", "1.0", "0.5", "-0.0", "1e6", "100000000", "100000001", "3.5",
};

static const uint64_t INTS[] = {
    0, 1, 2, 7, 8, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xffff, 0x10000, 0x7fffffff,
    0x80000000, 0xffffffff, 0x100000000ull, 0x7fffffffffffffffull, 0x8000000000000000ull,
    0xffffffffffffffffull, 100000000, 100000001, 99999999,
};

static size_t mutate(uint8_t *b, size_t n, size_t cap, uint64_t *rng) {
    size_t nd = 0;
    const char *const *dict = df_fuzz_dict ? df_fuzz_dict(&nd) : NULL;
    int op = (int)below(rng, 14);
    switch (op) {
    case 0: /* bit flip */
        if (n) b[below(rng, n)] ^= (uint8_t)(1u << below(rng, 8));
        break;
    case 1: /* random byte */
        if (n) b[below(rng, n)] = (uint8_t)rnd(rng);
        break;
    case 2: { /* structural byte */
        static const char s[] = "{}[]\",:0123456789-.eE \\\0\xff";
        if (n) b[below(rng, n)] = (uint8_t)s[below(rng, sizeof s - 1)];
        break;
    }
    case 3: { /* interesting integer, 1/2/4/8 bytes LE (often at 0: the length) */
        size_t w = (size_t)1 << below(rng, 4);
        if (n < w) break;
        size_t at = below(rng, 4) == 0 ? 0 : below(rng, n - w + 1);
        uint64_t v = INTS[below(rng, sizeof INTS / sizeof *INTS)];
        if (below(rng, 4) == 0) v += (uint64_t)below(rng, 5) - 2;
        for (size_t i = 0; i < w; i++) b[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 4: { /* insert random bytes */
        size_t k = 1 + below(rng, 8);
        if (n + k > cap) break;
        size_t at = below(rng, n + 1);
        memmove(b + at + k, b + at, n - at);
        for (size_t i = 0; i < k; i++) b[at + i] = (uint8_t)rnd(rng);
        n += k;
        break;
    }
    case 5: { /* delete a range */
        if (n < 2) break;
        size_t at = below(rng, n), k = 1 + below(rng, n - at < 16 ? n - at : 16);
        memmove(b + at, b + at + k, n - at - k);
        n -= k;
        break;
    }
    case 6: { /* duplicate a range elsewhere */
        if (!n) break;
        size_t from = below(rng, n), k = 1 + below(rng, n - from < 32 ? n - from : 32);
        if (n + k > cap) break;
        uint8_t tmp[32];
        memcpy(tmp, b + from, k);
        size_t at = below(rng, n + 1);
        memmove(b + at + k, b + at, n - at);
        memcpy(b + at, tmp, k);
        n += k;
        break;
    }
    case 7: { /* splice from another corpus entry */
        const unit *u = &corpus[below(rng, n_corpus)];
        if (!u->n) break;
        size_t from = below(rng, u->n), k = 1 + below(rng, u->n - from);
        if (below(rng, 2)) { /* overwrite */
            if (!n) break;
            size_t at = below(rng, n);
            if (k > n - at) k = n - at;
            memcpy(b + at, u->d + from, k);
        } else { /* insert */
            if (n + k > cap) k = cap - n;
            size_t at = below(rng, n + 1);
            memmove(b + at + k, b + at, n - at);
            memcpy(b + at, u->d + from, k);
            n += k;
        }
        break;
    }
    case 8:
    case 9: { /* replace a run of digits by a boundary number */
        if (!n) break;
        size_t at = below(rng, n), i = at;
        while (i < n && !(b[i] >= '0' && b[i] <= '9')) i++;
        if (i == n) break;
        size_t j = i;
        while (j < n && ((b[j] >= '0' && b[j] <= '9') || b[j] == '.' || b[j] == 'e' ||
                         b[j] == 'E' || b[j] == '-' || b[j] == '+'))
            j++;
        if (i > 0 && b[i - 1] == '-') i--;
        const char *num = NUMBERS[below(rng, sizeof NUMBERS / sizeof *NUMBERS)];
        size_t k = strlen(num);
        if (n - (j - i) + k > cap) break;
        memmove(b + i + k, b + j, n - j);
        memcpy(b + i, num, k);
        n = n - (j - i) + k;
        break;
    }
    case 10:
    case 11: { /* insert or overwrite with a dictionary token */
        const char *tok;
        if (dict && nd && below(rng, 3)) tok = dict[below(rng, nd)];
        else tok = GENERIC_DICT[below(rng, sizeof GENERIC_DICT / sizeof *GENERIC_DICT)];
        size_t k = strlen(tok);
        if (op == 10) {
            if (n + k > cap) break;
            size_t at = below(rng, n + 1);
            memmove(b + at + k, b + at, n - at);
            memcpy(b + at, tok, k);
            n += k;
        } else {
            if (n < k) break;
            memcpy(b + below(rng, n - k + 1), tok, k);
        }
        break;
    }
    case 12: { /* drop a JSON value: from one delimiter to a later one */
        if (n < 2) break;
        size_t at = below(rng, n), i = at;
        while (i < n && b[i] != ',' && b[i] != ':' && b[i] != '[' && b[i] != '{') i++;
        size_t j = i + 1;
        while (j < n && b[j] != ',' && b[j] != ']' && b[j] != '}') j++;
        if (j >= n) break;
        memmove(b + i + 1, b + j, n - j);
        n -= j - i - 1;
        break;
    }
    default: { /* swap two bytes */
        if (n < 2) break;
        size_t x = below(rng, n), y = below(rng, n);
        uint8_t t = b[x];
        b[x] = b[y];
        b[y] = t;
        break;
    }
    }
    return n;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: %s [-t SECONDS] [-n MAX_ITERS] [-s SEED] [-m MAX_LEN] [CORPUS_DIR|FILE...]\n",
            prog);
    exit(2);
}

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    prog = slash ? slash + 1 : argv[0];
    double seconds = 10;
    unsigned long long max_iters = 0;
    size_t max_len = 1 << 16;
    int opt;
    while ((opt = getopt(argc, argv, "t:n:s:m:h")) != -1) {
        switch (opt) {
        case 't': seconds = atof(optarg); break;
        case 'n': max_iters = strtoull(optarg, NULL, 0); break;
        case 's': seed_arg = strtoull(optarg, NULL, 0); break;
        case 'm': max_len = (size_t)strtoull(optarg, NULL, 0); break;
        default: usage();
        }
    }
    if (max_len < 16) max_len = 16;
    uint64_t rng = seed_arg * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    if (!rng) rng = 1;

    /* Under a sanitizer its own handlers report the fault, then call on_death;
     * replacing them would lose the report. */
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(on_death);
    } else {
        signal(SIGSEGV, on_signal);
        signal(SIGBUS, on_signal);
        signal(SIGFPE, on_signal);
    }
    /* A target's own invariant check calls abort(), which the sanitizers leave
     * alone (handle_abort=0): without this its input would be lost. */
    signal(SIGABRT, on_signal);
    signal(SIGALRM, on_alarm);
    alarm(10);
    features = calloc(FEATURE_CAP, sizeof *features);
    if (!features) abort();

    for (int i = optind; i < argc; i++) load_path(argv[i], &rng, max_len);
    n_seeds = n_corpus;
    if (n_corpus == 0) corpus_add((const uint8_t *)"{}", 2, &rng), n_seeds = 1;

    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t0 = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, now = t0;

    for (size_t i = 0; i < n_seeds; i++) {
        run_one(corpus[i].d, corpus[i].n);
        new_feature();
    }
    size_t seeds_run = n_seeds;

    uint8_t *buf = malloc(max_len);
    if (!buf) abort();
    size_t found = 0;
    /* Nothing mutates when only files were named: that is a replay. */
    int replay = argc > optind;
    for (int i = optind; i < argc && replay; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) replay = 0;
    }
    unsigned long long iters = 0;
    while (!replay && (max_iters == 0 || iters < max_iters)) {
        if ((iters & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
            if (now - t0 >= seconds) break;
        }
        iters++;
        const unit *u = &corpus[below(&rng, n_corpus)];
        size_t n = u->n < max_len ? u->n : max_len;
        memcpy(buf, u->d, n);
        int k = 1 + (int)below(&rng, 4);
        while (k-- > 0) n = mutate(buf, n, max_len, &rng);
        run_one(buf, n);
        if (new_feature()) {
            corpus_add(buf, n, &rng);
            found++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    alarm(0);
    printf("%s: %llu execs in %.1f s, 0 crashes (%zu seeds, %zu inputs added, %zu outcomes, "
           "seed 0x%llx)\n",
           prog, (unsigned long long)execs, now - t0, seeds_run, found, n_features,
           (unsigned long long)seed_arg);
    free(buf);
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i].d);
    free(corpus);
    free(features);
    return 0;
}
