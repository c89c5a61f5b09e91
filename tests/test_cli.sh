#!/usr/bin/env bash
# test_cli.sh ENGINE - the command line as a user meets it: --help everywhere,
# tokenize round trips, and bad input (missing, truncated, hostile or
# inconsistent checkpoints, bad options, FIFOs, full disks, malformed packs)
# giving a one-line error that names the file or field, exit code 2, and no
# crash; speculative decoding and the expert cache's size. Each architecture
# family's and weight format's bad input: test_cli_families.sh.
# Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
MODELS=${DF_TEST_MODELS:-build/test-models}
GOOD=$MODELS/engine-dense
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh


copy_model() { rm -rf "$T/m"; cp -r "$GOOD" "$T/m"; }

for c in run inspect tokenize logits pack cache-sim serve batch bench; do
    if "$ENG" $c --help >"$T/out" 2>&1 && grep -q usage "$T/out"; then ok "help-$c"; else bad "help-$c" "no usage"; fi
done
"$ENG" --help >/dev/null 2>&1 && ok help-main || bad help-main "exit $?"
v=$("$ENG" --version 2>&1) && [[ "$v" =~ ^deltafin\ \(git\ [0-9a-f]{7,}(-dirty)?\)$|^deltafin\ \(git\ unknown\)$ ]] && ok version || bad version "'$v'"
for c in run logits serve; do
    if "$ENG" bench $c --help >"$T/out" 2>&1 && grep -q "usage: deltafin bench $c" "$T/out" \
       && grep -q -- "--replay-routing\|--prefetch-depth" "$T/out"; then ok "help-bench-$c"; else bad "help-bench-$c" "no usage"; fi
done
# the benchmark and test controls are under `deltafin bench` only: the product
# commands refuse them by name and say where they are
for o in "--replay-routing t" "--sim-disk 1" "--prefetch-depth 2" "--prefetch-min-recall 0.5" \
         "--prefetch-min-precision 0.5" "--draft-fixed 2" "--teacher-force 7" "--random-prompt 8" "--prompt-seed 3"; do
    expect_error "run-refuses-${o%% *}" "^deltafin: ${o%% *} is for benchmarks and tests only: it is under \`deltafin bench run\`" \
        "$ENG" run --model "$GOOD" --prompt-tokens 1 $o
done
expect_error logits-refuses-replay "^deltafin: --replay-routing is for benchmarks and tests only: it is under \`deltafin bench logits\`" \
    "$ENG" logits --model "$GOOD" --tokens 1 --out "$T/lg" --replay-routing t
expect_error serve-refuses-depth "^deltafin: --prefetch-depth is for benchmarks and tests only: it is under \`deltafin bench serve\`" \
    "$ENG" serve --model "$GOOD" --prefetch-depth 2
expect_error bench-serve-refuses-replay "replay-routing is for benchmarks and tests only: the server refuses it" \
    "$ENG" bench serve --model "$GOOD" --replay-routing t
expect_error flag-takes-no-value "^deltafin: --print-ids takes no value" "$ENG" run --model "$GOOD" --prompt-tokens 1 --print-ids=1
expect_error option-needs-value "^deltafin: --max-new needs a value" "$ENG" run --model "$GOOD" --prompt-tokens 1 --max-new
# --name=VALUE is --name VALUE, for every command's options
a=$("$ENG" run --model "$GOOD" --prompt-tokens 5,6 --max-new 4 --temp 0 --print-ids 2>&1)
b=$("$ENG" run --model="$GOOD" --prompt-tokens=5,6 --max-new=4 --temp=0 --print-ids 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && ok option-equals-value || bad option-equals-value "'$a' vs '$b'"
# `bench run` is run: the same tokens
b=$("$ENG" bench run --model "$GOOD" --prompt-tokens 5,6 --max-new 4 --temp 0 --print-ids 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && ok bench-run-is-run || bad bench-run-is-run "'$a' vs '$b'"

expect_error unknown-command "unknown command 'frobnicate'" "$ENG" frobnicate
expect_error unknown-option "unknown option '--bogus'" "$ENG" run --model "$GOOD" --bogus 1
expect_error bad-number "--max-new expects an integer" "$ENG" run --model "$GOOD" --prompt hi --max-new abc
expect_error missing-dir "/no/such/model" "$ENG" inspect --model /no/such/model

copy_model; echo '{"model_type": "qwen3", "hidden_size": ' >"$T/m/config.json"
expect_error malformed-config "config.json" "$ENG" inspect --model "$T/m"

copy_model; $PY - "$T/m/config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["model_type"] = "llama"; json.dump(c, open(p, "w"))
PYEOF
expect_error unsupported-arch "model_type 'llama'" "$ENG" inspect --model "$T/m"

copy_model; $PY - "$T/m/config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["hidden_size"] = "big"; json.dump(c, open(p, "w"))
PYEOF
expect_error config-wrong-type "hidden_size" "$ENG" inspect --model "$T/m"

copy_model; $PY - "$T/m/config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["intermediate_size"] += 16; json.dump(c, open(p, "w"))
PYEOF
expect_error shape-mismatch "mlp.*(shape|\\[)" "$ENG" inspect --model "$T/m"

st() { ls "$T/m"/*.safetensors | head -1; }
copy_model; f=$(st); truncate -s $(( $(stat -c %s "$f") - 100 )) "$f"
expect_error truncated-safetensors "$(basename "$f")" "$ENG" inspect --model "$T/m"

copy_model; f=$(st); printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of="$f" bs=1 count=8 conv=notrunc status=none
expect_error huge-header "$(basename "$f")" "$ENG" inspect --model "$T/m"

# rewrite one tensor's header entry (the data after the header stays as it is)
edit_header() { $PY - "$1" "$2" <<'PYEOF'
import json, struct, sys
path, how = sys.argv[1], sys.argv[2]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
names = sorted(k for k in h if k != "__metadata__")
if how == "dtype":
    h[names[0]]["dtype"] = "Q4_K"
elif how == "overlap":
    h[names[1]]["data_offsets"] = h[names[0]]["data_offsets"]
    h[names[1]]["shape"] = h[names[0]]["shape"]; h[names[1]]["dtype"] = h[names[0]]["dtype"]
elif how == "past-end":
    a, e = h[names[0]]["data_offsets"]; h[names[0]]["data_offsets"] = [a + 10**9, e + 10**9]
elif how == "drop":
    h.pop("model.norm.weight")
s = json.dumps(h, separators=(",", ":")).encode()
s += b" " * (-len(s) % 8)
open(path, "wb").write(struct.pack("<Q", len(s)) + s + bytes(b[8 + n:]))
PYEOF
}
copy_model; edit_header "$(st)" dtype
expect_error unknown-dtype "Q4_K" "$ENG" inspect --model "$T/m"
copy_model; edit_header "$(st)" overlap
expect_error overlapping-tensors "overlap" "$ENG" inspect --model "$T/m"
copy_model; edit_header "$(st)" past-end
expect_error offsets-past-end "$(basename "$(st)")" "$ENG" inspect --model "$T/m"
copy_model; edit_header "$(st)" drop
expect_error missing-tensor "model.norm.weight" "$ENG" inspect --model "$T/m"

copy_model; rm "$T/m/tokenizer.json"
expect_error missing-tokenizer "tokenizer.json" "$ENG" inspect --model "$T/m"
# without tokenizer.json, tiktoken.model is the tokenizer (Kimi's format)
copy_model; rm "$T/m/tokenizer.json"; $PY - "$T/m" <<'PYEOF'
import base64, json, sys
d = sys.argv[1]
lines = "".join("%s %d\n" % (base64.b64encode(bytes([b])).decode(), b) for b in range(256))
open(d + "/tiktoken.model", "w").write(lines + "aGk= 256\n")
json.dump({"added_tokens_decoder": {"257": {"content": "<|im_end|>", "special": True}}},
          open(d + "/tokenizer_config.json", "w"))
open(d + "/bad.model", "w").write(lines + "aG!= 256\n")
PYEOF
out=$("$ENG" tokenize --model "$T/m" --text "hi hi<|im_end|>" 2>&1)
case "$out" in *"256 32 256 257"*) ok tiktoken-tokenize ;; *) bad tiktoken-tokenize "$out" ;; esac
mv "$T/m/bad.model" "$T/m/tiktoken.model"
expect_error bad-tiktoken "tiktoken.model: line 257: bad base64" "$ENG" tokenize --model "$T/m" --text hi

# a working model: inspect, tokenize round trip, run
if "$ENG" inspect --model "$GOOD" >"$T/out" 2>&1 && grep -q "routed experts" "$T/out"; then ok inspect; else bad inspect "$(tail -3 "$T/out")"; fi
txt='Hello world, deltafin! 123 ünïcödé'
ids=$("$ENG" tokenize --model "$GOOD" --text "$txt" 2>&1)
back=$("$ENG" tokenize --model "$GOOD" --decode "$(echo "$ids" | tr ' ' ',')" 2>&1)
[ "$back" = "$txt" ] && ok tokenize-roundtrip || bad tokenize-roundtrip "'$ids' -> '$back'"
if "$ENG" run --model "$GOOD" --prompt-tokens 1,2,3 --max-new 5 --temp 0 --print-ids >"$T/out" 2>&1 \
   && [ "$(wc -w <"$T/out")" -eq 5 ]; then ok run-ids; else bad run-ids "$(cat "$T/out")"; fi
# special tokens: `tokenize` and plain prompts recognise them; with --chat the
# prompt and --system are message content, where their text is ordinary text
# (more prompt rows than "x", the template's own control tokens aside)
[ "$("$ENG" tokenize --model "$GOOD" --text '<|im_end|>' 2>&1)" = 151645 ] && ok tokenize-specials \
    || bad tokenize-specials "$("$ENG" tokenize --model "$GOOD" --text '<|im_end|>' 2>&1)"
chat_rows() { # ARGS... -> prompt rows of a --chat run on the demo model
    "$ENG" run --model models/demo-moe --chat --max-new 1 --temp 0 --events "$T/ev" "$@" >/dev/null 2>"$T/err" \
        && sed -n 's/^{"event":"prefill","rows":\([0-9]*\),.*/\1/p' "$T/ev"
}
rx=$(chat_rows --prompt x); re=$(chat_rows --prompt '<|im_end|>')
sx=$(chat_rows --prompt x --system x); se=$(chat_rows --prompt x --system '<|im_end|>')
[ -n "$rx" ] && [ -n "$re" ] && [ -n "$sx" ] && [ -n "$se" ] && [ "$re" -gt "$rx" ] && [ "$se" -gt "$sx" ] \
    && ok run-chat-specials-are-text \
    || bad run-chat-specials-are-text "prompt rows: $rx for x, $re for <|im_end|>; $sx, $se with --system: $(tail -1 "$T/err")"
# a dense model has nothing to stream: a budget it cannot fit in is refused, not ignored
expect_error dense-budget-too-small "ram-budget 20.0 MiB is too small" "$ENG" run --model "$GOOD" --prompt-tokens 1,2 --max-new 1 --ram-budget 20M
# a budget below 0.1 MiB is named with the decimals that show it (it read "0.0 MiB")
expect_error tiny-budget-named "ram-budget 0.0010 MiB is too small" "$ENG" run --model "$GOOD" --prompt-tokens 1,2 --max-new 1 --ram-budget 1K
expect_error run-token-out-of-vocab "outside the vocabulary" "$ENG" run --model "$GOOD" --prompt-tokens 999999 --max-new 1

# ---- count options: the context holds the prompt and every new token
MOE=$MODELS/engine-moe # a 512-token context
SPORT=$((19000 + $$ % 1000)) # serve tests that must fail before listening
ids_of() { "$ENG" run --model "$MOE" --prompt-tokens 1,2,3 --temp 0 --print-ids "$@" 2>"$T/err"; }
# --max-new 0: until a stop token or the context is full (said on stderr), plain and speculative alike
a=$(ids_of --max-new 0 --ctx 8); rc=$?
b=$(ids_of --max-new 0 --ctx 8 --draft lookup --draft-k 16 --lookup-n 16); rcb=$?
[ $rc -eq 0 ] && [ $rcb -eq 0 ] && [ "$(echo "$a" | wc -w)" -eq 5 ] && [ "$a" = "$b" ] \
    && grep -q "context (--ctx) of 8 tokens is full after 5 new tokens" "$T/err" && ok max-new-0-until-ctx \
    || bad max-new-0-until-ctx "exit $rc/$rcb: '$a' / '$b' $(head -c 300 "$T/err")"
# --max-new beyond the room (and --draft-k beyond it): the context's 5 tokens
a=$(ids_of --max-new 16777216 --ctx 8); rc=$?
b=$(ids_of --max-new 100 --ctx 8 --draft lookup --draft-k 16 --lookup-n 1)
[ $rc -eq 0 ] && [ "$(echo "$a" | wc -w)" -eq 5 ] && [ "$a" = "$b" ] && ok max-new-beyond-ctx \
    || bad max-new-beyond-ctx "'$a' / '$b' $(head -c 300 "$T/err")"
[ "$(ids_of --max-new 5 --ctx 8 | wc -w)" -eq 5 ] && [ ! -s "$T/err" ] && ok max-new-fits-ctx-quietly \
    || bad max-new-fits-ctx-quietly "$(head -c 300 "$T/err")"
expect_error ctx-no-room "prompt of 3 tokens leaves no room for a new token in the 3-token context \\(--ctx\\)" \
    "$ENG" run --model "$MOE" --prompt-tokens 1,2,3 --ctx 3
expect_error ctx-1 "leaves no room for a new token in the 1-token context \\(--ctx\\)" \
    "$ENG" run --model models/demo-moe --prompt hi --ctx 1
expect_error prompt-fills-model-ctx "512 tokens leaves no room for a new token in the model's 512-token context" \
    "$ENG" bench run --model "$MOE" --random-prompt 512
for c in "run --prompt-tokens 1" "logits --tokens 1 --out $T/lg"; do
    expect_error "ctx-above-model-${c%% *}" "--ctx 513 exceeds the model's context of 512 tokens" \
        "$ENG" $c --model "$MOE" --ctx 513
done
expect_error ctx-above-model-serve "--ctx 513 exceeds the model's context of 512 tokens" \
    timeout 30 "$ENG" serve --model "$MOE" --port $SPORT --ctx 513
expect_error logits-ctx-below-tokens "--ctx 2 is less than the 3 tokens of --tokens" \
    "$ENG" logits --model "$MOE" --tokens 1,2,3 --out "$T/lg" --ctx 2
# each out-of-range value refused by name; the edges in range work (--draft-k 16 and
# --lookup-n 16 above, with less room than that)
for ov in "max-new -1 16777217 99999999999" "ctx 0 -1 99999999999" "draft-k 0 17 99999999999" \
          "lookup-n 0 17 -3" "chunk 0 65537 99999999999" "threads 0 257 99999999999"; do
    o=${ov%% *}
    for v in ${ov#* }; do
        d=(); case $o in draft-k|lookup-n) d=(--draft lookup) ;; esac
        expect_error "range-$o-$v" "^deltafin: --$o expects an integer in" "$ENG" run --model "$MOE" \
            --prompt-tokens 1 "${d[@]}" --$o "$v"
    done
done
edges_ok=1
for e in "--ctx 4 --max-new 1 --chunk 1 --threads 1" "--ctx 512 --max-new 2 --chunk 65536 --threads 256" \
         "--max-new 3 --draft lookup --draft-k 1 --lookup-n 1"; do
    # shellcheck disable=SC2086
    ids_of $e >/dev/null || { edges_ok=0; bad "range-edge $e" "$(head -c 300 "$T/err")"; }
done
[ $edges_ok -eq 1 ] && ok range-edges-run
# --experts names directories: an empty list or entry is refused, run and serve alike
expect_error experts-empty "--experts '' names no directory" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --experts ""
expect_error experts-commas "--experts ',,,' names no directory" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --experts ",,,"
expect_error experts-empty-serve "--experts '' names no directory" \
    timeout 30 "$ENG" serve --model "$MOE" --port $SPORT --experts ""

# prefetch options: checked values, and the per-layer report under --stats
MOE=$MODELS/engine-moe
expect_error prefetch-bad-mode "unknown prefetch mode 'sometimes'" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --ram-budget 400M --prefetch sometimes
expect_error prefetch-bad-depth "--prefetch-depth expects an integer in 1..8" "$ENG" bench run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --prefetch-depth 0
expect_error prefetch-bad-recall "--prefetch-min-recall expects a number in" "$ENG" bench run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --prefetch-min-recall 1.5
expect_error prefetch-bad-precision "--prefetch-min-precision expects a number in" "$ENG" bench run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --prefetch-min-precision 0
if "$ENG" bench run --model "$MOE" --prompt-tokens 1,2,3 --max-new 8 --temp 0 --print-ids --expert-cache 300K \
       --prefetch on --prefetch-min-precision 0.2 --stats --events "$T/ev" >"$T/out" 2>"$T/err" \
   && grep -q "read precision: first  prev  ranks read" "$T/err" \
   && grep -q '"read_precision_first":' "$T/ev"; then ok prefetch-precision-stats; else bad prefetch-precision-stats "$(tail -5 "$T/err")"; fi
if "$ENG" bench run --model "$MOE" --prompt-tokens 1,2,3 --max-new 8 --temp 0 --print-ids --expert-cache 300K \
       --prefetch router --prefetch-depth 1 --stats --events "$T/ev" >"$T/out" 2>"$T/err" \
   && grep -q "^prefetch: router, depth 1" "$T/err" && grep -qE "^ +2 +router" "$T/err" \
   && grep -q '"event":"prefetch"' "$T/ev"; then ok prefetch-stats; else bad prefetch-stats "$(tail -5 "$T/err")"; fi
# ---- speculative decoding: same ids as plain decoding, resident and streamed
MOE=$MODELS/engine-moe
if "$ENG" pack --model "$MOE" --out "$T/pack" >"$T/pack.out" 2>&1; then
    spec_bad=0
    SLOT=--expert-cache; SLOTV=200K # a few slots: most expert uses read
    # the release build here (test_speculative runs these paths under the
    # sanitizers): 28 runs, a third of the time, and the optimised code's bits
    SPEC=$(dirname "$ENG")/deltafin; [ -x "$SPEC" ] || SPEC=$ENG
    # greedy, and sampling with a seed: the same ids either way
    for P in "5,17,300,5,17,300,5,17,42 --temp 0" "33,44,55,66,77,33,44,55,66,77,33,44 --temp 0.9 --seed 4"; do
        for src in resident streamed; do
            extra=(); [ $src = streamed ] && extra=(--experts "$T/pack" $SLOT $SLOTV)
            "$SPEC" run --model "$MOE" --threads 2 --prompt-tokens $P --max-new 40 --print-ids "${extra[@]}" >"$T/plain" 2>"$T/err" \
                || { bad "spec-plain-$src" "$(head -c 300 "$T/err")"; continue; }
            for d in lookup "$MOE" "$MODELS/engine-dense"; do
                for k in "--draft-fixed 3" "--draft-k 2 --lookup-n 1"; do
                    "$SPEC" bench run --model "$MOE" --threads 2 --prompt-tokens $P --max-new 40 --print-ids "${extra[@]}" \
                        --draft "$d" $k >"$T/spec" 2>"$T/err"
                    if ! cmp -s "$T/plain" "$T/spec"; then
                        spec_bad=1
                        bad "spec-identical" "prompt $P $src draft $(basename "$d") $k: $(cat "$T/spec") vs $(cat "$T/plain") $(head -c 200 "$T/err")"
                        continue 2
                    fi
                done
            done
        done
    done
    [ $spec_bad -eq 0 ] && ok spec-identical-run
    "$ENG" run --model "$MOE" --prompt-tokens 5,17,300,5,17,300,5,17 --max-new 30 --temp 0 --draft "$MOE" --stats >"$T/out" 2>"$T/err"
    if grep -q "^speculative (draft model): .*accepted" "$T/err" && grep -q "speed-up" "$T/err"; then ok spec-stats
    else bad spec-stats "$(tail -4 "$T/err")"; fi
    # rejection sampling: a seed reproduces at a fixed depth
    a=$("$ENG" bench run --model "$MOE" --prompt-tokens 5,17,300 --max-new 20 --temp 0.9 --seed 3 --print-ids --draft "$MODELS/engine-dense" --draft-rejection --draft-fixed 2 2>&1)
    b=$("$ENG" bench run --model "$MOE" --prompt-tokens 5,17,300 --max-new 20 --temp 0.9 --seed 3 --print-ids --draft "$MODELS/engine-dense" --draft-rejection --draft-fixed 2 2>&1)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok spec-rejection-seed || bad spec-rejection-seed "'$a' vs '$b'"
else
    bad spec-pack "$(tail -3 "$T/pack.out")"
fi
# a FIFO where an input file should be is refused as not a regular file, at
# once (opening it used to wait for a writer for ever)
copy_model; rm "$T/m/config.json"; mkfifo "$T/m/config.json"
expect_error fifo-config "config.json: not a regular file" timeout 20 "$ENG" run --model "$T/m" --prompt-tokens 1
copy_model; rm "$T/m/model.safetensors"; mkfifo "$T/m/model.safetensors"
expect_error fifo-safetensors "model.safetensors: not a regular file" timeout 20 "$ENG" inspect --model "$T/m"
if [ -f "$T/pack/experts.bin" ]; then
    rm -rf "$T/fpack"; cp -r "$T/pack" "$T/fpack"; rm "$T/fpack/experts.bin"; mkfifo "$T/fpack/experts.bin"
    expect_error fifo-pack "experts.bin is not a regular file" \
        timeout 20 "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --experts "$T/fpack"
fi
# a malformed manifest record names the column or part at fault
if [ -f "$T/pack/manifest.json" ]; then
    pk_rec() { # NAME PATTERN PYTHON-EDIT-OF-r (record 1)
        rm -rf "$T/mpack"; cp -r "$T/pack" "$T/mpack"
        $PY - "$T/mpack/manifest.json" "$3" <<'PYEOF'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); r = m["records"][1]
exec(sys.argv[2])
json.dump(m, open(p, "w"))
PYEOF
        expect_error "pack-record-$1" "manifest.json: record 1 is malformed: $2" \
            "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --experts "$T/mpack"
    }
    pk_rec layer "layer 99 is outside 0\.\." 'r[0] = 99'
    pk_rec nbytes "part 0 \('[a-z_.]*'\): nbytes [0-9]* is not what its BF16 shape holds" 'r[6][0][3] -= 1'
    pk_rec dtype "part 1 \('[a-z_.]*'\): unknown dtype 'BOGUS'" 'r[6][1][1] = "BOGUS"'
fi
mkfifo "$T/jobs.fifo"
expect_error fifo-batch-input "^deltafin: --input: .*jobs.fifo: not a regular file" \
    timeout 20 "$ENG" batch --model "$GOOD" --input "$T/jobs.fifo" --output "$T/res.jsonl"
# an option whose value would be ignored or is out of range is refused, naming it
expect_error temp-range "^deltafin: --temp expects a number >= 0, got '-1'" "$ENG" run --model "$GOOD" --prompt-tokens 1 --temp -1
expect_error top-p-range "^deltafin: --top-p expects a number in \(0, 1\], got '0'" "$ENG" run --model "$GOOD" --prompt-tokens 1 --top-p 0
expect_error io-bw-range "^deltafin: --io-bw expects a number >= 0, got '-1'" "$ENG" run --model "$GOOD" --prompt-tokens 1 --io-bw -1
expect_error system-needs-chat "^deltafin: --system needs --chat" "$ENG" run --model "$GOOD" --prompt hi --system s
expect_error tokenize-system-needs-chat "^deltafin: --system needs --chat" "$ENG" tokenize --model "$GOOD" --text hi --system s
expect_error pin-needs-experts "^deltafin: --pin needs --experts" "$ENG" run --model "$GOOD" --prompt-tokens 1 --pin 1M
expect_error prompt-cache-empty "^deltafin: --prompt-cache must not be empty" "$ENG" run --model "$GOOD" --prompt-tokens 1 --prompt-cache ""
expect_error prompt-tokens-empty-entry "^deltafin: --prompt-tokens: '1,,2' has an empty entry" \
    "$ENG" run --model "$GOOD" --prompt-tokens 1,,2
expect_error prompt-tokens-trailing "^deltafin: --prompt-tokens: '1,2,' has an empty entry" \
    "$ENG" run --model "$GOOD" --prompt-tokens 1,2,
expect_error value-is-option "^deltafin: --prompt needs a value \(got the option --stats" \
    "$ENG" run --model "$GOOD" --prompt --stats
# output lost to a full disk is an error, not exit 0
expect_error events-full "^deltafin: /dev/full: writing the events failed: No space left on device" \
    "$ENG" run --model "$GOOD" --prompt-tokens 1,2 --max-new 2 --events /dev/full
expect_error stdout-full "^deltafin: writing to standard output failed" \
    bash -c '"$0" run --model "$1" --prompt-tokens 1,2 --max-new 2 >/dev/full' "$ENG" "$GOOD"
# an empty entry in a list of real pack directories is refused too, not skipped
expect_error experts-empty-entry "--experts '$T/pack,': directory 2 of the list is empty" \
    "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 1 --experts "$T/pack,"
expect_error spec-vocab-mismatch "vocabulary of 512 tokens" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 2 --draft "$MODELS/draft-v512"
copy_model; $PY - "$T/m/tokenizer.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; t = json.load(open(p)); v = t["model"]["vocab"]
a = next(k for k, i in v.items() if i == 10); b = next(k for k, i in v.items() if i == 11)
v[a], v[b] = 11, 10
json.dump(t, open(p, "w"))
PYEOF
expect_error spec-tokenizer-mismatch "token id 10 differs" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 2 --draft "$T/m"
expect_error spec-missing-draft "/no/such/draft" "$ENG" run --model "$MOE" --prompt-tokens 1,2 --max-new 2 --draft /no/such/draft
expect_error spec-k-range "--draft-k expects an integer in 1..16" "$ENG" run --model "$MOE" --prompt-tokens 1 --draft lookup --draft-k 0
expect_error spec-k-needs-draft "need --draft" "$ENG" run --model "$MOE" --prompt-tokens 1 --lookup-n 2
expect_error spec-teacher "cannot be combined" "$ENG" bench run --model "$MOE" --prompt-tokens 1 --draft lookup --teacher-force 3
# --sim-disk: needs a pack; with one, the same ids and the bound's bandwidth in --stats
expect_error sim-disk-needs-pack "simulated disk needs a pack" "$ENG" bench run --model "$MOE" --prompt-tokens 1 --sim-disk 1
expect_error sim-disk-positive "--sim-disk expects a bandwidth" "$ENG" bench run --model "$MOE" --prompt-tokens 1 --sim-disk 0
a=$("$ENG" run --model "$MOE" --prompt-tokens 5,17,300 --max-new 12 --temp 0 --print-ids --experts "$T/pack" --expert-cache 200K 2>&1)
b=$("$ENG" bench run --model "$MOE" --prompt-tokens 5,17,300 --max-new 12 --temp 0 --print-ids --experts "$T/pack" --expert-cache 200K \
    --sim-disk 0.05 --stats 2>"$T/err")
[ -n "$a" ] && [ "$a" = "$b" ] && grep -q "I/O bound .* at 0.050 GB/s (simulated disk)" "$T/err" && ok sim-disk \
    || bad sim-disk "'$a' / '$b' $(grep -i bound "$T/err")"
# --teacher-force 0 is off: the model's own tokens (the drafters' baseline in bench)
a=$("$ENG" run --model "$MOE" --prompt-tokens 5,17,300 --max-new 12 --temp 0 --print-ids 2>&1)
b=$("$ENG" bench run --model "$MOE" --prompt-tokens 5,17,300 --max-new 12 --temp 0 --print-ids --teacher-force 0 2>&1)
c=$("$ENG" bench run --model "$MOE" --prompt-tokens 5,17,300 --max-new 12 --temp 0 --print-ids --teacher-force 5 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && ok teacher-force-off || bad teacher-force-off "'$a' / '$b' / '$c'"
if "$ENG" bench --model "$MOE" --random-prompt 8 --max-new 6 --teacher-force 0 --draft lookup >"$T/bench.json" 2>"$T/err"; then
    ok bench-draft-teacher-off
else
    bad bench-draft-teacher-off "$(tail -1 "$T/err")"
fi

# --ram-budget holds the draft model too (weights, KV cache, buffers): a budget
# the target alone fits in is refused, naming the draft, once the draft comes
# along; where both fit, the expert cache gets less than without the draft.
DM=models/demo-moe; DD=models/demo-draft
need_of() { sed -n 's/.*already need \([0-9.]*\) MiB.*/\1/p' "$T/err"; }
"$ENG" run --model "$DM" --prompt-tokens 1,2 --max-new 1 --ctx 256 --ram-budget 1M >/dev/null 2>"$T/err"; need0=$(need_of)
"$ENG" run --model "$DM" --prompt-tokens 1,2 --max-new 1 --ctx 256 --ram-budget 1M --draft "$DD" >/dev/null 2>"$T/err"
resv=$(sed -n 's/.* and \([0-9.]*\) MiB for the draft .*/\1/p' "$T/err")
if [ -z "$need0" ] || [ -z "$resv" ]; then
    bad spec-budget "no sizes in the budget errors: $(cat "$T/err")"
else
    mid=$($PY -c "print(int(($need0 + $resv / 2) * 1024))")K
    big=$($PY -c "print(int(($need0 + $resv + 16) * 1024))")K
    if "$ENG" run --model "$DM" --prompt-tokens 1,2 --max-new 2 --ctx 256 --ram-budget "$mid" >/dev/null 2>"$T/err"; then
        expect_error spec-budget-counts-draft "MiB for the draft $DD" "$ENG" run --model "$DM" --prompt-tokens 1,2 \
            --max-new 2 --ctx 256 --ram-budget "$mid" --draft "$DD"
    else
        bad spec-budget-target-alone "$mid: $(cat "$T/err")"
    fi
    cache_of() { $PY -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"summary\"' in l][0]['cache_bytes'])" "$1"; }
    "$ENG" run --model "$DM" --prompt-tokens 1,2,3 --max-new 4 --ctx 256 --ram-budget "$big" --temp 0 --print-ids \
        --events "$T/ev0" >"$T/o0" 2>"$T/err" &&
    "$ENG" run --model "$DM" --prompt-tokens 1,2,3 --max-new 4 --ctx 256 --ram-budget "$big" --temp 0 --print-ids \
        --draft "$DD" --events "$T/ev1" >"$T/o1" 2>>"$T/err" &&
    c0=$(cache_of "$T/ev0") && c1=$(cache_of "$T/ev1") && cmp -s "$T/o0" "$T/o1" && [ "$c1" -lt "$c0" ] \
        && ok spec-budget-cache-shrinks || bad spec-budget-cache-shrinks "cache ${c0:-?} vs ${c1:-?} with the draft: $(tail -2 "$T/err")"
fi

# ---- the expert cache's size: --experts without a budget takes every expert
# (or what the machine has), and no size wraps (an unlimited cache once became
# a negative slot count: "less than one expert"); --stats says what set it
DP=$T/demo-pack
if "$ENG" pack --model "$DM" --out "$DP" >"$T/out" 2>&1; then
    # cache_run NAME PATTERN [ENV=VALUE...] -- ARGS... : run exits 0 and --stats matches PATTERN
    cache_run() {
        local name=$1 pat=$2 envs=(); shift 2
        while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
        if env "${envs[@]}" "$ENG" run --model "$DM" --experts "$DP" --prompt hi --max-new 2 --stats "$@" \
               >"$T/out" 2>"$T/err" && grep -qE -- "$pat" "$T/err"; then ok "$name"
        else bad "$name" "$(grep -E 'deltafin:|memory' "$T/err" | head -2)"; fi
    }
    cache_run experts-no-budget "estimated .*; expert cache: all experts fit" --
    cache_run budget-400T "budget 400.0 TiB, estimated .*all experts fit" -- --ram-budget 400T
    cache_run budget-1000T "budget 1000.0 TiB, .*all experts fit" -- --ram-budget 1000T
    cache_run budget-1e18 "all experts fit" -- --ram-budget 1e18
    cache_run expert-cache-1e18 "all experts fit" -- --expert-cache 1e18
    cache_run pin-1e18 "all experts fit" -- --ram-budget 1e18 --pin 1e18
    cache_run no-budget-available "sized to the available memory \(160.0 MiB\)" DF_TEST_MEM_AVAILABLE=160M --
    cache_run budget-over-available "budget 400.0 TiB, .*sized to the available memory \(40.0 MiB\)" \
        DF_TEST_MEM_AVAILABLE=40M -- --ram-budget 400T
    DF_TEST_MEM_AVAILABLE=100M expect_error no-budget-no-memory \
        "no --ram-budget or --expert-cache given, and the memory available \(100.0 MiB.* less than one expert" \
        "$ENG" run --model "$DM" --experts "$DP" --prompt hi --max-new 2
    expect_error expert-cache-below-one "--expert-cache sets 0.0 MiB for the expert cache: less than one expert" \
        "$ENG" run --model "$DM" --experts "$DP" --prompt hi --max-new 2 --expert-cache 1K
    # serve opens the engine the same way: it starts and answers with a pack and no
    # budget, and with a budget its session is the one the budget was sized for
    SPORT=$((19000 + $$ % 1000))
    serve_ok() { # NAME ARGS...
        local name=$1 spid code=; shift
        "$ENG" serve --model "$DM" --threads 2 --port "$SPORT" --experts "$DP" "$@" >"$T/serve.log" 2>&1 &
        spid=$!
        for _ in $(seq 300); do
            code=$(curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' \
                   "http://127.0.0.1:$SPORT/v1/completions" --data-binary '{"prompt":"hi","max_tokens":2}')
            [ "$code" = 200 ] && break
            kill -0 "$spid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
        [ "$code" = 200 ] && ok "$name" || bad "$name" "HTTP ${code:-none}: $(head -c 300 "$T/serve.log")"
        SPORT=$((SPORT + 1))
    }
    serve_ok serve-experts-no-budget
    serve_ok serve-budget-400T --ram-budget 400T
    serve_ok serve-budget-ctx --ram-budget 64M --ctx 64
else
    bad demo-pack "$(tail -3 "$T/out")"
fi

finish
