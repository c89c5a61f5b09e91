#!/usr/bin/env node
// diff.js - the reference side of the tokenizer differential test: encodes edge
// cases and seeded random Unicode strings with @lenml/tokenizers (transformers.js'
// tokenizers, an implementation that is not ours; pinned in package.json here)
// for each tokenizer.json named on the command line, and writes
// {"NAME": [{"text": ..., "ids": [...]}, ...], ...} to stdout. tests/test_tokenizer_diff.c
// encodes the same texts with the engine and compares. Usage:
//   node tests/tok/diff.js ROOT NAME... > out.json   (ROOT: the repository)
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("./node_modules/@lenml/tokenizers");

const EDGE = [
  "", " ", "  ", "   x", "x   ", "\t\t\n \n\n  x", "a\n\n\n\nb", " \u00a0 \u3000 x\u2003y", "\r\n\r\nz",
  "1", "12", "123", "1234567", "12 345 6789.01", "\u0661\u0662\u0663\u0664", "x1y22z333w4444",
  "你好世界，这是一个测试。", "日本語のテキスト、カタカナとひらがな", "한국어 텍스트", "中文English混合123",
  "\u{1F600}\u{1F44D}\u{1F3FD} \u{1F468}\u200d\u{1F469}\u200d\u{1F467} \u{1F1EF}\u{1F1F5}",
  "e\u0301 a\u0308\u0323 \u0301x", "Z\u0324\u0354\u0367\u0311\u0313 ok", "caf\u00e9 cafe\u0301",
  "<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>x<\uff5cend\u2581of\u2581sentence\uff5c>",
  "<|im_start|>user\nhi<|im_end|>\n", "<think>\nhmm\n</think>\n\nok", "<|endoftext|><|im_end", "<\uff5cUser",
  "don't 'S 'll I'M we'Ve", "!!!...???", " ((x)) [[y]] {{z}}", "def f(x):\n    return x**2  # sq\n",
  "http://example.com/a?b=c&d=e", "\u00c4pfel \u00d6l \u00dcber \u01c5 \u1e9e", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
  "\u0915\u094d\u0937 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u3005\u3006\u3007 \u30fc\u30fc", "\u00bd \u2153 \u2460 \u00b2",
];

// Ranges assigned before Unicode 14, so that Unicode versions agree.
const RANGES = [
  [0x20, 0x7e, 8], [0x09, 0x0d, 2], [0xa0, 0xff, 2], [0x100, 0x24f, 1], [0x300, 0x36f, 2],
  [0x370, 0x3ff, 1], [0x400, 0x4ff, 1], [0x600, 0x6ff, 1], [0x900, 0x97f, 1], [0x2000, 0x206f, 1],
  [0x3000, 0x303f, 1], [0x3040, 0x30ff, 2], [0x4e00, 0x9fa5, 3], [0xac00, 0xd7a3, 1],
  [0xff00, 0xffef, 1], [0x1f300, 0x1f64f, 1], [0x30, 0x39, 3],
];
const WEIGHT = RANGES.reduce((s, r) => s + r[2], 0);

function rng(seed) {
  let s = BigInt(seed);
  return () => {
    s = (s * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
    return Number(s >> 33n) / 2 ** 31;
  };
}

function randomText(r) {
  const n = 1 + Math.floor(r() * 40);
  let out = "";
  for (let i = 0; i < n; i++) {
    let w = r() * WEIGHT, k = 0;
    while (w >= RANGES[k][2]) w -= RANGES[k++][2];
    const [lo, hi] = RANGES[k];
    const len = r() < 0.2 ? 1 + Math.floor(r() * 6) : 1; // runs of one range
    for (let j = 0; j < len; j++) out += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
  }
  return out;
}

const root = process.argv[2];
const out = {};
for (const name of process.argv.slice(3)) {
  const dir = path.join(root, "assets/tokenizers", name);
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"))),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"))),
  });
  const r = rng(20261202);
  const texts = EDGE.slice();
  for (let i = 0; i < 300; i++) texts.push(randomText(r));
  out[name] = texts.map((text) => ({ text, ids: Array.from(tok.encode(text, { add_special_tokens: false })) }));
}
process.stdout.write(JSON.stringify(out) + "\n");
