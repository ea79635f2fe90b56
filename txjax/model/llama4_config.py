"""Llama 4's fields: chunked attention on the RoPE layers, its NoPE layers' query temperature, the RoPE layers'
weightless q/k norm (txjax.model.multi_head reads the three per layer, by LayerAttention) and its MoE's gate on the
experts' input (txjax.model.moe): a base of ModelConfig (keyword-only, so that they follow its positional fields),
checked by `check_llama4` from ModelConfig.__post_init__."""

from __future__ import annotations

import dataclasses

from txjax.fields import ReadBy, setting

_NOPE = (ReadBy("model.rope_layers", lambda r: "N" in r, "no layer is NoPE"),)
_TEMPERATURE = (ReadBy("model.attention_temperature", bool, "off"),)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Llama4Fields:
    """transformers' Llama4TextConfig's attention_chunk_size, attn_scale / floor_scale, use_qk_norm, and the router
    score on the experts' input."""

    attention_chunk: int = 0  # > 0: the layers rope_layers rotates attend within blocks of this many; 0 = off
    # NoPE layers' queries times 1 + attention_temperature * log(1 + floor((p + 1) / attention_floor_scale))
    attention_temperature: float = setting(0.0, resume=False, read_by=_NOPE)  # (attn_scale; 0 = off)
    attention_floor_scale: int = setting(8192, resume=False, read_by=_TEMPERATURE)
    qk_l2_norm: bool = False  # the RoPE layers' q and k divided by their RMS, no gain (use_qk_norm)
    moe_gate_input: bool = False  # the gate scales each expert's input, not its output: FFN_e(g x)


def check_llama4(cfg) -> None:
    """The Llama 4 fields of a ModelConfig: a ValueError naming the field and the fix."""
    if not isinstance(cfg.attention_chunk, int) or cfg.attention_chunk < 0:
        raise ValueError(f"model.attention_chunk={cfg.attention_chunk!r} must be an integer >= 0 (0 = off)")
    if not isinstance(cfg.attention_temperature, int | float) or not cfg.attention_temperature >= 0:
        raise ValueError(f"model.attention_temperature={cfg.attention_temperature!r} must be a number >= 0")
    if not isinstance(cfg.attention_floor_scale, int) or cfg.attention_floor_scale <= 0:
        raise ValueError(f"model.attention_floor_scale={cfg.attention_floor_scale!r} must be a positive integer")
