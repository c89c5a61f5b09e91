# bench/lib.sh - sourced by the benchmark scripts.
# dfrun BIN ARGS...: `BIN bench run ARGS` (run with the benchmark controls:
# --teacher-force, --sim-disk, ...), or `BIN run ARGS` for a build older than
# `deltafin bench run` (an A/B against an earlier binary).
dfrun() {
    local bin=$1; shift
    if "$bin" bench run --help >/dev/null 2>&1; then "$bin" bench run "$@"; else "$bin" run "$@"; fi
}

# ab_interleave N A B RUN: the two arms of an A/B (bench/ab_*.sh), N repetitions, in the
# order A B, B A, A B, ... so that drift on a shared machine falls on both alike; calls
# `RUN BIN ARM REP` (ARM A or B) for each run.
ab_interleave() {
    local n=$1 a=$2 b=$3 run=$4 i arm
    for i in $(seq "$n"); do
        for arm in $([ $((i % 2)) = 0 ] && echo B A || echo A B); do
            if [ "$arm" = A ]; then "$run" "$a" A "$i"; else "$run" "$b" B "$i"; fi
        done
    done
}
