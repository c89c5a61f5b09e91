#!/usr/bin/python3
"""check_demo - the shipped demo models (models/demo-moe, models/demo-draft) against
the code they were trained with.

Owns the `demo-models` part of `make test`. For each model directory:
  tokenizer  the engine (`deltafin tokenize`) and the training tokenizer
             (tools/demo_data.py) give identical ids on held-out text
             (tests/data/demo/heldout-sample.txt, cut from the held-out split);
  torch      the engine's logits (`deltafin logits`) on that text match the
             training code's own PyTorch forward pass (tools/demo_model.py, float32,
             on the BF16 weights as shipped): a third implementation, independent of
             the engine and of the float64 NumPy reference;
  mutant     the same comparison against an engine given rope_theta x10 must fail
             (the check can fail);
  reference  tests/ref/check_model.py (float64 NumPy reference: random-token logits
             and greedy decoding).

Tolerance for the torch comparison: both sides are float32 with different
summation orders (BLAS blocking vs the engine's 16-lane FMA order), so each dot
product differs by ~1e-7 relative; through 4 layers, 256-wide softmax and an
8192-way head this lands at ~1e-6 of max|logit| (measured: see docs/demo-models.md).
--tol 1e-4 leaves two orders of magnitude, while any semantic slip (rope layout,
a norm, expert order, routing renormalisation) moves logits by >1e-2 relative.
The argmax must agree on every row except near-ties (reference top-2 gap below
2 * tol * max|logit|). A router near-tie (top-k boundary gap < 1e-5) could flip
an expert legitimately; it is reported if it happens and the comparison then
falls back to the argmax alone.

    check_demo.py --engine build/deltafin-san [--models models/demo-moe,models/demo-draft]
Ends with "N passed, N failed"; exit status 0 iff all passed.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tests", "ref"))

TOL = 1e-4
MAX_TOKENS = 192
SAMPLE = os.path.join(REPO, "tests", "data", "demo", "heldout-sample.txt")


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {shlex.join(cmd)[:200]}: "
                           + p.stderr.decode(errors="replace").strip()[-300:])
    return p.stdout.decode()


def check_tokenizer(engine, model_dir, texts):
    import demo_data
    tok = demo_data.Tokenizer(os.path.join(model_dir, "tokenizer.json"))
    n = 0
    for i, t in enumerate(texts):
        want = tok.encode(t)
        got = [int(x) for x in run(engine + ["tokenize", "--model", model_dir, "--text", t]).split()]
        if got != want:
            k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]),
                     min(len(got), len(want)))
            return False, (f"text {i}: engine and training tokenizer differ at token {k}: "
                           f"engine {got[k:k + 5]} python {want[k:k + 5]}")
        n += len(want)
    return True, f"{len(texts)} texts, {n} ids identical"


def check_torch(engine, model_dir, ids, engine_dir=None):
    """engine_dir: what the engine loads (default model_dir); the mutant check gives
    it a deliberately altered copy."""
    import numpy as np
    import torch
    import demo_model
    torch.set_num_threads(1)
    m = demo_model.load_model(model_dir)
    with torch.no_grad():
        ref, _ = m(torch.tensor([ids]))
    ref = ref[0].double().numpy()
    gap_min = 1.0
    if m.c.moe:
        # The smallest gap between the k-th and (k+1)-th router probability: a
        # legitimately flippable expert choice if tiny.
        with torch.no_grad():
            hs = []
            m(torch.tensor([ids]), hidden_out=hs)
            for L, layer in enumerate(m.layers):
                x = hs[L]
                h = x + layer.self_attn(layer.input_layernorm(x),
                                        *demo_model.rope_cos_sin(m.c, len(ids)),
                                        torch.full((len(ids), len(ids)), float("-inf")).triu(1))
                p = torch.softmax(layer.mlp.gate(layer.post_attention_layernorm(h)).float(), -1)
                top = torch.topk(p[0], m.c.top_k + 1, -1).values
                gap_min = min(gap_min, float((top[:, -2] - top[:, -1]).min()))
    with tempfile.TemporaryDirectory(prefix="df-demo-") as tmp:
        out = os.path.join(tmp, "l.f32")
        run(engine + ["logits", "--model", engine_dir or model_dir, "--tokens", ",".join(map(str, ids)),
                      "--out", out])
        eng = np.fromfile(out, dtype="<f4")
    V = m.c.vocab
    if eng.size != len(ids) * V:
        return False, f"engine wrote {eng.size} floats, expected {len(ids)}*{V}"
    eng = eng.reshape(len(ids), V).astype(np.float64)
    if not np.all(np.isfinite(eng)):
        return False, "non-finite engine logits"
    scale = float(np.abs(ref).max())
    rel = float(np.abs(eng - ref).max()) / scale
    ra, ea = ref.argmax(1), eng.argmax(1)
    bad = [t for t in np.nonzero(ra != ea)[0] if ref[t, ra[t]] - ref[t, ea[t]] > 2 * TOL * scale]
    summ = (f"{len(ids)} tokens: max|diff|/max|logit| = {rel:.2e} (tol {TOL:g}), "
            f"argmax {len(ids) - int((ra != ea).sum())}/{len(ids)}")
    if m.c.moe:
        summ += f", min router top-k gap {gap_min:.1e}"
    if bad:
        return False, summ + f"; argmax differs at row {bad[0]}"
    if rel > TOL:
        if gap_min < 1e-5:
            return False, summ + " > tol (a router near-tie may explain it)"
        return False, summ + " > tol"
    return True, summ


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--models", default="models/demo-moe,models/demo-draft")
    ap.add_argument("--sample", default=SAMPLE)
    a = ap.parse_args(argv)
    engine = shlex.split(a.engine)
    texts = [t.strip() for t in open(a.sample, encoding="utf-8").read().split("\n\n\n") if t.strip()]
    passed = failed = 0

    def report(ok, name, line):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} {name} {line}", flush=True)
        if ok:
            passed += 1
        else:
            failed += 1

    try:
        import torch  # noqa: F401
        import regex  # noqa: F401
    except ImportError as e:
        print(f"FAIL demo-models: {e} (scripts/setup.sh installs python3-torch, python3-regex)")
        print("0 passed, 1 failed")
        return 1
    import check_model
    for md in filter(None, a.models.split(",")):
        md = os.path.join(REPO, md) if not os.path.isabs(md) else md
        name = os.path.basename(md)
        if not os.path.exists(os.path.join(md, "config.json")):
            report(False, name, f"{md}: no config.json")
            continue
        for what, fn in (("tokenizer", lambda: check_tokenizer(engine, md, texts)),
                         ("torch", None)):
            try:
                if what == "torch":
                    import demo_data
                    tok = demo_data.Tokenizer(os.path.join(md, "tokenizer.json"))
                    ids = tok.encode(texts[0])[:MAX_TOKENS]
                    ok, line = check_torch(engine, md, ids)
                else:
                    ok, line = fn()
            except Exception as e:  # a broken model or engine is a failure to report
                ok, line = False, f"{type(e).__name__}: {e}"
            report(ok, f"{name} {what}", line)
        # The comparison must be able to fail: the engine gets a copy whose only
        # change is rope_theta (x10); torch keeps the shipped config.
        try:
            import demo_data
            tok = demo_data.Tokenizer(os.path.join(md, "tokenizer.json"))
            ids = tok.encode(texts[0])[:MAX_TOKENS]
            with tempfile.TemporaryDirectory(prefix="df-demo-mut-") as mut:
                for f in os.listdir(md):
                    if f != "config.json":
                        os.symlink(os.path.join(md, f), os.path.join(mut, f))
                cfg = json.load(open(os.path.join(md, "config.json")))
                cfg["rope_theta"] = cfg["rope_theta"] * 10
                json.dump(cfg, open(os.path.join(mut, "config.json"), "w"))
                bad, line = check_torch(engine, md, ids, engine_dir=mut)
            report(not bad, f"{name} mutant", ("detected: " if not bad else "NOT detected: ") + line)
        except Exception as e:
            report(False, f"{name} mutant", f"{type(e).__name__}: {e}")
        ok, line = check_model.check_model(md, a.engine, name=f"{name} reference")
        print(line, flush=True)
        if ok:
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
