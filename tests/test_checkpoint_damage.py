"""A damaged checkpoint: bytes flipped in a step's array data (orbax stores no checksum of it; txjax writes
sha256sums.txt with every step). Readers and training fall back to the newest step that restores, with one warning
line naming the bad one; training from there ends bit-identical to a run that never met the damage. Averaging the
last N checkpoints (run.py eval --average=N) passes over a bad step the same way."""

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from test_train import TINY_FLAGS

from txjax import config as config_lib
from txjax.experiment import load_workdir
from txjax.state.checkpoint import Checkpointer
from txjax.training.loop import train

FLAGS = TINY_FLAGS  # 6 steps, checkpoints at 2, 4, 6


def flip_array_bytes(step_folder: Path) -> Path:
    """Flips one byte in the middle of the step's largest array-data file (orbax 0.12.8: OCDBT data files under
    default/ocdbt.process_*/d/; this one holds the embedding and the AdamW moments)."""
    path = max(step_folder.glob("default/ocdbt.process_*/d/*"), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("damage") / "reference"
    train(config_lib.from_command_line(None, FLAGS), workdir)
    return workdir


def params_of(workdir):
    return jax.device_get(load_workdir(workdir).params)


def test_every_step_carries_checksums_of_its_files(reference):
    for step in (2, 4, 6):
        listed = (reference / "checkpoints" / str(step) / "sha256sums.txt").read_text().splitlines()
        assert any("/ocdbt.process_0/d/" in line for line in listed) and any("_METADATA" in line for line in listed)


def test_a_damaged_latest_step_falls_back_and_training_ends_bit_exact(reference, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    damaged = flip_array_bytes(workdir / "checkpoints" / "6")
    capsys.readouterr()
    assert load_workdir(workdir).step == 4  # a reader (eval, generate) falls back too
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint step 6 (Damaged: ")
    assert f"{damaged.relative_to(workdir / 'checkpoints' / '6')} differs" in warnings[0]
    assert warnings[0].endswith("does not restore; trying step 4")
    result = train(config_lib.from_command_line(None, FLAGS), workdir)  # steps 5 and 6 again
    assert result["step"] == 6
    assert (workdir / "checkpoints" / "6.damaged").is_dir()  # set aside, not deleted
    leaves = zip(jax.tree_util.tree_leaves(params_of(reference)), jax.tree_util.tree_leaves(params_of(workdir)))
    for straight, resumed in leaves:
        np.testing.assert_array_equal(straight, resumed)  # bit for bit by construction: one program, the same batches


def test_when_no_step_restores_one_line_says_so(reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for step in (2, 4, 6):
        flip_array_bytes(workdir / "checkpoints" / str(step))
    with pytest.raises(config_lib.ConfigError, match=r"no checkpoint in .* restores \(step 6 .*; step 4 .*; step 2"):
        load_workdir(workdir)
    assert Checkpointer(workdir / "checkpoints", 3).manager.all_steps() == [2, 4, 6]  # a reader changes nothing


def test_average_is_the_mean_of_the_newest_steps_that_restore(reference, tmp_path, capsys):
    single = {step: params_of_step(reference, step) for step in (2, 4, 6)}
    run = load_workdir(reference, average=2)
    assert (run.step, run.averaged_steps) == (6, (6, 4))
    for got, a, b in zip(*(jax.tree_util.tree_leaves(p) for p in (jax.device_get(run.params), single[6], single[4]))):
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6, atol=1e-7)
        assert not np.array_equal(a, b)  # the steps differ, so a mean that kept one of them would fail
    assert load_workdir(reference, step=4, average=2).averaged_steps == (4, 2)
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    flip_array_bytes(workdir / "checkpoints" / "4")
    capsys.readouterr()
    assert load_workdir(workdir, average=2).averaged_steps == (6, 2)  # step 4 passed over, with one warning
    assert capsys.readouterr().err.count("warning: checkpoint step 4 (Damaged: ") == 1
    with pytest.raises(config_lib.ConfigError, match=r"3 checkpoints asked for, 2 restore .*\(steps 6, 2\): ask for"):
        load_workdir(workdir, average=3)
    with pytest.raises(config_lib.ConfigError, match=r"^--average=0: the number of checkpoints to average must be"):
        load_workdir(workdir, average=0)


def params_of_step(workdir, step):
    return jax.device_get(load_workdir(workdir, step=step).params)
