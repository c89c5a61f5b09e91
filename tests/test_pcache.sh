#!/usr/bin/env bash
# test_pcache.sh ENGINE - the prompt cache across processes: a second run with
# the same directory restores the prompt (--stats shows the hit) and prints the
# same tokens; two processes writing one directory at once (with a size cap
# that makes them evict each other's files) leave only whole, valid files; a
# full disk (a small tmpfs, where the machine lets us mount one) turns writing
# off with one warning and the run succeeds; option errors. Ends with
# "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
MODELS=${DF_TEST_MODELS:-build/test-models}
T=$(mktemp -d)
MNT=
cleanup() { [ -n "$MNT" ] && umount "$MNT" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
. tests/lib.sh

ids() { # ids N SEED: N comma-separated token ids
    awk -v n="$1" -v s="$2" 'BEGIN { for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
        printf "%s%d", (i ? "," : ""), s % 1000 } }'
}
P=$(ids 120 1)
run() { # run MODEL DIR PROMPT [options]: token ids on stdout, stats on stderr
    local m=$1 d=$2 p=$3; shift 3
    "$ENG" run --model "$MODELS/$m" --prompt-tokens "$p" --max-new 6 --temp 0 --print-ids \
        --prompt-cache "$d" --prompt-cache-every 32 --stats "$@"
}

# ---- across processes, every family ----
for m in engine-dense engine-moe engine-ds engine-kimi-linear engine-k3; do
    want=$("$ENG" run --model "$MODELS/$m" --prompt-tokens "$P" --max-new 6 --temp 0 --print-ids 2>/dev/null)
    a=$(run $m "$T/$m" "$P" 2>"$T/err1")
    b=$(run $m "$T/$m" "$P" 2>"$T/err2")
    if [ -n "$want" ] && [ "$a" = "$want" ] && [ "$b" = "$want" ] \
       && grep -q "prompt cache: hits 0 misses 1" "$T/err1" \
       && grep -q "prompt cache: hits 1 misses 0, 119 tokens restored" "$T/err2"; then
        ok "restart-$m"
    else
        bad "restart-$m" "'$want' / '$a' / '$b': $(grep -h 'prompt cache' "$T/err1" "$T/err2")"
    fi
done
# a longer prompt sharing the first one restores it and evaluates the rest
P2="$P,$(ids 20 9)"
want=$("$ENG" run --model "$MODELS/engine-k3" --prompt-tokens "$P2" --max-new 6 --temp 0 --print-ids 2>/dev/null)
b=$(run engine-k3 "$T/engine-k3" "$P2" 2>"$T/err")
# the longest cached prefix: the first run's end of generation (120 + 5 new)
# does not match P2; its prompt end (119) does
if [ "$b" = "$want" ] && grep -q "hits 1 misses 0, 119 tokens restored" "$T/err"; then ok longer-prompt
else bad longer-prompt "'$want' vs '$b': $(grep 'prompt cache' "$T/err")"; fi

# ---- two writers on one directory ----
D=$T/shared
for round in 1 2 3; do
    run engine-k3 "$D" "$(ids 100 $round),$(ids 60 2$round)" --prompt-cache-size 200K >/dev/null 2>"$T/w1" &
    p1=$!
    run engine-k3 "$D" "$(ids 100 $round),$(ids 70 3$round)" --prompt-cache-size 200K >/dev/null 2>"$T/w2" &
    p2=$!
    wait $p1; r1=$?
    wait $p2; r2=$?
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] || bad "writers-$round" "exit $r1 / $r2: $(cat "$T/w1" "$T/w2" | head -5)"
done
size=$(du -sb "$D" | cut -f1)
n_tmp=$(find "$D" -name '.tmp-*' | wc -l)
if [ "$size" -le $((200 * 1024 + 4096)) ] && [ "$n_tmp" -eq 0 ]; then ok writers-cap; else bad writers-cap "size $size, $n_tmp temporary files"; fi
# every file left is valid: restoring each prompt removes nothing and gives the uncached tokens
good=1
for round in 1 2 3; do
    for x in 2 3; do
        p="$(ids 100 $round),$(ids $((x == 2 ? 60 : 70)) $x$round)"
        want=$("$ENG" run --model "$MODELS/engine-k3" --prompt-tokens "$p" --max-new 6 --temp 0 --print-ids 2>/dev/null)
        got=$(run engine-k3 "$D" "$p" --prompt-cache-size 200K 2>"$T/err")
        if [ "$got" != "$want" ] || grep -q "removed" "$T/err"; then
            good=0; bad "writers-valid-$round-$x" "'$want' vs '$got': $(grep -h 'warning' "$T/err" | head -3)"
        fi
    done
done
[ $good -eq 1 ] && ok writers-valid

# ---- a full disk ----
MNT=$T/small
mkdir -p "$MNT"
if mount -t tmpfs -o size=64k tmpfs "$MNT" 2>/dev/null; then
    want=$("$ENG" run --model "$MODELS/engine-k3" --prompt-tokens "$P" --max-new 6 --temp 0 --print-ids 2>/dev/null)
    got=$(run engine-k3 "$MNT/pc" "$P" 2>"$T/err"); rc=$?
    n_warn=$(grep -c "no more states are written there" "$T/err")
    if [ $rc -eq 0 ] && [ "$got" = "$want" ] && [ "$n_warn" -eq 1 ] && grep -q "writing turned off" "$T/err" \
       && [ "$(find "$MNT/pc" -name '.tmp-*' | wc -l)" -eq 0 ]; then
        ok full-disk
    else
        bad full-disk "exit $rc, '$want' vs '$got', $n_warn warnings: $(head -c 400 "$T/err")"
    fi
else
    MNT=
    echo "SKIP full-disk: cannot mount a tmpfs here (test_pcache's injected failure covers it)"
fi

# ---- options ----
expect_error size-needs-dir "^deltafin: --prompt-cache-size and --prompt-cache-every need --prompt-cache" \
    "$ENG" run --model "$MODELS/engine-dense" --prompt-tokens 1 --prompt-cache-size 1M
touch "$T/file"
expect_error not-a-dir "prompt cache: .*file' is not a directory" \
    "$ENG" run --model "$MODELS/engine-dense" --prompt-tokens 1 --prompt-cache "$T/file"
expect_error ram-is-serve-only "unknown option '--prompt-cache-ram' for this command" \
    "$ENG" run --model "$MODELS/engine-dense" --prompt-tokens 1 --prompt-cache "$T/d" --prompt-cache-ram 1M
finish
