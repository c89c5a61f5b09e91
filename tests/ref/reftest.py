"""reftest - what the reference's own test scripts share.

Owns: the registry (`@test`), run in order by `main(prefix)` with one scratch
directory (`tmp(...)`) that is removed afterwards, each test's line ("ok NAME
(note)" or "FAIL NAME" and its traceback) and the closing "N passed, N failed"
that tests/run_all.sh counts; tiny checkpoints generated into the scratch
directory without a tokenizer (`gen`, and `suite_model` for a named suite's
arguments, once per name); and the two measures the scripts compare with
(`toks`, `rel_err`).
"""
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np

import gen_checkpoint

TESTS = []
_TMP = None
_MODELS = {}


def test(fn):
    TESTS.append(fn)
    return fn


def tmp(*parts):
    """A path in this run's scratch directory."""
    return os.path.join(_TMP, *parts)


def gen(name, *args):
    """Generates a checkpoint from gen_checkpoint's arguments under tmp(name)."""
    d = tmp(name)
    gen_checkpoint.generate(gen_checkpoint.parse_args(list(args) + ["--out", d, "--no-tokenizer"]))
    return d


def suite_model(suite, name):
    """suite[name]'s checkpoint (a dict of argument lists), generated once."""
    if name not in _MODELS:
        _MODELS[name] = gen(name, *suite[name])
    return _MODELS[name]


def toks(seed, n=64, vocab=1024):
    return [int(x) for x in np.random.default_rng(seed).integers(0, vocab, n)]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main(prefix):
    """Runs the registered tests; the exit status (1 if any failed)."""
    global _TMP
    _TMP = tempfile.mkdtemp(prefix=prefix)
    failed = 0
    try:
        for fn in TESTS:
            try:
                note = fn()
                print(f"ok   {fn.__name__}" + (f"  ({note})" if note else ""), flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {fn.__name__}", flush=True)
                traceback.print_exc(file=sys.stdout)
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)
    print(f"{len(TESTS) - failed} passed, {failed} failed")
    return 1 if failed else 0
