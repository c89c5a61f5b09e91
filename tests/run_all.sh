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
# The parts run in two lanes at once, each a single thread most of the time, so
# that two cores halve the wall time: the cmocka binaries in the background; the
# references, fuzzers and command-line tests in front. The tests that time
# things, kill processes or measure memory (budget, batch, server, mpi, prompt
# cache, replay) run after both, alone. Every part writes to its own scratch
# directory. Each part's output and result are kept in $R and printed when its
# lane is done, in order: "== name", its output, "-- name: Ns".
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
parts=()

note() { printf '%s\n' "$*"; }

# finish NAME PASSED FAILED START: records a part's result
finish() { printf '%s %s %s\n' "$2" "$3" $(($(date +%s) - $4)) > "$R/$1.res"; }

run_cmocka() { # name binary
    local name=$1 t0 out rc p f
    t0=$(date +%s)
    out=$("$2" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^\[ +(OK|FAILED|PASSED|ERROR|SKIPPED) +\]|^\[==========\]|ERROR|Sanitizer|runtime error' | head -100 > "$R/$name.out"
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        printf '%s\n' "$out" | tail -30 >> "$R/$name.out"
        f=1
    fi
    finish "$name" "$p" "$f" "$t0"
}

run_counted() { # name command... ; the command ends with "N passed, N failed"
    local name=$1 t0 out rc line p f; shift
    t0=$(date +%s)
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -40 > "$R/$name.out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(printf '%s' "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p'); f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    finish "$name" "$p" "$f" "$t0"
}

run_fuzz() { # name fuzzer: bounded by time, passes when it finds no crash
    local name=$1 t0 out
    t0=$(date +%s)
    if out=$("$2" -t "${DF_FUZZ_SECONDS:-5}" "tests/fuzz/corpus/${name#fuzz_}" 2>&1); then
        printf '%s\n' "$out" | tail -2 > "$R/$name.out"
        finish "$name" 1 0 "$t0"
    else
        printf '%s\n' "$out" | tail -40 > "$R/$name.out"
        finish "$name" 0 1 "$t0"
    fi
}

report() { # names...: prints each part's output and time, in order
    local n
    for n in "$@"; do
        note "== $n"
        cat "$R/$n.out" 2>/dev/null
        [ -f "$R/$n.res" ] || printf '0 1 0\n' > "$R/$n.res" # a part that never finished
        printf -- '-- %s: %ds\n' "$n" "$(cut -d' ' -f3 "$R/$n.res")"
        parts+=("$n")
    done
}

# Synthetic checkpoints used by the C tests.
mkdir -p "$DF_TEST_MODELS"
if ! bash tests/make_test_models.sh "$DF_TEST_MODELS" > "$B/test-models.log" 2>&1; then
    note "FAIL: could not generate test checkpoints (see $B/test-models.log)"
    cat "$B/test-models.log"
    printf '0 1 0\n' > "$R/make_test_models.res"
    parts+=(make_test_models)
fi

# ---- lane 1, in the background: the cmocka binaries (ASan+UBSan)
lane1=()
for t in "$B"/tests/test_*; do
    [ -x "$t" ] && lane1+=("$(basename "$t")")
done
(for n in "${lane1[@]}"; do run_cmocka "$n" "$B/tests/$n"; done) &
lane1_pid=$!

# ---- lane 2, in front: the references, the command line, the fuzzers
lane2=()
lane() { lane2+=("$1"); run_counted "$@"; }
lane ref-selftest $PY tests/ref/test_ref_selftest.py
lane deepseek-ref $PY tests/ref/test_deepseek_ref.py
lane quant-ref $PY tests/ref/test_quant_ref.py
lane quant-suite $PY tests/ref/test_quant_suite.py
lane kimi-linear-ref $PY tests/ref/test_kimi_linear_ref.py
lane reference $PY tests/ref/check_model.py --suite --engine "$B/deltafin-san" --dir "$DF_TEST_MODELS/ref"
# the DeepSeek-V3 family: every model also prefilled 3 rows at a time through the latent
# cache, and bitwise across thread counts
lane reference-deepseek $PY tests/ref/check_model.py --suite --set deepseek --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
# weights as shipped in FP8, INT4 and MXFP4 (issue 22), also batched and across thread counts
lane reference-formats $PY tests/ref/check_model.py --suite --set formats --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
# The Kimi-Linear family (Kimi-Linear, Kimi K3 with MXFP4 experts, per-channel A_log)
lane reference-kimi $PY tests/ref/check_model.py --suite --set kimi --engine "$B/deltafin-san" \
    --dir "$DF_TEST_MODELS/ref" --determinism --batch 3
lane replay-reference $PY tests/ref/check_replay.py --engine "$B/deltafin-san" --dir "$DF_TEST_MODELS"
lane demo-models $PY tests/demo/check_demo.py --engine "$B/deltafin-san"
lane cli bash tests/test_cli.sh "$B/deltafin-san"
lane cli-families bash tests/test_cli_families.sh "$B/deltafin-san"
lane real-layout bash tests/test_real_layout.sh "$B/deltafin-san"
lane bench-report bash tests/test_bench_report.sh
lane tokenizer-diff bash tests/test_tokenizer_diff.sh
for fz in "$B"/fuzz/fuzz_*; do
    [ -x "$fz" ] || continue
    lane2+=("$(basename "$fz")")
    run_fuzz "$(basename "$fz")" "$fz"
done
report "${lane2[@]}"
wait "$lane1_pid"
report "${lane1[@]}"

# ---- alone: the parts that time, kill or measure memory
alone() { run_counted "$@"; report "$1"; }
alone budget bash tests/test_budget.sh "$B/deltafin"
# resumable batch jobs under kill -9 (the release build: the kills need a run of a few seconds)
alone batch bash tests/test_batch.sh "$B/deltafin"
alone server bash tests/test_server.sh "$B/deltafin-san"
alone server-models bash tests/test_server_models.sh "$B/deltafin-san"
# experts by rank over Open MPI (mpirun on loopback, 2 and 3 ranks): bit-identical to one process
alone mpi bash tests/test_mpi.sh "$B/deltafin" "$B/deltafin-san"
alone prompt-cache bash tests/test_pcache.sh "$B/deltafin-san"
alone replay bash tests/test_replay.sh "$B/deltafin-san"

pass=0
fail=0
failed_names=()
for n in "${parts[@]}"; do
    read -r p f _ < "$R/$n.res"
    pass=$((pass + p)); fail=$((fail + f))
    [ "$f" -eq 0 ] || failed_names+=("$n")
done
[ ${#failed_names[@]} -eq 0 ] || note "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
