"""The architecture of either model family as one frozen, validated value: ModelConfig.

Every field has a default and a one-line check (`__post_init__`: a bad value is a ValueError naming the field and the
allowed values); `from_dict` builds one from a config's model section and names close matches of a misspelt key. The
fields declared with `setting()` (txjax.fields) carry what a resume may change and which settings read them.
The derived sizes (kv_heads, head_dim, encoder_layers) and muP's width multiplier and init scales are properties.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import NamedTuple

import jax.numpy as jnp

from txjax.fields import ReadBy, setting
from txjax.model import (
    activations,
    latent_config,
    linear_config,
    llama4_config,
    moe_config,
    positional,
    precision,
    score,
)
from txjax.model.attention import ATTENTION_IMPLS

NORMS = ("layernorm", "rmsnorm")

# model.remat: what the backward pass keeps of each block (txjax.model.models.remat_policy), most first
REMAT_POLICIES = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload", "full")
_CHOICES = {
    "positional": positional.POSITIONAL_KINDS,
    "norm": NORMS,
    "norm_placement": ("pre", "post", "sandwich"),  # txjax.model.layers: sandwich = pre + a norm of each branch
    "activation": activations.ACTIVATION_NAMES,
    "dtype": ("float32", "bfloat16"),
    "attention_impl": ATTENTION_IMPLS,
    "matmul_precision": precision.PRECISIONS,
    "attention_scale": ("sqrt", "none", "linear"),
    "parametrization": ("standard", "mup"),
    "router": ("topk_then_softmax", "softmax_then_topk", "sigmoid"),  # txjax.model.moe
    "prefix_attention": ("bidirectional", "causal"),  # txjax.families.prefix_lm
    "remat": REMAT_POLICIES,
}

# the settings a field needs (txjax.unread refuses it set without them); a field with setting()'s metadata but no
# read_by is one a resumed run may change (txjax.training.resume)
_ROPE = (ReadBy("model.positional", ("rope",), "only RoPE rotates"),)
_BUCKETS = (ReadBy("model.positional", ("relative_buckets",), "only T5's relative buckets have a table"),)
_LOCAL = ReadBy("model.attention_window", lambda w: w > 0, "every layer is global")
_MUP = ReadBy("model.parametrization", ("mup",), "only muP scales by a width")
_ENCODER = ReadBy("family", ("encoder_decoder",), "only an encoder-decoder has an encoder of its own")
_PREFIX = ReadBy("family", ("prefix_lm",), "only a prefix LM has a prefix")


def _scaled(*scalings: str) -> tuple[ReadBy, ...]:
    return (*_ROPE, ReadBy("model.rope_scaling", scalings, "another scaling's parameter"))


class LayerAttention(NamedTuple):
    """What differs between the self-attention of one decoder layer and another's (ModelConfig.layer_attention):
    Python ints for a looped stack or one value for all (static), a scanned stack's arrays [layers] otherwise."""

    window: int = 0  # the local window (masks.window_mask), 0 = global
    rope: bool = True  # positional='rope': this layer rotates q and k; False: a NoPE layer (rope_layers)
    linear: bool = False  # Gated DeltaNet mixes this layer's tokens (layer_types), always a Python bool


PLAIN_LAYER = LayerAttention()  # nothing of its own: global attention (every cross-attention, every encoder layer)


@dataclasses.dataclass(frozen=True)
class ModelConfig(latent_config.LatentFields, linear_config.LinearFields, llama4_config.Llama4Fields):
    """Architecture of either family; validated on construction (a bad field is a one-line ValueError)."""

    vocab_size: int
    d_model: int = 128
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: = num_heads; fewer gives grouped-query attention (smaller KV cache)
    d_head: int | None = None  # None: d_model // num_heads; set when a checkpoint fixes it apart (Qwen2, Mistral)
    d_ff: int = 512
    num_layers: int = 4  # decoder layers (and encoder layers unless num_encoder_layers is set)
    num_encoder_layers: int | None = setting(None, resume=False, read_by=(_ENCODER,))
    max_len: int = 256  # context length; the size of the learned position table
    positional: str = "learned"
    norm: str = "layernorm"
    norm_placement: str = "pre"
    activation: str = "gelu"
    tie_embeddings: bool = True
    share_embeddings: bool = True  # encoder-decoder: one table for source and target tokens
    use_bias: bool = False
    qkv_bias: bool = False  # biases on the query/key/value projections only (Qwen2), whatever use_bias says
    attention_bias: bool = False  # biases on q, k, v and the output projection (Llama's attention_bias; GPT-OSS)
    dropout: float = setting(0.0)  # a resumed run may change these (setting: the state's shapes stay)
    attention_dropout: float = setting(0.0)
    dtype: str = setting("float32")  # matmul/attention dtype; parameters, the residual stream and norms stay float32
    attention_impl: str = setting(
        "auto"
    )  # attention.resolve_impl: cuDNN's fused kernel on NVIDIA GPUs, else the reference
    attention_block_q: int = setting(256)  # attention_impl='blockwise': queries per block (txjax.model.blockwise),
    attention_block_kv: int = setting(256)  # and keys/values per block (benchmarks/attention_time.py compares sizes)
    matmul_precision: str = setting(
        "highest"
    )  # of float32 matmuls (txjax.model.precision): 'high'/'default' allow TF32 on GPUs
    attention_scale: str = "sqrt"
    scan_layers: bool = True
    remat: str = setting("none")  # none | full: recompute each block in the backward pass | dots_saveable,
    # dots_with_no_batch_dims_saveable: keep the matmuls' outputs (those without a batch dimension), recompute the
    # rest | offload: those outputs kept in host memory (jax.checkpoint_policies); true/false read as full/none
    # (XLA:CPU schedules a looped stack's recomputation early and keeps the activations: benchmarks/memory.py)
    norm_eps: float = 1e-5
    rope_base: float = setting(10000.0, resume=False, read_by=_ROPE)
    embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017, sec. 3.4)
    qk_norm: bool = False  # RMSNorm of q and k per head before the scores
    qk_norm_all_heads: bool = False  # qk_norm over all heads' channels at once, gains [heads, d_head] (OLMoE)
    logit_softcap: float = 0.0  # > 0: logits = c tanh(logits / c) (Gemma 2; modded-nanogpt); 0 = off
    attention_softcap: float = 0.0  # > 0: scores = c tanh(scores / c) (Gemma 2's attn_logit_softcapping); 0 = off
    attention_scale_dim: int = 0  # > 0: the d of attention_scale's 1/sqrt(d) (1/d), not d_k (query_pre_attn_scalar)
    attention_sinks: bool = False  # a learned logit per head in the softmax's denominator (GPT-OSS; model.score)
    attention_output_gate: bool = False  # each head's output times sigmoid(x W_g) before W^O (Qwen3-Next: multi_head)
    norm_offset: bool = False  # RMSNorm gains as 1 + w, w stored and zero at init (Gemma's; txjax.model.norms)
    init_std: float = 0.02
    parametrization: str = "standard"  # "mup": muP (Yang et al. 2022) relative to base_width (width_multiplier)
    base_width: int = setting(128, resume=False, read_by=(_MUP,))  # mup: the d_model its hyperparameters were tuned at
    # pretrained encoder-decoders (txjax.convert.marian, .bart, .t5)
    final_logits_bias: bool = False  # a learned bias [vocab] added to the logits (Marian/BART's final_logits_bias)
    embed_norm: bool = False  # a norm of each stack's input embeddings (BART's layernorm_embedding)
    relative_buckets: int = setting(
        32, resume=False, read_by=_BUCKETS
    )  # positional='relative_buckets' (T5): buckets of its table [buckets, heads]
    relative_max_distance: int = setting(
        128, resume=False, read_by=_BUCKETS
    )  # ... and the distance from which on all share its last bucket
    # local attention (txjax.model.masks.window_mask): a local layer's query sees itself and the window - 1 keys before
    # it; its KV cache is a ring buffer of window slots. Causal self-attention only (decoder layers)
    attention_window: int = 0  # 0 = every layer global
    window_pattern: str = ""  # 'L' local / 'G' global per decoder layer, repeated ('LLLLLG': Gemma 3); '' = all local
    # positional='rope': 'R' RoPE / 'N' none (NoPE) per decoder layer, repeated (Llama 4's 'RRRN', SmolLM3's
    # no_rope_layers); '' = all RoPE. Causal self-attention only, as window_pattern
    rope_layers: str = ""
    # RoPE's frequency scaling for long contexts (txjax.model.positional.Rope: transformers' rope_type and parameters)
    rope_scaling: str = setting("none", resume=False, read_by=_ROPE)  # none | linear | llama3 | yarn
    rope_factor: float = setting(
        1.0, resume=False, read_by=_scaled("linear", "llama3", "yarn")
    )  # linear, llama3, yarn: the context extension factor
    rope_low_freq_factor: float = setting(1.0, resume=False, read_by=_scaled("llama3"))  # llama3
    rope_high_freq_factor: float = setting(4.0, resume=False, read_by=_scaled("llama3"))  # llama3
    rope_original_max_len: int = setting(
        0, resume=False, read_by=_scaled("llama3", "yarn")
    )  # llama3, yarn: the pretraining context (original_max_position_embeddings)
    rope_beta_fast: float = setting(32.0, resume=False, read_by=_scaled("yarn"))  # yarn
    rope_beta_slow: float = setting(1.0, resume=False, read_by=_scaled("yarn"))  # yarn
    rope_truncate: bool = setting(True, resume=False, read_by=_scaled("yarn"))  # yarn: ramp ends at whole dimensions
    rope_attention_factor: float = setting(
        0.0, resume=False, read_by=_scaled("yarn")
    )  # yarn: multiplies cos and sin; 0 = 0.1 ln(factor) + 1
    rope_fraction: float = setting(
        1.0, resume=False, read_by=_ROPE
    )  # the share of each head's channels rotated (partial rotary; the first ones)
    rope_local_base: float = setting(
        0.0, resume=False, read_by=(*_ROPE, _LOCAL)
    )  # > 0: local layers' own unscaled RoPE base (Gemma 3's rope_local_base_freq)
    # mixture of experts (txjax.model.moe): 0 experts = the dense FFN in every layer
    num_experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 2  # top-k
    num_shared_experts: int = 0  # always-on experts beside the routed ones (DeepSeek-MoE, Qwen2-MoE)
    moe_d_ff: int | None = None  # each expert's width; None: d_ff
    moe_every: int = 1  # every n-th layer is MoE (layers n-1, 2n-1, ...), the others dense; 1: all
    moe_dense_first: int = 0  # the first k layers dense, moe_every's pattern from layer k on (first_k_dense_replace)
    router: str = "topk_then_softmax"  # Mixtral | softmax_then_topk (Switch, Qwen-MoE, OLMoE) | sigmoid (DeepSeek-V3)
    moe_norm_topk: bool = False  # softmax_then_topk / sigmoid: renormalise the k chosen gates to sum 1
    moe_capacity_factor: float = 0.0  # 0: dropless; c > 0: each expert takes ceil(c * tokens * k / E), drops the rest
    shared_expert_gate: bool = False  # the shared experts' output times sigmoid(x w_g), one gate per token (Qwen2-MoE)
    moe_bias: bool = False  # biases on the router's logits and on every expert's weights (GPT-OSS)
    moe_groups: int = 1  # sigmoid: experts in n groups, top-k among the moe_topk_groups best (DeepSeek-V3's n_group)
    moe_topk_groups: int = 1  # the groups a token's experts come from (topk_group), ranked by their 2 best scores
    moe_routed_scale: float = 1.0  # the routed experts' gates times this (DeepSeek-V3's routed_scaling_factor)
    # family prefix_lm: the source read both ways (T5's prefix LM) or causally (T5's decoder-only "LM" baseline)
    prefix_attention: str = setting("bidirectional", resume=False, read_by=(_PREFIX,))
    # multi-token prediction (txjax.model.mtp): modules after the decoder (DeepSeek-V3's 1); 0 = off
    mtp_depth: int = setting(0, resume=False, read_by=(ReadBy("family", ("decoder_lm",), "only decoder LMs have MTP"),))

    def __post_init__(self):
        if str(self.remat).lower() in ("true", "false"):  # model.remat's values when it was a bool (True, "false")
            object.__setattr__(self, "remat", "full" if str(self.remat).lower() == "true" else "none")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        positive = ("vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "max_len", "base_width")
        positive += ("relative_buckets", "relative_max_distance")
        for name in (*positive, "attention_block_q", "attention_block_kv"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be a positive integer")
        for name in ("num_kv_heads", "num_encoder_layers", "d_head"):  # optional: None or a positive integer
            if (value := getattr(self, name)) is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"model.{name}={value!r} must be None or a positive integer")
        if self.d_head is None and self.d_model % self.num_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.num_heads={self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} must be a multiple of model.num_kv_heads={self.kv_heads}"
            )
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"model.positional='rope' needs an even head dim, got {self.head_dim}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be in [0, 1)")
        if self.attention_impl == "cudnn" and self.dtype != "bfloat16":
            raise ValueError(
                "model.attention_impl='cudnn' needs model.dtype=bfloat16 (cuDNN's fused attention is 16-bit)"
            )
        if self.attention_impl == "blockwise" and self.attention_dropout > 0:
            raise ValueError(
                "model.attention_impl='blockwise' has no dropout on the attention weights: set "
                "model.attention_dropout=0 or model.attention_impl=reference"
            )
        if self.positional == "relative_buckets" and self.attention_impl == "blockwise":
            raise ValueError("model.positional='relative_buckets' has no blockwise form: set model.attention_impl=auto")
        for name in ("logit_softcap", "attention_softcap"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) >= 0:  # NaN too
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be a number >= 0 (0 = off)")
        lacking = score.fused_lacks(self) if self.attention_impl in ("fused", "cudnn") else []
        if lacking:
            raise ValueError(
                f"model.attention_impl={self.attention_impl!r} (jax.nn.dot_product_attention) cannot express "
                f"{', '.join(lacking)}: set model.attention_impl=auto, reference or blockwise, or "
                + " and ".join(f"{name}={str(getattr(ModelConfig, name.split('.')[1])).lower()}" for name in lacking)
            )
        if not isinstance(self.attention_scale_dim, int) or self.attention_scale_dim < 0:
            raise ValueError(
                f"model.attention_scale_dim={self.attention_scale_dim!r} must be an integer >= 0 (0 = d_k)"
            )
        if self.attention_scale_dim and self.attention_scale == "none":
            raise ValueError(
                "model.attention_scale_dim is read by attention_scale sqrt or linear, not none: set "
                "model.attention_scale_dim=0 (its default) or another model.attention_scale"
            )
        for name in ("attention_sinks", "attention_output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be true or false")
        if self.norm_offset and self.norm != "rmsnorm":
            raise ValueError("model.norm_offset (gains 1 + w) is an RMSNorm's: set model.norm=rmsnorm")
        if self.parametrization == "mup" and self.attention_scale != "linear":
            raise ValueError("model.parametrization='mup' scales the scores by 1/d_k: set model.attention_scale=linear")
        if not isinstance(self.attention_window, int) or self.attention_window < 0:
            raise ValueError(f"model.attention_window={self.attention_window!r} must be an integer >= 0 (0 = global)")
        if not isinstance(self.window_pattern, str) or set(self.window_pattern) - set("LG"):
            raise ValueError(
                f"model.window_pattern={self.window_pattern!r} must be a string of L (local) and G (global)"
            )
        if self.window_pattern and not self.attention_window:
            raise ValueError(f"model.window_pattern={self.window_pattern!r} needs model.attention_window > 0")
        if not isinstance(self.rope_layers, str) or set(self.rope_layers) - set("RN"):
            raise ValueError(f"model.rope_layers={self.rope_layers!r} must be a string of R (RoPE) and N (none)")
        for name in ("window_pattern", "rope_layers"):  # a letter past the stack would never be read
            pattern = getattr(self, name)
            if len(pattern) > self.num_layers:
                raise ValueError(
                    f"model.{name}={pattern!r} has {len(pattern)} letters for model.num_layers={self.num_layers}: give "
                    f"at most {self.num_layers} (the pattern repeats), e.g. model.{name}={pattern[: self.num_layers]}"
                )
        if self.rope_layers and self.positional != "rope":
            raise ValueError(
                f"model.rope_layers={self.rope_layers!r} is read by model.positional=rope only: set "
                "model.positional=rope or model.rope_layers='' (its default)"
            )
        if self.rope_scaling not in positional.ROPE_SCALINGS:
            raise ValueError(
                f"model.rope_scaling={self.rope_scaling!r} is not one of {', '.join(positional.ROPE_SCALINGS)}"
            )
        if self.rope_scaling in ("llama3", "yarn") and self.rope_original_max_len <= 0:
            raise ValueError(f"model.rope_scaling={self.rope_scaling!r} needs model.rope_original_max_len > 0")
        if self.rope_factor <= 0 or self.rope_local_base < 0:
            raise ValueError("model.rope_factor must be > 0 and model.rope_local_base >= 0 (0 = the global rope)")
        rotated = self.head_dim * self.rope_fraction
        if not 0 < self.rope_fraction <= 1 or (self.positional == "rope" and (rotated != int(rotated) or rotated % 2)):
            raise ValueError(
                f"model.rope_fraction={self.rope_fraction} must be in (0, 1] and rotate an even number of channels"
            )
        if self.qk_norm_all_heads and not self.qk_norm:
            raise ValueError("model.qk_norm_all_heads changes how qk_norm normalizes: set model.qk_norm=true")
        if not isinstance(self.mtp_depth, int) or self.mtp_depth < 0:
            raise ValueError(f"model.mtp_depth={self.mtp_depth!r} must be an integer >= 0 (0 = off)")
        moe_config.check_moe(self)
        latent_config.check_latent(self)
        linear_config.check_linear(self)
        llama4_config.check_llama4(self)

    @classmethod
    def from_dict(cls, d) -> ModelConfig:
        """Build from a mapping; an unknown key is an error that names the close matches."""
        fields = [f.name for f in dataclasses.fields(cls)]
        for key in d:
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(fields)}"
                raise ValueError(f"unknown field model.{key}{hint}")
        return cls(**d)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads if self.d_head is None else self.d_head

    @property
    def encoder_layers(self) -> int:
        return self.num_layers if self.num_encoder_layers is None else self.num_encoder_layers

    @property
    def layer_windows(self) -> tuple[int, ...]:
        """Each decoder layer's attention window (0 = global): window_pattern repeated over the layers."""
        pattern = self.window_pattern or "L"
        return tuple(self.attention_window * (pattern[i % len(pattern)] == "L") for i in range(self.num_layers))

    @property
    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Each decoder layer's LayerAttention: its window, and RoPE and linear by rope_layers, layer_types repeated."""
        r, windows = self.rope_layers or "R", enumerate(self.layer_windows)
        return tuple(LayerAttention(w, r[i % len(r)] == "R", linear_config.is_linear(self, i)) for i, w in windows)

    @property
    def rope(self) -> positional.Rope:
        """The RoPE of the global layers (and of the local ones unless rope_local_base is set)."""
        fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_len", "beta_fast", "beta_slow")
        kwargs = {name: getattr(self, f"rope_{name}") for name in (*fields, "truncate", "attention_factor", "fraction")}
        return positional.Rope(self.rope_base, self.rope_scaling, **kwargs)

    @property
    def local_rope(self) -> positional.Rope | None:
        """The local layers' own RoPE, unscaled (Gemma 3), or None: theirs is `rope`."""
        return positional.Rope(self.rope_local_base, fraction=self.rope_fraction) if self.rope_local_base else None

    @property
    def expert_d_ff(self) -> int:
        """Each routed (and shared) expert's hidden width."""
        return self.d_ff if self.moe_d_ff is None else self.moe_d_ff

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def width_multiplier(self) -> float:
        """muP's m = d_model / base_width; 1 under the standard parametrization."""
        return self.d_model / self.base_width if self.parametrization == "mup" else 1.0

    @property
    def hidden_init_std(self) -> float:
        """The hidden (matrix-like) weights' std: init_std, its variance times 1/m under muP (1/fan_in, Table 8)."""
        return self.init_std / self.width_multiplier**0.5

    @property
    def out_init_std(self) -> float:
        """GPT-2: residual-branch output projections scaled by 1/sqrt(2 * layers) (hidden weights: muP's 1/m too)."""
        return self.hidden_init_std / (2 * self.num_layers) ** 0.5
