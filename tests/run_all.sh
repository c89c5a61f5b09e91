#!/usr/bin/env bash
# run_all.sh - the whole test suite (`make test`): cmocka unit tests (ASan+UBSan),
# the independent references' self-tests and their comparison with the engine on
# synthetic checkpoints, the shipped demo models against their PyTorch training
# code and the reference, command-line
# bad-input tests and bounded fuzzing. Ends with one line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
PY=/usr/bin/python3
export DF_ROOT=$PWD DF_TEST_MODELS=$PWD/$B/test-models
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass=0
fail=0
failed_names=()

note() { printf '%s\n' "$*"; }
# each part's wall time, so the slow ones are visible ("== name" ... "-- name: Ns")
t_part=0
part() { note "== $1"; t_part=$(date +%s); }
took() { printf -- '-- %s: %ds\n' "$1" $(($(date +%s) - t_part)); }
count() { # name passed failed
    pass=$((pass + $2)); fail=$((fail + $3))
    [ "$3" -eq 0 ] || failed_names+=("$1")
}

# Synthetic checkpoints used by the C tests.
mkdir -p "$DF_TEST_MODELS"
if ! bash tests/make_test_models.sh "$DF_TEST_MODELS" > "$B/test-models.log" 2>&1; then
    note "FAIL: could not generate test checkpoints (see $B/test-models.log)"
    cat "$B/test-models.log"
    count make_test_models 0 1
fi

for t in "$B"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    part "$name"
    out=$("$t" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E '^\[ +(OK|FAILED|PASSED|ERROR|SKIPPED) +\]|^\[==========\]|ERROR|Sanitizer|runtime error' | head -100
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        printf '%s\n' "$out" | tail -30
        f=1
    fi
    count "$name" "$p" "$f"
    took "$name"
done

run_counted() { # name command... ; the command ends with "N passed, N failed"
    local name=$1; shift
    part "$name"
    local out rc
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -40
    local line p f
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(printf '%s' "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p'); f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    count "$name" "$p" "$f"
    took "$name"
}

run_counted ref-selftest $PY tests/ref/test_ref_selftest.py
run_counted deepseek-ref $PY tests/ref/test_deepseek_ref.py
run_counted quant-ref $PY tests/ref/test_quant_ref.py
run_counted quant-suite $PY tests/ref/test_quant_suite.py
run_counted kimi-linear-ref $PY tests/ref/test_kimi_linear_ref.py
run_counted reference $PY tests/ref/check_model.py --suite --engine "$B/deltafin-san" --dir "$DF_TEST_MODELS/ref"
# the DeepSeek-V3 family: every model also prefilled 3 rows at a time through the latent
# cache, and bitwise across thread counts
run_counted reference-deepseek $PY tests/ref/check_model.py --suite --set deepseek --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
# weights as shipped in FP8, INT4 and MXFP4 (issue 22), also batched and across thread counts
run_counted reference-formats $PY tests/ref/check_model.py --suite --set formats --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
# The Kimi-Linear family (Kimi-Linear, Kimi K3 with MXFP4 experts, per-channel A_log)
run_counted reference-kimi $PY tests/ref/check_model.py --suite --set kimi --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
run_counted replay-reference $PY tests/ref/check_replay.py --engine "$B/deltafin-san" --dir "$DF_TEST_MODELS"
run_counted demo-models $PY tests/demo/check_demo.py --engine "$B/deltafin-san"
run_counted cli bash tests/test_cli.sh "$B/deltafin-san"
run_counted cli-families bash tests/test_cli_families.sh "$B/deltafin-san"
run_counted real-layout bash tests/test_real_layout.sh "$B/deltafin-san"
run_counted budget bash tests/test_budget.sh "$B/deltafin"
# resumable batch jobs under kill -9 (the release build: the kills need a run of a few seconds)
run_counted batch bash tests/test_batch.sh "$B/deltafin"
run_counted server bash tests/test_server.sh "$B/deltafin-san"
run_counted server-models bash tests/test_server_models.sh "$B/deltafin-san"
# experts by rank over Open MPI (mpirun on loopback, 2 and 3 ranks): bit-identical to one process
run_counted mpi bash tests/test_mpi.sh "$B/deltafin" "$B/deltafin-san"
run_counted prompt-cache bash tests/test_pcache.sh "$B/deltafin-san"
run_counted replay bash tests/test_replay.sh "$B/deltafin-san"
run_counted bench-report bash tests/test_bench_report.sh
run_counted tokenizer-diff bash tests/test_tokenizer_diff.sh

for fz in "$B"/fuzz/fuzz_*; do
    [ -x "$fz" ] || continue
    name=$(basename "$fz")
    corpus=tests/fuzz/corpus/${name#fuzz_}
    part "$name"
    if out=$("$fz" -t "${DF_FUZZ_SECONDS:-5}" "$corpus" 2>&1); then
        printf '%s\n' "$out" | tail -2
        count "$name" 1 0
    else
        printf '%s\n' "$out" | tail -40
        count "$name" 0 1
    fi
    took "$name"
done

[ ${#failed_names[@]} -eq 0 ] || note "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
