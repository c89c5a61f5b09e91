#!/usr/bin/python3
"""demo_model - Qwen3 / Qwen3-MoE in plain PyTorch, for training the demo models.

Owns: the forward pass the demo models are trained with, their export to a
Hugging Face checkpoint (BF16 safetensors + config) and the loading of such a
checkpoint back into the same module. It follows the Hugging Face
Qwen3ForCausalLM / Qwen3MoeForCausalLM semantics, so the exported tensors mean
the same thing to the engine and to transformers:

  x = embed[ids]
  per layer: h = x + o_proj(attn(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))),
                                  v_proj(rms(x))))                 causal, GQA, 1/sqrt(head_dim)
             x = h + mlp(rms_post(h))
  dense mlp: down(silu(gate(y)) * up(y))
  MoE mlp:   p = softmax(router(y)) over all experts (float32), top-k of p, divided by
             their sum when norm_topk_prob, sum of p_i * expert_i(y)
  logits = lm_head(rms(x))  (embed_tokens when tied)

RMSNorm: y = w * x / sqrt(mean(x^2) + eps). Rotary: NeoX layout (rotate_half:
the first and second halves of head_dim pair up), inv_freq = theta^(-2i/head_dim).
Experts are held stacked ([E, I, H]) so training dispatches one matmul per expert;
export writes them as the per-expert tensors the hub uses.
"""

import json
import math
import os
import struct

import torch
import torch.nn.functional as F


class Cfg:
    def __init__(self, d):
        self.d = d
        self.moe = d["model_type"] == "qwen3_moe"
        self.vocab = d["vocab_size"]
        self.hidden = d["hidden_size"]
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.kv_heads = d["num_key_value_heads"]
        self.head_dim = d["head_dim"]
        self.inter = d.get("intermediate_size", 0)
        self.experts = d.get("num_experts", 0) if self.moe else 0
        self.top_k = d.get("num_experts_per_tok", 0)
        self.moe_inter = d.get("moe_intermediate_size", 0)
        self.norm_topk = bool(d.get("norm_topk_prob", False))
        self.eps = d["rms_norm_eps"]
        self.theta = d["rope_theta"]
        self.tied = bool(d["tie_word_embeddings"])


def make_config(arch, vocab, hidden, layers, heads, kv_heads, head_dim, inter=0, experts=0,
                top_k=0, moe_inter=0, max_pos=1024, theta=10000.0, bos=0, eos=(0,),
                aux_coef=0.01):
    d = {
        "architectures": ["Qwen3MoeForCausalLM" if arch == "qwen3_moe" else "Qwen3ForCausalLM"],
        "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": bos, "eos_token_id": list(eos),
        "head_dim": head_dim, "hidden_act": "silu", "hidden_size": hidden,
        "initializer_range": 0.02, "max_position_embeddings": max_pos,
        "max_window_layers": layers, "model_type": arch,
        "num_attention_heads": heads, "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6, "rope_scaling": None,
        "rope_theta": theta, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab,
    }
    if arch == "qwen3_moe":
        d.update({"decoder_sparse_step": 1, "mlp_only_layers": [],
                  "moe_intermediate_size": moe_inter, "norm_topk_prob": True,
                  "num_experts": experts, "num_experts_per_tok": top_k,
                  "output_router_logits": False, "router_aux_loss_coef": aux_coef,
                  "intermediate_size": inter or 4 * moe_inter})
    else:
        d["intermediate_size"] = inter
    return d


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(c, T, device=None):
    inv = 1.0 / (c.theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = torch.nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.eps)
        self.k_norm = RMSNorm(c.head_dim, c.eps)

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, c.heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.heads // c.kv_heads
        k = k.repeat_interleave(rep, dim=1)   # query head h uses kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim) + mask
        o = torch.softmax(s, -1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, c.heads * c.head_dim))


class DenseMLP(torch.nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        E, I, H = c.experts, c.moe_inter, c.hidden
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.w_gate = torch.nn.Parameter(torch.empty(E, I, H))
        self.w_up = torch.nn.Parameter(torch.empty(E, I, H))
        self.w_down = torch.nn.Parameter(torch.empty(E, H, I))

    def route(self, y):
        """y [N, H] -> (probs [N, E], top-k weights [N, k], top-k ids [N, k])."""
        p = torch.softmax(self.gate(y).float(), -1)
        w, idx = torch.topk(p, self.c.top_k, -1)
        if self.c.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        return p, w, idx

    def forward(self, x):
        shp = x.shape
        y = x.reshape(-1, shp[-1])
        p, w, idx = self.route(y)
        out = torch.zeros_like(y)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.c.experts).tolist()
        tok = order // self.c.top_k
        wts = w.reshape(-1)[order]
        # unbind once: indexing w_gate[e] per expert would make autograd build and
        # add a full [E, I, H] gradient for every expert.
        wg, wu, wd = self.w_gate.unbind(0), self.w_up.unbind(0), self.w_down.unbind(0)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            t = tok[start:start + n]
            xe = y[t]
            he = F.silu(xe @ wg[e].t()) * (xe @ wu[e].t())
            out.index_add_(0, t, (he @ wd[e].t()) * wts[start:start + n, None])
            start += n
        # Switch/Qwen load-balancing loss: E * sum_e f_e * P_e, f_e the fraction of
        # routed slots that went to e and P_e the mean router probability of e.
        f = torch.bincount(flat, minlength=self.c.experts).float() / flat.numel()
        aux = self.c.experts * (f * p.mean(0)).sum()
        self.last = (p.detach(), idx.detach())
        return out.view(shp), aux


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = MoE(c) if c.moe else DenseMLP(c.hidden, c.inter)
        self.moe = c.moe

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if self.moe:
            m, aux = self.mlp(self.post_attention_layernorm(h))
        else:
            m, aux = self.mlp(self.post_attention_layernorm(h)), h.new_zeros(())
        return h + m, aux


class Model(torch.nn.Module):
    def __init__(self, cfg_dict):
        super().__init__()
        c = self.c = Cfg(cfg_dict)
        self.cfg = cfg_dict
        self.embed_tokens = torch.nn.Embedding(c.vocab, c.hidden)
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c.layers)])
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = None if c.tied else torch.nn.Linear(c.hidden, c.vocab, bias=False)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        std = 0.02
        # Residual-branch outputs shrink with depth (GPT-2 style) so the stream
        # starts out dominated by the embedding.
        out_std = std / math.sqrt(2 * self.c.layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                torch.nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "w_down")):
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * out_std)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, ids, hidden_out=None):
        """ids [B, T] -> (logits [B, T, V], summed aux loss). hidden_out, if a list,
        receives the residual stream entering each layer and the final one."""
        B, T = ids.shape
        cos, sin = rope_cos_sin(self.c, T)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.embed_tokens(ids)
        aux = x.new_zeros(())
        for layer in self.layers:
            if hidden_out is not None:
                hidden_out.append(x)
            x, a = layer(x, cos, sin, mask)
            aux = aux + a
        if hidden_out is not None:
            hidden_out.append(x)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.t(), aux


# ---------------------------------------------------------------- checkpoint I/O

def hf_tensors(model):
    """name -> float32 tensor, in the hub's names and layout."""
    out = {}
    c = model.c
    out["model.embed_tokens.weight"] = model.embed_tokens.weight
    for i, L in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = L.input_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = getattr(L.self_attn, n).weight
        out[p + "self_attn.q_norm.weight"] = L.self_attn.q_norm.weight
        out[p + "self_attn.k_norm.weight"] = L.self_attn.k_norm.weight
        out[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm.weight
        if c.moe:
            out[p + "mlp.gate.weight"] = L.mlp.gate.weight
            for e in range(c.experts):
                q = p + f"mlp.experts.{e}."
                out[q + "gate_proj.weight"] = L.mlp.w_gate[e]
                out[q + "up_proj.weight"] = L.mlp.w_up[e]
                out[q + "down_proj.weight"] = L.mlp.w_down[e]
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(L.mlp, n).weight
    out["model.norm.weight"] = model.norm.weight
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def save_safetensors(path, tensors, dtype="BF16"):
    """tensors: name -> float32 tensor; stored as BF16 (round to nearest even)."""
    hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if dtype == "BF16":
            b = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            b = t.float().numpy().tobytes()
        hdr[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """name -> float32 tensor (BF16/F32 widened exactly)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in hdr.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        buf = bytearray(raw[base + a:base + b])
        if h["dtype"] == "BF16":
            t = torch.frombuffer(buf, dtype=torch.bfloat16).float()
        elif h["dtype"] == "F32":
            t = torch.frombuffer(buf, dtype=torch.float32).clone()
        else:
            raise ValueError(f"{path}: {name}: dtype {h['dtype']} not supported here")
        out[name] = t.view(h["shape"])
    return out


def load_model(model_dir):
    """A checkpoint directory -> Model holding its (BF16-widened) weights."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    m = Model(cfg)
    ts = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    c = m.c
    with torch.no_grad():
        m.embed_tokens.weight.copy_(ts["model.embed_tokens.weight"])
        for i, L in enumerate(m.layers):
            p = f"model.layers.{i}."
            L.input_layernorm.weight.copy_(ts[p + "input_layernorm.weight"])
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(L.self_attn, n).weight.copy_(ts[p + f"self_attn.{n}.weight"])
            L.self_attn.q_norm.weight.copy_(ts[p + "self_attn.q_norm.weight"])
            L.self_attn.k_norm.weight.copy_(ts[p + "self_attn.k_norm.weight"])
            L.post_attention_layernorm.weight.copy_(ts[p + "post_attention_layernorm.weight"])
            if c.moe:
                L.mlp.gate.weight.copy_(ts[p + "mlp.gate.weight"])
                for e in range(c.experts):
                    q = p + f"mlp.experts.{e}."
                    L.mlp.w_gate[e].copy_(ts[q + "gate_proj.weight"])
                    L.mlp.w_up[e].copy_(ts[q + "up_proj.weight"])
                    L.mlp.w_down[e].copy_(ts[q + "down_proj.weight"])
            else:
                for n in ("gate_proj", "up_proj", "down_proj"):
                    getattr(L.mlp, n).weight.copy_(ts[p + f"mlp.{n}.weight"])
        m.norm.weight.copy_(ts["model.norm.weight"])
        if m.lm_head is not None:
            m.lm_head.weight.copy_(ts["lm_head.weight"])
    m.eval()
    return m


def bf16_round_(model):
    """Rounds every parameter to BF16 in place: the exported model is these values."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
