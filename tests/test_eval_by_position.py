"""`run.py eval --by_position=W`: the loss per bucket of W positions, against a NumPy cross-entropy of the model's
logits written here; and a workdir evaluated in a changed model (a longer context, another RoPE scaling), refused
where the change would give it other parameters."""

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_clean_errors import REPO
from test_decode import lm
from test_train import TINY_MODEL

from txjax import config as config_lib
from txjax.evaluate.split import evaluate, make_eval_step
from txjax.training.loop import train


def run_py(capsys, *argv: str) -> tuple[int, str, str]:
    """run.py's main in this process: (exit status, stdout, stderr)."""
    spec = importlib.util.spec_from_file_location("run_py", REPO / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main(list(argv))
    return status, *capsys.readouterr()


def test_loss_by_position_is_the_cross_entropy_of_each_bucket():
    model, params = lm()
    rng = np.random.default_rng(0)
    tokens_BxL = rng.integers(1, model.cfg.vocab_size, (3, 11)).astype(np.int32)
    weights_BxL = np.ones((3, 10), np.float32)
    weights_BxL[2, 6:] = 0.0  # a padded tail: its positions count fewer tokens
    positions_BxL = np.broadcast_to(np.arange(10, dtype=np.int32), (3, 10))
    batch = {
        "inputs": tokens_BxL[:, :-1],
        "positions": positions_BxL,
        "segment_ids": np.ones((3, 10), np.int32),
        "targets": tokens_BxL[:, 1:],
        "weights": weights_BxL,
    }
    metrics = evaluate(make_eval_step(model, by_position=True), params, [batch], by_position=4)
    inputs = (jnp.asarray(batch[k]) for k in ("inputs", "positions", "segment_ids"))
    logits_BxLxV = np.asarray(model.apply({"params": params}, *inputs))
    logits_BxLxV = logits_BxLxV.astype(np.float64)
    log_z_BxL = np.log(np.exp(logits_BxLxV - logits_BxLxV.max(-1, keepdims=True)).sum(-1)) + logits_BxLxV.max(-1)
    ce_BxL = log_z_BxL - np.take_along_axis(logits_BxLxV, tokens_BxL[:, 1:, None], -1)[..., 0]
    buckets = metrics["by_position"]
    assert buckets["from"] == [0, 4, 8] and buckets["tokens"] == [12, 10, 4]
    for i, start in enumerate(buckets["from"]):
        w = weights_BxL[:, start : start + 4]
        expected = (w * ce_BxL[:, start : start + 4]).sum() / w.sum()
        np.testing.assert_allclose(buckets["loss"][i], expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], (weights_BxL * ce_BxL).sum() / weights_BxL.sum(), rtol=1e-5)


def test_a_workdir_evaluates_at_a_longer_context_with_another_rope_scaling(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(60)))
    workdir = tmp_path / "run"
    data = ["--config.data.kind=text", "--config.data.tokenizer=byte", f"--config.data.path={corpus}"]
    flags = [*TINY_MODEL, *data, "--config.data.seq_len=8", "--config.model.positional=rope", "--config.train.steps=2"]
    train(config_lib.from_command_line(None, flags), workdir)

    def eval_at_16(*changes):
        longer = ["--config.data.seq_len=16", "--config.model.max_len=16", "--by_position=4"]
        status, out, err = run_py(capsys, "eval", f"--workdir={workdir}", *longer, *changes)
        assert status == 0, err
        return json.loads(out.strip().splitlines()[-1])

    plain, identity = eval_at_16(), eval_at_16("--config.model.rope_scaling=linear", "--config.model.rope_factor=1")
    scaled = eval_at_16("--config.model.rope_scaling=linear", "--config.model.rope_factor=2")
    buckets = plain["by_position"]
    assert buckets["from"] == [0, 4, 8, 12] and sum(buckets["tokens"]) == plain["tokens"]
    mean = sum(loss * n for loss, n in zip(buckets["loss"], buckets["tokens"])) / plain["tokens"]
    assert mean == pytest.approx(plain["loss"], rel=1e-6)
    # linear scaling by 1 is another program (its frequencies made on the host: model/positional.py), equal to
    # float32 rounding (a bucket's loss 5.504029083 against 5.504029036 on an Intel Xeon); a model trained 2 steps
    # barely reads positions, yet scaling by 2 moves its loss by 2.4e-6 of itself (5.5201305 to 5.5201435), past that
    assert identity["by_position"] == {**buckets, "loss": pytest.approx(buckets["loss"], rel=1e-6)}
    assert scaled["loss"] != pytest.approx(plain["loss"], rel=1e-6)
    assert jax.tree.structure(scaled) == jax.tree.structure(plain)

    for changes, line in [
        (["--config.model.d_model=64"], "--config.model.d_model=64: changes the shapes of the model's parameters"),
        (["--config.data.seq_len=32"], "--config.data.seq_len=32 exceeds model.max_len=8: add"),
        (["--by_position=-1"], "--by_position=-1: a bucket width > 0"),
    ]:
        status, _, err = run_py(capsys, "eval", f"--workdir={workdir}", *changes)
        assert status != 0 and line in err and "Traceback" not in err, err
