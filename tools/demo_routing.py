#!/usr/bin/python3
"""demo_routing - routing facts of the trained demo MoE, for docs/demo-routing.md.

Owns: running the shipped BF16 demo model (tools/demo_model.py, float32 torch) over
held-out text, recording its routing as a trace in the engine's format
("# moe-routing-trace v1", src/experts/trace.h), and measuring per MoE layer:

  usage      share of the routed slots each expert received; entropy (bits; the
             maximum is log2(experts)), the largest and smallest share, and how
             many experts take half the slots;
  reuse      fraction of a token's layer-L experts that the previous token (same
             sequence) also used in layer L;
  predict    recall of layer L+1's experts predicted from the residual stream
             leaving layer L (before L+1's attention) by applying L+1's own
             post_attention_layernorm and router: |predicted top-k & actual| / k;
             chance is k / experts.

The trace is then replayed with `deltafin cache-sim` (the project's policy, LRU,
Belady) at the given cache fractions; those hit rates are the engine's numbers,
everything else is this tool's.

    demo_routing.py --model models/demo-moe --tokens build/demo/tokens \
        --engine build/deltafin --trace build/demo/heldout.trace --out build/demo/routing.json
"""

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import demo_model  # noqa: E402


@torch.no_grad()
def collect(m, seqs):
    """-> (actual [N, L, k], predicted-for-layer [N, L, k] (layer 0 unused), seq ids [N])."""
    acts, preds, sid = [], [], []
    for s, ids in enumerate(seqs):
        hs = []
        m(torch.tensor([ids]), hidden_out=hs)
        a = torch.stack([L.mlp.last[1] for L in m.layers], 1)       # [T, L, k]
        p = torch.zeros_like(a)
        for li in range(1, len(m.layers)):
            layer = m.layers[li]
            y = layer.post_attention_layernorm(hs[li][0])
            p[:, li] = layer.mlp.route(y)[2]
        acts.append(a)
        preds.append(p)
        sid.extend([s] * len(ids))
    return torch.cat(acts).numpy(), torch.cat(preds).numpy(), np.array(sid)


def usage_stats(act, E):
    out = []
    for li in range(act.shape[1]):
        cnt = np.bincount(act[:, li].reshape(-1), minlength=E).astype(np.float64)
        sh = cnt / cnt.sum()
        nz = sh[sh > 0]
        srt = np.sort(sh)[::-1]
        half = int(np.searchsorted(np.cumsum(srt), 0.5) + 1)
        out.append({"layer": li, "entropy_bits": round(float(-(nz * np.log2(nz)).sum()), 3),
                    "max_share": round(float(srt[0]), 4), "min_share": round(float(srt[-1]), 4),
                    "experts_for_half": half, "unused": int((cnt == 0).sum())})
    return out


def reuse_stats(act, sid, k):
    same = sid[1:] == sid[:-1]
    out = []
    for li in range(act.shape[1]):
        cur, prev = act[1:, li][same], act[:-1, li][same]
        hit = np.array([len(set(c) & set(p)) for c, p in zip(cur, prev)])
        out.append(round(float(hit.mean() / k), 4))
    return out


def predict_stats(act, pred, k):
    out = [None]
    for li in range(1, act.shape[1]):
        hit = np.array([len(set(a) & set(p)) for a, p in zip(act[:, li], pred[:, li])])
        out.append(round(float(hit.mean() / k), 4))
    return out


def write_trace(path, act, sid, model_name, E, k):
    L = act.shape[1]
    with open(path, "w") as f:
        f.write("# moe-routing-trace v1\n")
        f.write(f"# model: {model_name}\n")
        f.write(f"# moe_layers: {L} (model layers 0..{L - 1})  experts_per_layer: {E}  top_k: {k}\n")
        f.write("# recorded by tools/demo_routing.py (torch, BF16 weights) on held-out text\n")
        for t in range(len(act)):
            if t and sid[t] != sid[t - 1]:
                f.write("\n")
            f.write(" ".join(",".join(str(int(e)) for e in act[t, li]) for li in range(L)) + "\n")


def cache_sim(engine, trace, fraction):
    p = subprocess.run([engine, "cache-sim", "--trace", trace, "--fraction", str(fraction),
                        "--policy", "all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       check=True)
    return p.stdout.decode().strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="dir with <corpus>.heldout.npy")
    ap.add_argument("--engine", default="build/deltafin")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--per-corpus", type=int, default=8192, help="held-out tokens per corpus")
    ap.add_argument("--fractions", default="0.10,0.25")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    m = demo_model.load_model(a.model)
    E, k = m.c.experts, m.c.top_k
    seqs = []
    for name in ("moby-dick", "sotu"):
        s = np.load(os.path.join(a.tokens, f"{name}.heldout.npy")).astype(np.int64)[:a.per_corpus]
        seqs += [s[i:i + a.seq].tolist() for i in range(0, len(s) - a.seq + 1, a.seq)]
    act, pred, sid = collect(m, seqs)
    write_trace(a.trace, act, sid, f"deltafin demo-moe ({os.path.basename(a.model)})", E, k)
    res = {"tokens": int(len(act)), "sequences": len(seqs), "experts": E, "top_k": k,
           "chance_overlap": k / E, "usage": usage_stats(act, E),
           "reuse_prev_token": reuse_stats(act, sid, k),
           "predict_next_layer_recall": predict_stats(act, pred, k),
           "max_entropy_bits": math.log2(E), "cache_sim": {}}
    for fr in a.fractions.split(","):
        res["cache_sim"][fr] = cache_sim(a.engine, a.trace, float(fr))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    sys.exit(main())
