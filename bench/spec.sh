#!/usr/bin/env bash
# bench/spec.sh TARGET_DIR [DRAFT_DIR] - speculative decoding: decode tokens/s
# with and without each drafter (plain, --draft lookup, --draft DRAFT_DIR) on
# three prompts (a passage continued from a repeat of itself, or from PASSAGE; a
# list; free text). Each run is a fresh process, so the expert cache starts
# cold. Arms are interleaved within each repetition; medians are reported with
# the speed-up over plain, the acceptance and the mean drafted depth.
#
# Environment: B (build dir, default build), REPS (5), MAX_NEW (128), THREADS
# (all), EXPERTS (pack dir(s): stream experts), CACHE (--expert-cache size, with
# EXPERTS), BUDGET (--ram-budget), PASSAGE (file: its first 600 bytes are the
# passage prompt), EXTRA (more `run` options for every arm), OUT (results dir),
# OTHER (another deltafin binary, e.g. an older build: each drafter arm also runs
# with it, as `lookup-other`, `draft-other`, interleaved with the rest).
# Greedy decoding; every arm's output is checked to equal plain decoding's.
# Every run starts from the packs' heat files as they were when the script
# started (each run rewrites them), and the script leaves them so.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
TARGET=${1:?usage: bench/spec.sh TARGET_DIR [DRAFT_DIR]}
DRAFT=${2:-}
REPS=${REPS:-5}
MAX_NEW=${MAX_NEW:-128}
OUT=${OUT:-bench/results/$(date +%Y-%m-%d)}
mkdir -p "$OUT"
LOG=$OUT/spec-$(basename "$TARGET").txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

common=(--model "$TARGET" --max-new "$MAX_NEW" --temp 0 --print-ids)
[ -n "${THREADS:-}" ] && common+=(--threads "$THREADS")
[ -n "${EXPERTS:-}" ] && common+=(--experts "$EXPERTS")
[ -n "${CACHE:-}" ] && common+=(--expert-cache "$CACHE")
[ -n "${BUDGET:-}" ] && common+=(--ram-budget "$BUDGET")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && common+=($EXTRA)

if [ -n "${PASSAGE:-}" ]; then
    P1=$(head -c 600 "$PASSAGE")
else
    s="The river ran past the old mill, under the stone bridge and on through the meadows where the cattle grazed, until it reached the town. "
    P1="$s$s${s:0:60}"
fi
# (the demo model ends a shopping list after 5 tokens: a list it continues)
P2=$'Contents:\n1. Introduction\n2. Early life\n3. Career\n4. Personal life\n5.'
P3="Once upon a time, in a small village at the edge of a great forest, there lived"
PROMPTS=("$P1" "$P2" "$P3")
NAMES=(passage list free)

ARMS=(plain lookup)
[ -n "$DRAFT" ] && ARMS+=(draft)
if [ -n "${OTHER:-}" ]; then
    for a in "${ARMS[@]}"; do [ "$a" = plain ] || ARMS+=("$a-other"); done
fi
arm_bin() { case $1 in *-other) echo "$OTHER" ;; *) echo "$B/deltafin" ;; esac; }
arm_opts() {
    case ${1%-other} in
    plain) ;;
    lookup) echo --draft lookup ;;
    draft) echo --draft "$DRAFT" ;;
    esac
}

say() { echo "$*" | tee -a "$LOG"; }
: >"$LOG"
PACKS=()
IFS=, read -r -a PACKS <<<"${EXPERTS:-}"
. bench/heat.sh
. bench/lib.sh
heat_keep "$TMP" "${PACKS[@]}"
trap 'heat_reset; rm -rf "$TMP"' EXIT
say "# speculative decoding, $(date -u +%FT%TZ)"
say "target $TARGET${DRAFT:+, draft $DRAFT}${OTHER:+; -other arms: $OTHER}; max-new $MAX_NEW; reps $REPS; ${EXPERTS:+experts $EXPERTS cache ${CACHE:-budget ${BUDGET:-}}}"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for r in $(seq "$REPS"); do
    for pi in "${!PROMPTS[@]}"; do
        for a in "${ARMS[@]}"; do
            heat_reset
            # shellcheck disable=SC2046
            dfrun "$(arm_bin "$a")" "${common[@]}" --prompt "${PROMPTS[$pi]}" $(arm_opts "$a") \
                --events "$TMP/$pi-$a-$r.jsonl" >"$TMP/$pi-$a-$r.ids" 2>"$TMP/$pi-$a-$r.err" ||
                { echo "run failed: $(tail -2 "$TMP/$pi-$a-$r.err")" >&2; exit 1; }
            if [ "$a" != plain ] && ! cmp -s "$TMP/$pi-plain-$r.ids" "$TMP/$pi-$a-$r.ids"; then
                say "MISMATCH: ${NAMES[$pi]} $a rep $r differs from plain decoding"
                exit 1
            fi
        done
    done
done

/usr/bin/python3 - "$TMP" "$REPS" "${#PROMPTS[@]}" "${NAMES[*]}" "${ARMS[*]}" <<'EOF' | tee -a "$LOG"
import json, statistics, sys
tmp, reps, n_p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names, arms = sys.argv[4].split(), sys.argv[5].split()
print(f"{'prompt':8} {'arm':13} {'tokens':>6} {'tok/s (median)':>15} {'speed-up':>8} {'accept':>7} {'depth':>6} {'MB/token':>9}")
for p in range(n_p):
    base = None
    for a in arms:
        tps, acc, depth, mb, ntok = [], [], [], [], []
        for r in range(1, reps + 1):
            ev = [json.loads(l) for l in open(f"{tmp}/{p}-{a}-{r}.jsonl")]
            s = next(e for e in ev if e["event"] == "summary")
            tps.append(s["tokens_per_s"])
            ntok.append(s["decode_tokens"] + 1)
            mb.append(s["bytes_missed_per_token"] / 1e6)
            sp = [e for e in ev if e["event"] == "speculative"]
            if sp:
                acc.append(sp[0]["accepted"] / sp[0]["drafted"] if sp[0]["drafted"] else 0.0)
                depth.append(sp[0]["mean_depth"])
        m = statistics.median(tps)
        if a == "plain":
            base = m
        up = m / base if base else 0.0
        ac = f"{statistics.median(acc):.2f}" if acc else "-"
        dp = f"{statistics.median(depth):.2f}" if depth else "-"
        print(f"{names[p]:8} {a:13} {statistics.median(ntok):6.0f} {m:15.3f} {up:8.2f} {ac:>7} {dp:>6} {statistics.median(mb):9.2f}")
EOF
say "(results in $LOG)"
