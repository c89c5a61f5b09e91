#!/usr/bin/python3
"""check_replay - routing replay (`--replay-routing`) against the numpy reference.

For each MoE model of the reference suite (norm_topk_prob on and off, MoE layers
interleaved with dense ones) and two of the DeepSeek-V3 family's (sigmoid scores
with groups and a correction bias, scaled; softmax, not renormalised), a seeded
random trace of the model's shape (fewer tokens than the sequence, so it wraps
around) goes through
    ENGINE bench logits --model DIR --tokens ... --out FILE --replay-routing TRACE
and through the reference with its router overridden the same way: row t of the
sequence uses trace token t mod n_tokens; each replayed id is weighted by the
router's own score for it (Qwen3: its softmax probability; the DeepSeek family:
its softmax or sigmoid score, scaled by routed_scaling_factor), renormalised over
the k ids when the model renormalises its top-k. Pass: the same tolerance as
check_model.py. The engine without replay, compared with the replayed reference,
must fail it (so the comparison can tell replayed routing from the router's own).

    check_replay.py --engine build/deltafin-san [--dir build/test-models]
Ends with "N passed, N failed".
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_model  # noqa: E402
import deepseek_ref  # noqa: E402
import qwen3_ref  # noqa: E402

MODELS = ["moe-bf16", "moe-sparse", "moe-sharded", "ds-v3", "ds-v2"]
N_TOKENS = 24
TRACE_TOKENS = 10


class ReplayRef(qwen3_ref.Qwen3Ref):
    def __init__(self, model_dir, trace):
        super().__init__(model_dir)
        self.trace = trace  # [n_tokens][moe layer][k]
        moe = [i for i in range(self.cfg.n_layers) if self.cfg.layer_is_moe(i)]
        self.moe_index = {layer: j for j, layer in enumerate(moe)}

    def route(self, i, h):
        c = self.cfg
        logits = h @ self.w(f"model.layers.{i}.mlp.gate.weight", (c.n_experts, c.hidden)).T
        probs = qwen3_ref.softmax(logits, axis=-1)
        T = h.shape[0]
        idx = np.array([self.trace[t % len(self.trace)][self.moe_index[i]] for t in range(T)])
        wts = np.take_along_axis(probs, idx, axis=-1)
        if c.norm_topk:
            wts = wts / np.sum(wts, axis=-1, keepdims=True)
        return idx, wts


class ReplayDeepseekRef(deepseek_ref.DeepseekRef):
    def __init__(self, model_dir, trace):
        super().__init__(model_dir)
        self.trace = trace
        moe = [i for i in range(self.cfg.n_layers) if self.cfg.layer_is_moe(i)]
        self.moe_index = {layer: j for j, layer in enumerate(moe)}

    def route(self, i, h):
        c = self.cfg
        logits = h @ self.w(f"model.layers.{i}.mlp.gate.weight").T
        T = h.shape[0]
        idx = np.array([self.trace[t % len(self.trace)][self.moe_index[i]] for t in range(T)])
        return idx, deepseek_ref.route_weights(c, deepseek_ref.scores(c, logits), idx)


def write_trace(path, trace, n_experts, k):
    with open(path, "w") as f:
        f.write("# moe-routing-trace v1\n# model: check_replay\n")
        f.write(f"# moe_layers: {len(trace[0])}  experts_per_layer: {n_experts}  top_k: {k}\n")
        for tok in trace:
            f.write(" ".join(",".join(str(e) for e in ids) for ids in tok) + "\n")


def engine_logits(engine, d, tokens, extra, tmp):
    out = os.path.join(tmp, "logits.bin")
    cmd = [engine, "bench", "logits", "--model", d, "--tokens", ",".join(map(str, tokens)), "--out", out] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
    return np.fromfile(out, dtype="<f4")


def check(engine, d, name, tmp):
    ref = (ReplayDeepseekRef if deepseek_ref.is_family(d) else ReplayRef)(d, [])
    c = ref.cfg
    rng = random.Random(name)
    n_moe = len(ref.moe_index)
    trace = [[rng.sample(range(c.n_experts), c.top_k) for _ in range(n_moe)] for _ in range(TRACE_TOKENS)]
    ref.trace = trace
    tpath = os.path.join(tmp, f"{name}.trace")
    write_trace(tpath, trace, c.n_experts, c.top_k)
    tokens = [rng.randrange(c.vocab) for _ in range(N_TOKENS)]
    want = ref.logits(tokens)
    ref.close()
    results = []
    for label, extra in (("", ["--replay-routing", tpath]),
                         ("-batch3", ["--replay-routing", tpath, "--batch", "3"])):
        eng = engine_logits(engine, d, tokens, extra, tmp).reshape(want.shape)
        ok, summ, _ = check_model.compare_logits(want, eng, check_model.DEFAULT_TOL)
        results.append((ok, f"{'PASS' if ok else 'FAIL'} replay-{name}{label} {summ}"))
    # the router's own routing must not pass against the replayed reference
    own = engine_logits(engine, d, tokens, [], tmp).reshape(want.shape)
    ok, summ, _ = check_model.compare_logits(want, own, check_model.DEFAULT_TOL)
    results.append((not ok, f"{'PASS' if not ok else 'FAIL'} replay-{name}-discriminates "
                            f"(own routing vs replayed reference: {summ})"))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--dir", default=os.path.join(check_model.REPO, "build", "test-models"))
    a = ap.parse_args()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            d = os.path.join(a.dir, "ref", name)
            try:
                check_model.ensure_model(d, check_model.SUITES["all"][name])
                res = check(a.engine, d, name, tmp)
            except Exception as e:  # noqa: BLE001 - reported as a failure
                res = [(False, f"FAIL replay-{name}: {e}")]
            for ok, line in res:
                print(line, flush=True)
                passed += ok
                failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
