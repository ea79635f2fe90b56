"""Multi-token prediction (txjax/model/mtp.py, DeepSeek-V3 sec. 2.2): its loss against the definition written here in
NumPy over the model's own decoder and blocks, masks at the shifted positions (packed documents, padding), depth 0
and decoding as the model without the modules, a training run logging each depth's loss, and the refusals."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train import tiny_config

import run
from txjax import config as config_lib
from txjax import decode
from txjax.convert import llama
from txjax.errors import ConfigError
from txjax.families import DECODER_LM, init_params
from txjax.families.objective import forward, mtp_sums
from txjax.model.blockwise import Segments
from txjax.model.config import ModelConfig
from txjax.model.layers import Block
from txjax.model.models import Embedder, Stack
from txjax.training.loop import train

CFG = ModelConfig(
    vocab_size=32, d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=16, positional="rope", norm="rmsnorm",
    activation="swiglu", tie_embeddings=False, mtp_depth=2,
)  # fmt: skip
L = 12


@functools.cache
def _setup(cfg=CFG):
    """The model, its parameters and its forward pass, jitted (txjax.families.objective.forward; the init too: op by
    op it compiled each of its ops alone)."""
    model = DECODER_LM.module(cfg)
    params = jax.device_get(jax.jit(lambda: init_params(model, jax.random.key(0)))())
    return model, params, jax.jit(functools.partial(forward, model))


def _batch(inputs, segments, weights):
    """An LM batch whose targets are each document's next token (the last token's target has weight 0)."""
    inputs, segments = np.asarray(inputs, np.int32), np.asarray(segments, np.int32)
    nxt = np.concatenate([inputs[:, 1:], np.zeros_like(inputs[:, :1])], 1)
    last = np.concatenate([segments[:, 1:] != segments[:, :-1], np.ones_like(segments[:, :1], bool)], 1)
    positions = np.zeros_like(inputs)
    for b, row in enumerate(segments):
        for i in range(1, len(row)):
            positions[b, i] = positions[b, i - 1] + 1 if row[i] == row[i - 1] else 0
    w = np.asarray(weights, np.float32) * ~last * (segments > 0)
    return dict(inputs=inputs, targets=nxt, weights=w, segment_ids=segments, positions=positions)


def _rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g


def _ce(logits, target):
    z = logits - logits.max()
    return float(np.log(np.exp(z).sum()) - z[target])


def test_loss_is_deepseek_v3s_over_the_models_own_pieces():
    """h^0 from the model's embedding and decoder; each depth's [RMSNorm(e_{i+k}); RMSNorm(h^{k-1}_i)] W_k, its block,
    its norm and the shared head written here; targets t_{i+k+1} and weights by a loop over the positions. The main
    logits are the model's without the modules."""
    model, params, fwd = _setup()
    rng = np.random.default_rng(0)
    batch = _batch(rng.integers(1, 32, (2, L)), [[1] * 7 + [2] * 5, [1] * 9 + [0] * 3], np.ones((2, L)))
    logits, _, _, _, depths = fwd(params, batch)
    np.testing.assert_array_equal(
        logits, model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"])
    )
    got = mtp_sums(depths, 0.3)

    ctx = {"mask": Segments(batch["segment_ids"], batch["segment_ids"]), "pos": batch["positions"]}
    x = Embedder(CFG).apply({"params": params["embed"]}, batch["inputs"], batch["positions"])
    h = np.asarray(Stack(CFG, 1, causal=True).apply({"params": params["decoder"]}, x, ctx))
    table, head = params["embed"]["tokens"]["embedding"], params["embed"]["lm_head"]["kernel"]
    sums, counts = [], []
    for k in (1, 2):
        p = params["mtp"][f"depth_{k}"]
        ids = np.zeros_like(batch["inputs"])
        ids[:, : L - k] = batch["inputs"][:, k:]
        e, hn = (
            _rms(table[ids], p["embed_norm"]["scale"], CFG.norm_eps),
            _rms(h, p["hidden_norm"]["scale"], CFG.norm_eps),
        )
        both = np.concatenate([e, hn], -1)  # the order of DeepSeek-V3's released eh_proj
        block = Block(CFG, causal=True)
        h = np.asarray(block.apply({"params": p["block"]}, jnp.asarray(both @ p["proj"]["kernel"]), ctx)[0])
        logits_k = _rms(h, p["head_norm"]["scale"], CFG.norm_eps) @ head
        total = count = 0.0
        for b in range(2):
            for i in range(L - k):
                seg = batch["segment_ids"][b]
                if seg[i] and seg[i + k] == seg[i] and batch["weights"][b, i + k]:
                    total, count = total + _ce(logits_k[b, i], batch["inputs"][b, i + k + 1]), count + 1
        sums.append(total)
        counts.append(count)
    np.testing.assert_allclose(got["mtp_loss"], sums, rtol=2e-5)
    np.testing.assert_array_equal(got["mtp_weight"], counts)
    np.testing.assert_allclose(got["mtp_objective"], 0.3 * np.mean(sums), rtol=2e-5)


def test_documents_and_padding_do_not_reach_across():
    """Two documents packed in a row give the depths the sums of each document alone in its own padded row; tokens
    in the padding change nothing. (Without the segment check, the last positions of the first document would be
    scored against the second's tokens.)"""
    _, params, fwd = _setup()
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, 32, 7), rng.integers(1, 32, 5)
    packed = _batch([np.concatenate([a, b])], [[1] * 7 + [2] * 5], np.ones((1, L)))
    pads = rng.integers(1, 32, (2, L))
    alone = lambda pads: _batch(
        [np.concatenate([a, pads[0, 7:]]), np.concatenate([b, pads[1, 5:]])], [[1] * 7 + [0] * 5, [1] * 5 + [0] * 7],
        np.ones((2, L)),
    )  # fmt: skip
    sums = lambda batch: mtp_sums(fwd(params, batch)[4], 0.3)
    together, apart = sums(packed), sums(alone(pads))
    np.testing.assert_allclose(together["mtp_loss"], apart["mtp_loss"], rtol=1e-5)
    np.testing.assert_array_equal(together["mtp_weight"], apart["mtp_weight"])
    np.testing.assert_array_equal(together["mtp_weight"], [(7 - 2) + (5 - 2), (7 - 3) + (5 - 3)])
    np.testing.assert_array_equal(sums(alone(rng.integers(1, 32, (2, L))))["mtp_loss"], apart["mtp_loss"])


def test_depth_0_and_decoding_are_the_model_without_the_modules():
    """The same parameters without 'mtp' in a model of mtp_depth 0: the same logits, no depths, and greedy decoding
    of the model with the modules writes the same tokens as the one without."""
    model, params, fwd = _setup()
    plain = DECODER_LM.module(dataclasses.replace(CFG, mtp_depth=0))
    without = {k: v for k, v in params.items() if k != "mtp"}
    assert jax.tree.structure(without) == jax.tree.structure(
        jax.eval_shape(lambda: init_params(plain, jax.random.key(0)))
    )
    batch = _batch(np.random.default_rng(2).integers(1, 32, (1, L)), [[1] * L], np.ones((1, L)))
    mtp_logits, *_ = fwd(params, batch)
    plain_logits, _, _, _, depths = forward(plain, without, batch)
    assert depths == ()
    np.testing.assert_array_equal(mtp_logits, plain_logits)
    prompts = [[3, 5, 7], [2, 9]]
    ids = decode.generate(model, params, prompts, max_new_tokens=8).ids
    assert ids == decode.generate(plain, without, prompts, max_new_tokens=8).ids


def test_training_logs_each_depths_loss(tmp_path, capsys):
    """... and `run.py generate --speculative` prints the text greedy decoding prints."""
    config = tiny_config(
        "--config.model.mtp_depth=2", "--config.train.steps=4", "--config.train.eval_every=2",
        "--config.train.eval_batches=1",
    )  # fmt: skip
    result = train(config, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for split in ("train", "valid"):
        logged = [r for r in records if r["split"] == split]
        assert logged and all(
            np.isfinite(r[f"mtp_loss_{k}"]) and r[f"mtp_loss_{k}"] > 0 for r in logged for k in (1, 2)
        )
    assert "mtp_loss_3" not in records[0]
    assert result["valid_mtp_loss_1"] > 0
    texts = []
    for flags in ([], ["--speculative"]):
        capsys.readouterr()
        assert run.main(["generate", f"--workdir={tmp_path}", "--prompt=1234", "--max_new_tokens=6", *flags]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("1234")


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--config.model.mtp_depth=-1"], "model.mtp_depth=-1 must be"),
        (["--config.train.mtp_weight=0.1"], "train.mtp_weight"),
        (["--config.model.mtp_depth=1", "--config.mesh.sequence=2"], "has no multi-token prediction"),
    ],
)
def test_bad_settings_are_one_line(flags, named):
    with pytest.raises(ConfigError, match=named) as e:
        config_lib.validate(tiny_config(*flags))
    assert "\n" not in str(e.value)


def test_export_refuses_the_modules_in_one_line(tmp_path):
    _, params, _ = _setup()
    with pytest.raises(ConfigError, match=r"^export to LlamaForCausalLM cannot express model\.mtp_depth=2 ") as e:
        llama.save_llama(tmp_path / "out", CFG, params)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
