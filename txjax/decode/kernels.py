"""Decoding's kernels: the model's own parameters and methods rearranged for fast cached decoding, from outside.

The model (txjax.model.attention, txjax.model.layers) is the equations in one parameter layout. A decoding layout is two
transformations applied to a trained model, never a config: `decoding_params` rewrites its parameters under new
names (so nothing guesses a layout from shapes), and LAYOUT replaces seven of the model's methods declared replaceable
in txjax/model/replaceable.py (`installed()`: while it is installed, a module holding such a parameter runs the
method here that reads it; every other call runs the model's own).

    fused projections   x [W^Q | W^K | W^V] one product ('qkv'), SwiGLU's x [W1 | W3] one product ('wi_fused')
    out-major kernels   every weight stored output axes first ('kernel_t', 'qkv_t', 'out_t', ...), for one row on
                        XLA:CPU (out_major_product says why)
    cache layout        keys [B*KV, K, S], values [B*KV, S, K] (cache_layout says why; txjax.model.kv_cache's
                        'decoding' layout of its SCHEMA)
The encoder of an encoder-decoder keeps the trained layout (it runs once per source). Which of these pays on this
machine: `python benchmarks/decode_kernels.py` (an A/B of each against the plain model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.model import attention, kv_cache, precision, score
from txjax.model.activations import hidden_units
from txjax.model.ffn import FeedForward
from txjax.model.multi_head import MultiHeadAttention
from txjax.model.replaceable import Layout

DECODING_NAMES = ("qkv", "qkv_t", "wi_fused", "kernel_t", "out_t")  # parameters no trained model has


def decoding_params(tree, fused: bool = True, out_major: bool = True):
    """Trained parameters (unboxed, looped layers) -> the decoding layout, the same values rearranged: each
    self-attention's query/key/value side by side as 'qkv' [D, H+2G, K] (their biases 'qkv_bias'), each SwiGLU's
    wi/wi_gate as 'wi_fused' [D, 2F] (with `fused`); with `out_major` every kernel stored output axes first under a
    '_t' name (Dense 'kernel' [in, out] -> 'kernel_t' [out, in]; attention's query/key/value/qkv/gate [D, H, K] ->
    [H, K, D], out [H, K, D] -> 'out_t' [D, H, K]). The encoder's subtree is left as it is."""
    if not isinstance(tree, Mapping):
        return tree
    out = {k: v if k == "encoder" else decoding_params(v, fused, out_major) for k, v in tree.items()}
    if "kernel" in out and out_major:  # a Dense
        out["kernel_t"] = out.pop("kernel").T
    for name in ("self_attention", "cross_attention"):
        if "query" not in out.get(name, {}):
            continue
        weights, names = dict(out[name]), ("query", "key", "value")
        if fused and name == "self_attention":
            weights["qkv"] = jnp.concatenate([weights.pop(n) for n in names], axis=1)
            if "query_bias" in weights:
                weights["qkv_bias"] = jnp.concatenate([weights.pop(f"{n}_bias") for n in names], axis=0)
        if out_major:
            for n in {"qkv", *names, "gate"} & set(weights):  # gate: the output gate's W^G (its own product)
                weights[f"{n}_t"] = jnp.moveaxis(weights.pop(n), 0, -1)
            weights["out_t"] = jnp.moveaxis(weights.pop("out"), -1, 0)
        out[name] = weights
    ffn = dict(out.get("ffn", {}))
    if fused and "wi_gate" in ffn:  # SwiGLU: [W1 | W3] on the output axis (a bias's only axis)
        wi, gate = ffn.pop("wi"), ffn.pop("wi_gate")
        axis = 0 if out_major else -1
        ffn["wi_fused"] = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=axis), wi, gate)
        out["ffn"] = ffn
    return out


def is_decoding(params) -> bool:
    """Whether `params` are already in a decoding layout (hold a name of DECODING_NAMES)."""
    paths = jax.tree_util.tree_leaves_with_path(params)
    return any(getattr(key, "key", None) in DECODING_NAMES for path, _ in paths for key in path)


# ----------------------------------------------------------------------------------------------------------------
# The layouts' products and cache


def out_major_product(x_BxLxI, w_Oxi):
    """x W^T with W stored output axes first, [O..., I...]: x's trailing axes (I...) against W's as one
    [(O...), (I...)] matrix, the result's last axis split back into O... .

    Why: XLA:CPU multiplies a vector by an [out, in] matrix reading each output's weights as one contiguous row,
    faster than by [in, out]; a kernel with two output or input axes it would first transpose into [in, out] (a
    copy of the whole matrix at every call), hence the flattening. One row only: from 2 rows on, x [B, in] W [in,
    out] is the faster product (benchmarks/decode_profile.py --batch=32 lists the weight products)."""
    out_axes = w_Oxi.shape[: w_Oxi.ndim - (x_BxLxI.ndim - 2)]
    w_2d = w_Oxi.reshape(math.prod(out_axes), -1)
    y = precision.einsum("bli,oi->blo", x_BxLxI.reshape(*x_BxLxI.shape[:2], -1), w_2d)
    return y.reshape(*y.shape[:2], *out_axes)


def cache_layout(k_BxSxGxK, v_BxSxGxK):
    """Keys and values [B, S, KV, K] -> keys [B*KV, K, S], values [B*KV, S, K] (rows and K/V heads on one leading
    axis; keys transposed).

    Why one leading axis: XLA:CPU multiplies batched matrices in place only when their batch axes lead in memory in
    the product's order and are not of size 1; vmapped over the heads of [B, S, KV, K] the products' batch axes are
    (K/V head, row), so every decode step would copy each layer's whole cache into that order. Why keys transposed:
    XLA:CPU's batched product q [R, K] x k^T streams k [K, S] (a plain matrix product) faster than k [S, K]
    contracted on its minor axis (benchmarks/decode_profile.py shows the score products)."""
    return einops.rearrange(k_BxSxGxK, "b s g k -> (b g) k s"), einops.rearrange(v_BxSxGxK, "b s g k -> (b g) s k")


# ----------------------------------------------------------------------------------------------------------------
# The methods that read the decoding layout (each falls back to the model's own where its parameter is absent)


def _has(module, name):
    return module.has_variable("params", name)


def _project_qkv(own, module, x_BxLxD, kv_BxSxD):
    """Self-attention with 'qkv': one product x [W^Q | W^K | W^V], split into q, k, v."""
    if module.cross or not (_has(module, "qkv") or _has(module, "qkv_t")):
        return own(x_BxLxD, kv_BxSxD)
    h, g = module.num_heads, module.num_kv_heads
    q, k, v = jnp.split(module.heads_in("qkv", h + 2 * g, x_BxLxD), (h, h + g), axis=2)
    return module.norm("query_norm", q), module.norm("key_norm", k), v


def _out_major(module, name, x, bias):
    """x W^T (+ bias) for an out-major parameter `name` in the module's compute dtype."""
    w = module.get_variable("params", name)
    y = out_major_product(x.astype(module.dtype), w.astype(module.dtype))
    return y if bias is None else y + module.get_variable("params", bias).astype(module.dtype)


def _heads_in(own, module, name, heads, x_BxLxD):
    if not _has(module, f"{name}_t"):
        return own(name, heads, x_BxLxD)
    return _out_major(module, f"{name}_t", x_BxLxD, f"{name}_bias" if module.use_bias or module.qkv_bias else None)


def _project_out(own, module, out_BxLxHxK, d_model):
    if not _has(module, "out_t"):
        return own(out_BxLxHxK, d_model)
    return _out_major(module, "out_t", out_BxLxHxK, "out_bias" if module.use_bias else None)


def _dense(own, module, inputs):
    if not _has(module, "kernel_t"):
        return own(inputs)
    return _out_major(module, "kernel_t", inputs, "bias" if module.use_bias else None)


def _ffn_hidden(own, module, x_BxLxD):
    """SwiGLU with 'wi_fused': one product x [W1 | W3], split."""
    if not _has(module, "wi_fused"):
        return own(x_BxLxD)
    cfg, width = module.cfg, module.hidden_width
    h1, h3 = jnp.split(module.linear("wi_fused", 2 * width, ("embed", "mlp"), cfg.hidden_init_std, x_BxLxD), 2, -1)
    return hidden_units(cfg.activation, h1, h3)


def _update_cache(own, module, k_new, v_new, q_pos, k_pos, mask, window=0):
    """MultiHeadAttention.update_cache in cache_layout (kv_cache's 'decoding' layout)."""
    if module.cross:
        new = None if k_new is None else cache_layout(k_new, v_new)
        return own(*(new or (None, None)), q_pos, k_pos, mask)
    k_new, v_new = cache_layout(k_new, v_new)
    if isinstance(window, int) and window > 0:
        return kv_cache.window_kv_cache(module, k_new, v_new, q_pos, mask, window, layout="decoding")
    return kv_cache.append_kv_cache(module, k_new, v_new, q_pos, mask, layout="decoding")


def _attend(own, module, q_BxLxHxK, k, v, terms, deterministic):
    """Attention over keys [B*KV, K, S] and values [B*KV, S, K] (a module holding a cache: decode mode), its scores
    by txjax.model.score.weights from the model's own terms (score.Terms), every canonical array of them arranged
    into this layout by one function, so that no term can be left out here."""
    if not any(
        module.has_variable("cache", name) for name in (kv_cache.KEYS, kv_cache.WINDOW_KEYS, kv_cache.CROSS_KEYS)
    ):
        return own(q_BxLxHxK, k, v, terms, deterministic)
    b = q_BxLxHxK.shape[0]
    if module.impl == "fused":  # jax.nn.dot_product_attention's [B, S, KV, K]
        k, v = einops.rearrange(k, "(b g) k s -> b s g k", b=b), einops.rearrange(v, "(b g) s k -> b s g k", b=b)
        return attention.attend(q_BxLxHxK, k, v, terms, impl=module.impl)[0]
    g = k.shape[0] // b
    per_head = lambda t: t.shape[1] > 1

    def arrange(t):  # canonical [B|1, H|1, L, S] -> [B*KV, R, L, S], or [B*KV, L, S] shared by the heads
        t = jnp.broadcast_to(t, (b, *t.shape[1:]))  # [1, ...]: shared by the rows
        if per_head(t):
            return einops.rearrange(t, "b (g r) l s -> (b g) r l s", g=g)
        return einops.repeat(t[:, 0], "b l s -> (b g) l s", g=g)

    def one_head(q, k_KxS, v, terms_):  # XLA folds the swap into the score product, which reads [K, S]
        probs = score.weights(terms_, precision.einsum("...qd,...kd->...qk", q, k_KxS.T, out_dtype=jnp.float32))
        return attention.attention_output(probs, v)

    over_group = jax.vmap(
        one_head, in_axes=(-2, None, None, jax.tree.map(lambda t: -3 if per_head(t) else None, terms)), out_axes=-2
    )
    q_BGxLxRxK = einops.rearrange(q_BxLxHxK, "b l (g r) k -> (b g) l r k", g=g)
    out = jax.vmap(over_group)(q_BGxLxRxK, k, v, jax.tree.map(arrange, terms))
    return einops.rearrange(out, "(b g) l r k -> b l (g r) k", b=b)


LAYOUT = Layout(
    "txjax.decode.kernels",
    {
        (MultiHeadAttention, "project_qkv"): _project_qkv,
        (MultiHeadAttention, "heads_in"): _heads_in,
        (MultiHeadAttention, "project_out"): _project_out,
        (MultiHeadAttention, "update_cache"): _update_cache,
        (MultiHeadAttention, "attend"): _attend,
        (nn.Dense, "__call__"): _dense,
        (FeedForward, "hidden"): _ffn_hidden,
    },
)


def installed():
    """The context in which a model applied with decoding-layout parameters (and a cache) reads them."""
    return LAYOUT.installed()
