"""NoPE layers (model.rope_layers: RoPE on or off per decoder layer, SmolLM3's no_rope_layers, Llama 4's every
fourth layer): a NoPE layer is a layer without positions, bit for bit where the stack is static, scanned (a traced
flag per layer) as looped, and refused in one line where it would be ignored. Generation with NoPE layers against
the full forward pass: tests/test_score_everywhere.py (OPTIONS)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import random_ids, random_params, tiny

from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, unstack_layers


def logits(cfg, params, tokens):
    params = params if cfg.scan_layers else unstack_layers(params)
    return np.asarray(DecoderLM(cfg).apply({"params": params}, tokens))


def test_a_nope_layer_has_no_positions_and_a_pattern_repeats_over_the_stack():
    cfg = tiny(num_layers=4, max_len=32)
    params = random_params(DecoderLM(cfg), jnp.zeros((1, 4), jnp.int32))
    tokens = jnp.asarray(random_ids(0, (2, 12)))
    every = {p: logits(dataclasses.replace(cfg, rope_layers=p), params, tokens) for p in ("", "N", "RN", "RNRN")}
    plain = logits(cfg, params, tokens)
    np.testing.assert_array_equal(every[""], plain)  # '' = every layer RoPE, as before
    np.testing.assert_array_equal(every["N"], logits(dataclasses.replace(cfg, positional="none"), params, tokens))
    np.testing.assert_array_equal(every["RN"], every["RNRN"])  # the pattern repeats over the layers
    assert np.abs(every["RN"] - plain).max() > 1e-2 and np.abs(every["RN"] - every["N"]).max() > 1e-2
    assert [layer.rope for layer in dataclasses.replace(cfg, rope_layers="RRRN").layer_attention] == [1, 1, 1, 0]


def test_scanned_layers_read_a_traced_flag_as_looped_ones_read_a_static_one():
    """Scanned, the layers' flags are one array (one body for every layer); looped, Python bools; with a window
    pattern beside them (the two per-layer settings travel together)."""
    cfg = tiny(num_layers=4, max_len=32, rope_layers="RRRN", attention_window=3, window_pattern="LG")
    params = random_params(DecoderLM(cfg), jnp.zeros((1, 4), jnp.int32))
    tokens = jnp.asarray(random_ids(1, (2, 12)))
    scanned = logits(cfg, params, tokens)
    np.testing.assert_allclose(scanned, logits(dataclasses.replace(cfg, scan_layers=False), params, tokens), atol=2e-5)
    no_window = logits(dataclasses.replace(cfg, attention_window=0, window_pattern=""), params, tokens)
    assert np.abs(scanned - no_window).max() > 1e-2


@pytest.mark.parametrize(
    "fields,named",
    [(dict(rope_layers="RX"), "rope_layers='RX'"), (dict(rope_layers="RN", positional="learned"), "positional=rope")],
)
def test_bad_rope_layers_are_one_line(fields, named):
    with pytest.raises(ValueError, match=named) as e:
        ModelConfig(vocab_size=8, **fields)
    assert "\n" not in str(e.value)
