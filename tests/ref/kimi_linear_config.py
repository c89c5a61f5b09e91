"""kimi_linear_config - the Kimi-Linear family's checkpoint contract, for the reference.

Owns: what kimi_linear_ref.py's forward pass may assume about a checkpoint of
model_type kimi_linear (or Kimi K3's kimi_k3 wrapper: text_config, tensors under
language_model.): the config fields it uses and the values the contract allows
(Config: anything else raises ValueError naming config.json and the field), the
tensors such a checkpoint holds and their shapes (expected_tensors), which ones
may be there unread (skipped_kind), and which are Linear weights (is_linear).
Written from ../shared/notes/ARCHITECTURES.md sections 1.2, 1.3, 4 and 8, never
from the C engine.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np as st  # noqa: E402

ACTS = ("silu", "situ")


read_config = st.read_text_config  # (text config, tensor prefix)


def is_family(model_dir):
    try:
        cfg, _ = read_config(model_dir)
    except (OSError, ValueError):
        return False
    return cfg.get("model_type") == "kimi_linear"


def is_linear(name):
    """Whether tensor `name` is a Linear layer's weight (what a quantization config's
    "Linear" target names): not an embedding, a norm, a conv1d or the router."""
    mod, _, suf = name.rpartition(".")
    last = mod.rpartition(".")[2]
    return suf == "weight" and last != "embed_tokens" and "norm" not in last \
        and not last.endswith("conv1d") and not mod.endswith("block_sparse_moe.gate")


# ---- config -----------------------------------------------------------------------

class Config:
    """The text config fields the forward pass uses; values the contract does not
    allow raise ValueError naming config.json and the field."""

    def __init__(self, cfg, where="config.json"):
        self.where = where
        need, bad = self._need, self._bad
        self.raw = cfg
        if cfg.get("model_type") != "kimi_linear":
            bad("model_type", cfg.get("model_type"), "the text model must be kimi_linear")
        self.vocab, self.hidden = need("vocab_size"), need("hidden_size")
        self.n_layers, self.intermediate = need("num_hidden_layers"), need("intermediate_size")
        self.eps = float(cfg.get("rms_norm_eps", 1e-5))
        if cfg.get("tie_word_embeddings"):
            bad("tie_word_embeddings", True, "the family never ties lm_head")
        # MLA
        self.n_heads = need("num_attention_heads")
        if cfg.get("num_key_value_heads", self.n_heads) != self.n_heads:
            bad("num_key_value_heads", cfg["num_key_value_heads"], "must equal num_attention_heads (MLA)")
        self.q_lora = cfg.get("q_lora_rank") or 0
        self.kv_lora, self.nope = need("kv_lora_rank"), need("qk_nope_head_dim")
        self.rope_dim, self.v_dim = need("qk_rope_head_dim"), need("v_head_dim")
        if cfg.get("mla_use_nope") is not True:
            bad("mla_use_nope", cfg.get("mla_use_nope"), "only NoPE MLA (true) is defined")
        self.mla_gate = bool(cfg.get("mla_use_output_gate", False))
        self._init_kda(cfg)
        self._init_ffn(cfg)
        self.attn_res = cfg.get("attn_res_block_size") or 0
        if not isinstance(self.attn_res, int) or self.attn_res < 0:
            bad("attn_res_block_size", self.attn_res, "must be a positive integer")

    def _need(self, k, d=None, pre=""):
        d = self.raw if d is None else d
        if d.get(k) is None:
            raise ValueError(f"{self.where}: field {pre}{k} missing")
        return d[k]

    def _bad(self, k, v, why):
        raise ValueError(f"{self.where}: field {k}={v!r}: {why}")

    def _init_kda(self, cfg):
        need, bad = self._need, self._bad
        lac = cfg.get("linear_attn_config")
        if not isinstance(lac, dict):
            bad("linear_attn_config", lac, "need an object")
        la = "linear_attn_config."
        self.kda_heads, self.kda_dim = need("num_heads", lac, la), need("head_dim", lac, la)
        self.conv_k = lac.get("short_conv_kernel_size", 4)
        if not isinstance(self.conv_k, int) or self.conv_k < 1:
            bad(la + "short_conv_kernel_size", self.conv_k, "must be a positive integer")
        self.gate_lb = lac.get("gate_lower_bound")
        if self.gate_lb is not None and not float(self.gate_lb) < 0:
            bad(la + "gate_lower_bound", self.gate_lb, "must be negative")
        self.full_rank_gate = bool(lac.get("use_full_rank_gate", False))
        kda, mla = lac.get("kda_layers") or [], lac.get("full_attn_layers") or []
        every = set(range(1, self.n_layers + 1))
        for k, lst in (("kda_layers", kda), ("full_attn_layers", mla)):
            if not all(isinstance(x, int) and x in every for x in lst) or len(set(lst)) != len(lst):
                bad(la + k, lst, f"need distinct 1-based layer numbers in 1..{self.n_layers}")
        if set(kda) & set(mla) or set(kda) | set(mla) != every:
            bad(la + "kda_layers", kda, f"with full_attn_layers {mla} every layer must be in exactly one")
        self.kda_set = {x - 1 for x in kda}

    def _init_ffn(self, cfg):
        need, bad = self._need, self._bad
        self.act = cfg.get("hidden_act", "silu")
        if self.act not in ACTS:
            bad("hidden_act", self.act, f"not one of {', '.join(ACTS)}")
        self.situ_beta = float(cfg.get("activation_situ_beta", 4.0))
        self.situ_lin = float(cfg.get("activation_situ_linear_beta", 25.0))
        self.n_experts = cfg.get("num_experts") or 0
        self.first_dense = cfg.get("first_k_dense_replace") or 0
        self.moe_freq = cfg.get("moe_layer_freq") or 1
        self.n_shared = cfg.get("num_shared_experts") or 0
        self.latent = cfg.get("routed_expert_hidden_size") or 0
        self.latent_norm = bool(cfg.get("latent_moe_use_norm", False))
        if self.n_experts:
            self.top_k = need("num_experts_per_token")
            self.moe_intermediate = need("moe_intermediate_size")
            fn = cfg.get("moe_router_activation_func", "sigmoid")
            if fn != "sigmoid":
                bad("moe_router_activation_func", fn, "only sigmoid")
            self.renorm = bool(cfg.get("moe_renormalize", True))
            self.scaling = float(cfg.get("routed_scaling_factor", 1.0))
            self.grouped = bool(cfg.get("use_grouped_topk", False))
            self.n_group = cfg.get("num_expert_group") or 1
            self.topk_group = cfg.get("topk_group") or 1
            if not 1 <= self.top_k <= self.n_experts:
                bad("num_experts_per_token", self.top_k, f"must be in [1, num_experts={self.n_experts}]")
            if self.grouped and self.n_group > 1:
                if self.n_experts % self.n_group:
                    bad("num_expert_group", self.n_group, f"does not divide num_experts={self.n_experts}")
                if not 1 <= self.topk_group <= self.n_group:
                    bad("topk_group", self.topk_group, f"must be in [1, num_expert_group={self.n_group}]")
                per = self.n_experts // self.n_group
                if per < 2:
                    bad("num_expert_group", self.n_group, "a group scores its top-2: need >= 2 experts each")
                if self.top_k > self.topk_group * per:
                    bad("num_experts_per_token", self.top_k, "more than the experts in the kept groups")
        if self.latent_norm and not self.latent:
            bad("latent_moe_use_norm", True, "needs routed_expert_hidden_size")

    @property
    def qk_dim(self):
        return self.nope + self.rope_dim

    def layer_is_kda(self, i):
        return i in self.kda_set

    def layer_is_moe(self, i):
        return bool(self.n_experts) and i >= self.first_dense and i % self.moe_freq == 0


def expected_tensors(c, prefix=""):
    """{name: shape} of every tensor the forward pass reads (A_log: None, its shape
    is checked by read_a)."""
    H, V = c.hidden, c.vocab
    m = prefix + "model."
    t = {m + "embed_tokens.weight": (V, H), m + "norm.weight": (H,), prefix + "lm_head.weight": (V, H)}
    if c.attn_res:
        t[m + "output_attn_res_norm.weight"] = (H,)
        t[m + "output_attn_res_proj.weight"] = (1, H)
    Hk, dk = c.kda_heads, c.kda_dim
    Ck = Hk * dk
    for i in range(c.n_layers):
        p = f"{m}layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = (H,)
        t[p + "post_attention_layernorm.weight"] = (H,)
        if c.attn_res:
            for s in ("self_attention_res", "mlp_res"):
                t[f"{p}{s}_norm.weight"] = (H,)
                t[f"{p}{s}_proj.weight"] = (1, H)
        if c.layer_is_kda(i):
            for n in ("q", "k", "v"):
                t[f"{a}{n}_proj.weight"] = (Ck, H)
                t[f"{a}{n}_conv1d.weight"] = (Ck, 1, c.conv_k)
            if c.full_rank_gate:
                t[a + "g_proj.weight"] = (Ck, H)
            else:
                t[a + "g_a_proj.weight"] = (dk, H)
                t[a + "g_b_proj.weight"] = (Ck, dk)
            t.update({a + "f_a_proj.weight": (dk, H), a + "f_b_proj.weight": (Ck, dk),
                      a + "b_proj.weight": (Hk, H), a + "o_proj.weight": (H, Ck), a + "A_log": None,
                      a + "dt_bias": (Ck,), a + "o_norm.weight": (dk,)})
        else:
            nH = c.n_heads
            if c.q_lora:
                t[a + "q_a_proj.weight"] = (c.q_lora, H)
                t[a + "q_a_layernorm.weight"] = (c.q_lora,)
                t[a + "q_b_proj.weight"] = (nH * c.qk_dim, c.q_lora)
            else:
                t[a + "q_proj.weight"] = (nH * c.qk_dim, H)
            t[a + "kv_a_proj_with_mqa.weight"] = (c.kv_lora + c.rope_dim, H)
            t[a + "kv_a_layernorm.weight"] = (c.kv_lora,)
            t[a + "kv_b_proj.weight"] = (nH * (c.nope + c.v_dim), c.kv_lora)
            if c.mla_gate:
                t[a + "g_proj.weight"] = (nH * c.v_dim, H)
            t[a + "o_proj.weight"] = (H, nH * c.v_dim)
        if c.layer_is_moe(i):
            s = p + "block_sparse_moe."
            E, mI = c.n_experts, c.moe_intermediate
            X = c.latent or H
            t[s + "gate.weight"] = (E, H)
            t[s + "gate.e_score_correction_bias"] = (E,)
            for e in range(E):
                t[f"{s}experts.{e}.w1.weight"] = (mI, X)
                t[f"{s}experts.{e}.w3.weight"] = (mI, X)
                t[f"{s}experts.{e}.w2.weight"] = (X, mI)
            if c.latent:
                t[s + "routed_expert_down_proj.weight"] = (c.latent, H)
                t[s + "routed_expert_up_proj.weight"] = (H, c.latent)
                if c.latent_norm:
                    t[s + "routed_expert_norm.weight"] = (c.latent,)
            if c.n_shared:
                sI = c.n_shared * mI
                t[s + "shared_experts.gate_proj.weight"] = (sI, H)
                t[s + "shared_experts.up_proj.weight"] = (sI, H)
                t[s + "shared_experts.down_proj.weight"] = (H, sI)
        else:
            I = c.intermediate
            t.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                      p + "mlp.down_proj.weight": (H, I)})
    return t


def skipped_kind(name):
    """Why a tensor nothing reads may be in the checkpoint: 'vision' or None."""
    return "vision" if name.startswith(("vision_tower.", "mm_projector.")) else None
