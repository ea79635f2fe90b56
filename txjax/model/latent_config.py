"""Multi-head latent attention's fields (model.attention=mla: txjax.model.latent) and DeepSeek's YaRN softmax
multiplier: a base of ModelConfig (keyword-only, so that they follow its positional fields), checked by
`check_latent` from ModelConfig.__post_init__. A field MLA does not read is refused with MHA, and a setting MLA has
no form for (a local window, NoPE layers, q/k norms, K/V heads of their own, a fused kernel) is refused with MLA."""

from __future__ import annotations

import dataclasses

ATTENTIONS = ("mha", "mla")
LATENT_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentFields:
    """DeepSeek-V2/V3's MLA sizes (transformers' DeepseekV3Config names) and YaRN's mscale_all_dim."""

    attention: str = "mha"  # mha: MultiHeadAttention | mla: LatentAttention (txjax.model.latent), self-attention
    q_lora_rank: int = 0  # mla: the queries' latent width; 0 = the queries projected from x directly
    kv_lora_rank: int = 0  # mla: the keys' and values' shared latent, what the KV cache holds per token
    qk_nope_head_dim: int = 0  # mla: each head's key/query channels rebuilt from the latent (no RoPE)
    qk_rope_head_dim: int = 0  # mla: the RoPE channels of each query head and of the one key all heads share
    v_head_dim: int = 0  # mla: each head's value width
    rope_mscale_all_dim: float = 0.0  # yarn: the scores' scale times (0.1 m ln(factor) + 1)^2 (DeepSeek's), 0 = off

    @property
    def qk_head_dim(self) -> int:
        """The width of an MLA head's query and key: the d of its 1/sqrt(d) scale."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def check_latent(cfg) -> None:
    """The MLA fields of a ModelConfig: a ValueError naming the field and the fix."""
    if cfg.attention not in ATTENTIONS:
        raise ValueError(f"model.attention={cfg.attention!r} is not one of {', '.join(ATTENTIONS)}")
    if not isinstance(cfg.rope_mscale_all_dim, (int, float)) or not cfg.rope_mscale_all_dim >= 0:
        raise ValueError(f"model.rope_mscale_all_dim={cfg.rope_mscale_all_dim!r} must be a number >= 0 (0 = off)")
    if cfg.rope_mscale_all_dim and (cfg.positional, cfg.rope_scaling) != ("rope", "yarn"):
        raise ValueError(
            "model.rope_mscale_all_dim is YaRN's: set model.positional=rope and model.rope_scaling=yarn, or "
            "model.rope_mscale_all_dim=0"
        )
    if cfg.attention == "mha":
        if unread := [name for name in LATENT_SIZES if getattr(cfg, name) != 0]:
            raise ValueError(
                f"model.{' and model.'.join(unread)} {'are' if len(unread) > 1 else 'is'} read by model.attention=mla "
                f"only: set model.attention=mla or {' '.join(f'model.{name}=0' for name in unread)}"
            )
        return
    for name in LATENT_SIZES:
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 0:
            raise ValueError(f"model.{name}={getattr(cfg, name)!r} must be an integer >= 0")
    for name in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
        if getattr(cfg, name) == 0:
            raise ValueError(f"model.attention=mla needs model.{name} > 0")
    if cfg.qk_rope_head_dim % 2:
        raise ValueError(f"model.qk_rope_head_dim={cfg.qk_rope_head_dim} must be even (RoPE rotates pairs)")
    lacking = {
        "model.positional=rope": cfg.positional != "rope",  # the shared key's channels are RoPE's
        "model.rope_fraction=1.0": cfg.rope_fraction != 1.0,  # qk_rope_head_dim says which channels rotate
        "model.attention_impl=reference or blockwise": cfg.attention_impl in ("fused", "cudnn"),  # v_head_dim != d_k
        "model.attention_window=0": cfg.attention_window != 0,  # the latent cache has no ring buffer
        "model.rope_layers=''": cfg.rope_layers != "",
        "model.attention_chunk=0": cfg.attention_chunk != 0,
        "model.rope_local_base=0": cfg.rope_local_base != 0,
        "model.qk_norm=false": cfg.qk_norm,
        "model.attention_output_gate=false": cfg.attention_output_gate,
        "model.num_kv_heads=None": cfg.num_kv_heads is not None,  # every head reads the one latent
        "model.d_head=None": cfg.d_head is not None,  # qk_nope/qk_rope/v_head_dim give the heads' widths
        "model.qkv_bias, use_bias and attention_bias=false": cfg.qkv_bias or cfg.use_bias or cfg.attention_bias,
    }
    if wrong := [fix for fix, bad in lacking.items() if bad]:
        raise ValueError(f"model.attention=mla has no form for this: set {', '.join(wrong)}")
