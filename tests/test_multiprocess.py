"""Multi-process training on loopback: 2 CPU processes x 2 simulated devices, joined by jax.distributed (gloo
collectives), train like 1 process x 4 devices on a (2 data, 2 fsdp) mesh (each process holds half of the batch and
half of every parameter), on a sequence axis of 4 across both, and an MoE LM on an expert axis of 4 across both; the
checkpoint the 2 processes write together resumes in 1 process x 4 devices and in 1 process x 1 device, training
continuing identically. The processes run `run.py train` exactly as a user would (see docs/scaling.md). The models
are tests/test_sharded_training.py's char LM and tests/test_expert_parallel.py's MoE LM with 1 layer (SMALL): what
crosses the processes does not depend on their size, and every layer adds compile time in each process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from conftest import xla_flags
from test_expert_parallel import assert_same_moe_run, moe_lm_flags
from test_sharded_training import EXPERIMENT, assert_same_run, char_lm_flags, resume_from_step_2, write_corpus

from txjax.config import from_command_line
from txjax.training.loop import train

pytestmark = [
    pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (XLA_FLAGS set in conftest.py)"),
]

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # per multi-process run, then its processes are killed
SMALL = [
    f"--config.model.{name}={value}"
    for name, value in {"num_layers": 1, "d_model": 32, "num_heads": 2, "d_ff": 64}.items()
]


def small_lm_flags(text_path, mesh: tuple[int, int, int]) -> list[str]:
    """The char LM (test_sharded_training.char_lm_flags) with SMALL's sizes, on mesh = (data, fsdp, tensor)."""
    return [*char_lm_flags(text_path, mesh), *SMALL]


def small_moe_flags(text_path, mesh: dict) -> list[str]:
    """The MoE LM (test_expert_parallel.moe_lm_flags) with SMALL's sizes, on `mesh` (sizes of config.mesh's axes)."""
    return [*moe_lm_flags(text_path, mesh), *SMALL]


def train_here(flags: list[str], workdir) -> None:
    """`run.py train --config=EXPERIMENT FLAGS` in this process (8 devices: a mesh of fewer uses the first ones)."""
    train(from_command_line(EXPERIMENT, flags), workdir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_on_loopback(
    flags: list[str], workdir, num_processes: int = 2, devices_per_process: int = 2, heartbeat_timeout: int = 30
):
    """`run.py train FLAGS` in `num_processes` processes joined on 127.0.0.1: (processes, their log files)."""
    port = free_port()
    env = {
        name: value
        for name, value in os.environ.items()  # both would write the same cache entries at once
        if name not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
    }
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices_per_process)}
    logs = [workdir.parent / f"{workdir.name}.process{i}.log" for i in range(num_processes)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "run.py",
                "train",
                f"--workdir={workdir}",
                *flags,
                f"--coordinator_address=127.0.0.1:{port}",
                f"--num_processes={num_processes}",
                f"--process_id={i}",
                "--initialization_timeout=60",
                f"--heartbeat_timeout={heartbeat_timeout}",
            ],
            cwd=REPO,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for i, log in enumerate(logs)
    ]
    return procs, logs


def outputs(procs, logs) -> str:
    return "\n".join(
        f"--- process {i} (exit {p.returncode}):\n{log.read_text()[-3000:]}"
        for i, (p, log) in enumerate(zip(procs, logs))
    )


def train_on_loopback(text_path, mesh, workdir, sequence: int = 1) -> None:
    """The char LM trained by 2 processes x 2 devices; fails with their output if any fails or hangs."""
    run_on_loopback([*small_lm_flags(text_path, mesh), f"--config.mesh.sequence={sequence}"], workdir)


def run_on_loopback(flags: list[str], workdir) -> None:
    """`run.py train --config=EXPERIMENT FLAGS` by 2 processes x 2 devices; fails with their output if any fails or
    hangs."""
    procs, logs = start_on_loopback([f"--config={EXPERIMENT}", *flags], workdir)
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if codes != [0] * len(procs):
        pytest.fail(f"multi-process run failed or exceeded {TIMEOUT_S}s:\n{outputs(procs, logs)}")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The corpus, the 1 process x 4 devices reference run `one_process/`, the 2-process run `two_processes/`."""
    root = tmp_path_factory.mktemp("loopback")
    write_corpus(root / "text.txt")
    train_here(small_lm_flags(root / "text.txt", (4, 1, 1)), root / "one_process")
    train_on_loopback(root / "text.txt", (2, 2, 1), root / "two_processes")
    return root


def test_two_processes_train_like_one(root):
    assert_same_run(root / "two_processes", root / "one_process")


def test_the_sequence_axis_across_two_processes_trains_like_one(root):
    """mesh.sequence = 4 over 2 processes x 2 devices: ring attention's key/value shards pass between processes."""
    train_on_loopback(root / "text.txt", (1, 1, 1), root / "sequence", sequence=4)
    assert_same_run(root / "sequence", root / "one_process")


def test_expert_parallelism_across_two_processes_trains_like_one_device(tmp_path):
    """mesh.expert = 4 over 2 processes x 2 devices: each MoE layer's all-to-all sends tokens between the processes
    (tests/test_expert_parallel.py: the same on one process's devices)."""
    write_corpus(tmp_path / "text.txt")
    train_here(small_moe_flags(tmp_path / "text.txt", {}), tmp_path / "one")
    run_on_loopback(small_moe_flags(tmp_path / "text.txt", {"expert": 4}), tmp_path / "two_processes")
    assert_same_moe_run(tmp_path / "two_processes", tmp_path / "one")


@pytest.mark.parametrize("mesh", [(4, 1, 1), (1, 1, 1)], ids=["1x4_devices", "1x1_device"])
def test_checkpoint_of_two_processes_resumes_in_one(root, mesh):
    """Written by 2 processes x 2 devices at step 2, resumed by 1 process: step 4 as in the uninterrupted run."""
    resumed = root / f"resumed_{'x'.join(map(str, mesh))}"
    resume_from_step_2(root / "two_processes", resumed)
    train_here(small_lm_flags(root / "text.txt", mesh), resumed)
    assert_same_run(resumed, root / "two_processes")


def test_a_dead_process_stops_the_other(tmp_path):
    """SIGKILL one process once both have joined: the other exits with an error within the heartbeat timeout."""
    heartbeat_timeout = 5
    procs, logs = start_on_loopback(
        ["--config.train.steps=100000", "--config.mesh.data=4"], tmp_path / "run", heartbeat_timeout=heartbeat_timeout
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "[Gloo]" not in logs[0].read_text():  # printed once the processes share a collective
            assert time.monotonic() < deadline and procs[0].poll() is None, outputs(procs, logs)
            time.sleep(0.5)
        procs[1].kill()
        killed = time.monotonic()
        code = procs[0].wait(timeout=TIMEOUT_S)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert code != 0 and waited < heartbeat_timeout + 60, outputs(procs, logs)
    said = logs[0].read_text()
    assert "another task died" in said or "Connection reset by peer" in said, outputs(procs, logs)
