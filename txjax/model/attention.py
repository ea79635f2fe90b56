"""Attention, the function: its equation, the choice of a backend, and `attend`, the one call behind which they run.

    Attention(Q, K, V) = softmax(mask(Q K^T * scale)) V,     scale = 1/sqrt(d_k)   (Vaswani et al. 2017, eq. 1)

with two variants of the scores s = Q K^T * scale: soft-capped, c tanh(s / c) (Gemma 2's attn_logit_softcapping),
and a scale 1/sqrt(d) of another d than d_k (Gemma's query_pre_attn_scalar: `score_scale`).

`scaled_dot_product_attention` is one head; `attend` runs it vmapped over the heads (grouped-query attention: a K/V
head shared by its group of query heads, never copied) or a fused kernel, for self-attention, masked self-attention
(a causal mask, a local window: txjax.model.masks) and cross-attention alike. Masks are boolean with True meaning
"may attend". The multi-head module that projects into and out of the heads and keeps the KV cache:
txjax.model.multi_head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import einops
import jax
import jax.numpy as jnp

from txjax.model import blockwise, precision, ring_attention
from txjax.model.activations import soft_cap
from txjax.model.masks import NEG_INF, is_global, window_mask

ATTENTION_IMPLS = ("auto", "reference", "fused", "cudnn", "blockwise")  # auto: resolve_impl picks one of the rest

# ----------------------------------------------------------------------------------------------------------------
# The equation


def scaled_dot_product_attention(
    q, k, v, mask=None, *, bias=None, scale=None, softcap=0.0, keep=None, return_weights=False
):
    """softmax(mask(q k^T * scale + bias)) v for one head.

    q: [..., n_q, d_k], k: [..., n_k, d_k], v: [..., n_k, d_v]; mask: bool broadcastable to [..., n_q, n_k]
    (True = may attend); bias: float broadcastable to [..., n_q, n_k] (ALiBi). scale defaults to 1/sqrt(d_k);
    softcap c > 0 caps the scores q k^T * scale at c tanh(. / c) before the bias and mask.
    keep: dropout on the attention weights, multipliers (0 or 1/(1-p)) broadcastable to [..., n_q, n_k].
    The softmax runs in float32 whatever the input dtype; a row whose keys are all masked returns zeros.
    Returns [..., n_q, d_v]; with return_weights also the weights softmax(...) [..., n_q, n_k] (before dropout).
    """
    probs = attention_weights(q, k, mask, bias=bias, scale=scale, softcap=softcap)
    out = attention_output(probs if keep is None else probs * keep, v)
    return (out, probs) if return_weights else out


def attention_weights(q, k, mask=None, *, bias=None, scale=None, softcap=0.0):
    """The probabilities softmax(mask(soft_cap(q k^T * scale, softcap) + bias)) over keys: [..., n_q, n_k],
    float32."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = soft_cap(precision.einsum("...qd,...kd->...qk", q, k, out_dtype=jnp.float32) * scale, softcap)
    if bias is not None:
        scores = scores + bias
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask.any(axis=-1, keepdims=True), probs, 0.0)  # fully masked row -> zeros, not uniform


def attention_output(probs, v):
    """probs @ v: [..., n_q, n_k] x [..., n_k, d_v] -> [..., n_q, d_v] in v's dtype (float32 sums)."""
    return precision.einsum("...qk,...kd->...qd", probs.astype(v.dtype), v)


# ----------------------------------------------------------------------------------------------------------------
# Choosing a backend


def resolve_impl(impl: str, dtype, head_dim: int, softcap: float = 0.0) -> str:
    """The attention implementation that runs for ModelConfig.attention_impl: 'auto' is cuDNN's fused (flash)
    kernel on an NVIDIA GPU where it serves the case (16-bit q/k/v, d_k a multiple of 8 up to 128, no soft-capped
    scores), else the reference einsums; 'reference', 'fused' (jax.nn.dot_product_attention's XLA formulation) and
    'cudnn' as named (ModelConfig refuses them with a soft cap: jax.nn.dot_product_attention has none)."""
    if impl == "cudnn" and not cuda_available():
        raise ValueError(f"model.attention_impl='cudnn' needs an NVIDIA GPU (here: {jax.default_backend()}); use auto")
    if impl != "auto":
        return impl
    fits = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128 and not softcap
    return "cudnn" if fits and cuda_available() else "reference"


def segment_backend(
    impl: str, mask, needs_scores: bool, block_sizes: tuple[int, int], window=0, softcap=0.0
) -> Callable | None:
    """The one choice of an attention backend that reads the mask as blockwise.Segments (O(L) values), with
    blockwise.attention's signature: ring attention (txjax.model.ring_attention) while the mesh in context shards the
    sequence, else blockwise attention (txjax.model.blockwise) when `impl` asks for it; None for the dense paths
    (`attend`), and always when someone needs the dense scores (a decode step reads its cache, sown weights are
    L x S) or the mask is dense already. A local `window` and a soft cap are bound into blockwise's; ring attention
    refuses them."""
    if needs_scores or not (mask is None or isinstance(mask, blockwise.Segments)):
        return None
    if ring_attention.serves():
        if not is_global(window):
            raise ValueError("ring attention (mesh.sequence > 1) has no local window: set model.attention_window=0")
        if softcap:
            raise ValueError("ring attention (mesh.sequence > 1) has no score soft-capping: model.attention_softcap=0")
        return functools.partial(ring_attention.attention, block_q=block_sizes[0])
    if impl == "blockwise":
        blocks = dict(block_q=block_sizes[0], block_kv=block_sizes[1])
        return functools.partial(blockwise.attention, **blocks, window=window, softcap=softcap)
    return None


def cuda_available() -> bool:
    """Whether jax's default backend is an NVIDIA GPU (cuDNN's attention needs CUDA; a ROCm GPU is 'gpu' too)."""
    return jax.default_backend() == "gpu" and "cuda" in jax.devices()[0].client.platform_version.lower()


# ----------------------------------------------------------------------------------------------------------------
# The attention backends, behind one dispatch


def over_query_group(fn: Callable) -> Callable:
    """vmap a one-head fn(q, k, v, mask, bias, keep) over the R query heads that share one K/V head: q [.., L, R, K]
    with k/v [.., S, K] (broadcast, never copied), per-head bias/keep [.., R, L, S] -> (out [.., L, R, K], probs
    [.., R, L, S])."""
    return jax.vmap(fn, in_axes=(-2, None, None, None, -3, -3), out_axes=(-2, -3))


def _per_head(fn: Callable, q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, bias, keep):
    """fn vmapped over the K/V heads and then over their query heads (grouped-query attention: H = KV * R); the mask
    [B|1, L, S] is shared by the heads, bias/keep come as [B|1, H, L, S] -> out [B, L, H, K], probs [B, H, L, S]."""
    g = k_BxSxGxK.shape[-2]
    split = lambda t: None if t is None else einops.rearrange(t, "b (g r) l s -> b g r l s", g=g)
    q_BxLxGxRxK = einops.rearrange(q_BxLxHxK, "b l (g r) k -> b l g r k", g=g)
    over_kv = jax.vmap(over_query_group(fn), in_axes=(-3, -2, -2, None, 1, 1), out_axes=(-3, 1))
    out, probs = over_kv(q_BxLxGxRxK, k_BxSxGxK, v_BxSxGxK, mask, split(bias), split(keep))
    return einops.rearrange(out, "b l g r k -> b l (g r) k"), einops.rearrange(probs, "b g r l s -> b (g r) l s")


def score_scale(kind: str, head_dim: int) -> float:
    """The scores' scale: 'sqrt' 1/sqrt(d) (the paper's, d = d_k), 'none' 1, 'linear' 1/d (muP); `head_dim` is d
    (Gemma scales by its query_pre_attn_scalar, not always d_k)."""
    return {"sqrt": head_dim**-0.5, "none": 1.0, "linear": 1.0 / head_dim}[kind]


def attend(
    q, k, v, mask, *, causal=False, window=0, bias=None, scale=None, softcap=0.0, keep=None, impl="reference",
    weights=False,
):  # fmt: skip
    """softmax(mask(soft_cap(q k^T * scale, softcap) + bias)) v per head: q [B, L, H, K], k/v [B, S, KV, K], mask
    bool [B|1, 1, L, S] or None, `causal` adds causal order by index (positions grow along the sequence within a
    segment, as txjax's inputs do) and `window` (an int, 0 = global) a local window by index (masks.window_mask; the
    fused kernels' local_window_size); bias/keep [B|1, H, L, S]. -> (out [B, L, H, K], probs [B, H, L, S] or None).

    impl: 'reference' (the one-head function, vmapped over the heads), 'fused' / 'cudnn' (jax.nn.dot_product_attention's
    XLA or cuDNN kernel; they keep no weights, apply no dropout and cap no scores, so `weights`, `keep` or `softcap`
    take the reference)."""
    b, l, s = q.shape[0], q.shape[1], k.shape[1]
    if impl in ("fused", "cudnn") and keep is None and not weights and not softcap:
        full = None if mask is None else jnp.broadcast_to(mask, (b, 1, l, s))
        local = None if is_global(window) else (window - 1, 0)  # i - window < j <= i
        kernel = dict(
            scale=scale, is_causal=causal, local_window_size=local, implementation=impl.replace("fused", "xla")
        )
        out = jax.nn.dot_product_attention(q, k, v, bias, full, **kernel)
        if mask is None:
            return out, None
        # like the reference: a query with no key to attend to (padding) gets zeros
        attended = full & jnp.tri(l, s, dtype=bool) if causal else full
        return out * attended.any(-1)[:, 0, :, None, None].astype(out.dtype), None
    if causal:  # the reference applies the causal order (and the window) as part of the mask
        order = jnp.tri(l, s, dtype=bool)[None, None]
        if not is_global(window):
            order = order & window_mask(jnp.arange(l)[None], jnp.arange(s)[None], window)
        mask = order if mask is None else mask & order
    if k.shape[-2] < q.shape[-2] and q.dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
        # XLA:CPU runs bfloat16 dots only through XNNPACK, which takes at most two batch axes; the backward of
        # grouped-query attention over [B, S, KV, K] has three (batch, K/V head, query head of the group)
        q, k, v = (t.astype(jnp.float32) for t in (q, k, v))

    def one_head(q_, k_, v_, m_, bias_, keep_):
        kwargs = dict(bias=bias_, scale=scale, softcap=softcap, keep=keep_, return_weights=True)
        return scaled_dot_product_attention(q_, k_, v_, m_, **kwargs)

    out, probs = _per_head(one_head, q, k, v, None if mask is None else mask[:, 0], bias, keep)
    return out, probs if weights else None
