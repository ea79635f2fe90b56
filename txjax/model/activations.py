"""The FFN's nonlinearities by name (ModelConfig.activation):
FFN(x) = act(x W1) W2;  SwiGLU(x) = (silu(x W1) * x W3) W2;  GeGLU(x) = (gelu(x W1) * x W3) W2 (Shazeer 2020; T5
v1.1's gated-gelu, with GELU's tanh form)."""

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
