"""The norms, each computed in float32 (the residual stream's dtype):

    LayerNorm(x) = g * (x - mean(x)) / sqrt(var(x) + eps) + b          (Ba et al. 2016)
    RMSNorm(x)   = g * x / sqrt(mean(x^2) + eps)                          (Zhang & Sennrich 2019)
    RMSNorm with a unit offset: (1 + w) * x / sqrt(mean(x^2) + eps), the gain stored as w (init 0), so that weight
    decay pulls the gain towards 1, not 0 (Gemma's RMSNorm; `norm_offset`)
over the last axis. The block's norms, the final norm and the q/k norms (per head, or over the whole projection)
are built here.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.model import roles


class OffsetRMSNorm(nn.Module):
    """(1 + w) * x / sqrt(mean(x^2) + eps) over the last axis, w [features] ('scale', zeros at init), in float32."""

    epsilon: float
    axis_name: str = "embed"  # the gain's logical axis (sharding rules)

    @nn.compact
    def __call__(self, x):
        init = roles.init(nn.initializers.zeros, (self.axis_name,), roles.NORM)
        w = self.param("scale", init, (x.shape[-1],))
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon) * (1.0 + w)


def rms_norm(epsilon: float, offset: bool, axis_name: str | tuple[str, ...], name=None) -> nn.Module:
    """RMSNorm over the last axis (a tuple of logical names: over as many last axes, one gain per element, as
    OLMoE's q/k norm over the whole projection), its gain g ('scale', ones at init) or, with `offset`, 1 + w
    (OffsetRMSNorm, over the last axis only)."""
    names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    if offset:
        if len(names) > 1:
            raise ValueError("an RMSNorm with a unit offset (model.norm_offset) normalizes over the last axis only")
        return OffsetRMSNorm(epsilon, names[0], name=name)
    axes = tuple(range(-len(names), 0))
    scale_init = roles.init(nn.initializers.ones, names, roles.NORM)
    kwargs = dict(reduction_axes=axes, feature_axes=axes, scale_init=scale_init, name=name)
    return nn.RMSNorm(epsilon=epsilon, dtype=jnp.float32, **kwargs)


def make_norm(cfg, name=None) -> nn.Module:
    """The model's norm over d_model (cfg.norm: LayerNorm or RMSNorm, cfg.norm_offset: RMSNorm's 1 + w gain)."""
    if cfg.norm == "rmsnorm":
        return rms_norm(cfg.norm_eps, cfg.norm_offset, "embed", name)
    return nn.LayerNorm(
        epsilon=cfg.norm_eps,
        dtype=jnp.float32,
        scale_init=roles.init(nn.initializers.ones, ("embed",), roles.NORM),
        name=name,
        bias_init=roles.init(nn.initializers.zeros, ("embed",), roles.NORM),
    )


def l2_norm(x, epsilon: float):
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32, no gain (Llama 4's weightless L2Norm of q and k);
    back in x's dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + epsilon)).astype(x.dtype)
