"""Sharded training on 8 simulated CPU devices (tests/conftest.py asks XLA for them): the same run on the mesh
(data, fsdp, tensor) = (2,2,2) takes the same steps as on one device, and its checkpoint resumes under (1,1,8)
(tensor parallelism alone), the run continuing as if it never stopped. Data and fsdp over two processes:
tests/test_multiprocess.py."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from txjax.config import from_command_line
from txjax.evaluate.split import evaluate, make_eval_step
from txjax.experiment import CHECKPOINT_DIR, build_model, load_workdir
from txjax.families import init_params
from txjax.families.objective import params_shardings
from txjax.ops.metrics_log import read_metrics
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import global_batch
from txjax.training.loop import train

pytestmark = [
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS set in conftest.py)"),
]

STEPS = 4
EXPERIMENT = "experiments/shakespeare_char.py"


def write_corpus(path, num_chars: int = 20_000) -> None:
    """Random words over 64 characters (so the vocabulary splits 8 ways over the tensor axis)."""
    chars = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"))
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(chars, size=rng.integers(1, 8))) for _ in range(num_chars // 5)]
    path.write_text(" ".join(words)[: num_chars - 1] + "\n")


def char_lm_flags(text_path, mesh: tuple[int, int, int]) -> list[str]:
    """experiments/shakespeare_char.py's shape with 2 of its 4 layers (4 heads, d_model 128, context 64; each layer
    adds compilation time, not another way to shard) on `text_path`, batch 16
    (divisible by 8 devices), STEPS steps, a checkpoint every 2, laid out on `mesh` = (data, fsdp, tensor); in
    float32 (the experiment computes in bfloat16, whose rounding of sums taken in another order on another mesh
    moves a few parameters past the tolerance) and with GELU (at ReLU's kink such float differences switch a
    hidden unit on in one run and off in the other: a whole column of W_out then moves past the tolerance), and with
    AdamW (the experiment's Muon orthogonalises each update by Newton-Schulz iterations, which amplify such float
    differences)."""
    fields = {
        "data.path": text_path,
        "train.optimizer": "adamw",
        "train.learning_rate": 1e-3,
        "model.dtype": "float32",
        "model.activation": "gelu",
        "model.num_layers": 2,
        "train.steps": STEPS,
        "train.batch_size": 16,
        "train.warmup_steps": 2,
        "train.log_every": 1,
        "train.eval_every": 0,
        "train.checkpoint_every": 2,
        "train.keep_checkpoints": 5,
        "mesh.data": mesh[0],
        "mesh.fsdp": mesh[1],
        "mesh.tensor": mesh[2],
    }
    return [f"--config.{name}={value}" for name, value in fields.items()]


def train_here(text_path, mesh, workdir) -> None:
    """Trains in this process (8 devices: a mesh of fewer uses the first ones)."""
    train(from_command_line(EXPERIMENT, char_lm_flags(text_path, mesh)), workdir)


def train_losses(workdir) -> list[float]:
    return [r["loss"] for r in read_metrics(workdir) if r["split"] == "train"]


def assert_same_run(workdir, reference) -> None:
    """Same per-step losses and final parameters (float tolerance: sums run in another order on other meshes)."""
    np.testing.assert_allclose(train_losses(workdir), train_losses(reference), rtol=1e-5)
    a, b = load_workdir(workdir).params, load_workdir(reference).params
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5), a, b)


def resume_from_step_2(workdir, copy) -> None:
    """A copy of `workdir` as if the run had stopped right after its step-2 checkpoint."""
    shutil.copytree(workdir, copy)
    shutil.rmtree(copy / CHECKPOINT_DIR / str(STEPS))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A folder with the corpus and the one-device reference run in `one/`."""
    root = tmp_path_factory.mktemp("sharded")
    write_corpus(root / "text.txt")
    train_here(root / "text.txt", (1, 1, 1), root / "one")
    return root


def test_mesh_trains_like_one_device(root):
    """Every axis at once."""
    train_here(root / "text.txt", (2, 2, 2), root / "2x2x2")
    assert_same_run(root / "2x2x2", root / "one")


def test_checkpoint_resumes_under_another_mesh(root):
    """Saved at step 2 on (2,2,2) (by the test above), resumed on (1,1,8), tensor parallelism alone: steps 3 and 4
    as in the uninterrupted one-device run."""
    if not (root / "2x2x2").is_dir():
        train_here(root / "text.txt", (2, 2, 2), root / "2x2x2")
    resume_from_step_2(root / "2x2x2", root / "resumed")
    train_here(root / "text.txt", (1, 1, 8), root / "resumed")
    assert_same_run(root / "resumed", root / "one")


def test_many_eval_steps_dispatched_at_once_do_not_deadlock():
    """100 eval steps with every batch ready at once: without distributed.InFlight, XLA:CPU queues more than 32 on
    each of the 8 devices and their all-reduces deadlock (the process aborts); with it they finish."""
    config = from_command_line(
        None,
        [
            "--config.model.num_layers=1",
            "--config.model.d_model=32",
            "--config.model.num_heads=2",
            "--config.model.d_ff=64",
            "--config.model.vocab_size=16",
            "--config.model.max_len=8",
        ],
    )
    config.mesh.data = 8
    model, mesh = build_model(config), run_mesh(config.mesh)
    params = jax.jit(lambda: init_params(model, jax.random.key(0)), out_shardings=params_shardings(model, mesh))()
    tokens_8x8 = np.arange(64, dtype=np.int32).reshape(8, 8) % 16
    batch = {
        "inputs": tokens_8x8,
        "targets": tokens_8x8,
        "weights": np.ones((8, 8), np.float32),
        "positions": np.tile(np.arange(8, dtype=np.int32), (8, 1)),
        "segment_ids": np.ones((8, 8), np.int32),
    }
    metrics = evaluate(make_eval_step(model, mesh), params, [global_batch(batch, mesh)] * 100)
    assert metrics["tokens"] == 100 * 64
