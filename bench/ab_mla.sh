#!/bin/bash
# bench/ab_mla.sh OLD NEW [REPS] - A/B of two deltafin binaries on MLA's share of a decode
# step at context 4096, for a shared machine: the suite's DeepSeek-V3-shaped model in RAM
# (bench/suite.sh's deepseek section builds it), each binary decoding 32 tokens after a
# 16-token and after a 4064-token prompt, the binaries interleaved (A B, B A, ...). The
# share is the engine's own attention time per step (attn_s), its growth from context 16,
# over the long step: the timer isolates the block, which the step's total (noisy on a
# shared machine) does not; the step's growth is printed too. Prints each run and the
# medians per binary.
set -eu
A=$(realpath "$1"); B=$(realpath "$2"); N=${3:-3}
cd "$(dirname "$0")/.."
. bench/lib.sh
M=${B_DIR:-build}/bench-models/dsv3-h2048-l8-e64
[ -f "$M/config.json" ] || { echo "ab_mla: $M missing (SECTIONS=deepseek bash bench/suite.sh builds it)" >&2; exit 2; }
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
one() { # BIN ARM REP
  for p in 16 4064; do
    "$1" bench --model "$M" --random-prompt $p --max-new 33 --threads 2 > "$D/$2.$3.$p.json"
  done
}
ab_interleave "$N" "$A" "$B" one
/usr/bin/python3 - "$D" "$N" <<'PY'
import json, statistics as st, sys
D, N = sys.argv[1], int(sys.argv[2])
share, growth = {"A": [], "B": []}, {"A": [], "B": []}
for i in range(1, N + 1):
    for a in "AB":
        s, l = (json.loads(open(f"{D}/{a}.{i}.{p}.json").read()) for p in (16, 4064))
        step = lambda r, k: r[k] / r["decode_tokens"] * 1e3  # ms per decode step
        grow = step(l, "attn_s") - step(s, "attn_s")
        share[a].append(grow / step(l, "decode_s"))
        growth[a].append(1 - step(s, "decode_s") / step(l, "decode_s"))
        print(f"rep {i} {a}: step {step(s, 'decode_s'):.1f} -> {step(l, 'decode_s'):.1f} ms, attention "
              f"{step(s, 'attn_s'):.2f} -> {step(l, 'attn_s'):.2f} ms, share {share[a][-1]:.3f} "
              f"(by the step's growth {growth[a][-1]:.3f})")
for a in "AB":
    print(f"{a}: MLA share at context 4096, median {st.median(share[a]):.3f} "
          f"({min(share[a]):.3f}-{max(share[a]):.3f}); by the step's growth {st.median(growth[a]):.3f} "
          f"({min(growth[a]):.3f}-{max(growth[a]):.3f})")
PY
