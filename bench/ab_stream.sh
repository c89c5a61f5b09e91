#!/bin/bash
# bench/ab_stream.sh OLD NEW [REPS] - A/B of two deltafin binaries on streamed decode:
# bench/run.sh's model (hidden 2048, 8 layers, 128 experts of 9.4 MB, top-8) with its
# experts read from one pack through a cache of $CACHE (default 2G, about a fifth of
# them), paced by a simulated disk of $DISK GB/s (default 2) so that the storage
# is the same for both arms and the difference is the engine's. Both arms read the same
# pack, written by OLD (a newer build reads older pack versions); its heat file is
# removed before every run so every run starts from the same state. Runs interleave
# (A B, B A, ...); prints medians and the paired B/A ratio of decode tok/s.
set -eu
A=$(realpath "$1"); B=$(realpath "$2"); N=${3:-6}
cd "$(dirname "$0")/.."
. bench/lib.sh
BLD=${B_DIR:-build}
M=$BLD/bench-models/moe-h2048-e128
P=${PACK:-$M.pack}
CACHE=${CACHE:-2G}
DISK=${DISK:-2}
[ -f "$P/manifest.json" ] || "$A" pack --model "$M" --out "$P" --quiet
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
one() { # BIN ARM REP
  rm -f "$P/experts.heat"
  "$1" bench --model "$M" --experts "$P" --expert-cache "$CACHE" --sim-disk "$DISK" \
      --random-prompt 16 --max-new 33 --threads 2 --events "$D/$2.$3.jsonl" > /dev/null
}
ab_interleave "$N" "$A" "$B" one
rm -f "$P/experts.heat"
/usr/bin/python3 - "$D" "$N" <<'PY'
import json, sys, statistics as st
D, N = sys.argv[1], int(sys.argv[2])
res = {"A": [], "B": []}
for i in range(1, N + 1):
    for a in "AB":
        s = [json.loads(l) for l in open(f"{D}/{a}.{i}.jsonl") if '"summary"' in l][0]
        res[a].append((s["tokens_per_s"], s.get("storage_bytes_read", 0)))
for a in "AB":
    r = res[a]
    print(a, "decode tok/s:", " ".join("%.2f" % x[0] for x in r),
          "| median %.3f, bytes read per run (median) %.0f MB" % (st.median(x[0] for x in r),
                                                                  st.median(x[1] for x in r) / 1e6))
print("paired B/A decode median %.3f (min %.3f, max %.3f)" % (
    st.median(res["B"][i][0] / res["A"][i][0] for i in range(N)),
    min(res["B"][i][0] / res["A"][i][0] for i in range(N)),
    max(res["B"][i][0] / res["A"][i][0] for i in range(N))))
PY
