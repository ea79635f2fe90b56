"""RoPE's scalings (linear, llama3, yarn), partial rotary dimensions and local layers' own base: frequencies and
cos/sin tables against transformers' ROPE_INIT_FUNCTIONS and rotary embedding, the rotation against NumPy."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import random_ids, random_params, tiny

from txjax.model import positional
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, unstack_layers
from txjax.model.positional import Rope

CASES = {  # transformers' rope_parameters -> ours
    "linear": ({"rope_type": "linear", "factor": 4.0}, Rope(500000.0, "linear", factor=4.0)),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        Rope(500000.0, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=64),
    ),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        Rope(500000.0, "yarn", factor=4.0, original_max_len=64),
    ),
    "yarn partial": (
        {
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "attention_factor": 1.3,
            "partial_rotary_factor": 0.5,
        },
        Rope(
            500000.0,
            "yarn",
            factor=2.0,
            original_max_len=128,
            beta_fast=16.0,
            beta_slow=2.0,
            attention_factor=1.3,
            fraction=0.5,
        ),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_and_tables_equal_transformers(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params, rope = CASES[name]
    hf = transformers.LlamaConfig(
        hidden_size=192,
        num_attention_heads=2,
        head_dim=96,
        max_position_embeddings=512,
        rope_parameters={"rope_theta": rope.base, **params},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, None)
    theta, factor = rope.frequencies(96)
    np.testing.assert_allclose(theta, inv_freq.numpy(), rtol=1e-6)
    assert factor == pytest.approx(attention_factor, rel=1e-12)
    pos = np.arange(512)[None]
    cos_hf, sin_hf = (t.numpy()[0] for t in LlamaRotaryEmbedding(hf)(torch.zeros(1), torch.tensor(pos)))
    cos, sin = (np.asarray(t)[0, :, 0] for t in positional.rope_tables(jnp.asarray(pos), theta, factor))
    half = theta.shape[0]  # transformers' tables repeat the frequencies over the two halves
    for ours, theirs in ((cos, cos_hf), (sin, sin_hf)):
        np.testing.assert_allclose(ours, theirs[:, :half], atol=1e-6)
        np.testing.assert_allclose(ours, theirs[:, half:], atol=1e-6)


def test_partial_rotation_is_transformers_rotate_half_on_the_first_channels():
    """q * cos + rotate_half(q) * sin on the first d = 16 of 32 channels (NumPy), the rest passed through; ours on
    the same channels with each pair (i, i + d/2) of the rotated part side by side (the converters' permutation)."""
    rope = Rope(10000.0, "linear", factor=2.0, fraction=0.5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 7, 2, 32)).astype(np.float32)
    pos = np.arange(3, 10)[None]
    theta, _ = rope.frequencies(32)
    angles = pos[0, :, None, None] * np.concatenate([theta, theta])  # [L, 1, d]
    rot, rest = x[..., :16], x[..., 16:]
    rotate_half = np.concatenate([-rot[..., 8:], rot[..., :8]], axis=-1)
    want = np.concatenate([rot * np.cos(angles) + rotate_half * np.sin(angles), rest], axis=-1)
    pairs = np.concatenate([np.stack([np.arange(8), np.arange(8) + 8], 1).reshape(-1), np.arange(16, 32)])
    got = np.asarray(positional.apply_rope(jnp.asarray(x[..., pairs]), jnp.asarray(pos), rope))
    np.testing.assert_allclose(got, want[..., pairs], atol=1e-5)


def test_local_layers_rotate_with_their_own_base():
    """An all-local model with rope_local_base=B is the global model with rope_base=B (scaled globally, unscaled
    locally); with windows (4, 0, 4) scanned (a traced choice of the two ropes) it equals its layers looped."""
    cfg = tiny(attention_window=4, rope_local_base=1000.0, rope_scaling="linear", rope_factor=4.0, num_layers=1)
    params = random_params(DecoderLM(cfg), jnp.zeros((1, 4), jnp.int32))
    tokens = jnp.asarray(random_ids(0, (1, 9)))
    logits = lambda c, p=params: np.asarray(DecoderLM(c).apply({"params": p}, tokens))
    plain = dataclasses.replace(cfg, rope_local_base=0.0, rope_scaling="none", rope_factor=1.0, rope_base=1000.0)
    np.testing.assert_allclose(logits(cfg), logits(plain), atol=1e-6)
    mixed = dataclasses.replace(cfg, num_layers=3, window_pattern="LG")
    params = random_params(DecoderLM(mixed), jnp.zeros((1, 4), jnp.int32))
    looped = logits(dataclasses.replace(mixed, scan_layers=False), unstack_layers(params))
    np.testing.assert_allclose(logits(mixed, params), looped, atol=2e-5)
    assert np.abs(looped - logits(dataclasses.replace(mixed, rope_local_base=0.0), params)).max() > 1e-3


def test_bad_rope_fields_are_one_line():
    with pytest.raises(ValueError, match="rope_scaling='ntk' is not one of none, linear, llama3, yarn"):
        ModelConfig(vocab_size=8, rope_scaling="ntk")
    with pytest.raises(ValueError, match="rope_scaling='llama3' needs model.rope_original_max_len > 0"):
        ModelConfig(vocab_size=8, rope_scaling="llama3")
    with pytest.raises(ValueError, match=r"rope_fraction=0.3 must be in \(0, 1\] and rotate an even number"):
        ModelConfig(vocab_size=8, d_model=64, num_heads=2, positional="rope", rope_fraction=0.3)
