/*
 * dist/plan.c - who owns each routed expert: each rank's weight from its
 * expert cache and drive bandwidth (so that every rank's expected time
 * reading its misses is the same), weighted rendezvous hashing over
 * (layer, expert), and the measurement of a rank's drive bandwidth on its
 * pack. No MPI here.
 */
#include "dist/dist.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void df_dist_plan_weights(const uint64_t *cache, const double *bw, const bool *excluded, int n, uint64_t all,
                          double *w) {
    double sum_c = 0, sum_bw = 0;
    for (int r = 0; r < n; r++) {
        if (excluded[r]) continue;
        sum_c += (double)(cache[r] < all ? cache[r] : all);
        sum_bw += bw[r] > 0 ? bw[r] : 0;
    }
    double t = sum_bw > 0 && (double)all > sum_c ? ((double)all - sum_c) / sum_bw : 0;
    for (int r = 0; r < n; r++) {
        double c = (double)(cache[r] < all ? cache[r] : all);
        w[r] = excluded[r] ? 0 : c + t * (bw[r] > 0 ? bw[r] : 0);
        if (!excluded[r] && w[r] <= 0) w[r] = 1; /* nothing known: an equal share */
    }
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* u in (0, 1) for (layer, expert, rank). */
static double unit_hash(int layer, int e, int r) {
    uint64_t h = mix64(mix64(mix64((uint64_t)layer) ^ (uint64_t)e) ^ (uint64_t)r);
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void df_dist_plan_owners(const df_config *c, const double *w, int n_ranks, int *owner) {
    int E = c->num_experts;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int e = 0; e < E; e++) {
            int best = -1;
            double best_s = 0;
            for (int r = 0; c->layer_is_moe[l] && r < n_ranks; r++) {
                if (w[r] <= 0) continue;
                double s = -w[r] / log(unit_hash(l, e, r));
                if (best < 0 || s > best_s) best = r, best_s = s;
            }
            owner[(size_t)l * (size_t)E + (size_t)e] = best;
        }
}

/* The largest regular file directly in dir, or -1. */
static int largest_file(const char *dir, char *path, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    off_t best = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > best) {
            best = st.st_size;
            snprintf(path, n, "%s", p);
        }
    }
    closedir(d);
    return best > 0 ? 0 : -1;
}

double df_dist_measure_bandwidth(const char *dir) {
    char path[4096];
    if (!dir || largest_file(dir, path, sizeof path)) return 0;
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) fd = open(path, O_RDONLY); /* a file system without O_DIRECT */
    if (fd < 0) return 0;
    size_t blk = (size_t)1 << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, blk)) {
        close(fd);
        return 0;
    }
    double t0 = df_now(), t = t0;
    uint64_t got = 0;
    for (off_t off = 0; got < ((uint64_t)64 << 20) && t - t0 < 0.1; off += (off_t)blk) {
        ssize_t r = pread(fd, buf, blk, off);
        if (r <= 0) break;
        got += (uint64_t)r;
        t = df_now();
    }
    free(buf);
    close(fd);
    return got && t > t0 ? (double)got / (t - t0) : 0;
}
