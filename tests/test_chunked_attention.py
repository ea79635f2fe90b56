"""Chunked local attention (model.attention_chunk, Llama 4's attention_chunk_size): the mask against transformers'
chunked_causal_mask_function, on explicit positions (packed rows restart them), blocks not a sliding window in the
model's output, and the bad settings. Every backend and decoding layout: tests/test_score_everywhere.py's OPTIONS."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import random_params, tiny
from test_train import tiny_config

from txjax import config as config_lib
from txjax.errors import ConfigError
from txjax.model import masks
from txjax.model.models import DecoderLM

C = 4  # the chunk of every test here


def test_chunk_and_causal_masks_are_transformers_chunked_attention():
    masking_utils = pytest.importorskip("transformers.masking_utils")
    torch = pytest.importorskip("torch")
    hf = masking_utils.chunked_causal_mask_function(C, torch.zeros(1, dtype=torch.long))
    pos = jnp.arange(11)[None]
    ours = np.asarray(masks.chunk_mask(pos, pos, C) & masks.causal_mask(pos, pos))[0, 0]
    theirs = hf(0, 0, torch.arange(11)[:, None], torch.arange(11)[None, :]).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.sum(1).tolist() == [1, 2, 3, 4] * 2 + [1, 2, 3]  # back to 1 at each block's start


def test_the_chunks_read_explicit_positions_and_zero_is_none():
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])
    p = np.asarray(pos[0])
    np.testing.assert_array_equal(np.asarray(masks.chunk_mask(pos, pos, C))[0, 0], p[None] // C == p[:, None] // C)
    assert np.asarray(masks.chunk_mask(pos, pos, 0)).all()
    assert np.asarray(masks.chunk_mask(pos, pos, jnp.int32(0))).all()  # a scanned unchunked layer's traced 0


def test_a_chunked_layer_reads_its_own_block_only():
    """One chunked layer: the logits at position i change with a token at j <= i iff j is in i's block of C (a
    window of C would also reach back into the block before); the same model without chunks reads every j <= i."""
    cfg = tiny(num_layers=1, max_len=16, attention_chunk=C)
    model = DecoderLM(cfg)
    params = random_params(model, jnp.zeros((1, 4), jnp.int32))
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (1, 10)))
    for model_ in (model, DecoderLM(dataclasses.replace(cfg, attention_chunk=0))):
        run = jax.jit(lambda t, m=model_: m.apply({"params": params}, t))
        base = run(tokens)
        for j in range(10):
            changed = np.abs(run(tokens.at[0, j].set((tokens[0, j] + 1) % cfg.vocab_size)) - base).max(-1)[0] > 1e-6
            reached = np.arange(10) >= j
            if model_.cfg.attention_chunk:
                reached &= np.arange(10) // C == j // C
            np.testing.assert_array_equal(changed, reached, err_msg=f"token {j}")


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--config.model.attention_chunk=-1"], "model.attention_chunk=-1 must be an integer >= 0"),
        (["--config.model.attention_chunk=4", "--config.mesh.sequence=2"], "has no chunked attention"),
        (["--config.model.attention_temperature=0.1"], "attention_temperature=0.1 is not read by model.rope_layers=''"),
        (["--config.model.attention_floor_scale=4"], "attention_floor_scale"),
    ],
)
def test_bad_settings_are_one_line(flags, named):
    with pytest.raises(ConfigError, match=named) as e:
        config_lib.validate(tiny_config(*flags))
    assert "\n" not in str(e.value)
