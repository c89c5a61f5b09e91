/*
 * bench_io.c - the device bandwidth the I/O bound is measured against: large
 * O_DIRECT reads of record-sized blocks at random aligned offsets of the given
 * files, `depth` in flight through io_uring, for `seconds`. Prints
 * "io_bw_gbs X". Usage: bench_io [-s BLOCK_BYTES] [-d DEPTH] [-t SECONDS] FILE...
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t block = 8u << 20;
    int depth = 8;
    double secs = 5;
    int opt;
    while ((opt = getopt(argc, argv, "s:d:t:")) != -1) {
        if (opt == 's') block = (size_t)strtoull(optarg, NULL, 10);
        else if (opt == 'd') depth = atoi(optarg);
        else if (opt == 't') secs = atof(optarg);
        else return 2;
    }
    block = (block + 4095) & ~(size_t)4095;
    int nf = argc - optind;
    if (nf < 1 || depth < 1 || depth > 64) {
        fprintf(stderr, "usage: bench_io [-s BLOCK] [-d DEPTH] [-t SECONDS] FILE...\n");
        return 2;
    }
    int fds[64];
    uint64_t sizes[64];
    for (int i = 0; i < nf && i < 64; i++) {
        fds[i] = open(argv[optind + i], O_RDONLY | O_DIRECT);
        struct stat st;
        if (fds[i] < 0 || fstat(fds[i], &st) != 0) {
            fprintf(stderr, "bench_io: %s: %s\n", argv[optind + i], strerror(errno));
            return 1;
        }
        sizes[i] = (uint64_t)st.st_size;
        if (sizes[i] < block) {
            fprintf(stderr, "bench_io: %s is smaller than one block\n", argv[optind + i]);
            return 1;
        }
    }
    struct io_uring ring;
    if (io_uring_queue_init(64, &ring, 0) < 0) return 1;
    char *buf;
    if (posix_memalign((void **)&buf, 4096, block * (size_t)depth)) return 1;
    uint64_t seed = 88172645463325252ull, bytes = 0;
    int inflight = 0, f = 0;
    double t0 = now();
    for (;;) {
        while (inflight < depth && now() - t0 < secs) {
            seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
            f = (f + 1) % nf;
            uint64_t nblk = sizes[f] / block, off = (seed % nblk) * block;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            /* the data is not looked at, so in-flight reads may share buffers */
            io_uring_prep_read(sqe, fds[f], buf + (size_t)inflight * block, (unsigned)block, off);
            inflight++;
        }
        if (!inflight) break;
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) < 0) return 1;
        if (cqe->res > 0) bytes += (uint64_t)cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    double dt = now() - t0;
    printf("io_bw_gbs %.3f  (%d file(s), %zu-byte O_DIRECT reads, depth %d, %.1f s, %.0f MB)\n",
           (double)bytes / dt / 1e9, nf, block, depth, dt, (double)bytes / 1e6);
    return 0;
}
