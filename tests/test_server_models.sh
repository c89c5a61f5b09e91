#!/usr/bin/env bash
# test_server_models.sh ENGINE - `deltafin serve` with other models and across restarts:
# a DeepSeek-V3 (tokenizer.json, the real vocabulary) and a Kimi K2 (tiktoken.model)
# behind the server with the official openai client; the prompt cache across a restart
# and its RAM tier; prefix reuse on a Kimi K3-shaped model, whose recurrent state
# returns only to kept positions. The rest of the server is tests/test_server.sh.
# Ends with "N passed, N failed"; exits non-zero on any failure.
. "$(dirname "$0")/server/lib.sh"

# ---- the DeepSeek-V3 family: a DeepSeek-V3 (tokenizer.json, the real vocabulary) and a
# Kimi K2 (tiktoken.model) behind the server: the official client's chat and completions,
# streamed and not; greedy chat equal to `deltafin run --chat`; special-token text in a
# message is plain text (more prompt tokens than "x"), while a raw completions prompt
# keeps it one control token
FMODELS=${DF_TEST_MODELS:-build/test-models}
PORT6=$((PORT + 4000))
# fam_server NAME DIR X_TOKENS SPECIAL...: X_TOKENS the prompt tokens of a user "x" (empty:
# unchecked); each SPECIAL the text of one control token. As text, a special is two or
# more tokens: a message of k of them costs at least 2k tokens where "x" costs one.
fam_server() {
    local name=$1 dir=$2 nx=$3 s px pu ps sx pc fs rc=0 all; shift 3
    [ -f "$dir/config.json" ] || { bad "$name" "$dir missing: run tests/make_test_models.sh"; return; }
    MODEL=$dir start_server "$T/$name.log" "$PORT6" --ctx 1024 || { bad "$name-serve" "did not start"; return; }
    fs=$SPID
    local U=http://127.0.0.1:$PORT6
    if [ -d tests/server/node_modules/openai ]; then
        node tests/server/client.mjs "$U/v1" "$name-" >"$T/node6.out" 2>&1
        while read -r w n rest; do
            case $w in ok) ok "$n" ;; FAIL) bad "${n%:}" "$rest" ;; esac
        done <"$T/node6.out"
        grep -qE '^(ok|FAIL) ' "$T/node6.out" || bad "$name-node-client" "$(tail -5 "$T/node6.out")"
    else
        bad "$name-node-client" "tests/server/node_modules missing: run scripts/setup.sh"
    fi
    post /v1/chat/completions '{"model":"m","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}' >/dev/null
    "$ENG" run --model "$dir" --threads 2 --chat --prompt Hello --max-new 8 --temp 0 >"$T/run6" 2>&1
    $PY - "$T/body" "$T/run6" <<'EOF' && ok "$name-chat-exact" || bad "$name-chat-exact" "server chat differs from deltafin run --chat (see above)"
import json, sys
d = json.load(open(sys.argv[1]))
got = d["choices"][0]["message"]["content"].encode()
run = open(sys.argv[2], "rb").read()[:-1]
ok = got == run and d["usage"]["completion_tokens"] >= 1 and d["object"] == "chat.completion"
if not ok: print("server:", got, d.get("usage"), "\nrun:   ", run)
sys.exit(0 if ok else 1)
EOF
    px=$(prompt_tokens /v1/chat/completions "$(chat_one user x)")
    sx=$(prompt_tokens /v1/chat/completions "$(chat_one system x)")
    [ -n "$px" ] && { [ -z "$nx" ] || [ "$px" = "$nx" ]; } && ok "$name-chat-template-tokens" \
        || bad "$name-chat-template-tokens" "a user 'x' costs '$px' prompt tokens (want $nx)"
    all=$(printf '%s' "$@")
    for s in "$@" "$all"; do
        local k=1; [ "$s" = "$all" ] && k=$#
        pu=$(prompt_tokens /v1/chat/completions "$(chat_one user "$s")")
        ps=$(prompt_tokens /v1/chat/completions "$(chat_one system "$s")")
        [ -n "$pu" ] && [ -n "$ps" ] && [ "$pu" -ge $((px - 1 + 2 * k)) ] && [ "$ps" -ge $((sx - 1 + 2 * k)) ] \
            && ok "$name-specials-are-text-$s" \
            || bad "$name-specials-are-text-$s" "prompt_tokens: user x $px, '$s' $pu; system x $sx, '$s' $ps"
    done
    pc=$(prompt_tokens /v1/completions "{\"model\":\"m\",\"prompt\":\"$1\",\"max_tokens\":1,\"temperature\":0}")
    [ "$pc" = 1 ] && ok "$name-completions-keep-specials" || bad "$name-completions-keep-specials" "prompt_tokens $pc (want 1)"
    # the test tokenizer names 256 specials past the Kimi model's 1024 rows: a prompt with one is a 400
    [ "$name" = kimi ] && expect kimi-prompt-past-vocab 400 prompt /v1/completions \
        '{"model":"m","prompt":"a<|reserved_token_1100|>","max_tokens":1}'
    kill -TERM "$fs"; wait "$fs" || rc=$?
    PIDS=("${PIDS[@]/$fs}")
    [ $rc -eq 0 ] && ! grep -qE 'Sanitizer|runtime error' "$T/$name.log" && ok "$name-shutdown" \
        || bad "$name-shutdown" "exit $rc: $(grep -hE -A12 'Sanitizer|runtime error' "$T/$name.log" | head -30)"
    PORT6=$((PORT6 + 1))
}
# DeepSeek-V3: <｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜> is 4 tokens
fam_server ds "$FMODELS/engine-ds-chat" 4 '<｜end▁of▁sentence｜>' '<｜User｜>' '<｜Assistant｜>' '<｜begin▁of▁sentence｜>'
fam_server kimi "$FMODELS/engine-kimi" "" '<|im_end|>' '<|im_assistant|>' '<|im_middle|>'

# ---- prompt cache: a restarted server restores the prompt from disk (usage's
# prompt_tokens_details.cached_tokens, the same text), a later turn resumes, and a
# prompt the session no longer holds comes back from the RAM tier (/metrics)
PORT7=$((PORT + 5000))
U7=http://127.0.0.1:$PORT7
SYS=$(printf 'You are a careful assistant who answers in short sentences. %.0s' $(seq 30))
pc_turn() { node tests/server/pcache.mjs "$U7/v1" "$1" "$2"; } # SYSTEM USER -> JSON line
pc_field() { $PY -c "import json,sys; print(json.loads(sys.argv[1]).get('$2'))" "$1"; }
pc_metric() { curl -s "$U7/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
if [ -d tests/server/node_modules/openai ]; then
    start_server "$T/pc1.log" "$PORT7" --ctx 2048 --parallel 1 --prompt-cache "$T/pc" --prompt-cache-every 64 \
        || bad pcache-serve "did not start"
    a=$(pc_turn "$SYS" "Name a colour.")
    kill -TERM "$SPID"; wait "$SPID"; PIDS=("${PIDS[@]/$SPID}")
    start_server "$T/pc2.log" "$PORT7" --ctx 2048 --parallel 1 --prompt-cache "$T/pc" --prompt-cache-every 64 \
        || bad pcache-serve "did not start again"
    b=$(pc_turn "$SYS" "Name a colour.")
    np=$(pc_field "$a" prompt)
    if [ "$(pc_field "$a" cached)" = 0 ] && [ "$(pc_field "$a" stream_cached)" = $((np - 1)) ] \
       && [ "$(pc_field "$b" cached)" = $((np - 1)) ] && [ "$(pc_field "$b" text)" = "$(pc_field "$a" text)" ] \
       && [ "$(pc_field "$b" stream_text)" = "$(pc_field "$a" text)" ] && [ "$np" -gt 200 ]; then
        ok pcache-restart
    else
        bad pcache-restart "before: $a; after: $b"
    fi
    [ "$(pc_metric deltafin_prompt_cache_hits_total)" = 1 ] && [ "$(pc_metric deltafin_prompt_cache_tokens_restored_total)" = $((np - 1)) ] \
        && [ "$(pc_metric deltafin_prompt_cache_bytes_read_total)" -gt 0 ] \
        && ok pcache-metrics || bad pcache-metrics "$(curl -s "$U7/metrics" | grep -E 'prompt_cache|cached')"
    # another system prompt, then the first again: from the RAM tier, no disk read (one
    # slot, so the other prompt takes the session: with more, each keeps its own)
    c=$(pc_turn "Be terse." "Name a colour.")
    read0=$(pc_metric deltafin_prompt_cache_bytes_read_total)
    d=$(pc_turn "$SYS" "Name a colour.")
    if [ "$(pc_field "$d" cached)" = $((np - 1)) ] && [ "$(pc_field "$d" text)" = "$(pc_field "$a" text)" ] \
       && [ "$(pc_metric deltafin_prompt_cache_ram_hits_total)" -ge 1 ] \
       && [ "$(pc_metric deltafin_prompt_cache_bytes_read_total)" = "$read0" ]; then
        ok pcache-ram-tier
    else
        bad pcache-ram-tier "$c / $d: $(curl -s "$U7/metrics" | grep -E 'prompt_cache')"
    fi
    kill -TERM "$SPID"; rc=0; wait "$SPID" || rc=$?; PIDS=("${PIDS[@]/$SPID}")
    [ $rc -eq 0 ] && ! grep -qE 'Sanitizer|runtime error' "$T/pc1.log" "$T/pc2.log" && ok pcache-shutdown \
        || bad pcache-shutdown "exit $rc: $(grep -hE -A12 'Sanitizer|runtime error' "$T/pc1.log" "$T/pc2.log" | head -30)"
    # --prompt-cache-ram 0: no RAM tier, so the same prompt comes back from disk
    start_server "$T/pc3.log" "$PORT7" --ctx 2048 --parallel 1 --prompt-cache "$T/pc" --prompt-cache-every 64 \
        --prompt-cache-ram 0 || bad pcache-ram-0 "did not start"
    pc_turn "Be terse." "Name a colour." >/dev/null
    read0=$(pc_metric deltafin_prompt_cache_bytes_read_total)
    e=$(pc_turn "$SYS" "Name a colour.")
    if [ "$(pc_field "$e" cached)" = $((np - 1)) ] && [ "$(pc_field "$e" text)" = "$(pc_field "$a" text)" ] \
       && [ "$(pc_metric deltafin_prompt_cache_ram_hits_total)" = 0 ] \
       && [ "$(pc_metric deltafin_prompt_cache_ram_bytes)" = 0 ] \
       && [ "$(pc_metric deltafin_prompt_cache_bytes_read_total)" -gt "$read0" ]; then
        ok pcache-ram-0
    else
        bad pcache-ram-0 "$e: $(curl -s "$U7/metrics" | grep -E 'prompt_cache')"
    fi
    kill -TERM "$SPID"; wait "$SPID"; PIDS=("${PIDS[@]/$SPID}")
else
    bad pcache-restart "tests/server/node_modules missing: run scripts/setup.sh"
fi

# ---- prefix reuse with recurrent state: a Kimi K3-shaped model (KDA layers,
# whose state rolls back only to kept positions; df_generate keeps each
# prompt's end). A conversation extended turn by turn reuses the whole earlier
# prompt (deltafin_prompt_tokens_reused_total grows by at least its length),
# and every answer equals a fresh server's: server B answers the same requests
# latest first, so that nothing it holds is a prefix it could reuse (its
# counter stays 0). Asking again for the same turn reuses what was kept.
PORT8=$((PORT + 5100))
K3M=$FMODELS/engine-k3
if MODEL=$K3M start_server "$T/k3a.log" "$PORT8" --ctx 1024 && K3A=$SPID &&
   MODEL=$K3M start_server "$T/k3b.log" "$((PORT8 + 1))" --ctx 1024; then
    K3B=$SPID
    $PY - "http://127.0.0.1:$PORT8" "http://127.0.0.1:$((PORT8 + 1))" >"$T/k3.out" 2>&1 <<'PYEOF'
import json, re, sys, urllib.request
A, B = sys.argv[1], sys.argv[2]

def chat(url, msgs):
    body = {"model": "m", "messages": msgs, "max_tokens": 12, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    d = json.load(urllib.request.urlopen(req, timeout=120))
    return d["choices"][0]["message"]["content"], d["usage"]["prompt_tokens"]

def reused(url):
    m = re.search(r"^deltafin_prompt_tokens_reused_total (\d+)$",
                  urllib.request.urlopen(url + "/metrics", timeout=30).read().decode(), re.M)
    return int(m.group(1))

def check(name, cond, why):
    print(f"ok {name}" if cond else f"FAIL {name}: {why}")

turn1 = [{"role": "user", "content": "Hello"}]
a1, n1 = chat(A, turn1)
r = reused(A)
turn2 = turn1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And then?"}]
a2, n2 = chat(A, turn2)
d2 = reused(A) - r
check("k3-reuse-extends", n1 <= d2 < n2, f"reused {d2} of {n2} prompt tokens (want the first prompt's {n1})")
a2b, _ = chat(A, turn2)  # the same turn again: back to a kept position at or before its end
r3 = reused(A)
check("k3-reuse-again", 0 < r3 - r - d2 < n2, f"reused {r3 - r - d2} of {n2}")
turn3 = turn2 + [{"role": "assistant", "content": a2}, {"role": "user", "content": "Why?"}]
a3, n3 = chat(A, turn3)
d3 = reused(A) - r3
check("k3-reuse-extends-again", n2 <= d3 < n3, f"reused {d3} of {n3} prompt tokens (want the second prompt's {n2})")
f3, m3 = chat(B, turn3)
f2, m2 = chat(B, turn2)
check("k3-fresh-server", reused(B) == 0, f"the fresh server reused {reused(B)} tokens")
check("k3-reuse-exact", (a2, n2) == (f2, m2) and a2b == f2 and (a3, n3) == (f3, m3),
      f"with reuse {[a2, a2b, a3]!r}, fresh {[f2, f3]!r} (prompts {n2}, {n3} vs {m2}, {m3})")
# the answers depend on the conversation (a state that carried nothing would not tell)
check("k3-answers-differ", len({a1, a2, a3}) == 3, f"{[a1, a2, a3]!r}")
PYEOF
    while read -r w n rest; do
        case $w in ok) ok "$n" ;; FAIL) bad "${n%:}" "$rest" ;; esac
    done <"$T/k3.out"
    grep -qE '^(ok|FAIL) ' "$T/k3.out" || bad k3-reuse "$(tail -5 "$T/k3.out")"
    for p in "$K3A" "$K3B"; do kill -TERM "$p"; done
    rc8=0; wait "$K3A" || rc8=$?
    wait "$K3B" || rc8=$?
    PIDS=("${PIDS[@]/$K3A}"); PIDS=("${PIDS[@]/$K3B}")
    [ $rc8 -eq 0 ] && ! grep -qE 'Sanitizer|runtime error' "$T/k3a.log" "$T/k3b.log" && ok k3-shutdown \
        || bad k3-shutdown "exit $rc8: $(grep -hE -A12 'Sanitizer|runtime error' "$T/k3a.log" "$T/k3b.log" | head -30)"
else
    bad k3-reuse "servers did not start"
fi

finish
