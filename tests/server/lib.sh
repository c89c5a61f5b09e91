# tests/server/lib.sh - what the server tests (tests/test_server.sh,
# tests/test_server_models.sh) share, sourced first: the engine ($1), a scratch
# directory T whose servers the EXIT trap stops, the small synthetic Qwen3-MoE
# checkpoint MODEL, start_server, and the request helpers against the server at $U.
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
PY=/usr/bin/python3
T=$(mktemp -d)
PORT=$((18000 + $$ % 1000))
PORT2=$((PORT + 1000))
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
. tests/lib.sh
# A smaller ASan quarantine keeps the RSS measurement about the server itself.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}:quarantine_size_mb=16"
unset DELTAFIN_API_KEY # the servers below require a key only where they say so

MODEL=$T/model
$PY tools/gen_checkpoint.py --out "$MODEL" --arch qwen3_moe --vocab 151936 --hidden 64 --intermediate 128 \
    --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --experts 8 --top-k 2 --moe-intermediate 32 \
    --tie-embeddings 1 --seed 3 --max-pos 16384 >"$T/gen.log" 2>&1 || { cat "$T/gen.log"; echo "0 passed, 1 failed"; exit 1; }

# start_server LOG PORT ARGS... ; sets SPID; waits for /health
start_server() {
    local log=$1 port=$2; shift 2
    "$ENG" ${SERVE:-serve} --model "$MODEL" --threads 2 --port "$port" "$@" >"$log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    for _ in $(seq 150); do
        curl -s -o /dev/null "http://127.0.0.1:$port/health" && return 0
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server did not start:"; cat "$log"; return 1
}

# post PATH BODY -> $T/body, prints status
post() { curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "$U$1" --data-binary "$2"; }
jq_py() { $PY -c "import json,sys; d=json.load(open('$T/body')); print($1)" 2>/dev/null; }

# prompt_tokens PATH BODY -> usage.prompt_tokens, empty on an error
prompt_tokens() {
    [ "$(post "$1" "$2")" = 200 ] && jq_py 'd["usage"]["prompt_tokens"]'
}
chat_one() { echo "{\"model\":\"m\",\"messages\":[{\"role\":\"$1\",\"content\":\"$2\"}],\"max_tokens\":1,\"temperature\":0}"; }

# expect NAME STATUS PARAM PATH BODY: an OpenAI error of that status naming PARAM
expect() {
    local name=$1 want=$2 param=$3 path=$4 body=$5 st
    st=$(post "$path" "$body")
    local got; got=$(jq_py 'd["error"]["param"]')
    if [ "$st" != "$want" ]; then bad "$name" "status $st (want $want): $(head -c 300 "$T/body")"
    elif [ -n "$param" ] && [ "$got" != "$param" ]; then bad "$name" "param '$got' (want $param)"
    elif [ "$(jq_py 'd["error"]["type"]')" = "" ]; then bad "$name" "not an OpenAI error: $(head -c 200 "$T/body")"
    else ok "$name"; fi
}
