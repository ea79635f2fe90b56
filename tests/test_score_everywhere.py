"""Every term of the attention scores (txjax.model.score) through every backend and every decoding layout, against
the full forward pass of the reference: the logits of packed rows (two documents and padding: segment masks) by
blockwise/flash attention, jax.nn.dot_product_attention ('fused') and ring attention over 4 simulated devices,
and generation (teacher-forced logits and greedy tokens) by the model's own cached decoding and the decoding
layouts of one row (out-major kernels) and two left-padded rows (fused projections). A backend that cannot express
a term refuses it in one line. A new score option is tested everywhere by adding it to OPTIONS. Each option's model,
parameters and reference results are computed once, for all its backends and layouts."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import EOS, PAD, greedy_by_recomputing, random_ids, random_params, tiny
from test_decode_kernels import decoding_logits, forward, own_cached_logits

from txjax import decode
from txjax.model import ring_attention
from txjax.model.models import DecoderLM
from txjax.parallel.sharding import batch_sharding, make_mesh, on_mesh

# name -> (model fields, the backends that refuse them)
OPTIONS = {
    "plain": ({}, ()),
    "scale_dim": (dict(attention_scale_dim=2), ()),  # 1/sqrt(2), not 1/sqrt(d_k)
    "linear_scale": (dict(attention_scale="linear"), ()),
    "softcap": (dict(attention_softcap=0.5), ("fused",)),  # binds: the random weights' scores reach ~10
    "alibi": (dict(positional="alibi"), ("ring",)),
    "relative_buckets": (dict(positional="relative_buckets"), ("blockwise", "ring")),
    "window": (dict(attention_window=3, window_pattern="LG"), ("ring",)),
    "sinks": (dict(attention_sinks=True), ("fused",)),
    "nope_layers": (dict(rope_layers="RN"), ()),  # not a score term: the per-layer setting beside the window
    # not a score term: multi-head latent attention's heads (txjax.model.latent; decoding: its latent cache and the
    # absorbed form), v_head_dim != the query's width, which the fused kernels and ring attention refuse
    "mla": (
        dict(
            attention="mla",
            num_kv_heads=None,
            q_lora_rank=8,
            kv_lora_rank=12,
            qk_nope_head_dim=6,
            qk_rope_head_dim=4,
            v_head_dim=5,
        ),
        ("fused", "ring"),
    ),  # fmt: skip
    # Llama 4's: a chunked RoPE layer with q/k L2 norm, a global NoPE layer whose temperature binds from position 1
    "llama4": (
        dict(attention_chunk=4, rope_layers="RN", qk_l2_norm=True, attention_temperature=0.5, attention_floor_scale=2),
        ("ring",),
    ),
    # not a score term: Qwen3-Next's full attention, each head's output gated (its own projection), half the channels
    # rotated, zero-centred q/k norms
    "qwen3_next": (
        dict(attention_output_gate=True, rope_fraction=0.5, qk_norm=True, norm="rmsnorm", norm_offset=True),
        (),
    ),
}
BACKENDS = {
    "blockwise": dict(attention_impl="blockwise", attention_block_q=4, attention_block_kv=4),
    "fused": dict(attention_impl="fused"),
    "ring": dict(attention_impl="reference"),  # on a mesh whose `sequence` axis has 4 devices
}
LAYOUTS = ("own", "rows=1", "rows=2")  # the model's own cached decoding; decode.for_decoding's for 1 and 2 rows
TOL = dict(atol=1e-4, rtol=1e-5)


def config(option):
    return tiny(**{"max_len": 32, "attention_impl": "reference", **OPTIONS[option][0]})


@functools.cache
def reference(option):
    """The option's model (the reference attention) and its random parameters."""
    model = DecoderLM(config(option))
    return model, random_params(model, jnp.zeros((1, 4), jnp.int32))


def packed_inputs():
    """2 rows x 16 tokens: row 0 two documents (9 and 5 tokens) then 2 of padding, row 1 one document."""
    tokens = jnp.asarray(random_ids(0, (2, 16)))
    seg = jnp.array([[1] * 9 + [2] * 5 + [0] * 2, [1] * 16])
    pos = jnp.array([list(range(9)) + list(range(5)) + [0, 0], list(range(16))])
    return tokens, pos, seg


def ring_logits(model, params, tokens, pos, seg):
    """The forward pass on a mesh of 4 devices along `sequence`: the rows in zig-zag order (ring_attention.layout's),
    the logits back in order."""
    mesh = make_mesh(sequence=4, devices=jax.devices()[:4])
    zig = lambda t: ring_attention.zigzag(t, 4)
    rows = batch_sharding(mesh)
    run = jax.jit(on_mesh(lambda *a: model.apply({"params": params}, *a), mesh), in_shardings=(rows,) * 3)
    return ring_attention.unzigzag(run(zig(tokens), zig(pos), zig(seg)), 4)


@functools.cache
def packed_logits(option):
    """The reference's logits of packed_inputs()."""
    return forward(*reference(option), *packed_inputs())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", OPTIONS)
def test_every_backend_computes_the_references_scores(option, backend):
    if backend == "ring" and jax.device_count() < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS set in conftest.py)")
    tokens, pos, seg = packed_inputs()
    reference_model, params = reference(option)
    refused = backend in OPTIONS[option][1]
    try:
        model = DecoderLM(dataclasses.replace(reference_model.cfg, **BACKENDS[backend]))
        if backend == "ring":
            got = ring_logits(model, params, tokens, pos, seg)
        else:
            got = forward(model, params, tokens, pos, seg)
    except ValueError as e:
        assert refused, e
        assert "\n" not in str(e) and ("model." in str(e) or "ring attention" in str(e)), e
        return
    assert not refused, f"{backend} ran {option}, which it should refuse"
    want = packed_logits(option)
    real = (seg > 0)[..., None]
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), **TOL)
    np.testing.assert_array_equal(np.where(seg > 0, got.argmax(-1), 0), np.where(seg > 0, want.argmax(-1), 0))


TOKENS = jnp.asarray(random_ids(1, (2, 10)))  # fed to decode steps one at a time
GENERATED = 12  # new tokens, past the window
PROMPTS = [random_ids(2, 3).tolist(), random_ids(3, 6).tolist()]  # two rows decode both, left-padded; one the first


@functools.cache
def generation_reference(option):
    """The reference's logits of TOKENS, and the greedy tokens of PROMPTS by recomputing its full forward pass at
    every step."""
    model, params = reference(option)
    recompute = jax.jit(lambda x: model.apply({"params": params}, x))
    return forward(model, params, TOKENS), [greedy_by_recomputing(recompute, p, GENERATED, 32) for p in PROMPTS]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("option", OPTIONS)
def test_generation_reads_every_score_term(option, layout):
    """Teacher-forced decode steps give the full forward pass's logits, and greedy generation past the window (12
    new tokens; two prompts of 3 and 6 tokens, left-padded together for 2 rows) gives the tokens that recomputing
    the full forward pass at every step gives."""
    model, params = reference(option)
    want, expected = generation_reference(option)
    if layout == "own":
        np.testing.assert_allclose(own_cached_logits(model, params, TOKENS), want, **TOL)
        return
    rows = int(layout[-1])
    dmodel, dparams = decode.for_decoding(model, params, rows)
    np.testing.assert_allclose(decoding_logits(dmodel, dparams, TOKENS), want, **TOL)
    got = decode.generate(dmodel, dparams, PROMPTS[:rows], max_new_tokens=GENERATED, eos_id=EOS, pad_id=PAD)
    assert got.ids == expected[:rows]
