"""quant_suite - the quantized suite's checkpoints, for the tests of the weight formats.

Owns: check_model.FORMATS_SUITE's checkpoints generated once into the test run's
scratch directory (`suite_model`), each one's BF16 twin (the same seed and draws,
stored unquantized: `bf16_twin`), and the float64 reference over them
(`load_ref`, `vocab`). Used by test_quant_ref.py and test_quant_suite.py.
"""
import numpy as np

import check_model
import reftest

SUITE = check_model.FORMATS_SUITE
_TWINS = {}


def suite_model(name):
    return reftest.suite_model(SUITE, name)


def bf16_twin(name):
    """The suite model's arguments without quantization: the same seed, the same
    draws, stored BF16."""
    if name not in _TWINS:
        args = list(SUITE[name])
        for flag in ("--quant", "--quant-experts", "--quant-dense", "--fp8-scale-fmt"):
            while flag in args:
                i = args.index(flag)
                del args[i:i + 2]
        _TWINS[name] = reftest.gen(name + "-bf16", *args)
    return _TWINS[name]


def load_ref(d, dtype=np.float64):
    return check_model.load_ref(d, dtype)


def vocab(d):
    m = load_ref(d)
    m.close()
    return m.cfg.vocab
