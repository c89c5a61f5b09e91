#!/bin/bash
# bench/ab_scaled.sh A.c B.c [ISA] [MODE] [FORMAT] [REPS] [TOKENS] - A/B of two versions of a
# scaled-format ISA file inside one process (bench/ab_scaled.c: each round times A, then B,
# on the same data, so the host's swings fall on both). ISA avx512 (default) or avx2: the file
# is src/kernels/scaled_ISA.c in either version (git show REV:src/kernels/scaled_avx512.c >
# old.c gives an old one; MAP=1 and POW2=1 as in bench/ab_scaled.c). MODE l2 (one thread, in L2; default) or ram (2 threads, 1 GiB of
# copies); FORMAT fp8 (default), int4 or mxfp4; REPS rounds (9); TOKENS per product (1).
# Needs build/libdeltafin.a (make). Pin the process (taskset -c N) to see one core's state:
# on the shared VM one vCPU at times runs at about 60 % of the other's speed.
set -eu
A=$(realpath "$1"); B=$(realpath "$2"); ISA=${3:-avx512}; MODE=${4:-l2}; FMT=${5:-fp8}
cd "$(dirname "$0")/.."
FL="-std=c17 -D_GNU_SOURCE -O2 -ffp-contract=off -fno-fast-math -Iinclude -Isrc"
[ "$ISA" = avx512 ] && IF="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mavx2" ||
    IF="-mavx2 -mfma -mf16c"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
gcc $FL $IF -c "$A" -o "$D/A.o" -Ddf_qrows_$ISA=A_qrows -Ddf_qdecode_$ISA=A_qdecode
gcc $FL $IF -c "$B" -o "$D/B.o" -Ddf_qrows_$ISA=B_qrows -Ddf_qdecode_$ISA=B_qdecode
gcc $FL bench/ab_scaled.c "$D/A.o" "$D/B.o" build/libdeltafin.a -o "$D/ab" -lm -pthread \
    $(pkg-config --libs liburing jansson libpcre2-8 libutf8proc libmicrohttpd)
"$D/ab" "$MODE" "$FMT" "${6:-9}" "${7:-1}"
