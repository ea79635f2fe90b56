"""The two model families: config validation, parameter counts, causality, padding, cached decoding (the execution
variants: test_model_variants.py). Tiny models; one compiled model per (family, positional), shared per module."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import random_params

from txjax.decode.cache import empty_cache as init_cache  # the model's own layout (Flax wmt style)
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder

POSITIONALS = ("none", "sinusoidal", "learned", "rope", "alibi")
V, D, H, KV, F, NL, MAXLEN = 13, 16, 4, 2, 24, 2, 16


def make_cfg(**kw):
    base = dict(vocab_size=V, d_model=D, num_heads=H, num_kv_heads=KV, d_ff=F, num_layers=NL, max_len=MAXLEN)
    return ModelConfig(**{**base, **kw})


def _seq(rng, b, l):
    return jnp.asarray(rng.integers(1, V, size=(b, l)), jnp.int32)


def _arange(b, l, start=0):
    return jnp.broadcast_to(jnp.arange(start, start + l, dtype=jnp.int32), (b, l))


class LM:
    """A DecoderLM, its params and jitted calls (built once per config)."""

    def __init__(self, cfg):
        self.cfg, self.model = cfg, DecoderLM(cfg)
        self.params = random_params(self.model, jnp.ones((1, 4), jnp.int32))
        self.forward = jax.jit(lambda p, t, pos, seg: self.model.apply({"params": p}, t, pos, seg))
        self.step = jax.jit(
            lambda p, cache, t, pos, seg: self.model.apply(
                {"params": p, "cache": cache}, t, pos, seg, decode=True, mutable=["cache"]
            )
        )


class Seq2Seq:
    def __init__(self, cfg):
        self.cfg, self.model = cfg, EncoderDecoder(cfg)
        one = jnp.ones((1, 4), jnp.int32)
        self.params = random_params(self.model, one, one)
        m = self.model
        self.forward = jax.jit(
            lambda p, src, tgt, src_seg, tgt_seg: m.apply(
                {"params": p}, src, tgt, src_segment_ids=src_seg, tgt_segment_ids=tgt_seg
            )
        )
        self.encode = jax.jit(
            lambda p, src, src_seg: m.apply({"params": p}, src, src_segment_ids=src_seg, method=EncoderDecoder.encode)
        )
        self.step = jax.jit(
            lambda p, cache, tgt, enc, src_seg, pos: m.apply(
                {"params": p, "cache": cache},
                tgt,
                enc,
                src_seg,
                tgt_positions=pos,
                decode=True,
                mutable=["cache"],
                method=EncoderDecoder.decode,
            )
        )


_BUILT = {}


def built(kind, **kw):
    key = (kind, tuple(sorted(kw.items())))
    if key not in _BUILT:
        _BUILT[key] = (LM if kind == "lm" else Seq2Seq)(make_cfg(**kw))
    return _BUILT[key]


# ----------------------------------------------------------------------------------------------------------------
# Config validation


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("activation", "tanh", ["activation", "'tanh'", "relu", "gelu", "swiglu"]),
        ("norm", "batchnorm", ["norm", "layernorm", "rmsnorm"]),
        ("positional", "xpos", ["positional", "sinusoidal", "learned", "rope", "alibi", "none"]),
        ("norm_placement", "middle", ["norm_placement", "pre", "post"]),
        ("attention_impl", "flash", ["attention_impl", "reference", "fused"]),
        ("dtype", "float16", ["dtype", "float32", "bfloat16"]),
        ("d_model", 18, ["d_model", "num_heads"]),
        ("num_heads", 0, ["num_heads"]),
        ("num_kv_heads", 3, ["num_kv_heads"]),
        ("num_kv_heads", 0, ["num_kv_heads"]),
        ("num_encoder_layers", 0, ["num_encoder_layers"]),
        ("vocab_size", -1, ["vocab_size"]),
        ("dropout", 1.5, ["dropout"]),
    ],
)
def test_config_validation_names_field_and_allowed_values(field, value, words):
    with pytest.raises(ValueError) as err:
        make_cfg(**{field: value})
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_config_is_frozen_and_from_dict_suggests_close_matches():
    cfg = ModelConfig.from_dict({"vocab_size": 5, "d_model": 8, "num_heads": 2})
    assert cfg.head_dim == 4 and cfg.kv_heads == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 16
    with pytest.raises(ValueError, match="num_head.*did you mean.*num_heads"):
        ModelConfig.from_dict({"vocab_size": 5, "num_head": 2})
    with pytest.raises(ValueError) as err:
        ModelConfig.from_dict({"vocab_size": 5, "positonal": "rope"})
    assert "positional" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------------------------
# Parameter count, closed form


def expected_params(cfg, family):
    d, f, h, g, k, v = cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.vocab_size
    b = cfg.use_bias
    attn = d * h * k + 2 * d * g * k + h * k * d + (h * k + 2 * g * k + d if b else 0)  # 3h+1 matrices, GQA K/V
    n_in = 2 if cfg.activation == "swiglu" else 1
    ffn = n_in * d * f + f * d + (n_in * f + d if b else 0)
    norm = 2 * d if cfg.norm == "layernorm" else d
    final = norm if cfg.norm_placement == "pre" else 0
    embed = v * d + (cfg.max_len * d if cfg.positional == "learned" else 0)
    head = 0 if cfg.tie_embeddings else d * v
    if family == "lm":
        return embed + head + cfg.num_layers * (attn + ffn + 2 * norm) + final
    encoder = cfg.encoder_layers * (attn + ffn + 2 * norm) + final
    decoder = cfg.num_layers * (2 * attn + ffn + 3 * norm) + final
    embeds = embed + head if cfg.share_embeddings else 2 * embed + head  # the source table has no LM head
    return embeds + encoder + decoder


@pytest.mark.parametrize(
    "family,kw",
    [
        ("lm", {}),
        ("lm", dict(tie_embeddings=False, use_bias=True, activation="swiglu", norm="rmsnorm")),
        ("lm", dict(num_kv_heads=1, positional="rope", norm_placement="post", scan_layers=False, num_layers=3)),
        ("ed", dict(positional="sinusoidal")),
        ("ed", dict(share_embeddings=False, tie_embeddings=False, num_encoder_layers=3, use_bias=True)),
        ("ed", dict(share_embeddings=False, activation="swiglu", num_kv_heads=4, norm_placement="post")),
    ],
)
def test_parameter_count_matches_closed_form(family, kw):
    cfg = make_cfg(**kw)
    model = DecoderLM(cfg) if family == "lm" else EncoderDecoder(cfg)
    tok = jnp.ones((1, 4), jnp.int32)
    args = (tok,) if family == "lm" else (tok, tok)
    shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), *args)["params"]))
    leaves = jax.tree_util.tree_leaves(shapes)
    assert all(l.dtype == jnp.float32 for l in leaves)
    assert sum(int(np.prod(l.shape)) for l in leaves) == expected_params(cfg, family)


def test_logical_axis_names():
    model = DecoderLM(make_cfg(tie_embeddings=False))
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
    specs = nn.get_partition_spec(variables)["params"]
    assert tuple(specs["decoder"]["layers"]["self_attention"]["query"]) == ("layers", "embed", "heads", "kv")
    assert tuple(specs["decoder"]["layers"]["self_attention"]["key"]) == ("layers", "embed", "kv_heads", "kv")
    assert tuple(specs["decoder"]["layers"]["self_attention"]["out"]) == ("layers", "heads", "kv", "embed")
    assert tuple(specs["decoder"]["layers"]["ffn"]["wi"]["kernel"]) == ("layers", "embed", "mlp")
    assert tuple(specs["embed"]["tokens"]["embedding"]) == ("vocab", "embed")
    assert tuple(specs["embed"]["positions"]["embedding"]) == ("position", "embed")


# ----------------------------------------------------------------------------------------------------------------
# Causality


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONALS)
def test_decoder_lm_causal_and_packed_segments(positional):
    lm = built("lm", positional=positional)
    rng = np.random.default_rng(0)
    l, i = 8, 3
    base = _seq(rng, 1, l)
    changed = base.at[0, i + 1 :].set((base[0, i + 1 :] % (V - 1)) + 1)  # every later token different
    pos, seg = _arange(2, l), jnp.ones((2, l), jnp.int32)
    logits = lm.forward(lm.params, jnp.concatenate([base, changed]), pos, seg)
    assert logits.shape == (2, l, V) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits[1, : i + 1], logits[0, : i + 1], atol=1e-5)
    assert not np.allclose(logits[1, i + 1], logits[0, i + 1], atol=1e-3)
    # packed row: segment 1 = slots 0..3, segment 2 = slots 4..7 with positions restarting at 0
    seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2]] * 2)
    pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 3]] * 2)
    packed = lm.forward(lm.params, jnp.concatenate([base, changed]), pos, seg)
    np.testing.assert_allclose(packed[1, :4], packed[0, :4], atol=1e-5)
    # segment 2 sees nothing of segment 1: it equals the same tokens alone at positions 0..3 (prefix of a row)
    alone = lm.forward(lm.params, jnp.concatenate([changed[:, 4:], changed[:, 4:]], axis=1)[:1].repeat(2, 0), pos, seg)
    np.testing.assert_allclose(packed[1, 4:], alone[0, :4], atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONALS)
def test_encoder_decoder_decoder_side_causal(positional):
    s2s = built("ed", positional=positional)
    rng = np.random.default_rng(1)
    src = jnp.repeat(_seq(rng, 1, 6), 2, axis=0)
    tgt = _seq(rng, 1, 6)
    i = 2
    changed = tgt.at[0, i + 1 :].set((tgt[0, i + 1 :] % (V - 1)) + 1)
    ones = jnp.ones((2, 6), jnp.int32)
    logits = s2s.forward(s2s.params, src, jnp.concatenate([tgt, changed]), ones, ones)
    assert logits.shape == (2, 6, V)
    np.testing.assert_allclose(logits[1, : i + 1], logits[0, : i + 1], atol=1e-5)
    assert not np.allclose(logits[1, i + 1], logits[0, i + 1], atol=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# Padding


@pytest.mark.parametrize("positional", POSITIONALS)
def test_encoder_ignores_pad_contents(positional):
    s2s = built("ed", positional=positional)
    rng = np.random.default_rng(2)
    src = _seq(rng, 2, 6)
    src_seg = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    other = src.at[0, 4:].set(jnp.array([0, 7]))  # different pad contents in row 0
    enc_a = s2s.encode(s2s.params, src, src_seg)
    enc_b = s2s.encode(s2s.params, other, src_seg)
    assert not np.isnan(np.asarray(enc_a)).any()
    np.testing.assert_allclose(enc_b[0, :4], enc_a[0, :4], atol=1e-5)
    np.testing.assert_allclose(enc_b[1], enc_a[1], atol=1e-6)
    # and the decoder's logits do not depend on them either; a padded target row gives finite logits
    tgt = _seq(rng, 2, 6)
    tgt_seg = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    la = s2s.forward(s2s.params, src, tgt, src_seg, tgt_seg)
    lb = s2s.forward(s2s.params, other, tgt, src_seg, tgt_seg)
    assert np.isfinite(np.asarray(la)).all()
    np.testing.assert_allclose(lb[0, :3], la[0, :3], atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Cached decoding: prefill + one-token steps == the full forward pass


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONALS)
def test_lm_cached_decoding_equals_full_forward(positional):
    lm = built("lm", positional=positional)
    rng = np.random.default_rng(3)
    b, prompt, total = 2, 4, 8
    toks = _seq(rng, b, total)
    full = lm.forward(lm.params, toks, _arange(b, total), jnp.ones((b, total), jnp.int32))
    cache = init_cache(lm.model, b, total)
    ones = jnp.ones((b, 1), jnp.int32)
    out, upd = lm.step(lm.params, cache, toks[:, :prompt], _arange(b, prompt), jnp.ones((b, prompt), jnp.int32))
    got = [out]
    for t in range(prompt, total):
        out, upd = lm.step(lm.params, upd["cache"], toks[:, t : t + 1], ones * t, ones)
        got.append(out)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), full, atol=1e-4)


@pytest.mark.parametrize(
    "kw", [dict(positional=p) for p in POSITIONALS] + [dict(positional="alibi", attention_impl="fused")]
)
def test_lm_left_padded_prompt_equals_unpadded(kw):
    lm = built("lm", **kw)
    rng = np.random.default_rng(4)
    s = _seq(rng, 1, 8)[0]
    ref = lm.forward(lm.params, jnp.stack([s, s]), _arange(2, 8), jnp.ones((2, 8), jnp.int32))[0]
    pad = 0  # pad slots hold some token; their content must not matter
    # row 0: 2 pads + s[0:2]; row 1: 1 pad + s[0:3]; positions start at 0 on the first real token
    prompt = jnp.array([[pad, 5, s[0], s[1]], [3, s[0], s[1], s[2]]])
    seg = jnp.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    pos = jnp.array([[0, 0, 0, 1], [0, 0, 1, 2]])
    cache = init_cache(lm.model, 2, 8)
    out, upd = lm.step(lm.params, cache, prompt, pos, seg)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out[0, 2:], ref[0:2], atol=1e-4)
    np.testing.assert_allclose(out[1, 1:], ref[0:3], atol=1e-4)
    n_real = np.array([2, 3])
    for k in range(3):
        nxt = jnp.asarray(np.asarray(s)[n_real + k])[:, None]
        out, upd = lm.step(lm.params, upd["cache"], nxt, jnp.asarray(n_real + k)[:, None], jnp.ones((2, 1), jnp.int32))
        np.testing.assert_allclose(out[0, 0], ref[2 + k], atol=1e-4)
        np.testing.assert_allclose(out[1, 0], ref[3 + k], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONALS)
def test_encoder_decoder_cached_decoding_equals_full_forward(positional):
    s2s = built("ed", positional=positional)
    rng = np.random.default_rng(5)
    b, s_len, prompt, total = 2, 6, 2, 6
    src = _seq(rng, b, s_len)
    src_seg = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    tgt = _seq(rng, b, total)
    full = s2s.forward(s2s.params, src, tgt, src_seg, jnp.ones((b, total), jnp.int32))
    enc = s2s.encode(s2s.params, src, src_seg)
    cache = init_cache(s2s.model, b, total, s_len)
    out, upd = s2s.step(s2s.params, cache, tgt[:, :prompt], enc, src_seg, _arange(b, prompt))
    got = [out]
    for t in range(prompt, total):
        out, upd = s2s.step(s2s.params, upd["cache"], tgt[:, t : t + 1], None, src_seg, jnp.full((b, 1), t, jnp.int32))
        got.append(out)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), full, atol=1e-4)
