"""The FFN's nonlinearities by name (ModelConfig.activation):
FFN(x) = act(x W1) W2;  SwiGLU(x) = (silu(x W1) * x W3) W2;  GeGLU(x) = (gelu(x W1) * x W3) W2 (Shazeer 2020; T5
v1.1's gated-gelu and Gemma's, with GELU's tanh form); GPT-OSS's clamped SwiGLU, with a = min(x W1, 7) and
u = clip(x W3, -7, 7):  (a sigmoid(1.702 a) (u + 1)) W2; and soft-capping, the squashing of scores and logits."""

import flax.linen as nn
import jax.numpy as jnp

ACTIVATIONS = {
    "relu": nn.relu,  # Vaswani et al. 2017
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),  # GPT-2's
    "silu": nn.silu,  # x sigmoid(x), "swish" (Marian's opus-mt models)
    "relu2": lambda x: jnp.square(nn.relu(x)),  # ReLU^2 (So et al. 2021, Primer; modded-nanogpt)
}
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0  # GPT-OSS's swiglu_alpha and swiglu_limit (transformers' GptOssConfig)


def _swiglu_clamped(a, u):
    a = jnp.minimum(a, GPT_OSS_LIMIT)
    return a * nn.sigmoid(GPT_OSS_ALPHA * a) * (jnp.clip(u, -GPT_OSS_LIMIT, GPT_OSS_LIMIT) + 1)


GATED = {  # (x W1, x W3) -> the hidden units: a second input matrix, wi_gate
    "swiglu": lambda a, u: nn.silu(a) * u,
    "geglu": lambda a, u: nn.gelu(a, approximate=True) * u,
    "swiglu_clamped": _swiglu_clamped,  # GPT-OSS (its experts)
}


def hidden_units(activation: str, x_w1, x_w3=None):
    """The FFN's hidden units from x W1 (and x W3 for a gated activation): the one place every FFN (dense, the
    experts, decoding's fused product) applies its activation."""
    return GATED[activation](x_w1, x_w3) if activation in GATED else ACTIVATIONS[activation](x_w1)


ACTIVATION_NAMES = (*ACTIVATIONS, *GATED)  # ModelConfig.activation's choices


def soft_cap(x, cap: float):
    """c tanh(x / c): x squashed smoothly into (-c, c), about x where |x| << c (Gemma 2's attention-score and
    final-logit soft-capping; cap 0 = x as it is)."""
    return cap * jnp.tanh(x / cap) if cap > 0 else x
