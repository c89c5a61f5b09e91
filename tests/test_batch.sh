#!/usr/bin/env bash
# test_batch.sh ENGINE - `deltafin batch` on the demo model: 30 jobs (chat and
# completions, greedy and seeded or unseeded sampling, stop strings,
# penalties) and malformed lines (bad JSON, no custom_id, a bad url, a body the
# server refuses, a custom_id given twice). The output holds every custom_id
# exactly once in valid JSON lines, malformed lines as error lines; --parallel
# 1 and 4 write the same results; killed with SIGKILL at random moments again
# and again and restarted each time, it ends with the uninterrupted run's
# results and never leaves an incomplete line. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin}
MODEL=models/demo-moe
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh

$PY - "$T/jobs.jsonl" <<'EOF'
import json, sys
lines = []
for i in range(30):
    body = {"model": "demo", "max_tokens": 60 + (i * 37) % 90}
    if i % 5 == 0:
        body["messages"] = [{"role": "system", "content": "You write JavaScript."},
                            {"role": "user", "content": f"Task {i}: a function that"}]
        url = "/v1/chat/completions"
    else:
        body["prompt"] = f"// helper {i}\nfunction f{i}(a, b) {{\n  return"
        url = "/v1/completions"
    if i % 4 == 1: body["temperature"] = 0.8            # seed from the custom_id
    elif i % 4 == 2: body.update(temperature=1.0, seed=1000 + i)
    else: body["temperature"] = 0
    if i % 6 == 3: body["stop"] = ["}", ";\n"]
    if i % 7 == 4: body.update(presence_penalty=0.5, frequency_penalty=0.3)
    lines.append(json.dumps({"custom_id": f"job-{i:02d}", "method": "POST", "url": url, "body": body}))
lines.insert(3, '{"custom_id": "broken", "method": "POST", ')
lines.insert(8, json.dumps({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}))
lines.insert(13, json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}))
lines.insert(17, json.dumps({"custom_id": "bad-body", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "x", "n": 2}}))
lines.insert(21, "")
lines.insert(22, json.dumps({"custom_id": "twice", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "a", "max_tokens": 3}}))
lines.insert(25, json.dumps({"custom_id": "twice", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "b", "max_tokens": 3}}))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF

# check.py OUT [REF]: every line complete JSON, each key once, the jobs' and
# the malformed lines' results as expected, and (with REF) the same results
# as REF's but `created`
cat >"$T/check.py" <<'EOF'
import json, sys
def load(path):
    data = open(path, "rb").read()
    if data and not data.endswith(b"\n"):
        sys.exit("the last line is incomplete")
    out = {}
    for n, line in enumerate(data.decode().splitlines(), 1):
        o = json.loads(line)
        key = o["custom_id"] if o["custom_id"] is not None else o["id"]
        if key in out: sys.exit(f"line {n}: {key} twice")
        if o.get("response") and "body" in o["response"]:
            o["response"]["body"].pop("created", None)
            # what was reused depends on which jobs shared a session before: not part of the answer
            o["response"]["body"].get("usage", {}).pop("prompt_tokens_details", None)
        out[key] = o
    return out
got = load(sys.argv[1])
want = {f"job-{i:02d}" for i in range(30)} | {"broken", "bad-url", "bad-body", "twice"}
cids = {k for k in got if k.startswith(("job-", "bad", "twice"))}
if len(got) != len(want) + 1 or cids != want - {"broken"}:
    sys.exit(f"{len(got)} lines; keys {sorted(got)}")
for k, o in got.items():
    if k.startswith("job-"):
        r = o["response"]
        assert o["error"] is None and r["status_code"] == 200, (k, o)
        b = r["body"]
        assert b["choices"][0]["finish_reason"] in ("stop", "length"), (k, b)
        assert b["usage"]["completion_tokens"] >= 1, (k, b)
    elif k == "bad-body":
        assert o["response"]["status_code"] == 400 and o["response"]["body"]["error"]["param"] == "n", o
    else:
        assert o["response"] is None and o["error"]["code"] == "invalid_request", o
assert "lines 23, 26" in got["twice"]["error"]["message"], got["twice"]
assert sum(1 for o in got.values() if o["custom_id"] is None) == 2  # "broken" and the line without one
if len(sys.argv) > 2:
    ref = load(sys.argv[2])
    for k in ref:
        if ref[k] != got[k]: sys.exit(f"{k} differs:\n {json.dumps(ref[k])}\n {json.dumps(got[k])}")
EOF

run() { "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl" --threads 1 "$@"; }

if run --output "$T/ref.jsonl" --parallel 4 2>"$T/err" && $PY "$T/check.py" "$T/ref.jsonl"; then
    ok batch-uninterrupted
else
    bad batch-uninterrupted "$(tail -3 "$T/err")"
fi
grep -q "30 answered now, 5 error lines, 0 already there" "$T/err" && ok batch-summary \
    || bad batch-summary "$(cat "$T/err")"
# some job sampled and some stopped at a stop string: the test covers them
$PY - "$T/ref.jsonl" <<'EOF' && ok batch-covers || bad batch-covers "no stop-string end"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fin = [r["response"]["body"]["choices"][0]["finish_reason"] for r in rows if r["custom_id"] and r["custom_id"].startswith("job-")]
assert fin.count("stop") >= 1 and fin.count("length") >= 1
EOF

if run --output "$T/p1.jsonl" --parallel 1 2>"$T/err" && $PY "$T/check.py" "$T/p1.jsonl" "$T/ref.jsonl"; then
    ok batch-parallel-1-vs-4
else
    bad batch-parallel-1-vs-4 "$(tail -3 "$T/err")"
fi
# --draft lookup: every slot drafts inside the batch; the same results
if run --output "$T/spec.jsonl" --parallel 4 --draft lookup --draft-k 4 2>"$T/err" \
   && $PY "$T/check.py" "$T/spec.jsonl" "$T/ref.jsonl"; then
    ok batch-draft-lookup
else
    bad batch-draft-lookup "$(tail -3 "$T/err")"
fi

# the prompt cache: a second run in a new process restores the prompts the first
# stored (usage's cached_tokens) and answers the same
PC_CACHED='import json,sys; print(sum(json.loads(l)["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for l in open(sys.argv[1]) if json.loads(l).get("response") and json.loads(l)["response"]["status_code"] == 200))'
if run --output "$T/pc1.jsonl" --parallel 4 --prompt-cache "$T/pc" 2>"$T/err" \
   && run --output "$T/pc2.jsonl" --parallel 4 --prompt-cache "$T/pc" 2>>"$T/err" \
   && $PY "$T/check.py" "$T/pc2.jsonl" "$T/ref.jsonl" && $PY "$T/check.py" "$T/pc1.jsonl" "$T/ref.jsonl" \
   && [ "$($PY -c "$PC_CACHED" "$T/pc2.jsonl")" -gt "$($PY -c "$PC_CACHED" "$T/pc1.jsonl")" ] \
   && ls "$T/pc"/*.dfpc >/dev/null 2>&1; then
    ok batch-prompt-cache
else
    bad batch-prompt-cache "cached $($PY -c "$PC_CACHED" "$T/pc1.jsonl" 2>&1) then $($PY -c "$PC_CACHED" "$T/pc2.jsonl" 2>&1): $(tail -3 "$T/err")"
fi

# started again on a finished output: nothing to do, nothing written
cp "$T/ref.jsonl" "$T/again.jsonl"
run --output "$T/again.jsonl" 2>"$T/err"
cmp -s "$T/ref.jsonl" "$T/again.jsonl" && grep -q "0 answered now, 0 error lines, 35 already there" "$T/err" \
    && ok batch-rerun-noop || bad batch-rerun-noop "$(cat "$T/err")"

# an incomplete last line (a crash inside a write) is cut off and its job run again
head -c $(( $(stat -c %s "$T/ref.jsonl") - 40 )) "$T/ref.jsonl" >"$T/cut.jsonl"
if run --output "$T/cut.jsonl" 2>"$T/err" && $PY "$T/check.py" "$T/cut.jsonl" "$T/ref.jsonl" \
    && grep -q "1 answered now\|0 answered now, 1 error line" "$T/err"; then
    ok batch-cut-line
else
    bad batch-cut-line "$(tail -3 "$T/err")"
fi

# SIGKILL at random moments, started again until it finishes
RANDOM=7
kills=0 partial=0
for round in $(seq 1 60); do
    "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl" --threads 1 --output "$T/kill.jsonl" --parallel 4 \
        2>/dev/null &  # not through run(): the kill must reach deltafin itself
    pid=$!
    sleep "0.$(printf "%02d" $((RANDOM % 30 + 5)))"
    if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
    wait $pid 2>/dev/null
    rc=$?
    # never an incomplete line, whenever the kill came
    if [ -s "$T/kill.jsonl" ] && [ "$(tail -c 1 "$T/kill.jsonl" | od -An -c | tr -d ' ')" != '\n' ]; then
        partial=$((partial + 1))
    fi
    [ $rc -eq 0 ] && break
done
# on a loaded machine every round may be killed before its first answer: the
# last start runs to the end, so the kills above are what the resume must survive
if [ $rc -ne 0 ]; then
    "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl" --threads 1 --output "$T/kill.jsonl" --parallel 4 2>/dev/null
    rc=$?
fi
if [ $rc -eq 0 ] && [ $partial -eq 0 ] && [ $kills -ge 3 ] && $PY "$T/check.py" "$T/kill.jsonl" "$T/ref.jsonl"; then
    ok "batch-kill-resume ($kills kills)"
else
    bad batch-kill-resume "rc $rc after $kills kills, $partial incomplete last lines"
fi

expect_error batch-needs-io "^deltafin: --input FILE and --output FILE are required" \
    "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl"
expect_error batch-missing-input "^deltafin: --input: .*nope" \
    "$ENG" batch --model "$MODEL" --input "$T/nope" --output "$T/o.jsonl"
echo '{"not": "a result"}' >"$T/foreign.jsonl"
expect_error batch-foreign-output "^deltafin: --output .*line 1 is not a result line" \
    "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl" --output "$T/foreign.jsonl"
expect_error batch-parallel-range "--parallel" "$ENG" batch --model "$MODEL" --parallel 0
expect_error batch-draft-model "^deltafin: batch: --draft takes lookup only" \
    "$ENG" batch --model "$MODEL" --input "$T/jobs.jsonl" --output "$T/o2.jsonl" --draft "$MODEL"

finish
