#!/usr/bin/env bash
# test_replay.sh ENGINE - routing replay (`deltafin bench run --replay-routing`,
# benchmarks and tests only): a
# trace whose shape disagrees with the model is refused naming the file and the
# field; the experts a run uses are exactly the trace's (read back from the heat
# histogram the store persists next to the pack, which counts every use); output
# made this way is marked in --stats, --events and `deltafin bench`; the server
# refuses the option; `deltafin bench --parallel N` decodes N sequences with
# replayed routing and sums them in its summary. The same holds on a
# DeepSeek-V3 checkpoint (a dense first layer, a grouped router the trace's ids
# need not respect). Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
MODELS=${DF_TEST_MODELS:-build/test-models}
M=$MODELS/engine-moe     # 3 layers, layer 1 dense: MoE layers 0 and 2; 8 experts, top-3
DENSE=$MODELS/engine-dense
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh


trace() { # FILE LAYERS EXPERTS TOPK TOKEN_LINES...
    local f=$1 l=$2 e=$3 k=$4; shift 4
    { echo "# moe-routing-trace v1"; echo "# model: test"
      echo "# moe_layers: $l (model layers 0..2)  experts_per_layer: $e  top_k: $k"
      for line in "$@"; do echo "$line"; done; } >"$f"
}

# Three tokens, played in order and wrapped around: the union of what they use is
# layer 0 {0,1,2,3}, layer 1 {4,5,6,7}; the first token alone would miss 3 and 4.
trace "$T/good.trace" 2 8 3 "0,1,2 7,6,5" "2,1,0 5,6,7" "3,1,0 4,5,6"
trace "$T/layers.trace" 3 8 3 "0,1,2 3,4,5 5,6,7"
trace "$T/experts.trace" 2 16 3 "0,1,2 3,4,5"
trace "$T/topk.trace" 2 8 2 "0,1 3,4"

RUN=(bench run --model "$M" --prompt-tokens 5,9,200,31 --max-new 4 --temp 0 --print-ids)
expect_error mismatch-layers "layers.trace: moe_layers is 3 but the model has 2" "$ENG" "${RUN[@]}" --replay-routing "$T/layers.trace"
expect_error mismatch-experts "experts.trace: experts_per_layer is 16 but the model has 8" "$ENG" "${RUN[@]}" --replay-routing "$T/experts.trace"
expect_error mismatch-topk "topk.trace: top_k is 2 but the model has 3" "$ENG" "${RUN[@]}" --replay-routing "$T/topk.trace"
expect_error missing-trace "no-such.trace" "$ENG" "${RUN[@]}" --replay-routing "$T/no-such.trace"
expect_error dense-model "no routed experts" "$ENG" bench run --model "$DENSE" --prompt-tokens 1 --max-new 1 --replay-routing "$T/good.trace"
expect_error serve-refuses "replay-routing is for benchmarks and tests only" "$ENG" serve --model "$M" --replay-routing "$T/good.trace"

# The experts used, from the heat histogram written next to the pack on close.
used() { # PACKDIR -> "layer:expert ..." of every nonzero heat entry
    $PY - "$1/experts.heat" <<'PYEOF'
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"DFHEAT\r\n", "bad heat magic"
nl, ne = struct.unpack_from("<II", b, 12)
v = struct.unpack_from("<%dd" % (nl * ne), b, 40)
print(" ".join(f"{i // ne}:{i % ne}" for i, x in enumerate(v) if x > 0))
PYEOF
}
if "$ENG" pack --model "$M" --out "$T/pack" >/dev/null 2>&1; then
    # 4 prompt rows + 3 decoded rows = 7 trace tokens: the trace wraps around twice
    if "$ENG" "${RUN[@]}" --experts "$T/pack" --replay-routing "$T/good.trace" --stats \
        --events "$T/ev.jsonl" >"$T/out" 2>"$T/err"; then
        got=$(used "$T/pack")
        want="0:0 0:1 0:2 0:3 1:4 1:5 1:6 1:7"
        [ "$got" = "$want" ] && ok replayed-ids-used || bad replayed-ids-used "experts used '$got', want '$want'"
        grep -q "routing REPLAYED from $T/good.trace" "$T/err" && ok stats-marked \
            || bad stats-marked "$(tail -3 "$T/err")"
        n_ev=$(wc -l <"$T/ev.jsonl")
        n_marked=$(grep -c '"routing":"replay","replay_trace":"'"$T"'/good.trace"' "$T/ev.jsonl")
        [ "$n_ev" -gt 0 ] && [ "$n_ev" -eq "$n_marked" ] && ok events-marked \
            || bad events-marked "$n_marked of $n_ev events marked"
    else
        bad replayed-ids-used "run failed: $(tail -3 "$T/err")"
    fi
    # the model's own routing, for contrast: it is marked as such and uses other experts
    rm -f "$T/pack/experts.heat"
    if "$ENG" "${RUN[@]}" --experts "$T/pack" --events "$T/ev2.jsonl" >/dev/null 2>"$T/err"; then
        got=$(used "$T/pack")
        [ "$got" != "0:0 0:1 0:2 0:3 1:4 1:5 1:6 1:7" ] && ok own-routing-differs \
            || bad own-routing-differs "the router chose exactly the trace's experts: the test proves nothing"
        ! grep -q '"routing":"replay"' "$T/ev2.jsonl" && grep -q '"routing":"model"' "$T/ev2.jsonl" \
            && ok own-routing-unmarked || bad own-routing-unmarked "$(head -2 "$T/ev2.jsonl")"
    else
        bad own-routing-differs "run failed: $(tail -3 "$T/err")"
    fi
else
    bad pack "deltafin pack failed"
fi

# The DeepSeek-V3 family: engine-ds has MoE layers 1 and 2, 16 experts, top-4 in
# 4 groups of which the router keeps 2; the trace puts layer 0's four in one group.
DS=$MODELS/engine-ds
trace "$T/ds.trace" 2 16 4 "0,1,2,3 15,14,13,12" "3,2,1,0 12,13,14,11"
DS_RUN=(bench run --model "$DS" --prompt-tokens 5,9,200,31 --max-new 4 --temp 0 --print-ids --experts "$T/dspack")
if "$ENG" pack --model "$DS" --out "$T/dspack" >/dev/null 2>&1; then
    ds_want="0:0 0:1 0:2 0:3 1:11 1:12 1:13 1:14 1:15"
    if "$ENG" "${DS_RUN[@]}" --replay-routing "$T/ds.trace" >"$T/ds-replayed" 2>"$T/err"; then
        got=$(used "$T/dspack")
        [ "$got" = "$ds_want" ] && ok ds-replayed-ids-used || bad ds-replayed-ids-used "experts used '$got', want '$ds_want'"
    else
        bad ds-replayed-ids-used "run failed: $(tail -3 "$T/err")"
    fi
    rm -f "$T/dspack/experts.heat"
    if "$ENG" "${DS_RUN[@]}" >"$T/ds-own" 2>"$T/err"; then
        got=$(used "$T/dspack")
        [ "$got" != "$ds_want" ] && ! cmp -s "$T/ds-own" "$T/ds-replayed" && ok ds-own-routing-differs \
            || bad ds-own-routing-differs "the router chose the trace's experts ('$got') or the same tokens"
    else
        bad ds-own-routing-differs "run failed: $(tail -3 "$T/err")"
    fi
else
    bad ds-pack "deltafin pack failed"
fi

# Replayed output differs from the model's own (the ids change the sum) and is
# deterministic (same trace, same output).
a=$("$ENG" "${RUN[@]}" 2>/dev/null)
b=$("$ENG" "${RUN[@]}" --replay-routing "$T/good.trace" 2>/dev/null)
c=$("$ENG" "${RUN[@]}" --replay-routing "$T/good.trace" 2>/dev/null)
[ -n "$b" ] && [ "$b" = "$c" ] && ok replay-deterministic || bad replay-deterministic "'$b' vs '$c'"
[ "$a" != "$b" ] && ok replay-changes-output || bad replay-changes-output "same tokens '$a' with and without replay"

# `deltafin bench`: one JSON summary on stdout, marked.
if "$ENG" bench --model "$M" --random-prompt 8 --max-new 4 --replay-routing "$T/good.trace" \
    >"$T/bench.json" 2>"$T/err" && $PY - "$T/bench.json" <<'PYEOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
d = json.loads(lines[0])
assert d["event"] == "summary" and d["routing"] == "replay", d
assert d["prompt_tokens"] == 8 and d["decode_tokens"] == 3, d
PYEOF
then ok bench-json; else bad bench-json "$(cat "$T/bench.json" "$T/err" | tail -5)"; fi

# `deltafin bench --parallel N`: N sequences decoded together, streamed; the summary
# counts all of them (aggregate tok/s) and adds per-sequence speed and expert bytes
# per decoded token; each sequence replays its own stretch of the trace.
if [ -f "$T/pack/manifest.json" ] && "$ENG" bench --model "$M" --random-prompt 8 --max-new 4 --parallel 3 \
    --experts "$T/pack" --expert-cache 100K --replay-routing "$T/good.trace" >"$T/bench3.json" 2>"$T/err" &&
    $PY - "$T/bench3.json" <<'PYEOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
d = json.loads(lines[0])
assert d["event"] == "summary" and d["routing"] == "replay", d
assert d["parallel"] == 3 and d["steps"] == 3 and d["prompt_tokens"] == 24 and d["decode_tokens"] == 9, d
assert abs(d["tokens_per_s_per_seq"] * 3 - d["tokens_per_s"]) < 1e-3 * d["tokens_per_s"], d
assert d["expert_bytes_per_token"] > 0 and d["expert_misses"] > 0, d
PYEOF
then ok bench-parallel-json; else bad bench-parallel-json "$(cat "$T/bench3.json" "$T/err" | tail -5)"; fi
expect_error bench-parallel-prompt "--parallel takes --random-prompt N" "$ENG" bench --model "$M" \
    --prompt-tokens 1,2 --parallel 2

finish
