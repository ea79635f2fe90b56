"""Attention maps: weights captured from the model's own attention, panels, PNG files."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train import tiny_config

import run
from txjax.data import CharTokenizer
from txjax.evaluate.viz import attention_maps, capture_attention, select_panels, token_labels
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder, unstack_layers
from txjax.ops.summary import param_shapes
from txjax.training.loop import train

TOK = CharTokenizer.from_text("abc de\n$", specials=True)
CFG = ModelConfig(vocab_size=TOK.vocab_size, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=16)
IDS = TOK.encode("abc de\nab")


def random_params(model):
    """Parameters of `model` drawn from N(0, 0.3^2), from shapes alone (faster than model.init)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.normal(0.0, 0.3, s.shape).astype(np.float32), param_shapes(model))


@pytest.fixture(scope="module")
def lm_params():
    return random_params(DecoderLM(CFG))


def test_lm_weights_are_causal_distributions_in_both_layouts(lm_params):
    params = lm_params
    weights = capture_attention(DecoderLM(CFG, sow_weights=True), params, jnp.asarray([IDS]))
    w = weights["decoder/self_attention"]
    assert list(weights) == ["decoder/self_attention"] and w.shape == (2, 2, len(IDS), len(IDS))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(w, k=1) == 0)  # no query sees a later key
    looped = capture_attention(
        DecoderLM(dataclasses.replace(CFG, scan_layers=False), sow_weights=True),
        unstack_layers(params),
        jnp.asarray([IDS]),
    )
    np.testing.assert_allclose(looped["decoder/self_attention"], w, atol=1e-6)


def test_capture_needs_sow_weights(lm_params):
    with pytest.raises(ValueError, match="sow_weights"):
        capture_attention(DecoderLM(CFG), lm_params, jnp.asarray([IDS]))


def test_panels():
    w = np.random.default_rng(0).random((3, 4, 5, 5))
    assert [t for t, _ in select_panels(w, 1, None)] == [f"layer 1 head {h}" for h in range(4)]
    assert len(select_panels(w, None, 2)) == 3
    title, panel = select_panels(w, None, None)[0]
    assert "mean" in title and np.allclose(panel, w[0].mean(0))
    with pytest.raises(ValueError, match="--layer=3"):
        select_panels(w, 3, None)


def test_labels_show_whitespace_and_specials():
    assert token_labels(TOK, [TOK.bos_id, *TOK.encode(" \n$")]) == ["<bos>", "\u2423", "\\n", r"\$"]


def test_pngs_for_lm_and_encoder_decoder(lm_params, tmp_path):
    files = attention_maps(DecoderLM(CFG), lm_params, TOK, IDS, tmp_path / "lm.png", layer=0)
    cfg = dataclasses.replace(CFG, scan_layers=False)
    tgt = [TOK.bos_id, *TOK.encode("ed")]
    params = random_params(EncoderDecoder(cfg))
    files += attention_maps(EncoderDecoder(cfg), params, TOK, IDS, tmp_path / "ed.png", target_ids=tgt)
    assert [f.name for f in files] == ["lm.png", "ed-encoder.png", "ed-decoder.png", "ed-cross.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


@pytest.fixture(scope="module")
def seq2seq_workdir(tmp_path_factory):
    """A tiny encoder-decoder trained for one step on the reverse task."""
    workdir = tmp_path_factory.mktemp("seq2seq")
    train(tiny_config("--config.family=encoder_decoder", "--config.train.steps=1"), workdir)
    return workdir


def test_attention_command_on_encoder_decoder(seq2seq_workdir, tmp_path, capsys):
    out = tmp_path / "a.png"
    assert run.main(["attention", f"--workdir={seq2seq_workdir}", "--text=1234", f"--out={out}"]) == 0  # translates
    assert (
        run.main(["attention", f"--workdir={seq2seq_workdir}", "--text=12", "--target=21", "--layer=0", f"--out={out}"])
        == 0
    )
    files = json.loads(capsys.readouterr().out.splitlines()[-1])["files"]
    assert [Path(f).name for f in files] == ["a-encoder.png", "a-decoder.png", "a-cross.png"]
    assert run.main(["attention", f"--workdir={seq2seq_workdir}", "--text=12", "--layer=5"]) == 2
    assert "--layer=5 is out of range" in capsys.readouterr().err


def test_inspect_command(seq2seq_workdir, capsys):
    assert run.main(["inspect", f"--workdir={seq2seq_workdir}", "--batch_size=2"]) == 0
    table = capsys.readouterr().out
    assert "decoder/layers/cross_attention" in table and "batch 2 x context" in table
    assert run.main(["inspect", "--config.model.num_layers=3"]) == 0  # the default experiment, sizes from its data
    assert "train FLOPs / token" in capsys.readouterr().out
