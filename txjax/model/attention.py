"""Attention, the function: its equation, the choice of a backend, and `attend`, the one call behind which they run.

    Attention(Q, K, V) = softmax(mask(Q K^T * scale)) V,     scale = 1/sqrt(d_k)   (Vaswani et al. 2017, eq. 1)

with every term of the scores (scale, soft-capping, positional biases, masks) written once in txjax.model.score.

`scaled_dot_product_attention` is one head; `attend` runs the scores' terms over all heads at once (grouped-query
attention: a K/V head shared by its group of query heads, never copied) or a fused kernel, for self-attention,
masked self-attention (a causal mask, a local window: txjax.model.masks) and cross-attention alike. Masks are
boolean with True meaning "may attend". The multi-head module that projects into and out of the heads and keeps
the KV cache: txjax.model.multi_head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import einops
import jax
import jax.numpy as jnp

from txjax.model import blockwise, precision, ring_attention, score
from txjax.model.masks import is_global

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
    float32 (txjax.model.score.weights of one head's terms)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    raw = precision.einsum("...qd,...kd->...qk", q, k, out_dtype=jnp.float32)
    return score.weights(score.Terms(scale, softcap, mask=mask, bias=bias), raw)


def attention_output(probs, v):
    """probs @ v: [..., n_q, n_k] x [..., n_k, d_v] -> [..., n_q, d_v] in v's dtype (float32 sums)."""
    return precision.einsum("...qk,...kd->...qd", probs.astype(v.dtype), v)


# ----------------------------------------------------------------------------------------------------------------
# Choosing a backend


def resolve_impl(impl: str, dtype, head_dim: int, fused_lacks: bool = False) -> str:
    """The attention implementation that runs for ModelConfig.attention_impl: 'auto' is cuDNN's fused (flash)
    kernel on an NVIDIA GPU where it serves the case (16-bit q/k/v, d_k a multiple of 8 up to 128, no score term it
    lacks: score.fused_lacks), else the reference einsums; 'reference', 'fused' (jax.nn.dot_product_attention's XLA
    formulation) and 'cudnn' as named (ModelConfig refuses them with a term they lack)."""
    if impl == "cudnn" and not cuda_available():
        raise ValueError(f"model.attention_impl='cudnn' needs an NVIDIA GPU (here: {jax.default_backend()}); use auto")
    if impl != "auto":
        return impl
    fits = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128 and not fused_lacks
    return "cudnn" if fits and cuda_available() else "reference"


def segment_backend(
    impl: str, mask, needs_scores: bool, block_sizes: tuple[int, int], window=0, softcap=0.0, chunk=0
) -> Callable | None:
    """The one choice of an attention backend that reads the mask as blockwise.Segments (O(L) values), with
    blockwise.attention's signature: ring attention (txjax.model.ring_attention) while the mesh in context shards the
    sequence, else blockwise attention (txjax.model.blockwise) when `impl` asks for it; None for the dense paths
    (`attend`), and always when someone needs the dense scores (a decode step reads its cache, sown weights are
    L x S) or the mask is dense already. A soft cap is bound into either, a local `window` and chunked attention's
    blocks into blockwise's (ring attention refuses them)."""
    if needs_scores or not (mask is None or isinstance(mask, blockwise.Segments)):
        return None
    if ring_attention.serves():
        if not is_global(window):
            raise ValueError("ring attention (mesh.sequence > 1) has no local window: set model.attention_window=0")
        if not is_global(chunk):
            raise ValueError("ring attention (mesh.sequence > 1) has no chunked attention: set model.attention_chunk=0")
        return functools.partial(ring_attention.attention, block_q=block_sizes[0], softcap=softcap)
    if impl == "blockwise":
        blocks = dict(block_q=block_sizes[0], block_kv=block_sizes[1])
        return functools.partial(blockwise.attention, **blocks, window=window, softcap=softcap, chunk=chunk)
    return None


def cuda_available() -> bool:
    """Whether jax's default backend is an NVIDIA GPU (cuDNN's attention needs CUDA; a ROCm GPU is 'gpu' too)."""
    return jax.default_backend() == "gpu" and "cuda" in jax.devices()[0].client.platform_version.lower()


# ----------------------------------------------------------------------------------------------------------------
# The attention backends, behind one dispatch


def _per_head(fn: Callable, q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, terms: score.Terms, keep):
    """fn(q, k, v, terms, keep) of one head ([B, L, K], [B, S, K], terms and keep [B|1, L, S]) vmapped over the K/V
    heads and then over their query heads (grouped-query attention: H = KV * R, K/V broadcast, never copied): each
    canonical [B|1, H, L, S] array of `terms` and `keep` split by head, a [B|1, 1, L, S] one shared by all of them.
    -> out [B, L, H, K], probs [B, H, L, S]."""
    g = k_BxSxGxK.shape[-2]
    per_head = lambda t: t.shape[1] > 1
    split = lambda t: einops.rearrange(t, "b (g r) l s -> b g r l s", g=g) if per_head(t) else t[:, 0]
    axes = lambda axis: lambda t: axis if per_head(t) else None
    over_group = jax.vmap(fn, in_axes=(-2, None, None, *(jax.tree.map(axes(-3), (terms, keep)))), out_axes=(-2, -3))
    over_kv = jax.vmap(over_group, in_axes=(-3, -2, -2, *(jax.tree.map(axes(1), (terms, keep)))), out_axes=(-3, 1))
    q_BxLxGxRxK = einops.rearrange(q_BxLxHxK, "b l (g r) k -> b l g r k", g=g)
    out, probs = over_kv(q_BxLxGxRxK, k_BxSxGxK, v_BxSxGxK, *jax.tree.map(split, (terms, keep)))
    return einops.rearrange(out, "b l g r k -> b l (g r) k"), einops.rearrange(probs, "b g r l s -> b (g r) l s")


def attend(q, k, v, terms: score.Terms, *, keep=None, impl="reference", weights=False):
    """softmax(mask(soft_cap(q k^T * scale) + bias)) v per head, its scores' terms from `terms` (score.Terms): q
    [B, L, H, K], k/v [B, S, KV, K], keep (dropout multipliers) [B|1, H, L, S] or None.
    -> (out [B, L, H, K], probs [B, H, L, S] or None).

    impl: 'reference' (score.weights of one head, vmapped over the heads), 'fused' / 'cudnn'
    (jax.nn.dot_product_attention's XLA or cuDNN kernel with the terms it expresses: scale, bias, mask, causal
    order and window by index; it keeps no weights and applies no dropout, so `weights` or `keep` take the
    reference; ModelConfig refuses the terms it lacks, score.FUSED_LACKS)."""
    b, l, s = q.shape[0], q.shape[1], k.shape[1]
    if impl in ("fused", "cudnn") and keep is None and not weights:
        mask, causal = terms.mask, terms.causal
        full = None if mask is None else jnp.broadcast_to(mask, (b, 1, l, s))
        local = None if is_global(terms.window) else (terms.window - 1, 0)  # i - window < j <= i
        kernel = dict(is_causal=causal, local_window_size=local, implementation=impl.replace("fused", "xla"))
        out = jax.nn.dot_product_attention(q, k, v, terms.bias, full, scale=terms.scale, **kernel)
        if mask is None:
            return out, None
        # like the reference: a query with no key to attend to (padding) gets zeros
        attended = full & jnp.tri(l, s, dtype=bool) if causal else full
        return out * attended.any(-1)[:, 0, :, None, None].astype(out.dtype), None
    if k.shape[-2] < q.shape[-2] and q.dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
        # XLA:CPU runs bfloat16 dots only through XNNPACK, which takes at most two batch axes; the backward of
        # grouped-query attention over [B, S, KV, K] has three (batch, K/V head, query head of the group)
        q, k, v = (t.astype(jnp.float32) for t in (q, k, v))

    def one_head(q_, k_, v_, terms_, keep_):
        probs = score.weights(terms_, precision.einsum("...qd,...kd->...qk", q_, k_, out_dtype=jnp.float32))
        return attention_output(probs if keep_ is None else probs * keep_, v_), probs

    out, probs = _per_head(one_head, q, k, v, terms, keep)
    return out, probs if weights else None
