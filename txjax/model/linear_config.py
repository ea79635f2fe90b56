"""Which decoder layers mix tokens by Gated DeltaNet (txjax.model.gated_deltanet) instead of softmax attention, and
those layers' sizes: ModelConfig's layer_types and linear_* fields (LinearFields, its base), resolved
(`linear_sizes`) and checked (`check_linear`).

model.layer_types is a pattern of 'L' (linear: Gated DeltaNet) and 'F' (full attention) repeated over the decoder
layers ('LLLF': Qwen3-Next's three linear layers then one full). A stack that mixes both scans (or loops) groups of
the pattern's length, so the pattern's length divides num_layers (txjax.model.models.Stack).
"""

from __future__ import annotations

import dataclasses

LINEAR_FIELDS = ("linear_heads", "linear_v_heads", "linear_head_dim", "linear_v_head_dim", "linear_conv")
LINEAR_FIELDS += ("linear_chunk",)
_DEFAULTS = {"linear_conv": 4, "linear_chunk": 64}  # the others: 0, the attention's sizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearFields:
    """model.layer_types and the linear layers' sizes (0: the attention's): a base of ModelConfig, keyword-only."""

    layer_types: str = ""  # 'L' linear (Gated DeltaNet) / 'F' full per decoder layer, repeated ('LLLF'); '' = all F
    linear_heads: int = 0  # query/key heads (0: num_heads)
    linear_v_heads: int = 0  # value heads, a multiple of linear_heads (0: linear_heads)
    linear_head_dim: int = 0  # d_k (0: head_dim)
    linear_v_head_dim: int = 0  # d_v (0: linear_head_dim)
    linear_conv: int = 4  # the causal depthwise convolution's width
    linear_chunk: int = 64  # tokens per chunk of the training form (txjax.model.gated_deltanet)


@dataclasses.dataclass(frozen=True)
class LinearSizes:
    """A Gated DeltaNet layer's sizes: query/key heads and their d_k, value heads (a multiple of them) and d_v, the
    causal convolution's width and the training form's chunk length."""

    heads: int
    v_heads: int
    head_dim: int
    v_head_dim: int
    conv: int
    chunk: int

    @property
    def conv_channels(self) -> int:
        """The convolution's channels: q, k and v side by side."""
        return 2 * self.heads * self.head_dim + self.v_heads * self.v_head_dim


def linear_sizes(cfg) -> LinearSizes:
    """The linear layers' sizes, a 0 field taking the attention's (heads: num_heads; d_k: head_dim) or its pair's."""
    heads, head_dim = cfg.linear_heads or cfg.num_heads, cfg.linear_head_dim or cfg.head_dim
    v_heads, v_head_dim = cfg.linear_v_heads or heads, cfg.linear_v_head_dim or head_dim
    return LinearSizes(heads, v_heads, head_dim, v_head_dim, cfg.linear_conv, cfg.linear_chunk)


def is_linear(cfg, layer: int) -> bool:
    """Whether decoder layer `layer` is a Gated DeltaNet layer (layer_types repeated over the stack)."""
    pattern = cfg.layer_types or "F"
    return pattern[layer % len(pattern)] == "L"


def full_layers(cfg) -> int:
    """The decoder layers of softmax attention (the FLOP count's L x T^2 term; a linear layer's mixing is counted by
    its parameters only, its chunks' products L x C left out)."""
    return sum(not is_linear(cfg, i) for i in range(cfg.num_layers))


def check_linear(cfg) -> None:
    """The layer_types and linear_* fields: a one-line ValueError naming the field and the fix for a bad one."""
    pattern = cfg.layer_types
    if not isinstance(pattern, str) or set(pattern) - set("LF"):
        raise ValueError(f"model.layer_types={pattern!r} must be a string of L (linear: Gated DeltaNet) and F (full)")
    if len(set(pattern)) > 1 and cfg.num_layers % len(pattern):
        raise ValueError(
            f"model.layer_types={pattern!r} mixes linear and full layers in groups of {len(pattern)}, which do not "
            f"divide model.num_layers={cfg.num_layers}: give a pattern whose length divides it"
        )
    for name in LINEAR_FIELDS:
        value, least = getattr(cfg, name), 1 if name in _DEFAULTS else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"model.{name}={value!r} must be an integer >= {least}")
    if "L" not in pattern:
        unread = [name for name in LINEAR_FIELDS if getattr(cfg, name) != _DEFAULTS.get(name, 0)]
        if unread:
            back = " ".join(f"model.{name}={_DEFAULTS.get(name, 0)}" for name in unread)
            raise ValueError(
                f"model.{' and model.'.join(unread)} sized linear layers and no layer is linear: set {back} or "
                "model.layer_types with an L"
            )
        return
    linear = linear_sizes(cfg)
    if linear.v_heads % linear.heads:
        raise ValueError(
            f"model.linear_v_heads={linear.v_heads} must be a multiple of the query/key heads "
            f"(model.linear_heads, 0 = num_heads) {linear.heads}"
        )
    if cfg.attention_window or cfg.rope_layers:
        raise ValueError(
            "model.layer_types with linear layers takes full attention in the other layers, with RoPE in every one: "
            "set model.attention_window=0 and model.rope_layers='' (their defaults)"
        )
