#!/bin/bash
# bench/ab_inram.sh OLD NEW [REPS] - A/B of two deltafin binaries on the in-RAM decode of
# bench/run.sh's model, for a shared machine: runs interleaved (A B, B A, ...), each
# preceded by its own memory-bandwidth measurement (bench_kernels --membw-only), so each run
# is divided by the bandwidth measured next to it. Prints medians and the paired B/A ratio.
# MODEL=DIR picks another model (e.g. the formats section's FP8 or INT4 one), PROMPT the
# prompt's length (64).
set -eu
A=$(realpath "$1"); B=$(realpath "$2"); N=${3:-6}
cd "$(dirname "$0")/.."
. bench/lib.sh
BLD=${B_DIR:-build}
M=${MODEL:-$BLD/bench-models/moe-h2048-e128}
K=$BLD/bench_kernels
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
one() { # BIN ARM REP
  local bw0
  bw0=$($K --membw-only | awk '/^membw_gbs/{print $2}')
  "$1" bench --model $M --random-prompt ${PROMPT:-64} --max-new 65 --threads 2 --events $D/$2.$3.jsonl > /dev/null
  echo "$bw0" > $D/$2.$3.bw
}
ab_interleave "$N" "$A" "$B" one
/usr/bin/python3 - $D $N <<'PY'
import json,sys,statistics as st
D,N=sys.argv[1],int(sys.argv[2])
res={"A":[],"B":[]}
for i in range(1,N+1):
    for a in "AB":
        ev=[json.loads(l) for l in open(f"{D}/{a}.{i}.jsonl")]
        s=[e for e in ev if e["event"]=="summary"][0]
        bw=float(open(f"{D}/{a}.{i}.bw").read())
        tps=s["tokens_per_s"]; frac=tps*s["active_bytes_per_token"]/1e9/bw
        res[a].append((tps, s["prompt_tokens"]/s["prefill_s"], bw, frac, s["storage_bytes_read"]))
for a in "AB":
    r=res[a]
    print(a, "runs (tok/s, prefill tok/s, membw, frac):", "; ".join("%.1f %.0f %.1f %.2f" % x[:4] for x in r))
    print(a, "median decode %.2f tok/s, prefill %.1f tok/s, membw %.1f GB/s, fraction %.3f, prefill/decode %.2fx, storage reads %s" % (
        st.median(x[0] for x in r), st.median(x[1] for x in r), st.median(x[2] for x in r), st.median(x[3] for x in r),
        st.median(x[1]/x[0] for x in r), sum(x[4] for x in r)))
print("paired B/A decode median %.3f, prefill %.3f" % (st.median(res["B"][i][0]/res["A"][i][0] for i in range(N)),
      st.median(res["B"][i][1]/res["A"][i][1] for i in range(N))))
PY
