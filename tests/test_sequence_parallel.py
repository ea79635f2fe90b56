"""Sequence parallelism on 4 and 8 simulated CPU devices (tests/conftest.py asks XLA for 8): with mesh.sequence = 4
(and data = 2 x fsdp = 2 x sequence = 2: rows split, parameters split, context split) the model's attention runs as
ring attention over the zig-zag layout, and a tiny
decoder LM's losses, gradients and parameters over a few train steps of packed, padded rows equal the one-device
run's; a checkpoint written under mesh.sequence = 4 resumes under data = 2 (no sequence axis), the run continuing as
the uninterrupted run. The sequence axis across two processes: tests/test_multiprocess.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_sharded_training import assert_same_run, char_lm_flags, resume_from_step_2, write_corpus

from txjax.config import ConfigError, from_command_line
from txjax.experiment import build_model
from txjax.families import param_roles
from txjax.families.objective import forward, params_shardings, token_sums
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import batch_sharding, global_batch, on_mesh
from txjax.sections.train import TrainConfig
from txjax.state.optim import make_optimizer
from txjax.state.train_state import init_state, state_shardings
from txjax.training.loop import train
from txjax.training.step import make_train_step

pytestmark = [
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS set in conftest.py)"),
]

TINY = [
    "--config.model.num_layers=2",
    "--config.model.d_model=32",
    "--config.model.num_heads=4",
    "--config.model.num_kv_heads=2",
    "--config.model.d_ff=64",
    "--config.model.vocab_size=16",
    "--config.model.max_len=32",
    "--config.model.positional=rope",
    "--config.train.optimizer=adamw",
    "--config.train.warmup_steps=1",
]
MESHES = {
    "one": (1, 1, 1),
    "sequence=4": (1, 1, 4),
    "data=2 x fsdp=2 x sequence=2": (2, 2, 2),
}  # (data, fsdp, sequence)


def packed_batches(steps: int = 3):
    """Batches of 4 rows x 32 tokens: two documents packed per row, then padding (segment 0, weight 0)."""
    rng = np.random.default_rng(0)
    seg = np.array([[1] * 20 + [2] * 9 + [0] * 3, [1] * 5 + [2] * 27, [1] * 32, [1] * 13 + [0] * 19], np.int32)
    pos = np.array([[i - np.argmax(row == s) if s else 0 for i, s in enumerate(row)] for row in seg], np.int32)
    for _ in range(steps):
        tokens = rng.integers(0, 16, (5, 33)).astype(np.int32)[:4]
        yield {
            "inputs": tokens[:, :-1],
            "targets": tokens[:, 1:],
            "weights": (seg > 0).astype(np.float32),
            "positions": pos,
            "segment_ids": seg,
        }


def steps_on(data: int, fsdp: int, sequence: int):
    """(per-step losses, first step's gradients, final parameters, the step's lowered text) of 3 AdamW steps."""
    mesh_flags = [f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}", f"--config.mesh.sequence={sequence}"]
    config = from_command_line(None, [*TINY, *mesh_flags])
    model, mesh, t = build_model(config), run_mesh(config.mesh), TrainConfig.of(config.train)
    tx = make_optimizer(t.optim, param_roles(model))
    shardings = state_shardings(model, tx, 0, mesh)
    state = jax.jit(lambda: init_state(model, tx, 0), out_shardings=shardings)()
    objective = lambda p, b: token_sums(*forward(model, p, b)[:3])["objective"]
    grad = jax.jit(
        on_mesh(jax.grad(objective), mesh), in_shardings=(params_shardings(model, mesh), batch_sharding(mesh))
    )
    step, losses = make_train_step(model, tx, t, mesh), []
    for i, batch in enumerate(packed_batches()):
        batch = global_batch(batch, mesh)
        if i == 0:
            grads, text = grad(state.params, batch), step.lower(state, batch).as_text()
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(grads), jax.device_get(state.params), text


@pytest.fixture(scope="module")
def one_device():
    return steps_on(*MESHES["one"])


@pytest.mark.parametrize("mesh", ["sequence=4", "data=2 x fsdp=2 x sequence=2"])
def test_ring_attention_trains_like_one_device(one_device, mesh):
    losses, grads, params, text = steps_on(*MESHES[mesh])
    assert "collective_permute" in text and "collective_permute" not in one_device[3]  # the ring ran
    np.testing.assert_allclose(losses, one_device[0], rtol=1e-5)
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    jax.tree.map(close, grads, one_device[1])
    jax.tree.map(close, params, one_device[2])


def test_a_context_that_does_not_split_into_2n_chunks_is_one_line():
    with pytest.raises(ConfigError, match=r"config.data.seq_len=36 must divide into 2 \* mesh.sequence = 8 chunks"):
        from_command_line("experiments/shakespeare_char.py", ["--config.data.seq_len=36", "--config.mesh.sequence=4"])
    with pytest.raises(ConfigError, match="no attention dropout and no ALiBi"):
        from_command_line(None, [*TINY, "--config.model.positional=alibi", "--config.mesh.sequence=4"])


def test_checkpoint_from_the_sequence_axis_resumes_without_it(tmp_path):
    """Trained on (sequence 4) to step 4 with a checkpoint at 2; resumed from step 2 on (data 2): steps 3 and 4 as
    in the uninterrupted run (which trains like one device: the test above)."""
    write_corpus(tmp_path / "text.txt")
    run = lambda mesh, sequence, workdir: train(
        from_command_line(
            "experiments/shakespeare_char.py",
            [*char_lm_flags(tmp_path / "text.txt", mesh), f"--config.mesh.sequence={sequence}"],
        ),
        workdir,
    )
    run((1, 1, 1), 4, tmp_path / "ring")
    resume_from_step_2(tmp_path / "ring", tmp_path / "resumed")
    run((2, 1, 1), 1, tmp_path / "resumed")
    assert_same_run(tmp_path / "resumed", tmp_path / "ring")
