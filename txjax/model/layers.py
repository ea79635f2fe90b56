"""Norms, the position-wise feed-forward network and the transformer block.

Block, pre-LN (Xiong et al. 2020; GPT-2):     t1 = LN(x);  t3 = x + MHA(t1);  h = t3 + FFN(LN(t3))
Block, post-LN (Vaswani et al. 2017):         t3 = LN(x + MHA(x));  h = LN(t3 + FFN(t3))
A decoder block of an encoder-decoder adds cross-attention over the encoder output between the two, and the FFN
reads t5 instead of t3:                       t5 = t3 + CrossMHA(LN(t3), enc)   (pre-LN)
                                              t5 = LN(t3 + CrossMHA(t3, enc))   (post-LN)
FFN(x) = act(x W1 + b1) W2 + b2 (ReLU in the 2017 paper, GELU in GPT-2); SwiGLU(x) = (silu(x W1) * x W3) W2.
Dropout is applied to each residual branch before the addition and is off when deterministic.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from txjax.model import precision as precision_lib
from txjax.model.activations import ACTIVATIONS, GATED
from txjax.model.attention import MultiHeadAttention, resolve_impl
from txjax.model.config import ModelConfig
from txjax.parallel.sharding import BATCH_LENGTH, constrain


def dense(features: int, axes: tuple[str, str], use_bias: bool, dtype, std: float, name=None) -> nn.Dense:
    """y = x W + b, W [in, out] ~ N(0, std^2): flax's nn.Dense ('kernel', 'bias'), its axes named (`axes`: in, out;
    for the sharding rules), the product through txjax.model.precision (float32 sums for 16-bit operands)."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=nn.with_logical_partitioning(nn.initializers.normal(std), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
        dot_general=_dense_product,
        name=name,
    )


def _dense_product(x, w, dimension_numbers, precision=None):
    """nn.Dense's dot_general as txjax.model.precision.einsum: x's last axis against w's first, no batch axes (the
    one form nn.Dense asks for; another is refused, not computed as this one)."""
    (x_contract, w_contract), batch_axes = dimension_numbers
    if tuple(x_contract) != (x.ndim - 1,) or tuple(w_contract) != (0,) or any(batch_axes):
        raise NotImplementedError(f"dense product with dimension_numbers={dimension_numbers}")
    return precision_lib.einsum("...i,io->...o", x, w)


def make_norm(cfg, name=None):
    """LayerNorm: g * (x - mean) / sqrt(var + eps) + b;  RMSNorm: g * x / sqrt(mean(x^2) + eps). Computed in float32."""
    scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=jnp.float32, scale_init=scale_init, name=name)
    return nn.LayerNorm(
        epsilon=cfg.norm_eps,
        dtype=jnp.float32,
        scale_init=scale_init,
        name=name,
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    )


class FeedForward(nn.Module):
    """act(x W1 + b1) W2 + b2, or SwiGLU; W1 (and W3) [d_model, d_ff], W2 [d_ff, d_model]."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        return self.linear("wo", x_BxLxD.shape[-1], ("mlp", "embed"), cfg.out_init_std)(self.hidden(x_BxLxD))

    def hidden(self, x_BxLxD):
        """act(x W1 + b1), or a gated act(x W1) * x W3 (SwiGLU, GeGLU): [B, L, d_ff]."""
        w_in = lambda name: self.linear(name, self.cfg.d_ff, ("embed", "mlp"), self.cfg.hidden_init_std)(x_BxLxD)
        act = ACTIVATIONS[self.cfg.activation]
        return act(w_in("wi")) * w_in("wi_gate") if self.cfg.activation in GATED else act(w_in("wi"))

    def linear(self, name, features, axes, std):
        return dense(features, axes, self.cfg.use_bias, self.cfg.compute_dtype, std, name=name)


def make_attention(cfg, cross: bool, name: str, sow_weights=False):
    """The one attention module, configured for self- (rope/alibi apply) or cross-attention (they do not)."""
    return MultiHeadAttention(
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        dtype=cfg.compute_dtype,
        use_bias=cfg.use_bias,
        qkv_bias=cfg.qkv_bias,
        dropout=cfg.attention_dropout,
        scale=cfg.attention_scale,
        impl=resolve_impl(cfg.attention_impl, cfg.compute_dtype, cfg.head_dim),
        block_sizes=(cfg.attention_block_q, cfg.attention_block_kv),
        rope=cfg.rope if (not cross and cfg.positional == "rope") else None,
        local_rope=cfg.local_rope,
        alibi=not cross and cfg.positional == "alibi",
        max_distance=cfg.relative_max_distance,
        qk_norm=cfg.qk_norm,
        norm_eps=cfg.norm_eps,
        sow_weights=sow_weights,
        cross=cross,
        init_std=cfg.hidden_init_std,
        out_init_std=cfg.out_init_std,
        name=name,
    )


class Block(nn.Module):
    """One transformer layer: self-attention, optional cross-attention, FFN, each a residual branch.

    Signature fits nn.scan: (x, ctx, window) -> (x, None) with ctx (masks, positions, encoder output) broadcast and
    the self-attention's local window (an int, 0 = global; or a scanned layer's traced scalar) broadcast or scanned.
    """

    cfg: ModelConfig
    cross: bool = False  # decoder block of an encoder-decoder
    causal: bool = False  # self-attention in causal order (a decoder) on top of ctx's mask
    sow_weights: bool = False
    deterministic: bool = True  # no dropout (eval, decode)
    decode: bool = False  # write keys/values into the KV cache

    @nn.compact
    def __call__(self, x_BxLxD, ctx, window=0):
        """ctx: dict with 'mask' (blockwise.Segments [B, L] twice; `causal` adds the causal order), 'pos' [B,L], and
        for cross blocks 'enc' [B,S,D] (None on cached decode steps) and 'enc_mask' (Segments [B, L], [B, S]). The
        hidden states are laid out as activations (rows over data x fsdp, the length over sequence) on the mesh in
        context."""
        cfg, deterministic, decode = self.cfg, self.deterministic, self.decode
        x_BxLxD = constrain(x_BxLxD, (*BATCH_LENGTH, None))
        dropout = nn.Dropout(cfg.dropout)
        drop = lambda y: dropout(y, deterministic=deterministic)  # on each residual branch, before the addition
        ln = lambda name: make_norm(cfg, f"{name}_norm")
        self_attn = make_attention(cfg, False, "self_attention", self.sow_weights)
        mha = lambda t: self_attn(
            t,
            ctx["mask"],
            q_pos=ctx["pos"],
            causal=self.causal,
            window=window,
            deterministic=deterministic,
            decode=decode,
            relative_table=ctx.get("relative_table"),  # T5's bucketed bias, one table per stack (models.Stack)
        )
        if self.cross:
            cross_attn = make_attention(cfg, True, "cross_attention", self.sow_weights)
            kv, mask = ctx["enc"], ctx["enc_mask"]
            cross = lambda t: cross_attn(t, mask, q_pos=ctx["pos"], kv=kv, deterministic=deterministic, decode=decode)
        ffn = FeedForward(cfg, name="ffn")
        x = x_BxLxD

        if cfg.norm_placement == "pre":  # Xiong et al. 2020; GPT-2
            t1 = ln("self_attention")(x)
            t3 = x + drop(mha(t1))
            t5 = t3 + drop(cross(ln("cross_attention")(t3))) if self.cross else t3
            h = t5 + drop(ffn(ln("ffn")(t5)))
        else:  # post-LN, Vaswani et al. 2017
            t3 = ln("self_attention")(x + drop(mha(x)))
            t5 = ln("cross_attention")(t3 + drop(cross(t3))) if self.cross else t3
            h = ln("ffn")(t5 + drop(ffn(t5)))
        return h.astype(x_BxLxD.dtype), None
