"""LoRA's adapters inside the model: each block's weights merged with their adapters where the block runs.

A LoRA run (txjax.state.lora) applies the model to its frozen base parameters and a variable collection `lora` of
the same nesting, {"a": A [..., I, r], "b": s B [..., r, O]} at each adapted weight W (s folded into B). Each block
(txjax.model.layers.Block or Group: a stack's scanned or looped unit, a multi-token prediction module's block)
reads its weights merged,

    W' = W + A (s B)  (reshaped as W),

as it runs (DoRA's {"a", "b", "m"}: W' = m V / ||V||, V = W + A (s B), `merge`): the backward pass then holds one
unit's W' and its gradient at a time. Merging the whole tree before a scanned stack would make the gradient of every
layer's W' at once, as large as a full fine-tune's gradient. The model without the collection (initialization,
evaluation and decoding on merged weights) runs its blocks as they are.

With dropout on the adapters' input (train.lora_dropout = p > 0, peft's lora_dropout, traced under `dropout(p)`)
no weight is merged: each adapted projection adds its own low-rank term (`low_rank`),

    y = x W + drop(x) A (s B),  drop(x) = m * x / (1 - p),  m ~ Bernoulli(1 - p) from the "dropout" rng,

attention's (txjax.model.multi_head: query, key, value, out) and the dense FFN's (txjax.model.ffn: wi, wi_gate, wo),
the weights txjax.state.lora lets it adapt then.
"""

from __future__ import annotations

import contextlib
import contextvars

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

COLLECTION = "lora"
_DROPOUT = contextvars.ContextVar("lora_dropout", default=0.0)  # p of the train step being traced


@contextlib.contextmanager
def dropout(rate: float):
    """A trace in which the adapters' inputs drop out with probability `rate` (0: the blocks merge their weights)."""
    token = _DROPOUT.set(rate)
    try:
        yield
    finally:
        _DROPOUT.reset(token)


def merge(w, a, b, m=None):
    """W + A B laid out as W, the product in float32 precision (b already scaled by s). With DoRA's magnitude m
    [..., O]: m V / ||V||, V = W + A B as [..., I, O] (W's input axes flattened, as A's rows; its outputs as B's
    columns), the norm per output held out of the gradient (peft's, the paper's section 4.3: m and the direction's
    numerator train, the norm is a constant of the step)."""
    delta = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
    if m is None:
        return w + delta.reshape(w.shape).astype(w.dtype)
    v_IxO = w.reshape(delta.shape).astype(jnp.float32) + delta.astype(jnp.float32)
    scale_O = m.astype(jnp.float32) / jax.lax.stop_gradient(norms(v_IxO))
    return (v_IxO * scale_O[..., None, :]).reshape(w.shape).astype(w.dtype)


def norms(w_IxO):
    """The L2 norm of each output's column of a weight laid out [..., I, O] (float32): [..., O]."""
    return jnp.sqrt(jnp.sum(jnp.square(w_IxO.astype(jnp.float32)), axis=-2))


def merged(params, adapters):
    """`params` with each weight that `adapters` ({path...: {"a", "b"}} or DoRA's {"a", "b", "m"}, the same
    nesting) adapts merged."""
    if not adapters:
        return params
    flat = traverse_util.flatten_dict(params)
    for path, ab in traverse_util.flatten_dict(adapters, is_leaf=lambda _, x: "a" in x).items():
        flat[path] = merge(flat[path], ab["a"], ab["b"], ab.get("m"))
    return traverse_util.unflatten_dict(flat)


def variables(params, adapters=None) -> dict:
    """The variables model.apply reads: the parameters, and a LoRA run's adapters as their own collection."""
    return {"params": params} | ({COLLECTION: adapters} if adapters is not None else {})


def merging(module: nn.Module, unit: type[nn.Module]) -> type[nn.Module]:
    """`unit` as `module` builds it: reading its parameters merged with their adapters where `module`'s variables
    hold the collection, else as it is."""
    if COLLECTION not in module.variables or _DROPOUT.get() > 0:  # none, or the projections add their own terms
        return unit
    return nn.map_variables(unit, ("params", COLLECTION), trans_in_fn=_merged_in)


def low_rank(module: nn.Module, path: tuple[str, ...], x, y, inputs: int):
    """y + drop(x) A (s B), y = x W the product of the weight at `path` in `module` (x's last `inputs` axes its
    input): where the module's variables hold that weight's adapter (a train step under `dropout`), else y."""
    ab = module.variables.get(COLLECTION, {})
    for name in path:
        ab = ab.get(name, {})
    if not ab:
        return y
    rate = _DROPOUT.get()
    keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - rate, x.shape)
    dropped = jnp.where(keep, x.astype(ab["a"].dtype) / (1.0 - rate), 0.0)
    lead = x.shape[: x.ndim - inputs]
    low = jnp.matmul(dropped.reshape(*lead, -1), ab["a"], precision=jax.lax.Precision.HIGHEST)
    low = jnp.matmul(low, ab["b"], precision=jax.lax.Precision.HIGHEST)
    return y + low.reshape(y.shape).astype(y.dtype)


def _merged_in(variables):
    return {"params": merged(variables["params"], variables.get(COLLECTION)), COLLECTION: {}}
