#!/usr/bin/env bash
# tests/test_mpi.sh REL [SAN] - experts by rank (--experts-by-rank, src/dist/) with
# mpirun on loopback, 2 and 3 ranks on this machine: the logits of a several-row
# prompt (prefill batch) and greedy decoding are bit-identical to the single-process
# run on Qwen3-MoE, DeepSeek-V3 and Kimi K3 (latent MoE, SiTU), with resident experts
# and streamed from a pack per rank ("{rank}" in --experts) under a small expert
# cache, with and without rank 0 owning experts; a rank that opened another model is
# refused by fingerprint (MPMD), and so is a rank whose pack is of another model
# (naming rank, host and pack); the server behind rank 0 (the openai npm client's
# requests, alone and batched, answer as a single-process server's; SIGTERM to rank 0
# ends every rank, exit 0); faults: a worker stopped (SIGSTOP: the request fails
# naming the rank and host within --rank-timeout, the server stops itself, non-zero),
# a worker killed, rank 0 killed (no rank lingers). REL is the release binary; SAN (the ASan+UBSan
# build) runs two of the cases under mpirun too, with tests/mpi_lsan.supp
# suppressing only Open MPI's own leaks (its MCA components preloaded so that
# their frames are named). Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin}
SAN=${2:-}
MODELS=${DF_TEST_MODELS:-$PWD/build/test-models}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh

if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not installed (apt: openmpi-bin libopenmpi-dev)"
    finish
    exit $?
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# loopback only, no other network interface looked for
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
MPI=(timeout 60 mpirun --oversubscribe --bind-to none)
PROMPT=5,17,300,5,9,2,44,81
COMMON=(--threads 1)

# same NAME A B: the two files are the same bytes
same() {
    if cmp -s "$2" "$3"; then ok "$1"; else bad "$1" "differs: $(head -c 300 "$T/log")"; fi
}

# ---- logits of a 8-row prompt: resident experts, 2 and 3 ranks, rank 0 owning or not
for m in engine-moe engine-ds engine-k3; do
    M=$MODELS/$m
    "$ENG" logits --model "$M" --tokens $PROMPT --out "$T/want" "${COMMON[@]}" 2>"$T/log" || bad "logits-$m" "single run failed"
    for cfg in "2 yes" "3 no"; do
        set -- $cfg
        "${MPI[@]}" -n "$1" "$ENG" logits --model "$M" --tokens $PROMPT --out "$T/got" "${COMMON[@]}" \
            --experts-by-rank --rank0-experts "$2" >"$T/log" 2>&1
        same "logits-$m-ranks$1-rank0-$2" "$T/want" "$T/got"
    done
done

# ---- greedy decoding, streamed from a pack per rank under a small expert cache
for m in engine-moe engine-ds engine-k3; do
    M=$MODELS/$m
    for r in 0 1 2; do "$ENG" pack --model "$M" --out "$T/pack-$m-$r" >/dev/null 2>&1 || bad "pack-$m" "pack failed"; done
    "$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids "${COMMON[@]}" \
        >"$T/want" 2>"$T/log" || bad "run-$m" "single run failed"
    for cfg in "3 yes" "2 no"; do
        set -- $cfg
        "${MPI[@]}" -n "$1" "$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids \
            "${COMMON[@]}" --experts-by-rank --rank0-experts "$2" --experts "$T/pack-$m-{rank}" \
            --expert-cache 100K --stats >"$T/got" 2>"$T/log"
        same "run-streamed-$m-ranks$1-rank0-$2" "$T/want" "$T/got"
    done
done
# the last run's plan and statistics
grep -q "^deltafin:   rank 1 on .*experts" "$T/log" && ok plan-printed || bad plan-printed "$(head -3 "$T/log")"
grep -q "experts by rank: 2 ranks; per decoded token rank 0 sent" "$T/log" && ok stats-ranks \
    || bad stats-ranks "$(grep -i rank "$T/log" | head -3)"
grep -q "experts by rank: the other ranks read [0-9.]* MB from storage (hits [0-9]* misses [1-9]" "$T/log" \
    && ok stats-worker-storage || bad stats-worker-storage "$(grep -i "other ranks" "$T/log")"

# ---- resident on rank 0, streamed on rank 1 (MPMD: per-rank options)
M=$MODELS/engine-ds
"$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids "${COMMON[@]}" >"$T/want" 2>/dev/null
"${MPI[@]}" -n 1 "$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids "${COMMON[@]}" \
    --experts-by-rank : -n 1 "$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids \
    "${COMMON[@]}" --experts-by-rank --experts "$T/pack-engine-ds-1" --expert-cache 60K >"$T/got" 2>"$T/log"
same run-mpmd-resident-and-streamed "$T/want" "$T/got"

# ---- --rank0-experts no under --ram-budget: rank 0 opens no expert cache (the budget
# counts none for it), the output is the same
"${MPI[@]}" -n 2 "$ENG" run --model "$M" --prompt-tokens $PROMPT --max-new 12 --temp 0 --print-ids "${COMMON[@]}" \
    --experts-by-rank --rank0-experts no --experts "$T/pack-engine-ds-{rank}" --ram-budget 100M --stats >"$T/got" 2>"$T/log"
if grep -q "expert cache sized by --rank0-experts no (none)" "$T/log" && grep -q "cache 0 slots" "$T/log"; then
    same run-rank0-no-experts-budget "$T/want" "$T/got"
else bad run-rank0-no-experts-budget "$(grep -m3 "deltafin\|cache" "$T/log")"; fi

# ---- batch jobs (continuous batching of several requests) over 3 ranks, experts
# streamed from the safetensors under a budget on every rank
python3 -c "
import json
for i in range(6):
    print(json.dumps({'custom_id': f'j{i}', 'method': 'POST', 'url': '/v1/completions',
                      'body': {'model': 'm', 'prompt': [5 + i, 17, 300, 9][:2 + i % 3], 'max_tokens': 10,
                               'temperature': 0}}))" >"$T/in.jsonl"
"$ENG" batch --model "$M" --input "$T/in.jsonl" --output "$T/b1.jsonl" --parallel 3 "${COMMON[@]}" 2>/dev/null
"${MPI[@]}" -n 3 "$ENG" batch --model "$M" --input "$T/in.jsonl" --output "$T/b2.jsonl" --parallel 3 "${COMMON[@]}" \
    --experts-by-rank --ram-budget 200M >/dev/null 2>"$T/log"
texts() { python3 -c "
import json, sys
print(sorted((d['custom_id'], d['response']['body']['choices'][0]['text']) for d in map(json.loads, open(sys.argv[1]))))" "$1"; }
if [ -s "$T/b1.jsonl" ] && [ "$(texts "$T/b1.jsonl")" = "$(texts "$T/b2.jsonl" 2>/dev/null)" ]; then ok batch-ranks3
else bad batch-ranks3 "$(grep -m2 deltafin "$T/log")"; fi

# ---- a rank with another model is refused by fingerprint, every rank exits non-zero
"${MPI[@]}" -n 1 "$ENG" logits --model "$MODELS/engine-moe" --tokens 5,17 --out "$T/x" "${COMMON[@]}" \
    --experts-by-rank : -n 1 "$ENG" logits --model "$MODELS/engine-ds" --tokens 5,17 --out "$T/x" \
    "${COMMON[@]}" --experts-by-rank >"$T/out" 2>"$T/log"
rc=$?
n=$(grep -c "rank 1 on host .* opened another model than rank 0" "$T/log")
if [ $rc -ne 0 ] && [ "$n" -ge 1 ]; then ok fingerprint-refused; else bad fingerprint-refused "exit $rc: $(head -c 400 "$T/log")"; fi

# a rank whose pack is of another model: refused at start-up naming rank, host and pack
"${MPI[@]}" -n 1 "$ENG" logits --model "$MODELS/engine-moe" --tokens 5,17 --out "$T/x" "${COMMON[@]}" \
    --experts-by-rank --experts "$T/pack-engine-moe-0" : -n 1 "$ENG" logits --model "$MODELS/engine-moe" \
    --tokens 5,17 --out "$T/x" "${COMMON[@]}" --experts-by-rank --experts "$T/pack-engine-ds-1" >"$T/out" 2>"$T/log"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^deltafin: rank 1 on $(hostname): pack $T/pack-engine-ds-1: built from a different model" "$T/log"
then ok pack-of-another-model-refused; else bad pack-of-another-model-refused "exit $rc: $(head -c 400 "$T/log")"; fi


# ---- the server behind rank 0: the official openai npm client's requests (alone and
# continuously batched, tests/server/parallel.mjs) answer as a single-process
# --parallel 1 server does; SIGTERM to rank 0 stops every rank, mpirun exits 0
SM=$T/smodel
/usr/bin/python3 tools/gen_checkpoint.py --out "$SM" --arch qwen3_moe --vocab 151936 --hidden 64 --intermediate 128 \
    --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --experts 8 --top-k 2 --moe-intermediate 32 \
    --tie-embeddings 1 --seed 3 --max-pos 16384 >"$T/gen.log" 2>&1 || bad gen-server-model "$(tail -2 "$T/gen.log")"
PORT=$((19000 + $$ % 1000))
SPIDS=()
trap 'for p in "${SPIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
# up PORT PID LOG: waits for /health while PID lives
up() {
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$1/health" && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
# mpi_serve PORT LOG ARGS...: mpirun -n 2 serve (a 60 s guard); sets MP (the guard's pid)
mpi_serve() {
    local port=$1 log=$2; shift 2
    timeout -s KILL 60 mpirun --oversubscribe --bind-to none -n 2 "$ENG" serve --model "$SM" --port "$port" \
        --threads 1 --experts-by-rank "$@" >"$log" 2>&1 &
    MP=$!
    SPIDS+=("$MP")
    up "$port" "$MP"
}
# rank_pid PORT RANK: that rank's process (Open MPI puts the rank in its environment)
rank_pid() {
    local p
    for p in $(pgrep -f -- "serve --model $SM --port $1 "); do
        grep -qxz "OMPI_COMM_WORLD_RANK=$2" "/proc/$p/environ" 2>/dev/null && { echo "$p"; return; }
    done
}
# gone PORT: no process of the server on PORT remains (within 3 s)
gone() {
    for _ in $(seq 30); do
        pgrep -f -- "--port $1 " >/dev/null || return 0
        sleep 0.1
    done
    return 1
}
P1=$PORT P2=$((PORT + 1))
"$ENG" serve --model "$SM" --port "$P1" --threads 1 --ctx 8192 --parallel 1 >"$T/ref.log" 2>&1 &
REF=$!
SPIDS+=("$REF")
if ! up "$P1" "$REF" || ! mpi_serve "$P2" "$T/srv.log" --ctx 8192; then
    bad serve-ranks-start "$(tail -3 "$T/ref.log" "$T/srv.log")"
elif [ ! -d tests/server/node_modules/openai ]; then
    bad serve-ranks-node "tests/server/node_modules missing: run scripts/setup.sh"
else
    node tests/server/parallel.mjs "http://127.0.0.1:$P1/v1" "http://127.0.0.1:$P2/v1" >"$T/node.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] || grep -q "^FAIL " "$T/node.out" || bad serve-ranks-node "node exited $rc: $(tail -3 "$T/node.out")"
    while read -r w n rest; do
        case $w in ok) ok "ranks2-$n" ;; FAIL) bad "ranks2-${n%:}" "$rest" ;; esac
    done <"$T/node.out"
    grep -qE '^(ok|FAIL) ' "$T/node.out" || bad serve-ranks-node "$(tail -5 "$T/node.out")"
    kill -TERM "$(rank_pid "$P2" 0)" 2>/dev/null
    wait "$MP"
    rc=$?
    if [ $rc -eq 0 ] && gone "$P2" && grep -q "stopping (signal 15)" "$T/srv.log"; then ok serve-ranks-sigterm-rank0
    else bad serve-ranks-sigterm-rank0 "exit $rc: $(tail -3 "$T/srv.log"; pgrep -af -- "--port $P2 ")"; fi
fi
kill "$REF" 2>/dev/null
wait "$REF"

# SIGTERM to mpirun: Open MPI forwards it to every rank and ends the job (its own
# exit status is then 1, whatever the ranks do); no rank remains
P3=$((PORT + 2))
if mpi_serve "$P3" "$T/srv3.log"; then
    kill -TERM "$(pgrep -P "$MP" mpirun)"
    wait "$MP"
    gone "$P3" && ok serve-ranks-sigterm-mpirun || bad serve-ranks-sigterm-mpirun "$(pgrep -af -- "--port $P3 ")"
else bad serve-ranks-sigterm-mpirun "did not start: $(tail -3 "$T/srv3.log")"; fi

# ---- faults. A worker that stops answering (SIGSTOP): the request fails naming the rank
# and its host within --rank-timeout, the server stops itself, every rank ends, non-zero
HOST=$(hostname)
P4=$((PORT + 3))
if mpi_serve "$P4" "$T/srv4.log" --rank-timeout 2; then
    kill -STOP "$(rank_pid "$P4" 1)"
    t0=$(date +%s)
    st=$(curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "http://127.0.0.1:$P4/v1/completions" \
        --data-binary '{"model":"m","prompt":[1,2,3],"max_tokens":4,"temperature":0}')
    wait "$MP"
    rc=$? el=$(($(date +%s) - t0))
    if [ "$st" = 500 ] && grep -q "rank 1 on $HOST did not answer MoE layer 0 within 2 s" "$T/body" && [ $rc -ne 0 ] &&
        [ $rc -ne 137 ] && [ $el -le 15 ] && grep -q "stopping: rank 1 on $HOST did not answer" "$T/srv4.log" && gone "$P4"
    then ok fault-worker-stopped; else bad fault-worker-stopped "status $st, exit $rc after ${el}s: $(cat "$T/body"; tail -3 "$T/srv4.log")"; fi
else bad fault-worker-stopped "did not start: $(tail -3 "$T/srv4.log")"; fi

# a worker killed (SIGKILL): mpirun ends the run at once, naming the rank and the host
P5=$((PORT + 4))
if mpi_serve "$P5" "$T/srv5.log"; then
    kill -KILL "$(rank_pid "$P5" 1)"
    t0=$(date +%s)
    curl -s -o /dev/null -m 20 -H 'Content-Type: application/json' "http://127.0.0.1:$P5/v1/completions" \
        --data-binary '{"model":"m","prompt":[1,2,3],"max_tokens":4,"temperature":0}'
    wait "$MP"
    rc=$? el=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] && [ $el -le 15 ] && grep -q "process rank 1 .* on node $HOST exited on signal 9" "$T/srv5.log" && gone "$P5"
    then ok fault-worker-killed; else bad fault-worker-killed "exit $rc after ${el}s: $(tail -4 "$T/srv5.log")"; fi
else bad fault-worker-killed "did not start: $(tail -3 "$T/srv5.log")"; fi

# rank 0 killed (SIGKILL): mpirun ends the workers, none lingers
P6=$((PORT + 5))
if mpi_serve "$P6" "$T/srv6.log"; then
    kill -KILL "$(rank_pid "$P6" 0)"
    t0=$(date +%s)
    wait "$MP"
    rc=$? el=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] && [ $el -le 15 ] && gone "$P6"; then ok fault-rank0-killed
    else bad fault-rank0-killed "exit $rc: $(tail -3 "$T/srv6.log"; pgrep -af -- "--port $P6 ")"; fi
else bad fault-rank0-killed "did not start: $(tail -3 "$T/srv6.log")"; fi

# a lone process (MPI's singleton, no mpirun) with no rank to own the experts
expect_error rank0-experts-alone "^deltafin: --rank0-experts no needs other ranks to own the experts" \
    "$ENG" logits --model "$MODELS/engine-moe" --tokens 1 --out "$T/x" --experts-by-rank --rank0-experts no
expect_error rank0-experts-bad "^deltafin: --rank0-experts expects yes or no, got 'maybe'" \
    "$ENG" logits --model "$MODELS/engine-moe" --tokens 1 --out "$T/x" --experts-by-rank --rank0-experts maybe

# ---- the sanitizer build under mpirun
if [ -n "$SAN" ] && [ -x "$SAN" ]; then
    # Open MPI's own leaks only: its MCA components and hwloc's plugins stay
    # loaded (preloaded) so that their frames are named; deltafin never calls asprintf (the one libc
    # frame suppressed).
    if git grep -q asprintf -- src; then bad no-asprintf "src/ calls asprintf: tests/mpi_lsan.supp would hide its leaks"; else ok no-asprintf; fi
    ASANLIB=$(ldd "$SAN" | awk '/libasan/{print $3}')
    PRE=$ASANLIB:$(ls /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_*.so /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so \
        /usr/lib/x86_64-linux-gnu/hwloc/hwloc_*.so 2>/dev/null | tr '\n' ':')
    SANENV=(-x LD_PRELOAD="$PRE" -x LSAN_OPTIONS=suppressions=$PWD/tests/mpi_lsan.supp:print_suppressions=0
            -x ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 -x UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
    M=$MODELS/engine-k3
    "$SAN" run --model "$M" --prompt-tokens $PROMPT --max-new 6 --temp 0 --print-ids "${COMMON[@]}" >"$T/want" 2>"$T/log"
    "${MPI[@]}" "${SANENV[@]}" -n 3 "$SAN" run --model "$M" --prompt-tokens $PROMPT --max-new 6 --temp 0 --print-ids \
        "${COMMON[@]}" --experts-by-rank --experts "$T/pack-engine-k3-{rank}" --expert-cache 60K >"$T/got" 2>"$T/log"
    rc=$?
    if [ $rc -eq 0 ] && ! grep -q "Sanitizer\|runtime error" "$T/log"; then same san-run-streamed-k3-ranks3 "$T/want" "$T/got"
    else bad san-run-streamed-k3-ranks3 "exit $rc: $(grep -m3 "ERROR\|SUMMARY\|runtime error\|deltafin:" "$T/log")"; fi
    M=$MODELS/engine-moe
    "$SAN" logits --model "$M" --tokens $PROMPT --out "$T/want" "${COMMON[@]}" 2>/dev/null
    "${MPI[@]}" "${SANENV[@]}" -n 2 "$SAN" logits --model "$M" --tokens $PROMPT --out "$T/got" "${COMMON[@]}" \
        --experts-by-rank --rank0-experts no >"$T/out" 2>"$T/log"
    rc=$?
    if [ $rc -eq 0 ] && ! grep -q "Sanitizer\|runtime error" "$T/log"; then same san-logits-moe-ranks2 "$T/want" "$T/got"
    else bad san-logits-moe-ranks2 "exit $rc: $(grep -m3 "ERROR\|SUMMARY\|runtime error\|deltafin:" "$T/log")"; fi
fi

finish
