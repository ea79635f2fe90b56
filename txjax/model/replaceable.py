"""The model's replaceable methods: the one list of what may run in place of the model's own code, and how.

A decoding layout (txjax.decode.kernels: the same parameters rearranged for fast cached decoding) or a family's
change to a cached call (txjax.families.prefix_lm: the prefill's bidirectional source) replaces some of the model's
methods from outside, through flax.linen.intercept_methods. Only the methods declared in REPLACEABLE can be replaced,
each keeping the signature written there: a `Layout` is built from {(class, method): replacement}, where replacement
is `fn(own, module, <the method's parameters>)` (own: the model's method, bound to its arguments' module), and
refuses at import a method not declared or a replacement whose parameters differ from the model's. The model's side
is held to the declared signatures by tests/test_decode_contract.py, so that renaming or reordering a parameter of
one of these methods fails there, not silently in a layout far away.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import flax.linen as nn

from txjax.model.ffn import FeedForward
from txjax.model.multi_head import MultiHeadAttention

# (module class, method) -> its signature; a replacement takes (own, module, *these parameters but self)
REPLACEABLE = {
    (MultiHeadAttention, "project_qkv"): "(self, x_BxLxD, kv_BxSxD)",
    (MultiHeadAttention, "heads_in"): "(self, name, heads, x_BxLxD)",
    (MultiHeadAttention, "project_out"): "(self, out_BxLxHxK, d_model)",
    (MultiHeadAttention, "update_cache"): "(self, k_new, v_new, q_pos, k_pos, mask, window=0)",
    (MultiHeadAttention, "attend"): "(self, q_BxLxHxK, k, v, terms, deterministic)",
    (FeedForward, "hidden"): "(self, x_BxLxD)",
    (nn.Dense, "__call__"): "(self, inputs)",
}


def parameters(fn: Callable, skip: int) -> str:
    """fn's parameters after the first `skip` as '(a, b=0)': names, kinds and defaults (annotations left out)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params]))


def mismatches() -> list[str]:
    """Each declared method whose signature on the model's side differs from REPLACEABLE's, as one line."""
    out = []
    for (cls, name), declared in REPLACEABLE.items():
        actual = parameters(getattr(cls, name), 0)
        if actual != declared:
            out.append(f"{cls.__name__}.{name}{actual} is declared {declared} in txjax/model/replaceable.py")
    return out


class Layout:
    """A set of replacements of REPLACEABLE methods, installed around a model call by `installed()`."""

    def __init__(self, name: str, replacements: dict[tuple[type, str], Callable]):
        for (cls, method), fn in replacements.items():
            if (cls, method) not in REPLACEABLE:
                raise TypeError(f"{name}: {cls.__name__}.{method} is not declared in txjax/model/replaceable.py")
            own, theirs = parameters(getattr(cls, method), 1), parameters(fn, 2)
            if own != theirs:
                raise TypeError(f"{name}: {fn.__name__}(own, module, ...) takes {theirs}, the model's {own}")
        self.name, self.replacements = name, dict(replacements)

    def _intercept(self, own, args, kwargs, context):
        fn = self.replacements.get((type(context.module), context.method_name))
        return own(*args, **kwargs) if fn is None else fn(own, context.module, *args, **kwargs)

    def installed(self):
        """The context in which the model's calls run these replacements (the model's own methods elsewhere)."""
        return nn.intercept_methods(self._intercept)
