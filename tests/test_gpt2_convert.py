"""GPT-2 folder import/export without PyTorch: round trips and one-line errors on bad input."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from txjax.convert import load_gpt2, load_gpt2_tokenizer, save_gpt2
from txjax.convert.gpt2 import GPT2_SMALL
from txjax.model.models import DecoderLM

CFG = dataclasses.replace(GPT2_SMALL, vocab_size=50, d_model=16, num_heads=2, d_ff=64, num_layers=2, max_len=12)


def random_params(cfg, seed=0):
    """DecoderLM params with every leaf random (biases and LayerNorms included), as float32 numpy."""
    init = lambda: DecoderLM(cfg).init(jax.random.key(0), jnp.zeros((1, 1), int))
    shapes = nn.meta.unbox(jax.eval_shape(init)["params"])
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32), shapes)


@pytest.fixture
def folder(tmp_path):
    return save_gpt2(tmp_path / "gpt2", CFG, random_params(CFG))


def edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_tensors(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_export_then_import_is_identity(tmp_path):
    params = random_params(CFG)
    cfg, back = load_gpt2(save_gpt2(tmp_path / "a", CFG, params))
    assert cfg == CFG
    jax.tree.map(np.testing.assert_array_equal, back, params)


def test_looped_layers_export_like_scanned(tmp_path):
    params = random_params(CFG)
    looped_cfg = dataclasses.replace(CFG, scan_layers=False)
    looped = {
        **params,
        "decoder": {
            "final_norm": params["decoder"]["final_norm"],
            **{
                f"layers_{i}": jax.tree.map(lambda a, i=i: a[i], params["decoder"]["layers"])
                for i in range(CFG.num_layers)
            },
        },
    }
    scanned_files = load_file(save_gpt2(tmp_path / "s", CFG, params) / "model.safetensors")
    looped_files = load_file(save_gpt2(tmp_path / "l", looped_cfg, looped) / "model.safetensors")
    jax.tree.map(np.testing.assert_array_equal, scanned_files, looped_files)
    tokens = jnp.arange(10)[None] % CFG.vocab_size
    np.testing.assert_allclose(
        DecoderLM(looped_cfg).apply({"params": looped}, tokens),
        DecoderLM(CFG).apply({"params": params}, tokens),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"model_type": "llama"}, "model_type"),
        ({"activation_function": "silu"}, "activation_function"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"n_embd": 32}, "has shape"),
        ({"n_layer": 3}, "h.2.attn.c_attn.weight. is missing"),
        ({"n_head": "2"}, "n_head"),
    ],
)
def test_bad_config_is_one_line_error(folder, changes, field):
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=field) as e:
        load_gpt2(folder)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda t: t.pop("transformer.wpe.weight"), "wpe.weight"),
        (lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"] + 1}), "lm_head.weight"),
        (lambda t: t.update({"transformer.h.0.attn.q_attn.weight": t["transformer.wpe.weight"]}), "q_attn"),
        (lambda t: t.update({"transformer.h.0.mlp.c_fc.bias": t["transformer.h.0.mlp.c_fc.bias"][:-1]}), "c_fc.bias"),
    ],
)
def test_bad_tensors_are_one_line_errors(folder, change, field):
    edit_tensors(folder, change)
    with pytest.raises(ValueError, match=field):
        load_gpt2(folder)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="vocab_size"):
        load_gpt2(tmp_path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("positional", "rope"),
        ("activation", "swiglu"),
        ("use_bias", False),
        ("tie_embeddings", False),
        ("num_kv_heads", 1),
    ],
)
def test_unexportable_config_writes_nothing(tmp_path, field, value):
    cfg = dataclasses.replace(CFG, **{field: value})
    with pytest.raises(ValueError, match=field):
        save_gpt2(tmp_path / "out", cfg, random_params(cfg))
    assert list(tmp_path.iterdir()) == []


def test_mismatched_params_write_nothing(tmp_path):
    params = random_params(dataclasses.replace(CFG, d_ff=32))
    with pytest.raises(ValueError, match="wi"):
        save_gpt2(tmp_path / "out", CFG, params)
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_nonempty_folder(folder):
    with pytest.raises(ValueError, match="not an empty folder"):
        save_gpt2(folder, CFG, random_params(CFG))


def test_folder_without_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="no GPT-2 tokenizer files"):
        load_gpt2_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}, "pre_tokenizer": None}))
    with pytest.raises(ValueError, match="model.type='Unigram'"):
        load_gpt2_tokenizer(tmp_path)


def test_hub_layout_without_prefix_and_with_mask_buffers(folder):
    """openai-community/gpt2's file: no `transformer.` prefix, the causal-mask buffers h.i.attn.bias stored too."""
    _, want = load_gpt2(folder)

    def to_hub_layout(tensors):
        renamed = {k.removeprefix("transformer."): tensors.pop(k) for k in list(tensors)}
        tensors.update(renamed)
        tensors.update({f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 12, 12), np.float32)) for i in range(2)})

    edit_tensors(folder, to_hub_layout)
    jax.tree.map(np.testing.assert_array_equal, load_gpt2(folder)[1], want)
