#!/usr/bin/env bash
# compare_builds.sh OLD NEW [MODEL_DIR...] - the logits of two deltafin builds,
# byte for byte, on every reference checkpoint: `deltafin logits` over 40
# tokens, whole and in batches of 7, with 1 and 2 threads, on every ISA path
# this CPU has, and for MoE checkpoints streamed from a pack (small cache) and
# from the safetensors under a budget. For refactorings that must not change
# a result (the default model list: build/test-models/**, models/demo-*).
# Prints one line per case and "N same, N differ"; exits 1 if any differ.
set -u
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2
shift 2
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    for d in build/test-models/* build/test-models/ref/* models/demo-moe models/demo-draft; do
        [ -f "$d/config.json" ] && models+=("$d")
    done
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
isas=(c)
grep -q ' avx2 ' /proc/cpuinfo && isas+=(avx2)
grep -q ' avx512f ' /proc/cpuinfo && isas+=(avx512)
same=0 differ=0
run() { # name args...
    run_packs "$1" "" "" "${@:2}"
}
run_packs() { # name OLD-PACK NEW-PACK args...: each build streams from its pack ("": none)
    local name=$1 op=$2 np=$3; shift 3
    "$OLD" logits "$@" ${op:+--experts "$op"} --out "$T/old.f32" >"$T/old.err" 2>&1; local a=$?
    "$NEW" logits "$@" ${np:+--experts "$np"} --out "$T/new.f32" >"$T/new.err" 2>&1; local b=$?
    if [ $a -ne 0 ] || [ $b -ne 0 ]; then
        echo "DIFFER $name: exit $a / $b: $(tail -1 "$T/old.err") | $(tail -1 "$T/new.err")"; differ=$((differ + 1))
    elif cmp -s "$T/old.f32" "$T/new.f32"; then
        echo "same   $name"; same=$((same + 1))
    else
        echo "DIFFER $name"; differ=$((differ + 1))
    fi
}
for m in "${models[@]}"; do
    vocab=$(/usr/bin/python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['vocab_size'])" "$m/config.json")
    toks=$(/usr/bin/python3 -c "import sys;v=int(sys.argv[1]);print(','.join(str((i*7919+13)%v) for i in range(40)))" "$vocab")
    n=$(basename "$m")
    for isa in "${isas[@]}"; do
        run "$n $isa" --model "$m" --tokens "$toks" --isa "$isa" --threads 2
        run "$n $isa batch 7 threads 1" --model "$m" --tokens "$toks" --isa "$isa" --threads 1 --batch 7
    done
    if grep -q '"num_experts": *[1-9]' "$m/config.json"; then
        # Each build streams from the pack it writes; the new one also from the old one's
        # (an older pack format must stay readable).
        rm -rf "$T/pack" "$T/pack-new"
        if "$OLD" pack --model "$m" --out "$T/pack" >/dev/null 2>&1 &&
            "$NEW" pack --model "$m" --out "$T/pack-new" >/dev/null 2>&1; then
            run_packs "$n pack cache 1M" "$T/pack" "$T/pack-new" --model "$m" --tokens "$toks" \
                --expert-cache 1M --batch 5
            run "$n old pack cache 1M" --model "$m" --tokens "$toks" --experts "$T/pack" --expert-cache 1M --batch 5
        fi
        run "$n safetensors budget" --model "$m" --tokens "$toks" --ram-budget 2G --batch 3
    fi
done
echo "$same same, $differ differ"
[ $differ -eq 0 ]
