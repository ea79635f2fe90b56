"""Tests of the prefix-LM family (txjax/families/prefix_lm.py): its mask, the loss on the target only, cached
decoding against the full forward pass, beam search, a training run and `run.py eval`'s BLEU."""

import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import config as config_lib
from txjax import decode
from txjax.cli import eval as cli_eval
from txjax.data.batching import seq2seq_batch
from txjax.evaluate.probes import run_probes
from txjax.families.objective import forward, token_sums
from txjax.families.prefix_lm import PrefixLM, prefix_batch
from txjax.model.config import ModelConfig
from txjax.model.masks import prefix_mask, segment_mask
from txjax.ops.metrics_log import read_metrics
from txjax.training.loop import train

VOCAB, PAD, EOS, BOS = 13, 0, 1, 2
SOURCES = [[5, 6, 7, 8, EOS], [9, 4, EOS], [3, 11, 12, 10, 6, 7, EOS]]


@functools.cache
def model_and_params():
    """2 layers, GQA, RoPE; every parameter ~ N(0, 0.5^2): peaked distributions, so argmax never hinges on rounding."""
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=24)
    model = PrefixLM(cfg)
    ones = jnp.ones((1, 1), jnp.int32)
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ones, ones, ones, ones)["params"])
    rng = np.random.default_rng(0)
    return model, jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), shapes)


@functools.cache
def _jitted_forward():
    model, params = model_and_params()
    return jax.jit(lambda *rows: model.apply({"params": params}, *rows)[0])


def full_forward(tokens, positions, segments, prefix, length=24):
    """The model's logits [L, V] over one row, right-padded (segment 0) to `length` so that one compilation serves
    every row: padding after a token changes nothing before it."""
    n = len(tokens)
    pad = lambda x: np.pad(np.broadcast_to(np.asarray(x, np.int32), (n,)), (0, length - n))[None]
    return np.asarray(_jitted_forward()(*map(pad, (tokens, positions, segments, prefix))))[:n]


@pytest.mark.parametrize(
    "setting, message", [({"attention_window": 4}, "attention_window=0"), ({"attention_impl": "blockwise"}, "dense")]
)
def test_settings_a_prefix_lm_cannot_apply_are_refused(setting, message):
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=24, **setting)
    ones = jnp.ones((1, 1), jnp.int32)
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(PrefixLM(cfg).init, jax.random.key(0), ones, ones, ones, ones)


def test_prefix_mask_is_numpy_s_rule():
    """Key j visible to query i iff same nonzero segment and (j <= i, or both in the prefix), on explicit positions."""
    pos = np.array([[0, 1, 2, 3, 0, 1, 2]])
    seg = np.array([[1, 1, 1, 1, 2, 2, 0]])
    pre = np.array([[1, 1, 0, 0, 1, 0, 0]], bool)
    got = np.asarray(segment_mask(seg, seg) & prefix_mask(pos, pos, pre, pre))[0, 0]
    want = [
        [seg[0, i] == seg[0, j] > 0 and (pos[0, j] <= pos[0, i] or (pre[0, i] and pre[0, j])) for j in range(7)]
        for i in range(7)
    ]
    np.testing.assert_array_equal(got, np.array(want))


def test_source_reads_both_ways_target_causally_and_documents_never_leak():
    """One packed row: document 1 = source 3 tokens + target 2, document 2 = source 2 + target 1."""
    tokens = np.array([3, 4, 5, 6, 7, 8, 9, 10])
    positions = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    segments = np.array([1, 1, 1, 1, 1, 2, 2, 2])
    prefix = np.array([1, 1, 1, 0, 0, 1, 1, 0])
    run = full_forward
    base = np.asarray(run(tokens, positions, segments, prefix))

    def changed(index):
        other = tokens.copy()
        other[index] = 11
        return np.abs(np.asarray(run(other, positions, segments, prefix)) - base).max(-1) > 1e-5

    later_source = changed(2)  # document 1's last source token
    assert later_source[:2].all() and not later_source[5:].any()  # earlier source positions see it; doc 2 does not
    target = changed(4)  # document 1's last target token
    assert not target[:4].any() and not target[5:].any()
    other_document = changed(6)
    assert not other_document[:5].any() and other_document[5]


def test_loss_is_the_target_tokens_cross_entropy_of_each_document_alone():
    """A packed prefix batch's loss sum equals NumPy's cross-entropy over each pair's target tokens, each pair run
    alone as [source ; BOS target] (so the mask, the positions and the weights of packing are all checked)."""
    model, params = model_and_params()
    targets = [[4, 5, EOS], [6, EOS], [7, 8, 9, EOS]]
    pairs = seq2seq_batch(
        [[0, 1], [2]], [np.array(s) for s in SOURCES], [np.array(t) for t in targets], 10, 8, PAD, BOS
    )
    batch = prefix_batch(pairs)
    logits, targets_BxL, weights_BxL, *_ = jax.jit(functools.partial(forward, model))(params, batch)
    assert batch["weights"].sum() == sum(map(len, targets))
    want = 0.0
    for source, target in zip(SOURCES, targets):
        row = np.array([*source, BOS, *target[:-1]])
        n = len(source)
        logits_LxV = np.asarray(full_forward(row, np.arange(len(row)), np.ones(len(row)), np.arange(len(row)) < n))
        z = logits_LxV - logits_LxV.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        want -= sum(logp[n + t, token] for t, token in enumerate(target))
    got = float(token_sums(logits, targets_BxL, weights_BxL)["loss"])
    np.testing.assert_allclose(got, want, rtol=1e-4)


def log_probs(source, targets):
    """log p(targets | source) by the full forward pass over [source ; BOS ; targets[:-1]]."""
    row, n = np.array([*source, BOS, *targets[:-1]]), len(source)
    logp_LxV = jax.nn.log_softmax(full_forward(row, np.arange(len(row)), 1, np.arange(len(row)) < n))
    return float(sum(logp_LxV[n + t, token] for t, token in enumerate(targets)))


def greedy_by_recomputing(source, steps):
    """The full forward pass over [source ; BOS ; tokens so far], argmax of its last position, until EOS."""
    out = []
    for _ in range(steps):
        row = np.array([*source, BOS, *out])
        logits = full_forward(row, np.arange(len(row)), 1, np.arange(len(row)) < len(source))
        out.append(int(np.argmax(logits[-1])))
        if out[-1] == EOS:
            return out[:-1]
    return out


def test_cached_greedy_decoding_equals_the_full_forward_argmax():
    model, params = model_and_params()
    cached = decode.generate(model, params, SOURCES, bos_id=BOS, pad_id=PAD, eos_id=EOS, max_new_tokens=8)
    assert cached.ids == [greedy_by_recomputing(s, 8) for s in SOURCES]
    want = [log_probs(s, ids + [EOS] * stopped) for s, ids, stopped in zip(SOURCES, cached.ids, cached.stopped)]
    np.testing.assert_allclose(cached.scores, want, rtol=1e-4, atol=1e-4)  # every step's logits, through the cache
    row = np.array([*SOURCES[0], BOS])  # the source read causally (as the cache's own mask would) gives other logits
    both_ways = full_forward(row, np.arange(len(row)), 1, row != BOS)[-1]
    assert np.abs(both_ways - full_forward(row, np.arange(len(row)), 1, 0)[-1]).max() > 1e-2
    with pytest.raises(ValueError, match="prefill_chunk=0"):
        decode.generate(model, params, SOURCES, bos_id=BOS, eos_id=EOS, max_new_tokens=4, prefill_chunk=2)


def test_beam_search_scores_equal_the_full_forward_pass_of_their_hypotheses():
    model, params = model_and_params()
    beam = decode.generate(
        model, params, SOURCES, bos_id=BOS, eos_id=EOS, max_new_tokens=8, method="beam", beam_size=3, length_penalty=0.6
    )
    for source, ids, stopped, score in zip(SOURCES, beam.ids, beam.stopped, beam.scores):
        targets = ids + [EOS] * stopped
        want = log_probs(source, targets) / decode.length_penalty(len(targets), 0.6)
        np.testing.assert_allclose(score, want, rtol=1e-4, atol=1e-4)


def test_a_tiny_run_learns_and_run_py_eval_gives_bleu_as_the_sweep_probe_does(tmp_path, pairs_tsv, capsys):
    data = [f"--config.data.{k}={pairs_tsv}" for k in ("path", "valid_path", "test_path")]
    flags = ["--config.family=prefix_lm", "--config.data.kind=parallel", "--config.data.tokenizer=char", *data]
    model = ["--config.model.num_layers=1", "--config.model.num_heads=2", "--config.model.d_model=32"]
    model += ["--config.model.d_ff=64", "--config.data.pack=true"]
    train_flags = ["--config.train.steps=20", "--config.train.batch_size=4", "--config.train.warmup_steps=2"]
    train_flags += ["--config.train.learning_rate=0.01", "--config.train.log_every=5", "--config.train.eval_every=0"]
    decoding = ["--config.decode.method=beam", "--config.decode.max_new_tokens=12"]
    config = config_lib.from_command_line(None, [*model, *flags, *train_flags, *decoding])
    assert train(config, tmp_path / "run")["step"] == 20
    losses = [r["loss"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert losses[-1] < 0.5 * losses[0]
    capsys.readouterr()
    cli_eval.main(["--workdir", str(tmp_path / "run"), "--split=test"])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= metrics["bleu"] <= 100 and metrics["decode"]["method"] == "beam" and metrics["tokens"] > 0
    probed = run_probes(["test_split"], tmp_path / "run")  # a sweep's probe: the same numbers, eval_test.json too
    # exact by construction: the probe runs split_metrics as run.py eval did, the same compiled programs and batches
    assert probed == {f"test_{k}": v for k, v in metrics.items() if isinstance(v, float)} and "test_bleu" in probed
    assert json.loads((tmp_path / "run" / "eval_test.json").read_text())["bleu"] == metrics["bleu"]


def test_attention_maps_show_the_source_read_both_ways(tmp_path):
    """The sown weights of the one map over [source ; target]: a source query weighs later source keys, never a
    target key; a target query no later key; and run.py attention's PNG is written."""
    from txjax.data import CharTokenizer
    from txjax.evaluate.viz import attention_maps, capture_attention
    from txjax.families.prefix_lm import PrefixLMFamily

    model, params = model_and_params()
    source, target = SOURCES[0], [BOS, 4, 5]
    inputs, maps = PrefixLMFamily().attention_example(source, target)
    weights_NxHxLxL = capture_attention(model.clone(sow_weights=True), params, *inputs)["decoder/self_attention"]
    n, length = len(source), len(source) + len(target)
    later = np.triu(np.ones((length, length), bool), 1)
    assert (weights_NxHxLxL[..., :n, :n][..., later[:n, :n]] > 0).all()  # source rows: every later source key
    assert (weights_NxHxLxL[..., :n, n:] == 0).all() and (weights_NxHxLxL[..., n:, :][..., later[n:]] == 0).all()
    tokenizer = CharTokenizer("abcdefghijk", specials=True)
    assert [
        p.name for p in attention_maps(model, params, tokenizer, source, tmp_path / "a.png", target_ids=target)
    ] == ["a.png"]


def test_causal_prefix_attention_is_a_decoder_only_lm_over_the_row_cached_too():
    """model.prefix_attention=causal (the same parameters): a later source token changes no earlier position, the
    logits are the bidirectional model's with no prefix, and cached greedy decoding equals their argmax."""
    model, params = model_and_params()
    causal = PrefixLM(dataclasses.replace(model.cfg, prefix_attention="causal"))
    row = np.array([*SOURCES[2], BOS, 4, 5])
    ones, positions = np.ones((1, len(row)), np.int32), np.arange(len(row))[None]
    source = (positions < len(SOURCES[2])).astype(np.int32)
    logits = lambda tokens: np.asarray(causal.apply({"params": params}, tokens[None], positions, ones, source)[0])
    np.testing.assert_allclose(logits(row), full_forward(row, positions[0], 1, 0), rtol=1e-5, atol=1e-5)
    other = row.copy()
    other[3] = 11
    changed = np.abs(logits(other) - logits(row)).max(-1) > 1e-5
    assert not changed[:3].any() and changed[3:].all()
    got = decode.generate(causal, params, SOURCES, bos_id=BOS, pad_id=PAD, eos_id=EOS, max_new_tokens=6)
    for source, ids, stopped in zip(SOURCES, got.ids, got.stopped):
        out = []
        for _ in range(len(ids) + stopped):
            r = np.array([*source, BOS, *out])
            out.append(int(np.argmax(full_forward(r, np.arange(len(r)), 1, 0)[-1])))
        assert out[: len(ids)] == ids
