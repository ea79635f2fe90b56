"""Local (sliding-window) attention: the band against transformers' definition, blockwise attention with a window
against NumPy (outputs and gradients), the model's every attention path and layer layout against the reference,
and generation with ring-buffer KV caches past the window against greedy decoding by the full forward pass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_blockwise import case, np_attention_and_grads
from test_decode import EOS, PAD, greedy_by_recomputing, random_ids, random_params, tiny
from test_decode_kernels import forward

from txjax import decode
from txjax.model import blockwise, masks
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, unstack_layers

W = 4  # the window of every test here


def test_window_and_causal_masks_are_transformers_sliding_window():
    masking_utils = pytest.importorskip("transformers.masking_utils")
    hf = masking_utils.and_masks(masking_utils.sliding_window_overlay(W), masking_utils.causal_mask_function)
    pos = jnp.arange(12)[None]
    ours = np.asarray(masks.window_mask(pos, pos, W) & masks.causal_mask(pos, pos))[0, 0]
    torch = pytest.importorskip("torch")
    theirs = hf(0, 0, torch.arange(12)[:, None], torch.arange(12)[None, :]).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.sum(1).tolist() == [1, 2, 3, 4] + [4] * 8  # the query and the W - 1 keys before it


def test_the_window_reads_explicit_positions_and_zero_is_global():
    """Packed rows restart their positions: the band is i - W < j on positions, not on indices."""
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])
    got = np.asarray(masks.window_mask(pos, pos, W))[0, 0]
    p = np.asarray(pos[0])
    np.testing.assert_array_equal(got, p[None, :] > p[:, None] - W)
    assert np.asarray(masks.window_mask(pos, pos, 0)).all()
    assert np.asarray(masks.window_mask(pos, pos, jnp.int32(0))).all()  # a scanned global layer's traced 0


@pytest.mark.parametrize("block_q,block_kv", [(4, 4), (5, 3)])
def test_blockwise_with_a_window_matches_numpy(block_q, block_kv):
    """Outputs and gradients of causal windowed attention in small blocks (most key blocks skipped), the window a
    Python int and a traced scalar."""
    q, k, v, d_out, seg_q, seg_k, pos_q, pos_k = case()
    want = []
    for r in range(q.shape[0]):
        allowed = (seg_q[r, :, None] == seg_k[r, None, :]) & (seg_q[r, :, None] > 0) & (seg_k[r, None, :] > 0)
        allowed &= (pos_k[r, None, :] <= pos_q[r, :, None]) & (pos_k[r, None, :] > pos_q[r, :, None] - W)
        bias = np.zeros((q.shape[2], *allowed.shape))
        want.append(np_attention_and_grads(q[r], k[r], v[r], allowed, bias, q.shape[-1] ** -0.5, d_out[r]))
    want = [np.stack(t) for t in zip(*want)]
    segments = blockwise.Segments(jnp.asarray(seg_q), jnp.asarray(seg_k))
    kw = dict(causal=True, heads_H={}, scale=q.shape[-1] ** -0.5, block_q=block_q, block_kv=block_kv)
    for window in (W, jnp.int32(W)):

        def out_and_grads(q, k, v, d_out, w=window):  # jitted: op by op, each primitive compiled alone
            out, vjp = jax.vjp(
                lambda q, k, v: blockwise.attention(q, k, v, segments, pos_q, pos_k, window=w, **kw), q, k, v
            )
            return (out, *vjp(d_out))

        got = jax.jit(out_and_grads)(q, k, v, jnp.asarray(d_out))
        for name, g, e in zip(("out", "dq", "dk", "dv"), got, want):
            np.testing.assert_allclose(np.asarray(g), e, rtol=2e-5, atol=2e-5, err_msg=f"{name} window={window!r}")


def test_blockwise_never_reads_the_key_blocks_before_the_window():
    """Values of the first key block are NaN: the queries whose windows start past it stay finite only if its
    products are skipped (masked weights 0 times NaN would be NaN)."""
    q, k, v, *_ = case(b=1, l=16, s=16, packed=False)
    v = v.copy()
    v[0, :4] = np.nan
    pos = jnp.arange(16)[None]
    kw = dict(causal=True, heads_H={}, scale=1.0, block_q=4, block_kv=4, window=W)
    out = np.asarray(jax.jit(lambda q, k, v: blockwise.attention(q, k, v, None, pos, pos, **kw))(q, k, v))
    assert np.isnan(out[0, :8]).any() and np.isfinite(out[0, 8:]).all()  # queries 8.. see keys 5.. only


def model_cfg(**overrides):
    return tiny(attention_window=W, window_pattern="LGL", num_layers=3, max_len=32, **overrides)


def test_every_attention_path_and_layer_layout_gives_the_reference_logits():
    """Windows (4, 0, 4): scanned (a traced window per layer) or looped (static), reference, blockwise in blocks of
    4 and jax.nn.dot_product_attention's local_window_size; two packed segments in row 0. The first W positions
    of each segment see every earlier token, so they equal a global model's; the later ones do not."""
    cfg = model_cfg(attention_impl="reference")
    params = random_params(DecoderLM(cfg), jnp.zeros((1, 4), jnp.int32))
    tokens = jnp.asarray(random_ids(0, (2, 14)))
    seg = jnp.array([[1] * 9 + [2] * 5, [1] * 14])
    pos = jnp.array([list(range(9)) + list(range(5)), list(range(14))])
    looped = unstack_layers(params)
    # jitted: op by op, each path's primitives (the blockwise loops' too) compiled alone
    logits = lambda c: forward(DecoderLM(c), params if c.scan_layers else looped, tokens, pos, seg)
    want = np.asarray(logits(cfg))
    for change in (
        {"scan_layers": False},
        {"attention_impl": "blockwise", "attention_block_q": 4, "attention_block_kv": 4},
        {"attention_impl": "fused", "scan_layers": False},
        {"remat": True},
    ):
        np.testing.assert_allclose(logits(dataclasses.replace(cfg, **change)), want, atol=2e-5, err_msg=str(change))
    global_ = np.asarray(logits(dataclasses.replace(cfg, attention_window=0, window_pattern="")))
    near = (pos < W)[..., None]
    np.testing.assert_allclose(np.where(near, want, 0), np.where(near, global_, 0), atol=2e-5)
    assert np.abs(np.where(near, 0, want - global_)).max() > 1e-2


def test_a_windowed_layer_under_remat_and_scan_keeps_the_window_static():
    """Uniform windows scan with the window as a Python int (the ring-buffer cache needs it): one cache of W slots."""
    model = DecoderLM(tiny(attention_window=W, max_len=32))
    cache = decode.cache.empty_cache(model, 2, 16)
    shapes = {"/".join(str(k.key) for k in p): leaf.shape for p, leaf in jax.tree_util.tree_leaves_with_path(cache)}
    assert shapes["decoder/layers/self_attention/window_key"] == (2, 2, W, 2, 8)  # [layers, B, W, KV, K]
    assert not any("cached_key" in name for name in shapes)


@pytest.mark.parametrize("pattern,chunks", [("LG", (None, 2, 6)), ("", (6,))])
def test_generation_past_the_window_equals_greedy_by_the_full_forward_pass(pattern, chunks):
    """Ring buffers of W slots in the local layers (the global one keeps the growing cache), prompts of 3 and 9
    tokens left-padded in one batch, 20 new tokens; the prompt in one call and in chunks of 2 and 6 (longer than
    the window); every layer local: no cache grows."""
    cfg = dataclasses.replace(model_cfg(), window_pattern=pattern, num_layers=2)
    model = DecoderLM(cfg)
    params = random_params(model, jnp.zeros((1, 4), jnp.int32))
    forward = jax.jit(lambda x: model.apply({"params": params}, x))
    prompts = [random_ids(1, 3).tolist(), random_ids(2, 9).tolist()]
    want = [greedy_by_recomputing(forward, p, 20, 32) for p in prompts]
    assert max(map(len, want)) > W + 1  # generation runs past the window
    dmodel, dparams = decode.for_decoding(model, params, rows=2)
    cache = decode.init_cache(dmodel, 2, 16)
    shapes = {"/".join(k.key for k in p): leaf.shape for p, leaf in jax.tree_util.tree_leaves_with_path(cache)}
    assert shapes["decoder/layers_0/self_attention/window_key"] == (2 * 2, 8, W)  # [B*KV, K, W]: kernels' layout
    assert ("decoder/layers_1/self_attention/cached_key" in shapes) == (pattern == "LG")
    for chunk in chunks:
        got = decode.generate(dmodel, dparams, prompts, max_new_tokens=20, eos_id=EOS, pad_id=PAD, prefill_chunk=chunk)
        assert got.ids == want, f"prefill_chunk={chunk}"


def test_bad_windows_are_one_line():
    with pytest.raises(ValueError, match="attention_window=-1 must be an integer >= 0"):
        ModelConfig(vocab_size=8, attention_window=-1)
    with pytest.raises(ValueError, match="window_pattern='LX' must be a string of L"):
        ModelConfig(vocab_size=8, attention_window=4, window_pattern="LX")
    with pytest.raises(ValueError, match="needs model.attention_window > 0"):
        ModelConfig(vocab_size=8, window_pattern="LG")
    assert ModelConfig(vocab_size=8, num_layers=6, attention_window=3, window_pattern="LLG").layer_windows == (
        3,
        3,
        0,
        3,
        3,
        0,
    )


def test_ring_attention_refuses_a_window_in_one_line():
    from txjax.config import base_config, validate_sequence_axis
    from txjax.errors import ConfigError

    config = base_config()
    config.mesh.sequence, config.model.attention_window = 2, W
    with pytest.raises(ConfigError, match="ring attention.*has no local window: set model.attention_window=0"):
        validate_sequence_axis(config)


def test_beam_search_reorders_the_ring_buffers():
    """Beams past the window (cache rows gathered by parent beam, ring buffers included): each prompt's best
    hypothesis re-scored by the full forward pass gives the beam's score."""
    model = DecoderLM(dataclasses.replace(model_cfg(), num_layers=2, window_pattern="LG"))
    params = random_params(model, jnp.zeros((1, 4), jnp.int32))
    forward = jax.jit(lambda t: model.apply({"params": params}, t))
    prompts = [random_ids(3, 2).tolist(), random_ids(4, 6).tolist()]
    kw = dict(max_new_tokens=12, eos_id=EOS, method="beam", beam_size=3, length_penalty=0.6)
    beam = decode.generate(model, params, prompts, **kw)
    for prompt, ids, stopped, score in zip(prompts, beam.ids, beam.stopped, beam.scores):
        seq = prompt + ids + [EOS] * stopped
        logp_TxV = jax.nn.log_softmax(forward(np.array([seq]))[0])
        logp = float(sum(logp_TxV[t - 1, seq[t]] for t in range(len(prompt), len(seq))))
        assert len(seq) - len(prompt) > W
        np.testing.assert_allclose(score, logp / decode.length_penalty(len(ids) + stopped, 0.6), rtol=1e-4)
