"""The position-wise feed-forward network and the dense projection every module builds its products from.

FFN(x) = act(x W1 + b1) W2 + b2 (ReLU in Vaswani et al. 2017, GELU in GPT-2);  SwiGLU(x) = (silu(x W1) * x W3) W2
(Shazeer 2020; GeGLU with gelu). Its width is d_ff, or another one where a mixture of experts' shared experts use it
(txjax.model.moe).
"""

from __future__ import annotations

import flax.linen as nn

from txjax.model import adapters, roles
from txjax.model import precision as precision_lib
from txjax.model.activations import GATED, hidden_units
from txjax.model.config import ModelConfig


def dense(
    features: int, axes: tuple[str, str], use_bias: bool, dtype, std: float, name=None, role=roles.MATRIX
) -> nn.Dense:
    """y = x W + b, W [in, out] ~ N(0, std^2): flax's nn.Dense ('kernel', of `role`; 'bias'), its axes named (`axes`:
    in, out; for the sharding rules), the product through txjax.model.precision (float32 sums for 16-bit operands)."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=roles.init(nn.initializers.normal(std), axes, role),
        bias_init=roles.init(nn.initializers.zeros, axes[1:], roles.BIAS),
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


class FeedForward(nn.Module):
    """act(x W1 + b1) W2 + b2, or SwiGLU; W1 (and W3) [d_model, F], W2 [F, d_model]; F = d_ff unless `width`."""

    cfg: ModelConfig
    width: int | None = None

    @property
    def hidden_width(self) -> int:
        return self.cfg.d_ff if self.width is None else self.width

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        return self.linear("wo", x_BxLxD.shape[-1], ("mlp", "embed"), cfg.out_init_std, self.hidden(x_BxLxD))

    def hidden(self, x_BxLxD):
        """act(x W1 + b1), or a gated act(x W1) * x W3 (SwiGLU, GeGLU): [B, L, F]."""
        w_in = lambda name: self.linear(name, self.hidden_width, ("embed", "mlp"), self.cfg.hidden_init_std, x_BxLxD)
        gated = self.cfg.activation in GATED
        return hidden_units(self.cfg.activation, w_in("wi"), w_in("wi_gate") if gated else None)

    def linear(self, name, features, axes, std, x):
        """x W + b (+ a LoRA train step's dropped-out low-rank term, txjax.model.adapters)."""
        y = dense(features, axes, self.cfg.use_bias, self.cfg.compute_dtype, std, name=name)(x)
        return adapters.low_rank(self, (name, "kernel"), x, y, inputs=1)
