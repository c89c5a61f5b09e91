# bench/lib.sh - sourced by the benchmark scripts.
# dfrun BIN ARGS...: `BIN bench run ARGS` (run with the benchmark controls:
# --teacher-force, --sim-disk, ...), or `BIN run ARGS` for a build older than
# `deltafin bench run` (an A/B against an earlier binary).
dfrun() {
    local bin=$1; shift
    if "$bin" bench run --help >/dev/null 2>&1; then "$bin" bench run "$@"; else "$bin" run "$@"; fi
}
