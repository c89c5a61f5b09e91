# tests/lib.sh - the shell tests' shared harness, sourced after the test sets
# T (its scratch directory): PASS/FAIL lines, the error-path check every CLI
# test makes, and the summary line tests/run_all.sh reads ("N passed, N failed").
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1: $2"; }

# expect_error NAME PATTERN CMD... : the command exits 2 with exactly one stderr
# line, matching PATTERN (a bad input gets one clear message, never a crash)
expect_error() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    local lines; lines=$(wc -l <"$T/err")
    if [ $rc -ne 2 ]; then bad "$name" "exit $rc (want 2): $(head -c 300 "$T/err")"; return; fi
    if [ "$lines" -ne 1 ]; then bad "$name" "stderr has $lines lines: $(head -c 600 "$T/err")"; return; fi
    if ! grep -qE -- "$pat" "$T/err"; then bad "$name" "message '$(cat "$T/err")' lacks /$pat/"; return; fi
    ok "$name"
}

# the summary line; the test's exit status
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
