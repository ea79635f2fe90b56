"""Tests of txjax.decode.kernels: the decoding layout (rearranged parameters read by intercepted methods) computes
what the model's own methods compute on the trained parameters, in a full pass and in cached decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_decode import lm, random_ids, seq2seq, teacher_forced_steps
from txjax import decode
from txjax.decode import kernels
from txjax.decode.cache import empty_cache
from txjax.families import family_of
from txjax.model.models import EncoderDecoder


@functools.cache
def trained(family, **fields):
    """The model (scanned, unfused) with `fields`, its parameters, its inputs (2 rows x 6 tokens; an encoder-decoder's
    source the same) and its full forward pass's logits of them: one computation for both rows' cases."""
    model, params = (lm if family == "lm" else seq2seq)("rope", **fields)
    inputs = [jnp.asarray(random_ids(1, (2, 6)))] * (1 if family == "lm" else 2)
    return model, params, inputs, forward(model, params, *inputs)


@pytest.mark.parametrize("family", ["lm", "seq2seq"])
@pytest.mark.parametrize("rows", [1, 8])
def test_the_decoding_layout_computes_what_the_trained_one_does(family, rows):
    """for_decoding's parameters (layers unrolled; W^Q|W^K|W^V and SwiGLU's W1|W3 one matrix each; for one row on a
    CPU every kernel output axes first) under the kernels: the same full forward pass as the scanned, unfused model,
    with each option that adds parameters to the rearranged projections (q/k/v biases, QK-norm, SwiGLU,
    grouped-query heads) or kernels (biases everywhere, an untied head)."""
    options = dict(activation="swiglu", qkv_bias=True, qk_norm=True, scan_layers=True)
    for extra in ({}, dict(use_bias=True, tie_embeddings=False)):
        model, params, inputs, expected = trained(family, **options, **extra)
        decoding_model, decoding = decode.for_decoding(model, params, rows)
        cfg, layer, t = model.cfg, decoding["decoder"]["layers_1"], "_t" if rows == 1 else ""
        h, g, k, d, f = cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model, cfg.d_ff
        out_first = lambda *shape: shape if rows == 1 else shape[-1:] + shape[:-1]  # [out..., in] or [in, out...]
        assert set(layer["self_attention"]) >= {f"qkv{t}", "qkv_bias", f"out{t}", "query_norm", "key_norm"}
        assert layer["self_attention"][f"qkv{t}"].shape == out_first(h + 2 * g, k, d)
        assert layer["self_attention"][f"out{t}"].shape == ((d, h, k) if rows == 1 else (h, k, d))
        assert layer["ffn"]["wi_fused"][f"kernel{t}"].shape == out_first(2 * f, d) and "wi_gate" not in layer["ffn"]
        assert layer["ffn"]["wo"][f"kernel{t}"].shape == out_first(d, f)
        if extra:
            embedder = decoding["embed" if family == "lm" else "src_embed"]  # shared by source and target
            assert embedder["lm_head"][f"kernel{t}"].shape == out_first(cfg.vocab_size, d)
        with kernels.installed():  # active while forward traces
            got = forward(decoding_model, decoding, *inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        again = decode.for_decoding(decoding_model, decoding, 9 - rows)
        assert again == (decoding_model, decoding)  # already in the decoding layout


def forward(model, params, *inputs, method=None, **kwargs):
    """The full forward pass (or `method`), compiled: eagerly, each of its primitives would compile on its own (seconds
    a model). `kwargs`: apply's keyword arguments (the module's, `mutable`)."""
    return jax.jit(lambda params: model.apply({"params": params}, *inputs, method=method, **kwargs))(params)


def own_cached_logits(model, params, tokens_BxL, src_BxS=None):
    """The model's own cached decoding (its methods and parameters, its [B, S, KV, K] cache, no kernels; Flax wmt
    style: apply(decode=True) on a cache from init(decode=True)): logits [B, L, V] of the tokens fed one at a time,
    one compiled call a token."""
    (b, n), logits = tokens_BxL.shape, []
    cache = empty_cache(model, b, n, None if src_BxS is None else src_BxS.shape[1])
    method = None if src_BxS is None else EncoderDecoder.decode
    step = jax.jit(
        lambda params, cache, args: model.apply(
            {"params": params, "cache": cache}, *args, decode=True, mutable=["cache"], method=method
        )
    )
    if src_BxS is not None:
        src_seg_BxS = jnp.ones(src_BxS.shape, jnp.int32)
        encoded_BxSxD = forward(model, params, src_BxS, None, src_seg_BxS, method=EncoderDecoder.encode)
    for t in range(n):
        token_Bx1, pos_Bx1 = tokens_BxL[:, t : t + 1], jnp.full((b, 1), t)
        if src_BxS is None:
            args = (token_Bx1, pos_Bx1)
        else:  # the first call caches the encoder's keys/values, the later ones reuse them
            args = (token_Bx1, encoded_BxSxD if t == 0 else None, src_seg_BxS, pos_Bx1)
        out, mutated = step(params, cache, args)
        cache = mutated["cache"]
        logits.append(out[:, -1])
    return jnp.stack(logits, 1)


def decoding_logits(model, params, tokens_BxL, src_BxS=None):
    """Cached decoding through txjax.decode on for_decoding's `params` (the kernels' cache layout and writes):
    logits [B, L, V] of a prefill of the first token (at position 0) then teacher-forced steps, one compiled call."""
    (b, n), s = tokens_BxL.shape, None if src_BxS is None else src_BxS.shape[1]

    @jax.jit
    def run(params):
        cache = decode.init_cache(model, b, n, s)
        context = family_of(model).encode(model, params, None if s is None else (src_BxS, jnp.full(b, s)))
        prompt = (tokens_BxL[:, :1], jnp.zeros((b, 1), jnp.int32))
        first_BxV, cache = decode.extend(model, params, cache, *prompt, context=context, prefill=True)
        steps_LxBxV = teacher_forced_steps(model, params, cache, tokens_BxL, 1, context)
        return jnp.concatenate([first_BxV[:, None], steps_LxBxV.transpose(1, 0, 2)], 1)

    return run(params)


@pytest.mark.parametrize("family", ["lm", "seq2seq"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_decode_what_the_model_own_cached_decoding_does(family, dtype):
    """Cached decoding through txjax.decode (for_decoding's parameters, the kernels' cache layout and writes) gives
    the logits and greedy tokens of the model's own cached decoding on its trained parameters, and both follow the
    full forward pass; grouped-query heads (4 on 2), SwiGLU, in float32 and bfloat16."""
    model, params = (lm if family == "lm" else seq2seq)("rope", dtype=dtype, activation="swiglu")
    tokens_BxL, src_BxS = jnp.asarray(random_ids(0, (2, 6))), jnp.asarray(random_ids(1, (2, 5)))
    src = None if family == "lm" else src_BxS
    full_BxLxV = forward(model, params, *((tokens_BxL,) if src is None else (src, tokens_BxL)))
    own_BxLxV = own_cached_logits(model, params, tokens_BxL, src)
    kernels_BxLxV = decoding_logits(*decode.for_decoding(model, params, 2), tokens_BxL, src)
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == "float32" else dict(atol=0.05 * float(jnp.abs(full_BxLxV).max()))
    np.testing.assert_allclose(own_BxLxV, full_BxLxV, **tol)
    np.testing.assert_allclose(kernels_BxLxV, own_BxLxV, **tol)
    if dtype == "float32":  # bfloat16 rounding may tie two tokens
        np.testing.assert_array_equal(kernels_BxLxV.argmax(-1), own_BxLxV.argmax(-1))
