#!/usr/bin/env bash
# test_tokenizer_diff.sh - the tokenizer differential test run live: node encodes
# the texts with @lenml/tokenizers (tests/tok, installed by scripts/setup.sh) and
# build/tests/test_tokenizer_diff checks the engine gives the same ids
# (DeepSeek-V3 and Qwen3 tokenizer.json). Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
pass=0 fail=0
out="$B/tok-diff.json"
if [ ! -d tests/tok/node_modules/@lenml/tokenizers ]; then
    echo "FAIL: tests/tok/node_modules missing (run scripts/setup.sh)"
    fail=1
elif ! node tests/tok/diff.js "$PWD" deepseek_v3 qwen3 > "$out"; then
    echo "FAIL: node tests/tok/diff.js"
    fail=1
elif DF_ROOT=$PWD DF_TOK_DIFF="$out" "$B/tests/test_tokenizer_diff" 2>&1 | grep -E 'texts encode|FAILED|got'; \
     [ "${PIPESTATUS[0]}" -eq 0 ]; then
    pass=1
else
    echo "FAIL: the engine's ids differ from @lenml/tokenizers'"
    fail=1
fi
echo "$pass passed, $fail failed"
