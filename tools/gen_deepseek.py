"""gen_deepseek - the DeepSeek-V3 family half of gen_checkpoint.py.

Owns: config.json fields and the tensor plan of random-weight checkpoints for
model_type deepseek_v2, deepseek_v3 and kimi_k2 (the DeepseekV3 architecture),
optionally inside a Kimi K2.5-style wrapper (config with text_config, every text
tensor prefixed `language_model.`, plus vision_tower.* / mm_projector.* tensors).
Names, fields and row layouts follow ../shared/notes/ARCHITECTURES.md sections 2-3
as shipped: q-LoRA (q_a_proj, q_a_layernorm, q_b_proj) or q_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; dense layers before
first_k_dense_replace and between moe_layer_freq steps; routed experts, router
gate.weight (+ F32 e_score_correction_bias for noaux_tc), shared experts.

Things a runtime must recognise and skip can be planted: MTP layers
(num_nextn_predict_layers, stored as model.layers.{num_hidden_layers + j}.*),
self_attn.rotary_emb.inv_freq buffers, vision tensors. --router-near-tie plants
a routing near-tie (see near_tie_fills).
"""

import math

import numpy as np

ARCHS = ("deepseek_v2", "deepseek_v3", "kimi_k2")
# (bos, [eos...]) as shipped; left out of tiny-vocab configs when out of range.
SPECIAL_IDS = {"deepseek_v2": (100000, [100001]), "deepseek_v3": (0, [1]),
               "kimi_k2": (163584, [163585])}
SCORING = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def add_args(p):
    g = p.add_argument_group("DeepSeek-V3 family (--arch deepseek_v2 | deepseek_v3 | kimi_k2)")
    g.add_argument("--q-lora-rank", type=int, default=0, help="0: no q-LoRA (q_proj, V2-Lite style)")
    g.add_argument("--kv-lora-rank", type=int, default=32)
    g.add_argument("--qk-nope-dim", type=int, default=16)
    g.add_argument("--qk-rope-dim", type=int, default=8)
    g.add_argument("--v-head-dim", type=int, default=16)
    g.add_argument("--n-shared-experts", type=int, default=1)
    g.add_argument("--first-k-dense", type=int, default=1, help="first_k_dense_replace")
    g.add_argument("--moe-layer-freq", type=int, default=1)
    g.add_argument("--routed-scaling-factor", type=float, default=1.0)
    g.add_argument("--scoring-func", default="auto", help="softmax | sigmoid (auto: by arch)")
    g.add_argument("--topk-method", default="auto",
                   help="greedy | group_limited_greedy | noaux_tc (auto: by arch)")
    g.add_argument("--n-group", type=int, default=1)
    g.add_argument("--topk-group", type=int, default=1)
    g.add_argument("--mtp-layers", type=int, default=0, help="num_nextn_predict_layers")
    g.add_argument("--inv-freq-buffers", action="store_true",
                   help="write self_attn.rotary_emb.inv_freq buffers (plain theta frequencies)")
    g.add_argument("--wrap-language-model", action="store_true",
                   help="Kimi K2.5-style wrapper: text_config, language_model. prefix, vision tensors")
    g.add_argument("--router-bias-std", type=float, default=0.1,
                   help="std of e_score_correction_bias (noaux_tc)")
    g.add_argument("--router-near-tie", default="",
                   help="A,B[,N]: in every MoE layer gate row B copies row A; with a correction "
                        "bias, bias[B] = bias[A] + N*2^-24 (default N=4), else an exact tie")
    g.add_argument("--q-a-gain", type=float, default=1.0,
                   help="scale of q_a_proj; small values make the latent norm's eps matter")
    g.add_argument("--allow-invalid", action="store_true",
                   help="skip the config checks (bad-input tests)")


def check_args(p, a):
    """Fills the arch-dependent defaults and rejects inconsistent shapes."""
    if a.scoring_func == "auto":
        a.scoring_func = "softmax" if a.arch == "deepseek_v2" else "sigmoid"
    if a.topk_method == "auto":
        a.topk_method = "greedy" if a.arch == "deepseek_v2" else "noaux_tc"
    if a.rope_theta is None:
        a.rope_theta = 50000.0 if a.arch == "kimi_k2" else 10000.0
    tie = [x for x in a.router_near_tie.split(",") if x.strip()]
    if tie and len(tie) not in (2, 3):
        p.error("--router-near-tie: give A,B or A,B,N")
    a.near_tie = None
    if tie:
        ea, eb = int(tie[0]), int(tie[1])
        a.near_tie = (ea, eb, int(tie[2]) if len(tie) == 3 else 4)
    if a.tie_embeddings:
        p.error("--tie-embeddings: the DeepSeek family never ties lm_head")
    if a.allow_invalid:
        return
    if a.qk_rope_dim % 2:
        p.error("--qk-rope-dim must be even (rotary pairs)")
    if a.scoring_func not in SCORING:
        p.error(f"--scoring-func {a.scoring_func!r}: one of {', '.join(SCORING)}")
    if a.topk_method not in TOPK_METHODS:
        p.error(f"--topk-method {a.topk_method!r}: one of {', '.join(TOPK_METHODS)}")
    if a.experts % a.n_group:
        p.error("--experts must be a multiple of --n-group")
    if not 1 <= a.topk_group <= a.n_group:
        p.error("--topk-group must be in [1, n-group]")
    if not 1 <= a.top_k <= a.topk_group * (a.experts // a.n_group):
        p.error("--top-k must be in [1, experts in the kept groups]")
    if a.topk_method == "noaux_tc" and a.experts // a.n_group < 2:
        p.error("noaux_tc scores a group by its top-2: need >= 2 experts per group")
    if a.near_tie and not all(0 <= e < a.experts for e in a.near_tie[:2]) or \
            (a.near_tie and a.near_tie[0] == a.near_tie[1]):
        p.error("--router-near-tie: two different expert ids below --experts")


def layer_is_moe(cfg, i):
    """DeepSeek's rule (V2 and the V3 remote code): routed experts exist, the layer
    is at or past first_k_dense_replace, and i is a multiple of moe_layer_freq."""
    return (bool(cfg.get("n_routed_experts"))
            and i >= cfg.get("first_k_dense_replace", 0)
            and i % cfg.get("moe_layer_freq", 1) == 0)


def build_config(a, dtype_name):
    """The text model's config.json, fields as the shipped configs spell them."""
    v3 = a.arch != "deepseek_v2"
    cls = "DeepseekV3" if v3 else "DeepseekV2"
    cfg = {
        "architectures": [cls + "ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": f"configuration_deepseek.{cls}Config",
                     "AutoModel": f"modeling_deepseek.{cls}Model",
                     "AutoModelForCausalLM": f"modeling_deepseek.{cls}ForCausalLM"},
        "aux_loss_alpha": 0.001,
        "ep_size": 1,
        "first_k_dense_replace": a.first_k_dense,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate,
        "kv_lora_rank": a.kv_lora_rank,
        "max_position_embeddings": a.max_pos,
        "model_type": a.arch,
        "moe_intermediate_size": a.moe_intermediate,
        "moe_layer_freq": a.moe_layer_freq,
        "n_group": a.n_group,
        "n_routed_experts": a.experts,
        "n_shared_experts": a.n_shared_experts,
        "norm_topk_prob": bool(a.norm_topk_prob),
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.heads,
        "pretraining_tp": 1,
        "q_lora_rank": a.q_lora_rank or None,
        "qk_nope_head_dim": a.qk_nope_dim,
        "qk_rope_head_dim": a.qk_rope_dim,
        "rms_norm_eps": a.rms_eps,
        "rope_scaling": a.rope,
        "rope_theta": a.rope_theta,
        "routed_scaling_factor": a.routed_scaling_factor,
        "scoring_func": a.scoring_func,
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": a.topk_group,
        "topk_method": a.topk_method,
        "torch_dtype": dtype_name,
        "transformers_version": "4.46.3" if v3 else "4.39.3",
        "use_cache": True,
        "v_head_dim": a.v_head_dim,
        "vocab_size": a.vocab,
    }
    if v3:
        cfg["num_nextn_predict_layers"] = a.mtp_layers
    elif a.mtp_layers:
        cfg["num_nextn_predict_layers"] = a.mtp_layers
    if a.bos is not None:
        cfg["bos_token_id"] = a.bos
    if a.eos:
        cfg["eos_token_id"] = a.eos[0]
    return dict(sorted(cfg.items()))


def wrap_config(text_cfg, dtype_name):
    """Kimi K2.5-style multimodal wrapper around the text config."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "model_type": "kimi_k25",
        "text_config": text_cfg,
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name,
        "transformers_version": "4.56.2",
        "vision_config": {"hidden_size": 32, "init_pos_emb_height": 4, "init_pos_emb_width": 4,
                          "merge_kernel_size": [2, 2], "model_type": "moonvit",
                          "num_attention_heads": 2, "num_hidden_layers": 1, "patch_size": 2},
    }


def generation_config(a):
    g = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"}
    if a.bos is not None:
        g["bos_token_id"] = a.bos
    if a.eos:
        g["eos_token_id"] = a.eos if len(a.eos) != 1 else a.eos[0]
    return dict(sorted(g.items()))


def _normal(shape, mean, std):
    """The draw write_tensor makes for an unplanted tensor, as one array."""
    def fill(rng):
        x = rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
        x *= np.float32(std)
        x += np.float32(mean)
        return x.reshape(shape)
    return fill


def near_tie_fills(a, E, H, gate_std):
    """(gate fill, bias fill) planting the near-tie: gate row B equals row A, so
    both experts get bit-identical router logits and scores. With a correction
    bias the selection values then differ by exactly N*2^-24 (bias A is drawn
    below 1/8 in magnitude so F32 holds the sum exactly): a few ULP of the
    score + bias sum, an order an fp32 router keeps and a bf16 one loses. Without
    a bias it is an exact tie, which the lower expert id wins."""
    ea, eb, n = a.near_tie

    def gate(rng):
        w = _normal((E, H), 0.0, gate_std)(rng)
        w[eb] = w[ea]
        return w

    def bias(rng):
        b = _normal((E,), 0.0, a.router_bias_std)(rng)
        b[ea] = np.float32(np.clip(b[ea], -0.12, 0.12))
        b[eb] = b[ea] + np.float32(n * 2.0 ** -24)
        assert float(b[eb]) - float(b[ea]) == n * 2.0 ** -24
        return b
    return gate, bias


def tensor_plan(cfg, a, prefix=""):
    """[(name, shape, mean, std[, extra])] in module registration order (decides
    sharding). extra: {"dtype": safetensors dtype, "fill": rng -> array}."""
    H, V, nH = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    E, mI, nS = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]
    norm = (1.0, 0.1)

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    m = prefix + "model."
    inv = (1.0 / cfg["rope_theta"] ** (np.arange(0, rope, 2, dtype=np.float64) / rope)).astype(np.float32)

    def layer(i):
        p = f"{m}layers.{i}."
        t = []
        if qr:
            t += [(p + "self_attn.q_a_proj.weight", (qr, H)) + proj(H, a.q_a_gain),
                  (p + "self_attn.q_a_layernorm.weight", (qr,)) + norm,
                  (p + "self_attn.q_b_proj.weight", (nH * (nope + rope), qr)) + proj(qr)]
        else:
            t.append((p + "self_attn.q_proj.weight", (nH * (nope + rope), H)) + proj(H))
        t += [(p + "self_attn.kv_a_proj_with_mqa.weight", (kvr + rope, H)) + proj(H),
              (p + "self_attn.kv_a_layernorm.weight", (kvr,)) + norm,
              (p + "self_attn.kv_b_proj.weight", (nH * (nope + vd), kvr)) + proj(kvr),
              (p + "self_attn.o_proj.weight", (H, nH * vd)) + proj(nH * vd)]
        if a.inv_freq_buffers:
            t.append((p + "self_attn.rotary_emb.inv_freq", (rope // 2,), 0.0, 0.0,
                      {"dtype": "F32", "fill": lambda rng: inv}))
        if layer_is_moe(cfg, i):
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                t += [(q + "gate_proj.weight", (mI, H)) + proj(H),
                      (q + "up_proj.weight", (mI, H)) + proj(H),
                      (q + "down_proj.weight", (H, mI)) + proj(mI)]
            gate_std = proj(H, 2.0)[1]
            gfill, bfill = near_tie_fills(a, E, H, gate_std) if a.near_tie else (None, None)
            t.append((p + "mlp.gate.weight", (E, H), 0.0, gate_std) + (({"fill": gfill},) if gfill else ()))
            if cfg["topk_method"] == "noaux_tc":
                t.append((p + "mlp.gate.e_score_correction_bias", (E,), 0.0, a.router_bias_std,
                          {"dtype": "F32", "fill": bfill or _normal((E,), 0.0, a.router_bias_std)}))
            if nS:
                sI = nS * mI
                t += [(p + "mlp.shared_experts.gate_proj.weight", (sI, H)) + proj(H),
                      (p + "mlp.shared_experts.up_proj.weight", (sI, H)) + proj(H),
                      (p + "mlp.shared_experts.down_proj.weight", (H, sI)) + proj(sI)]
        else:
            I = cfg["intermediate_size"]
            t += [(p + "mlp.gate_proj.weight", (I, H)) + proj(H),
                  (p + "mlp.up_proj.weight", (I, H)) + proj(H),
                  (p + "mlp.down_proj.weight", (H, I)) + proj(I)]
        t += [(p + "input_layernorm.weight", (H,)) + norm,
              (p + "post_attention_layernorm.weight", (H,)) + norm]
        return t

    plan = [(m + "embed_tokens.weight", (V, H), 0.0, 1.0)]
    for i in range(cfg["num_hidden_layers"]):
        plan += layer(i)
    plan.append((m + "norm.weight", (H,)) + norm)
    plan.append((prefix + "lm_head.weight", (V, H)) + proj(H, 2.0))
    return plan + mtp_and_vision_plan(cfg, a, prefix, layer)


def mtp_and_vision_plan(cfg, a, prefix, layer):
    """Tensors no forward pass reads. MTP: a full decoder layer plus its projection,
    norms and (copies of) the embedding and head, after the main layers."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    m = prefix + "model."
    norm = (1.0, 0.1)

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    plan = []
    for j in range(cfg.get("num_nextn_predict_layers") or 0):
        p = f"{m}layers.{L + j}."
        plan += layer(L + j)
        plan += [(p + "embed_tokens.weight", (V, H), 0.0, 1.0),
                 (p + "enorm.weight", (H,)) + norm,
                 (p + "hnorm.weight", (H,)) + norm,
                 (p + "eh_proj.weight", (H, 2 * H)) + proj(2 * H),
                 (p + "shared_head.norm.weight", (H,)) + norm,
                 (p + "shared_head.head.weight", (V, H)) + proj(H, 2.0)]
    if a.wrap_language_model:
        plan += [("vision_tower.patch_embed.proj.weight", (32, 3, 2, 2)) + proj(12),
                 ("vision_tower.encoder.blocks.0.wqkv.weight", (96, 32)) + proj(32),
                 ("vision_tower.encoder.final_layernorm.weight", (32,)) + norm,
                 ("mm_projector.pre_norm.weight", (32,)) + norm,
                 ("mm_projector.proj.0.weight", (H, 128)) + proj(128),
                 ("mm_projector.proj.2.weight", (H, H)) + proj(H)]
    return plan


# ---- a small Kimi-style tiktoken tokenizer for test models -------------------------
# Kimi K2's tokenizer is a tiktoken.model (base64 bytes and rank per line) with its
# specials in tokenizer_config.json. No copy of Kimi's own file can be fetched, so
# test models get one written from the Llama 3 byte-level BPE vocabulary (lowest
# ranks first, so every kept token's merges are kept) with Kimi's special names at
# the top of the model's vocabulary.
KIMI_SPECIALS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                 "<|im_middle|>", "<|start_header_id|>", "<|end_header_id|>", "[UNK]", "[PAD]",
                 "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_argument_begin|>", "<|tool_call_end|>")


def _gpt2_byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def test_tiktoken_ranks(vocab):
    """How many ranks write_test_tiktoken keeps for a model of `vocab` ids (the
    specials follow them; Llama 3 has 128,000 ranks)."""
    return min(vocab, 128000) - len(KIMI_SPECIALS)


def write_test_tiktoken(out_dir, llama3_json, vocab, specials=KIMI_SPECIALS, eos_token="[EOS]"):
    """Writes tiktoken.model + tokenizer_config.json for a model of `vocab` ids
    (specials: len(KIMI_SPECIALS) names after the ranks); returns (bos, [eos]) ids."""
    import base64
    import json
    import os
    with open(llama3_json, encoding="utf-8") as f:
        v = json.load(f)["model"]["vocab"]
    n_ranks = test_tiktoken_ranks(vocab)
    if n_ranks < 256:
        raise SystemExit(f"gen_checkpoint: --vocab {vocab} too small for a tiktoken tokenizer")
    dec = _gpt2_byte_decoder()
    ranks = sorted((i, t) for t, i in v.items() if i < n_ranks)
    lines = []
    for i, t in ranks:
        lines.append("%s %d\n" % (base64.b64encode(bytes(dec[ch] for ch in t)).decode(), i))
    if len(lines) != n_ranks or len({ln.split()[0] for ln in lines}) != n_ranks:
        raise SystemExit(f"gen_checkpoint: {llama3_json}: ranks 0..{n_ranks - 1} are not distinct")
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        f.writelines(lines)
    assert len(specials) == len(KIMI_SPECIALS)
    added = {str(n_ranks + k): {"content": s, "special": True} for k, s in enumerate(specials)}
    cfg = {"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": eos_token,
           "tokenizer_class": "TikTokenTokenizer"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return n_ranks, [n_ranks + specials.index(eos_token)]
