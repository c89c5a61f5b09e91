#!/bin/bash
# bench/ab_kernels.sh OLD NEW [REPS] [ISA] [TOKENS] - A/B of two bench_kernels binaries on the
# weight formats (bench_kernels --formats: one [2048 x 7168] product per call, 2 threads,
# copies cycling through 1 GiB), for a shared machine: the binaries interleaved (A B, B A,
# ...), each run's GB/s divided by the read bandwidth it measured next to it (of_membw).
# Prints each arm's fractions per format, sorted, and their medians, then the medians of the
# in-cache speed over the bandwidth (c/membw: below 1, compute-bound). ISA: avx512 (default),
# avx2 or c; TOKENS: the tokens per product (1).
set -eu
A=$(realpath "$1"); B=$(realpath "$2"); N=${3:-6}; ISA=${4:-avx512}; TOK=${5:-1}
cd "$(dirname "$0")/.."
. bench/lib.sh
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
one() { # BIN ARM REP
  "$1" --formats --isa "$ISA" --tokens "$TOK" | awk -v a="$2" -v isa="$ISA" '$1 == isa {print a, $2, $9, $12}' >> "$D/runs"
}
ab_interleave "$N" "$A" "$B" one
/usr/bin/python3 - "$D/runs" <<'PY'
import statistics as st, sys
runs = {}
cached = {}
for line in open(sys.argv[1]):
    arm, fmt, frac, *cfrac = line.split()  # no cfrac: a bench_kernels from before the column
    runs.setdefault((fmt, arm), []).append(float(frac))
    if cfrac:
        cached.setdefault((fmt, arm), []).append(float(cfrac[0]))
for (fmt, arm) in sorted(runs):
    v = sorted(runs[(fmt, arm)])
    print("%-22s %s median %.3f  runs %s" % (fmt, arm, st.median(v), " ".join("%.2f" % x for x in v)))
for (fmt, arm) in sorted(cached):
    print("%-22s %s in cache: median %.3f of membw" % (fmt, arm, st.median(cached[(fmt, arm)])))
PY
