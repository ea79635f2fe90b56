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

from collections.abc import Mapping
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax import precision
from txjax.activations import ACTIVATIONS
from txjax.attention import MultiHeadAttention, out_major_product, resolve_impl
from txjax.model_config import ModelConfig


class Dense(nn.Module):
    """y = x W + b, x [B, L, in], W [in, out] ~ N(0, std^2); with out_major (decoding one row) W is stored [out, in]
    and y = x W^T + b (attention.out_major_product says why). Parameters 'kernel' and 'bias', as nn.Dense names
    them, carry logical axis names (`axes`: in, out; for the sharding rules); in a low-precision dtype the product
    accumulates in float32 (txjax.precision)."""

    features: int
    axes: tuple[str, str]
    use_bias: bool
    dtype: jnp.dtype
    std: float
    out_major: bool = False

    @nn.compact
    def __call__(self, x_BxLxI):
        shape, axes, product = (x_BxLxI.shape[-1], self.features), self.axes, partial(precision.einsum, "bli,io->blo")
        if self.out_major:
            shape, axes, product = shape[::-1], axes[::-1], out_major_product
        kernel = self.param("kernel", nn.with_logical_partitioning(nn.initializers.normal(self.std), axes), shape)
        y_BxLxO = product(x_BxLxI.astype(self.dtype), kernel.astype(self.dtype))
        if not self.use_bias:
            return y_BxLxO
        bias_init = nn.with_logical_partitioning(nn.initializers.zeros, self.axes[1:])
        return y_BxLxO + self.param("bias", bias_init, (self.features,)).astype(self.dtype)


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
    """act(x W1 + b1) W2 + b2, or SwiGLU; W1 [d_model, d_ff], W2 [d_ff, d_model]. In the decoding layout SwiGLU's W1
    and W3 are one matrix 'wi_fused' (one product instead of two), its kernels [out, in] or [in, out] (Dense)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg, dtype = self.cfg, self.cfg.compute_dtype
        linear = lambda n, axes, name, std: Dense(n, axes, cfg.use_bias, dtype, std, cfg.out_major_kernels, name=name)
        w_in = lambda name, n=1: linear(n * cfg.d_ff, ("embed", "mlp"), name, cfg.hidden_init_std)
        act = ACTIVATIONS[cfg.activation]
        if cfg.activation != "swiglu":
            h_BxLxF = act(w_in("wi")(x_BxLxD))
        elif cfg.decoding_layout:
            h1_BxLxF, h3_BxLxF = jnp.split(w_in("wi_fused", 2)(x_BxLxD), 2, axis=-1)
            h_BxLxF = act(h1_BxLxF) * h3_BxLxF
        else:
            h_BxLxF = act(w_in("wi")(x_BxLxD)) * w_in("wi_gate")(x_BxLxD)
        return linear(x_BxLxD.shape[-1], ("mlp", "embed"), "wo", cfg.out_init_std)(h_BxLxF)


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
        rope_base=cfg.rope_base if (not cross and cfg.positional == "rope") else None,
        alibi=not cross and cfg.positional == "alibi",
        qk_norm=cfg.qk_norm,
        decoding_layout=cfg.decoding_layout,
        out_major=cfg.out_major_kernels,
        norm_eps=cfg.norm_eps,
        sow_weights=sow_weights,
        cross=cross,
        init_std=cfg.hidden_init_std,
        out_init_std=cfg.out_init_std,
        name=name,
    )


class Block(nn.Module):
    """One transformer layer: self-attention, optional cross-attention, FFN, each a residual branch.

    Signature fits nn.scan: (x, ctx) -> (x, None) with ctx (masks, positions, encoder output) broadcast.
    """

    cfg: ModelConfig
    cross: bool = False  # decoder block of an encoder-decoder
    causal: bool = False  # self-attention in causal order (a decoder) on top of ctx's mask
    sow_weights: bool = False
    deterministic: bool = True  # no dropout (eval, decode)
    decode: bool = False  # write keys/values into the KV cache

    @nn.compact
    def __call__(self, x_BxLxD, ctx):
        """ctx: dict with 'mask' [B,1,L,L] (segments; `causal` adds the causal order), 'pos' [B,L], and for cross
        blocks 'enc' [B,S,D] (None on cached decode steps) and 'enc_mask' [B,1,L,S]."""
        cfg, deterministic, decode = self.cfg, self.deterministic, self.decode
        dropout = nn.Dropout(cfg.dropout)
        drop = lambda y: dropout(y, deterministic=deterministic)  # on each residual branch, before the addition
        ln = lambda name: make_norm(cfg, f"{name}_norm")
        self_attn = make_attention(cfg, False, "self_attention", self.sow_weights)
        mha = lambda t: self_attn(
            t, ctx["mask"], q_pos=ctx["pos"], causal=self.causal, deterministic=deterministic, decode=decode
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


def decoding_params(tree, out_major: bool = True):
    """Parameters (unboxed, any nesting) -> those of decoding_layout=True, the same values rearranged: each
    self-attention's query/key/value side by side as 'qkv' [D, H+2G, K] (their biases likewise; cross-attention's
    stay apart: its keys and values read the encoder output), each SwiGLU FFN's wi/wi_gate as 'wi_fused' [D, 2F];
    with out_major every kernel stored output axes first (Dense [in, out] -> [out, in]; attention's
    query/key/value/qkv [D, H, K] -> [H, K, D], its out [H, K, D] -> [D, H, K]). What a decode step gains: 4 matrix
    products per layer instead of 7, each reading its weights row by row when it decodes one row
    (benchmarks/decode_profile.py)."""
    if not isinstance(tree, Mapping):
        return tree
    out = {key: decoding_params(sub, out_major) for key, sub in tree.items()}
    if "kernel" in out and out_major:  # a Dense
        out["kernel"] = out["kernel"].T
    for name in ("self_attention", "cross_attention"):
        if "query" not in out.get(name, {}):
            continue
        attention, names = dict(out[name]), ("query", "key", "value")
        if out_major:
            for n in names:
                attention[n] = jnp.moveaxis(attention[n], 0, -1)
            attention["out"] = jnp.moveaxis(attention["out"], -1, 0)
        if name == "self_attention":
            attention["qkv"] = jnp.concatenate([attention.pop(n) for n in names], axis=0 if out_major else 1)
            if "query_bias" in attention:
                attention["qkv_bias"] = jnp.concatenate([attention.pop(f"{n}_bias") for n in names], axis=0)
        out[name] = attention
    ffn = dict(out.get("ffn", {}))
    if "wi_gate" in ffn:  # SwiGLU: [W1 | W3], on the output axis (a bias's only axis)
        wi, gate = ffn.pop("wi"), ffn.pop("wi_gate")
        axis = 0 if out_major else -1
        ffn["wi_fused"] = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=axis), wi, gate)
        out["ffn"] = ffn
    return out
