"""The FFN's nonlinearities by name (ModelConfig.activation):
FFN(x) = act(x W1) W2;  SwiGLU(x) = (silu(x W1) * x W3) W2;  GeGLU(x) = (gelu(x W1) * x W3) W2 (Shazeer 2020; T5
v1.1's gated-gelu and Gemma's, with GELU's tanh form); and soft-capping, the squashing of scores and logits."""

import flax.linen as nn
import jax.numpy as jnp

ACTIVATIONS = {
    "relu": nn.relu,  # Vaswani et al. 2017
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),  # GPT-2's
    "silu": nn.silu,  # x sigmoid(x), "swish" (Marian's opus-mt models)
    "swiglu": nn.silu,  # gated: silu(x W1) * (x W3)
    "relu2": lambda x: jnp.square(nn.relu(x)),  # ReLU^2 (So et al. 2021, Primer; modded-nanogpt)
    "geglu": lambda x: nn.gelu(x, approximate=True),  # gated: gelu(x W1) * (x W3)
}
GATED = ("swiglu", "geglu")  # act(x W1) * (x W3): a second input matrix, wi_gate


def soft_cap(x, cap: float):
    """c tanh(x / c): x squashed smoothly into (-c, c), about x where |x| << c (Gemma 2's attention-score and
    final-logit soft-capping; cap 0 = x as it is)."""
    return cap * jnp.tanh(x / cap) if cap > 0 else x
