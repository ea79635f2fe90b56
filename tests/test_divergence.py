"""A run whose loss turns NaN or inf stops with its last good checkpoint named, alone or stacked with others (one
loop for one run and R vmapped runs: the others end as they end alone)."""

import jax
import numpy as np
import pytest
from test_train import params_of, tiny_config

from txjax.state.checkpoint import Checkpointer
from txjax.training.loop import train
from txjax.training.run import Diverged
from txjax.training.stack import train_runs


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    config = tiny_config(
        "--config.train.learning_rate=1e30",
        "--config.train.warmup_steps=0",
        "--config.train.checkpoint_every=1",
        "--config.train.log_every=1",
    )
    with pytest.raises(Diverged, match=r"NaN/inf by step 2 .* the last good checkpoint \(step 1\)"):
        train(config, tmp_path)
    assert Checkpointer(tmp_path / "checkpoints", 3).manager.all_steps() == [1]
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params_of(tmp_path)))


def test_a_stacked_run_diverges_alone_and_the_others_end_as_they_end_alone(tmp_path):
    """One loop for one run and R stacked runs: in a group whose second run diverges, that run stops with the
    single-run message naming its last good checkpoint, and the first ends with the parameters and the result
    keys it has when trained alone."""
    flags = ["--config.train.checkpoint_every=1", "--config.train.log_every=1"]
    bad = tiny_config(*flags, "--config.train.learning_rate=1e30", "--config.train.warmup_steps=0")
    good, bad_dir = tiny_config(*flags), tmp_path / "bad"
    outcomes = train_runs([good, bad], [tmp_path / "good", bad_dir])
    assert isinstance(outcomes[1], Diverged), outcomes[1]
    assert "NaN/inf by step 2" in str(outcomes[1]) and "the last good checkpoint (step 1)" in str(outcomes[1])
    assert Checkpointer(bad_dir / "checkpoints", 3).manager.all_steps() == [1]
    alone = train(tiny_config(*flags), tmp_path / "alone")
    assert sorted(outcomes[0]) == sorted(alone) and outcomes[0]["runs_vmapped"] == 2
    for a, b in zip(
        jax.tree_util.tree_leaves(params_of(tmp_path / "good")),
        jax.tree_util.tree_leaves(params_of(tmp_path / "alone")),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_divergence_before_any_save_says_so(tmp_path):
    config = tiny_config("--config.train.learning_rate=1e30", "--config.train.warmup_steps=0")
    with pytest.raises(Diverged, match="before any checkpoint was saved"):
        train(config, tmp_path)
