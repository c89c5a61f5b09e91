#!/usr/bin/env bash
# test_budget.sh ENGINE - the RAM budget is a bound, measured: a MoE checkpoint
# whose experts are several times the budget runs with `--ram-budget` from a pack
# (and from the safetensors), its peak RSS (VmHWM) stays within the budget, and
# the generated tokens equal the all-in-RAM run. Uses the release binary (ASan's
# shadow memory would make RSS meaningless). Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin}
MODELS=${DF_TEST_MODELS:-build/test-models}
M=$MODELS/budget-moe
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh

if [ ! -f "$M/config.json" ]; then
    /usr/bin/python3 tools/gen_checkpoint.py --out "$M" --arch qwen3_moe --seed 21 --dtype bf16 \
        --vocab 2048 --hidden 256 --intermediate 512 --layers 6 --heads 4 --kv-heads 2 --head-dim 64 \
        --experts 64 --top-k 4 --moe-intermediate 512 --norm-topk-prob 1 --max-pos 512 \
        --fast-init >/dev/null || { bad generate "gen_checkpoint failed"; echo "$pass passed, $fail failed"; exit 1; }
fi
"$ENG" pack --model "$M" --out "$T/pack" >/dev/null 2>&1 || bad pack "deltafin pack failed"
EXPERT_MB=$("$ENG" inspect --model "$M" | sed -n 's/.*routed experts \([0-9.]*\) MiB.*/\1/p')
PROMPT=$(seq -s, 7 3 100)
want=$("$ENG" run --model "$M" --prompt-tokens "$PROMPT" --max-new 24 --temp 0 --print-ids 2>&1)

for src in pack safetensors; do
    for budget in 160 200; do
        args=(--ram-budget ${budget}M --ctx 64)
        [ $src = pack ] && args+=(--experts "$T/pack")
        got=$("$ENG" run --model "$M" --prompt-tokens "$PROMPT" --max-new 24 --temp 0 --print-ids \
              --events "$T/ev" "${args[@]}" 2>"$T/err")
        rc=$?
        name="$src-${budget}M"
        if [ $rc -ne 0 ]; then bad "$name" "exit $rc: $(cat "$T/err")"; continue; fi
        [ "$got" = "$want" ] && ok "$name-tokens" || bad "$name-tokens" "'$got' != '$want'"
        peak=$(sed -n 's/.*"peak_rss_bytes":\([0-9]*\).*/\1/p' "$T/ev")
        misses=$(sed -n 's/.*"event":"summary".*"expert_misses":\([0-9]*\).*/\1/p' "$T/ev")
        lim=$((budget * 1048576))
        if [ -n "$peak" ] && [ "$peak" -le "$lim" ] && [ "${misses:-0}" -gt 0 ]; then
            ok "$name-rss $((peak / 1048576)) MiB <= $budget MiB (experts $EXPERT_MB MiB, $misses misses)"
        else
            bad "$name-rss" "peak RSS ${peak:-?} > $lim or no misses (${misses:-?})"
        fi
    done
done
finish
