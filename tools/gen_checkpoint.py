#!/usr/bin/python3
"""gen_checkpoint - writes a random-weight Hugging Face Qwen3 / Qwen3-MoE / DeepSeek-V3 / Kimi-Linear family checkpoint.

Owns: the synthetic models the tests and benchmarks run. Output is a checkpoint
directory as the hub lays it out: config.json, generation_config.json,
model.safetensors (or model-0000i-of-0000N.safetensors shards plus
model.safetensors.index.json), tokenizer.json and tokenizer_config.json.

Tensors are generated and written one at a time (in row chunks) so multi-GB
checkpoints never sit in memory. Every tensor draws from its own generator seeded
by (seed, crc32(name)), so a tensor's values do not depend on sharding, dtype
layout order or which other tensors exist.

The DeepSeek-V3 family (deepseek_v2, deepseek_v3, kimi_k2, and the Kimi K2.5
wrapper) lives in gen_deepseek.py: its config fields and tensor plan; the
Kimi-Linear family (kimi_linear, and the Kimi K3 wrapper kimi_k3: KDA + NoPE MLA,
latent MoE, SiTU, attention residuals) in gen_kimi_linear.py. Weights in
the shipped 8- and 4-bit formats (--quant fp8 | int4 | mxfp4, --quant-experts,
--quant-dense) come from gen_quant.py: the quantizers, companion tensors and
quantization_config.

Init: projections are N(0, gain/sqrt(fan_in)) so activations stay O(1) through the
layers, norm weights are 1 + N(0, 0.1), the lm_head gives logits a spread of a few
units, and router weights are large enough that top-k routing differs between
tokens. The point is a non-degenerate model: distinct argmaxes, varied routing.

    python3 tools/gen_checkpoint.py --arch qwen3_moe --layers 2 --out build/m
"""

import argparse
import re
import json
import math
import os
import shutil
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import safetensors_np as st  # noqa: E402
import gen_deepseek as ds  # noqa: E402
import gen_kimi_linear as kl  # noqa: E402
import gen_quant as gq  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DTYPES = {"bf16": ("BF16", "bfloat16"), "f16": ("F16", "float16"), "f32": ("F32", "float32")}
QWEN3_BOS = 151643
QWEN3_EOS = [151645, 151643]   # <|im_end|>, <|endoftext|>
CHUNK_ELEMS = 1 << 22          # generation chunk (elements); bounds memory per tensor
POOL_ELEMS = 1 << 22           # --fast-init pool size
POOL_MIN = 1 << 16             # --fast-init: smaller tensors are drawn normally


def parse_kv_spec(spec):
    """'yarn:factor=4,original_max_position_embeddings=32' -> rope_scaling dict."""
    if spec in (None, "", "none"):
        return None
    kind, _, rest = spec.partition(":")
    out = {"rope_type": kind}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise SystemExit(f"--rope-scaling: '{item}' is not key=value")
        k = k.strip()
        v = v.strip()
        if v.lower() in ("true", "false"):
            out[k] = v.lower() == "true"
        elif k.endswith("max_position_embeddings"):
            out[k] = int(v)
        else:
            out[k] = float(v)
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["qwen3", "qwen3_moe"] + list(ds.ARCHS) + list(kl.ARCHS),
                   default="qwen3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=0, help="0: hidden/heads")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-intermediate", type=int, default=32)
    p.add_argument("--decoder-sparse-step", type=int, default=1)
    p.add_argument("--mlp-only-layers", default="", help="comma list, e.g. 0,2")
    p.add_argument("--norm-topk-prob", type=int, choices=[0, 1], default=1)
    p.add_argument("--tie-embeddings", type=int, choices=[0, 1], default=0)
    p.add_argument("--rope-theta", type=float, default=None,
                   help="default 1e6 (qwen3), 1e4 (deepseek), 5e4 (kimi_k2)")
    p.add_argument("--rope-scaling", default="none",
                   help="none | linear:factor=2 | dynamic:factor=2 | "
                        "yarn:factor=4,original_max_position_embeddings=32[,beta_fast=..,"
                        "beta_slow=..,attention_factor=..,mscale=..,mscale_all_dim=..,truncate=false]")
    p.add_argument("--rope-legacy-key", action="store_true",
                   help='write rope_scaling {"type": ...} (older configs) instead of "rope_type"')
    p.add_argument("--max-pos", type=int, default=4096)
    p.add_argument("--rms-eps", type=float, default=None,
                   help="default 1e-6 (1e-5 for kimi_linear / kimi_k3)")
    p.add_argument("--max-shard-size", type=int, default=0, help="bytes; 0 = one file")
    p.add_argument("--bos-id", default="auto",
                   help="auto: Qwen3's 151643 if inside the vocab, else none; 'none'; or an id")
    p.add_argument("--eos-ids", default="auto",
                   help="auto: Qwen3's 151645,151643 if inside the vocab, else none; 'none'; or ids")
    p.add_argument("--tokenizer-dir", default=None,
                   help="default assets/tokenizers/qwen3 (qwen3 archs; both files required) or "
                        "assets/tokenizers/<arch> if present (deepseek family; files copied if present)")
    p.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    p.add_argument("--fast-init", action="store_true",
                   help="fill big tensors from a shared random pool at random offsets "
                        "(GB/s; for benchmark checkpoints, not for correctness tests)")
    p.add_argument("--match-trace", metavar="TRACE",
                   help="shape the MoE layers after a routing trace (# moe-routing-trace v1) so "
                        "`deltafin bench run --replay-routing TRACE` accepts it: --experts, --top-k and "
                        "--layers from its header; model layers before the trace's first MoE layer "
                        "(\"model layers a..b\") become dense via mlp_only_layers")
    p.add_argument("--sparse", action="store_true",
                   help="tensors are holes of zero bytes (sparse files): full-size real shapes for "
                        "layout checks with `deltafin inspect`, not for running")
    p.add_argument("--out", required=True)
    ds.add_args(p)
    kl.add_args(p)
    gq.add_args(p)
    a = p.parse_args(argv)
    if a.match_trace:
        match_trace(p, a)
    gq.check_args(p, a)
    a.deepseek = a.arch in ds.ARCHS
    a.kimi_linear = a.arch in kl.ARCHS
    if a.rms_eps is None:
        a.rms_eps = 1e-5 if a.kimi_linear else 1e-6
    if a.kimi_linear:
        return kl.check_args(p, a)
    if a.deepseek:
        return parse_deepseek(p, a)
    qwen3_defaults(p, a)
    if a.head_dim == 0:
        if a.hidden % a.heads:
            p.error("--hidden not divisible by --heads; give --head-dim")
        a.head_dim = a.hidden // a.heads
    if a.heads % a.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    if a.head_dim % 2:
        p.error("--head-dim must be even (rotary halves)")
    a.mlp_only = [int(x) for x in a.mlp_only_layers.split(",") if x.strip()]
    a.rope = parse_kv_spec(a.rope_scaling)
    if a.rope and a.rope_legacy_key:
        a.rope = {"type" if k == "rope_type" else k: v for k, v in a.rope.items()}
    # Tiny test models have a vocab far below Qwen3's special ids; a config whose
    # bos/eos point past the vocab is invalid, so "auto" leaves them out there.
    if a.bos_id == "auto":
        a.bos = QWEN3_BOS if QWEN3_BOS < a.vocab else None
    else:
        a.bos = None if a.bos_id == "none" else int(a.bos_id)
    if a.eos_ids == "auto":
        a.eos = [e for e in QWEN3_EOS if e < a.vocab]
    else:
        a.eos = [] if a.eos_ids == "none" else [int(x) for x in a.eos_ids.split(",") if x.strip()]
    if a.arch == "qwen3_moe" and a.experts > 0 and not (1 <= a.top_k <= a.experts):
        p.error("--top-k must be in [1, experts]")
    return a


def qwen3_defaults(p, a):
    if a.rope_theta is None:
        a.rope_theta = 1000000.0
    if a.tokenizer_dir is None:
        a.tokenizer_dir = os.path.join(REPO, "assets", "tokenizers", "qwen3")
    if a.wrap_language_model:
        p.error("--wrap-language-model: deepseek family only")


def parse_deepseek(p, a):
    """The DeepSeek-V3 family's arguments: shipped special ids when they fit the
    vocab, rope_scaling under the legacy "type" key as the shipped configs write it."""
    ds.check_args(p, a)
    a.rope = parse_kv_spec(a.rope_scaling)
    if a.rope:
        a.rope = {"type" if k == "rope_type" else k: v for k, v in a.rope.items()}
    bos, eos = ds.SPECIAL_IDS[a.arch]
    if a.bos_id == "auto":
        a.bos = bos if bos < a.vocab else None
    else:
        a.bos = None if a.bos_id == "none" else int(a.bos_id)
    if a.eos_ids == "auto":
        a.eos = [e for e in eos if e < a.vocab]
    else:
        a.eos = [] if a.eos_ids == "none" else [int(x) for x in a.eos_ids.split(",") if x.strip()]
    if a.tokenizer_dir is None:
        # DeepSeek-V2's tokenizer has V3's format; Kimi K2's is made from Llama 3's
        own = os.path.join(REPO, "assets", "tokenizers", a.arch)
        a.tokenizer_dir = own if os.path.isdir(own) or a.arch != "deepseek_v2" else \
            os.path.join(REPO, "assets", "tokenizers", "deepseek_v3")
    a.test_tiktoken = a.arch == "kimi_k2" and not a.no_tokenizer and \
        not os.path.exists(os.path.join(a.tokenizer_dir, "tiktoken.model"))
    if a.test_tiktoken:
        n_ranks = ds.test_tiktoken_ranks(a.vocab)
        if a.bos_id == "auto" and a.bos is None:
            a.bos = n_ranks
        if a.eos_ids == "auto" and not a.eos:
            a.eos = [n_ranks + 1]
    a.mlp_only = []
    return a


def match_trace(p, a):
    """Reads a trace's header (the lines before its first token) into the MoE shape."""
    hdr = {}
    with open(a.match_trace, encoding="utf-8") as f:
        if f.readline().strip() != "# moe-routing-trace v1":
            p.error(f"{a.match_trace}: not a moe-routing-trace v1 file")
        for line in f:
            if not line.startswith("#"):
                break
            m = re.search(r"moe_layers:\s*(\d+)(?:\s*\(model layers (\d+)\.\.(\d+)\))?", line)
            if m:
                hdr["layers"] = int(m.group(1))
                hdr["first"] = int(m.group(2)) if m.group(2) else 0
            for key in ("experts_per_layer", "top_k"):
                m = re.search(key + r":\s*(\d+)", line)
                if m:
                    hdr[key] = int(m.group(1))
    for key in ("layers", "experts_per_layer", "top_k"):
        if key not in hdr:
            p.error(f"{a.match_trace}: header gives no {key if key != 'layers' else 'moe_layers'}")
    a.arch = "qwen3_moe"
    a.experts, a.top_k = hdr["experts_per_layer"], hdr["top_k"]
    a.layers = hdr["first"] + hdr["layers"]
    a.decoder_sparse_step = 1
    a.mlp_only_layers = ",".join(str(i) for i in range(hdr["first"]))


def layer_is_moe(cfg, i):
    """Qwen3-MoE's rule: sparse iff experts exist, the layer is not listed in
    mlp_only_layers, and (i+1) is a multiple of decoder_sparse_step."""
    if cfg.get("model_type") != "qwen3_moe":
        return False
    return (i not in cfg.get("mlp_only_layers", [])
            and cfg.get("num_experts", 0) > 0
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def build_config(a):
    torch_dtype = DTYPES[a.dtype][1]
    cfg = {
        "architectures": ["Qwen3ForCausalLM" if a.arch == "qwen3" else "Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate,
        "max_position_embeddings": a.max_pos,
        "max_window_layers": a.layers,
        "model_type": a.arch,
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": a.rms_eps,
        "rope_scaling": a.rope,
        "rope_theta": a.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": bool(a.tie_embeddings),
        "torch_dtype": torch_dtype,
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a.vocab,
    }
    if a.bos is not None:
        cfg["bos_token_id"] = a.bos
    if a.eos:
        cfg["eos_token_id"] = a.eos[0]
    if a.arch == "qwen3_moe":
        cfg.update({
            "decoder_sparse_step": a.decoder_sparse_step,
            "mlp_only_layers": a.mlp_only,
            "moe_intermediate_size": a.moe_intermediate,
            "norm_topk_prob": bool(a.norm_topk_prob),
            "num_experts": a.experts,
            "num_experts_per_tok": a.top_k,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        })
    return dict(sorted(cfg.items()))


def generation_config(a):
    g = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
         "transformers_version": "4.51.0"}
    if a.bos is not None:
        g["bos_token_id"] = a.bos
        g["pad_token_id"] = a.bos
    if a.eos:
        g["eos_token_id"] = a.eos if len(a.eos) != 1 else a.eos[0]
    return dict(sorted(g.items()))


def tensor_plan(cfg):
    """[(name, shape, mean, std)] in the state-dict order Hugging Face saves
    (module registration order), which decides shard assignment."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    I = cfg["intermediate_size"]
    tied = cfg["tie_word_embeddings"]
    norm = (1.0, 0.1)

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    plan = [("model.embed_tokens.weight", (V, H)) + ((0.0, 2.0 / math.sqrt(H)) if tied else (0.0, 1.0))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        plan += [
            (p + "self_attn.q_proj.weight", (nH * hd, H)) + proj(H),
            (p + "self_attn.k_proj.weight", (nKV * hd, H)) + proj(H),
            (p + "self_attn.v_proj.weight", (nKV * hd, H)) + proj(H),
            (p + "self_attn.o_proj.weight", (H, nH * hd)) + proj(nH * hd),
            (p + "self_attn.q_norm.weight", (hd,)) + norm,
            (p + "self_attn.k_norm.weight", (hd,)) + norm,
        ]
        if layer_is_moe(cfg, i):
            E, mI = cfg["num_experts"], cfg["moe_intermediate_size"]
            plan.append((p + "mlp.gate.weight", (E, H)) + proj(H, 2.0))
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                plan += [(q + "gate_proj.weight", (mI, H)) + proj(H),
                         (q + "up_proj.weight", (mI, H)) + proj(H),
                         (q + "down_proj.weight", (H, mI)) + proj(mI)]
        else:
            plan += [(p + "mlp.gate_proj.weight", (I, H)) + proj(H),
                     (p + "mlp.up_proj.weight", (I, H)) + proj(H),
                     (p + "mlp.down_proj.weight", (H, I)) + proj(I)]
        plan += [(p + "input_layernorm.weight", (H,)) + norm,
                 (p + "post_attention_layernorm.weight", (H,)) + norm]
    plan.append(("model.norm.weight", (H,)) + norm)
    if not tied:
        plan.append(("lm_head.weight", (V, H)) + proj(H, 2.0))
    return plan


def plan_shards(plan, itemsize, max_shard):
    """Hub sharding: walk tensors in order and start a new shard when the next one
    would overflow the current; a tensor bigger than the limit gets its own."""
    if max_shard <= 0:
        return [plan]
    shards, cur, cur_size = [], [], 0
    for t in plan:
        size = (st.itemsize(t[4]["dtype"]) if len(t) > 4 and "dtype" in t[4] else itemsize) \
            * int(np.prod(t[1]))
        if size > max_shard:
            shards.append([t])
            continue
        if cur and cur_size + size > max_shard:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(t)
        cur_size += size
    if cur:
        shards.append(cur)
    return shards


class Pool:
    """--fast-init: per (mean, std), a block of 2*POOL_ELEMS stored values; tensors
    copy slices from random offsets. Values repeat across tensors, which is fine for
    throughput benchmarks and wrong for anything that checks numerics."""

    def __init__(self, seed, dtype):
        self.seed, self.dtype, self.blocks = seed, dtype, {}

    def get(self, mean, std):
        key = (mean, std)
        if key not in self.blocks:
            rng = np.random.default_rng([self.seed, 0x9001, zlib.crc32(repr(key).encode())])
            x = rng.standard_normal(2 * POOL_ELEMS, dtype=np.float32) * np.float32(std) + np.float32(mean)
            self.blocks[key] = st.to_storage(x, self.dtype)
        return self.blocks[key]


def tensor_dtype(t, default):
    """A plan entry's stored dtype: its own (e.g. an F32 router bias) or the model's."""
    return t[4].get("dtype", default) if len(t) > 4 else default


def tensor_rng(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def row_source(t, seed):
    """gen_quant's view of plan entry t: source(rows) yields its float32 values in
    row chunks, the same values write_tensor would store."""
    name, shape, mean, std = t[:4]
    C = int(shape[1])

    def source(rows):
        rng = tensor_rng(seed, name)
        if len(t) > 4 and "fill" in t[4]:
            full = np.asarray(t[4]["fill"](rng), dtype=np.float32).reshape(shape)
            for r0 in range(0, shape[0], rows):
                yield full[r0:r0 + rows]
            return
        for r0 in range(0, shape[0], rows):
            n = min(rows, shape[0] - r0)
            x = rng.standard_normal(n * C, dtype=np.float32)
            x *= np.float32(std)
            x += np.float32(mean)
            yield x.reshape(n, C)
    return source


def write_tensor(w, name, shape, mean, std, seed, dtype, pool):
    rng = tensor_rng(seed, name)
    total = int(np.prod(shape))
    row = int(np.prod(shape[1:])) if len(shape) > 1 else total
    rows_per_chunk = max(1, CHUNK_ELEMS // max(1, row))
    chunk = rows_per_chunk * row
    done = 0
    while done < total:
        n = min(chunk, total - done)
        if pool is not None and total >= POOL_MIN:
            block = pool.get(mean, std)
            left = n
            while left:
                m = min(left, POOL_ELEMS)
                off = int(rng.integers(0, POOL_ELEMS))
                w.write_part(name, block[off:off + m], raw=True)
                left -= m
        else:
            x = rng.standard_normal(n, dtype=np.float32)
            x *= np.float32(std)
            x += np.float32(mean)
            w.write_part(name, x)
        done += n


def generate(a):
    os.makedirs(a.out, exist_ok=True)
    st_dtype = DTYPES[a.dtype][0]
    itemsize = st.itemsize(st_dtype)
    if a.kimi_linear:
        cfg = kl.build_config(a)
        prefix = "language_model." if a.arch == "kimi_k3" else ""
        plan, qcfg = kl.apply_quant(kl.tensor_plan(cfg, a, prefix), a, lambda t: row_source(t, a.seed),
                                    (lambda t: tensor_rng(a.seed, t[0])) if a.fast_init else None)
        gen_cfg = kl.generation_config(a)
    else:
        if a.deepseek:
            cfg = ds.build_config(a, DTYPES[a.dtype][1])
            plan = ds.tensor_plan(cfg, a, "language_model." if a.wrap_language_model else "")
            gen_cfg = ds.generation_config(a)
        else:
            cfg = build_config(a)
            plan = tensor_plan(cfg)
            gen_cfg = generation_config(a)
        prefix = "language_model." if a.deepseek and a.wrap_language_model else ""
        plan, qcfg = gq.apply(plan, a, prefix, lambda t: row_source(t, a.seed),
                              (lambda t: tensor_rng(a.seed, t[0])) if a.fast_init else None)
    if qcfg is not None:
        # a wrapper's text config (cfg) is its text_config: the quantization config goes there
        cfg["quantization_config"] = qcfg
        cfg = dict(sorted(cfg.items()))
    if not prefix:
        file_cfg = cfg
    else:
        file_cfg = kl.wrap_config(cfg) if a.kimi_linear else ds.wrap_config(cfg, DTYPES[a.dtype][1])
    shards = plan_shards(plan, itemsize, a.max_shard_size)

    # Remove checkpoint files of an earlier run so a stale shard can never be read.
    for fn in os.listdir(a.out):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(a.out, fn))

    pool = Pool(a.seed, st_dtype) if a.fast_init else None
    n = len(shards)
    weight_map, total = {}, 0
    for si, shard in enumerate(shards):
        fn = "model.safetensors" if n == 1 else f"model-{si + 1:05d}-of-{n:05d}.safetensors"
        # The safetensors library lays data out sorted by name within a file; do
        # the same so readers cannot rely on module order.
        shard = sorted(shard, key=lambda t: t[0])
        specs = [(t[0], tensor_dtype(t, st_dtype), t[1]) for t in shard]
        w = st.SafeTensorsWriter(os.path.join(a.out, fn), specs, {"format": "pt"})
        for t in shard:
            name, shape, mean, std = t[:4]
            if a.sparse and name.endswith(".weight_shape"):
                # metadata, not weights: holes would say [0, 0] (the loader checks it)
                t[4]["packed"].write(w, name)
            elif a.sparse:
                w.skip(name)
            elif len(t) > 4 and "packed" in t[4]:
                t[4]["packed"].write(w, name)
            elif len(t) > 4 and "fill" in t[4]:
                w.write(name, t[4]["fill"](tensor_rng(a.seed, name)))
            else:
                write_tensor(w, name, shape, mean, std, a.seed, tensor_dtype(t, st_dtype), pool)
            weight_map[name] = fn
            total += st.itemsize(tensor_dtype(t, st_dtype)) * int(np.prod(shape))
        w.close()
    if n > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(file_cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")

    if (a.deepseek or a.kimi_linear) and getattr(a, "test_tiktoken", False):
        ds.write_test_tiktoken(a.out, os.path.join(REPO, "assets", "tokenizers", "llama3", "tokenizer.json"),
                               a.vocab, *(kl.test_tokenizer(a) if a.kimi_linear else ()))
    elif not a.no_tokenizer:
        optional = a.deepseek   # tokenizer.json or tiktoken.model, whichever the dir has
        names = ("tokenizer.json", "tokenizer_config.json") + (("tiktoken.model",) if a.deepseek else ())
        for fn in names:
            src = os.path.join(a.tokenizer_dir, fn)
            if optional and not os.path.exists(src):
                continue
            if not os.path.exists(src):
                raise SystemExit(f"gen_checkpoint: {src} missing (run scripts/fetch_assets.sh, "
                                 f"or pass --tokenizer-dir / --no-tokenizer)")
            dst = os.path.join(a.out, fn)
            if not (os.path.exists(dst) and os.path.getsize(dst) == os.path.getsize(src)):
                shutil.copyfile(src, dst)
    return cfg, total, n


def main(argv=None):
    a = parse_args(argv)
    cfg, total, n = generate(a)
    print(f"gen_checkpoint: {a.out}: {cfg['model_type']} {cfg['num_hidden_layers']} layers, "
          f"{total} bytes in {n} file(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
