"""What decoding computes against what the model computes: the decoding layout's attention with every term of the
scores (txjax.model.score.Terms, each field on its own), the model's replaceable methods (txjax/model/replaceable.py)
against the model's side and the layouts', and the KV cache's schema (txjax/model/kv_cache.py) against the caches
the model and the decoding layout create."""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax.decode import cache, kernels
from txjax.families import prefix_lm
from txjax.model import attention, kv_cache, replaceable, score
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder
from txjax.model.multi_head import MultiHeadAttention


class CachedModule:
    """What the decoding layout's attend reads of a module: a cache (decode mode) and its attention_impl."""

    impl = "reference"

    def has_variable(self, collection, name):
        return collection == "cache"


def test_decoding_attends_with_every_term_of_the_scores():
    """kernels' attend over keys [B*KV, K, S] and values [B*KV, S, K] equals the model's over [B, S, KV, K] with every
    array of score.Terms set (random, per row and head), and each array changes what both compute: a term that
    decoding skipped, or a new one its layout did not arrange, fails here."""
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    b, l, h, g, s, k = 2, 3, 4, 2, 6, 8
    q, keys, values = normal(b, l, h, k), normal(b, s, g, k), normal(b, s, g, k)
    arrays = {
        "mask": jnp.asarray(rng.random((b, 1, l, s)) < 0.7).at[..., 0].set(True),
        "bias": normal(b, h, l, s),
        "sinks": normal(1, h, 1, 1),
    }
    fields = [f.name for f in dataclasses.fields(score.Terms) if f.metadata.get("pytree_node", True)]
    assert set(fields) <= set(arrays), f"give the new term of score.Terms a value here: {set(fields) - set(arrays)}"
    full = score.Terms(0.5, softcap=2.0, **{name: arrays[name] for name in fields})
    decoding = lambda terms: kernels._attend(None, CachedModule(), q, *kernels.cache_layout(keys, values), terms, True)
    want = attention.attend(q, keys, values, full)[0]
    np.testing.assert_allclose(decoding(full), want, atol=1e-5)
    for name in fields:
        without = dataclasses.replace(full, **{name: None})
        np.testing.assert_allclose(decoding(without), attention.attend(q, keys, values, without)[0], atol=1e-5)
        assert float(jnp.abs(decoding(without) - want).max()) > 1e-3, name


def test_every_declared_method_has_its_declared_signature_on_the_models_side():
    assert replaceable.mismatches() == []


def test_a_changed_parameter_on_the_models_side_is_a_mismatch(monkeypatch):
    """A refactor that renames update_cache's `mask` (or reorders its parameters) is caught here, and a layout
    replacing it refuses to be built."""

    def update_cache(self, k_new, v_new, q_pos, k_pos, attention_mask, window=0):
        return None

    monkeypatch.setattr(MultiHeadAttention, "update_cache", update_cache)
    assert replaceable.mismatches() == [
        "MultiHeadAttention.update_cache(self, k_new, v_new, q_pos, k_pos, attention_mask, window=0) is declared "
        "(self, k_new, v_new, q_pos, k_pos, mask, window=0) in txjax/model/replaceable.py"
    ]
    with pytest.raises(TypeError, match="takes .*mask.*the model's .*attention_mask"):
        replaceable.Layout("test", kernels.LAYOUT.replacements)


def test_the_layouts_replace_declared_methods_only_with_their_parameters():
    for layout in (kernels.LAYOUT, prefix_lm.PREFILL):
        for key, fn in layout.replacements.items():
            assert key in replaceable.REPLACEABLE
            own = replaceable.parameters(getattr(*key), 1)
            assert replaceable.parameters(fn, 2) == own, fn.__name__

    def project_out(own, module, out_BxLxHxK):
        return own(out_BxLxHxK, 0)

    with pytest.raises(TypeError, match="project_out"):
        replaceable.Layout("test", {(MultiHeadAttention, "project_out"): project_out})
    with pytest.raises(TypeError, match="norm is not declared"):
        replaceable.Layout("test", {(MultiHeadAttention, "norm"): project_out})


def tiny(**overrides):
    fields = dict(vocab_size=11, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=16)
    return ModelConfig(**{**fields, "scan_layers": False, **overrides})


@pytest.mark.parametrize("layout", ["trained", "decoding"])
@pytest.mark.parametrize("kind", ["lm", "seq2seq", "local", "linear"])
def test_the_caches_created_follow_the_schema(kind, layout):
    """Every leaf the model creates (its own methods, or the decoding layout's) is named in SCHEMA with the shape
    and dtype written there: B=3 rows, S=7 slots, W=4 (a local layer's window), R=5 source tokens; a Gated DeltaNet
    layer's T=2 inputs of history, F=56 channels (q, k: 2 heads x 8 each, v: 4 heads x 6), H=4 value heads, K=8, V=6."""
    linear = dict(layer_types="LF", linear_heads=2, linear_v_heads=4, linear_v_head_dim=6, linear_conv=3)
    cfg = tiny(
        dtype="bfloat16", **(dict(attention_window=4) if kind == "local" else linear if kind == "linear" else {})
    )
    model = EncoderDecoder(cfg) if kind == "seq2seq" else DecoderLM(cfg)
    installed = kernels.installed() if layout == "decoding" else contextlib.nullcontext()
    with installed:
        created = jax.eval_shape(lambda: cache.empty_cache(model, 3, 7, 5 if kind == "seq2seq" else None))
    sizes = {"B": 3, "S": 7, "W": 4, "R": 5, "KV": 2, "K": 8, "B*KV": 6, "T": 2, "F": 56, "H": 4, "V": 6}
    names = set()
    for path, leaf in jax.tree_util.tree_leaves_with_path(created):
        name = path[-1].key
        names.add(name)
        schema = kv_cache.SCHEMA[name]
        assert leaf.shape == tuple(sizes[a] for a in getattr(schema, layout)), (path, leaf.shape)
        assert leaf.dtype == (jnp.bfloat16 if schema.dtype == "keys" else jnp.dtype(schema.dtype)), path
    expected = {"lm": {"cached_key"}, "seq2seq": {"cached_key", "cross_key"}, "local": {"window_key"}}.get(kind, set())
    expected |= {"conv_state", "delta_state", "cached_key"} if kind == "linear" else set()
    assert expected <= names and "cache_index" in names
