"""Test session setup: 8 simulated CPU devices (for the sharding tests) and XLA:CPU's cheapest code generation, all
set in XLA_FLAGS before anything imports jax (and inherited by run.py subprocesses); the measured matmul peak
(txjax.ops.peak) cached in a temporary folder; one persistent compilation cache for the session's processes; a tiny
parallel corpus.

The suite compiles some hundred small programs and runs each for a few steps: at LLVM's -O0
(--xla_backend_optimization_level=0) compiling a toy model's train step takes about a third less time, its few steps
run slower, and what the tests compare (runs against runs, against NumPy or transformers within tolerances) is
computed the same way on both sides. The suite also turns off XLA:CPU's MLIR fusion emitters
(--xla_cpu_use_fusion_emitters=false: the older emitter lowers each fusion to LLVM IR directly), which compiles that
train step about twice as fast again (benchmarks/compile.py measures both). Users' runs keep XLA's defaults. A flag
this XLA does not know would abort every process (newer XLA removed the legacy emitters): each codegen flag is tried in
a child process first and left out where it fails. Float32 matmuls are float32 (JAX_DEFAULT_MATMUL_PRECISION=highest:
what the comparisons need on a GPU, whose default is TF32).

Every other test runs on the first device as it would on a one-device machine.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

CODEGEN_XLA_FLAGS = {  # code generation for the suite's many small compiles; each dropped where XLA lacks it
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
    "--xla_gpu_deterministic_ops": "true",  # on a GPU: runs compared bit for bit (resume) sum in one order
}
_CHECKED = "TXJAX_TEST_XLA_FLAGS"  # the flags the first process of this session found accepted (xdist workers reuse)


def _accepted(flags: dict[str, str]) -> bool:
    """Whether a fresh process starts XLA with `flags`: an XLA that does not know a flag aborts the process (newer
    releases removed XLA:CPU's legacy emitters and their flag), so each is tried in a child before the suite uses it."""
    env = {**os.environ, "XLA_FLAGS": " ".join(f"{k}={v}" for k, v in flags.items()), "JAX_PLATFORMS": "cpu"}
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


def _test_xla_flags() -> dict[str, str]:
    """8 simulated CPU devices, plus the codegen flags this XLA accepts (all together in one probe, else one by one)."""
    if _CHECKED in os.environ:
        return dict(flag.split("=", 1) for flag in os.environ[_CHECKED].split())
    flags = {"--xla_force_host_platform_device_count": "8"}
    if _accepted(CODEGEN_XLA_FLAGS):
        flags |= CODEGEN_XLA_FLAGS
    else:
        flags |= {k: v for k, v in CODEGEN_XLA_FLAGS.items() if _accepted({k: v})}
    os.environ[_CHECKED] = " ".join(f"{k}={v}" for k, v in flags.items())
    return flags


TEST_XLA_FLAGS = _test_xla_flags()
for _flag, _value in TEST_XLA_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()
# The suite's float32 comparisons (against NumPy, transformers, other runs) want float32 matmuls: on a GPU, XLA's
# default multiplies float32 in TF32. Tests that check another precision set it themselves.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

# One persistent compilation cache for the processes the suite starts (run.py, Ray trials, gpu.sh's stages): they
# load a program that another of them compiled before (they train the same tiny models, each in a fresh process).
# Only programs that took 0.3 s or more to compile are kept (train and eval steps, not the many one-op programs).
# The test processes themselves (the xdist workers) neither read nor write it (jax_enable_compilation_cache off
# below, after jax's import): XLA:CPU's deserialization of a cached program crashed a worker with a segmentation
# fault twice on 2026-12-07 (AMD EPYC with AVX-512, in jax's get_executable_and_time, at a different test each
# time, not reproducible from the same cache folder), taking the session down with it; a worker loaded thousands
# of one-op programs there, which its own in-memory cache already shares between its tests. Fresh each session
# (tests of what compiles see no program from an earlier tree) and removed at its end. Tests of the cache itself,
# and the 2-process runs, drop these variables.
_SESSION_CACHE = "TXJAX_TEST_JAX_CACHE"  # set by the process that made the folder, which removes it at the end
_MADE_CACHE = _SESSION_CACHE not in os.environ
if _MADE_CACHE:
    os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="txjax-test-jax-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_SESSION_CACHE]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"
# libtpu (the tpu extra) on a host without TPU chips: the suite's processes, and every one they start, keep to the
# CPU, as run.py does (txjax.parallel.platforms; libtpu's failed start-up otherwise costs each process and writes
# to its stderr). jax is imported here, after the variables above that it reads at import.
import jax  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)  # this process only (see above); its children read the env

from txjax.parallel.platforms import leave_out_absent_tpu  # noqa: E402

leave_out_absent_tpu()
if os.environ.get("JAX_PLATFORMS") is None and jax.config.jax_platforms:
    os.environ["JAX_PLATFORMS"] = jax.config.jax_platforms


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a subprocess with `devices` simulated CPU devices and the suite's code generation level."""
    flags = {**TEST_XLA_FLAGS, "--xla_force_host_platform_device_count": str(devices)}
    return " ".join(f"{flag}={value}" for flag, value in flags.items())


@pytest.fixture(scope="session", autouse=True)
def peak_cache_dir(tmp_path_factory) -> str:
    """TXJAX_CACHE_DIR for the whole session (run.py subprocesses included): training runs measure the matmul peak
    once, there, and never write to ~/.cache."""
    directory = str(tmp_path_factory.mktemp("txjax_cache"))
    before = os.environ.get("TXJAX_CACHE_DIR")
    os.environ["TXJAX_CACHE_DIR"] = directory
    yield directory
    if before is None:
        del os.environ["TXJAX_CACHE_DIR"]
    else:
        os.environ["TXJAX_CACHE_DIR"] = before


@pytest.fixture
def pairs_tsv(tmp_path):
    """Four English-Spanish pairs in data.kind=parallel's format (source TAB target, one pair per line)."""
    path = tmp_path / "pairs.tsv"
    path.write_text("a cat\tun gato\nthe dog\tel perro\na dog\tun perro\nthe cat\tel gato\n")
    return path


# The files that take longest (seconds of their tests in a run of the suite on an idle 2-core machine,
# `--durations=0`), longest first, run before every other file. `-n 2 --dist loadfile --no-loadscope-reorder` (in
# the README's command) hands each worker the next file in this order when it finishes one, so the long files
# overlap each other and the suite ends on short ones instead of one worker finishing a long file alone while the
# other idles (xdist's own order, most tests first, put these few-test files last).
LONGEST_FIRST = [
    "test_sweep_ray.py",  # ~63: a local Ray cluster and its trial processes (one shared sweep, 5 trial processes)
    "test_score_everywhere.py",  # ~57: every score term x every backend and decoding layout (66 cases)
    "test_gpu_script.py",  # ~53: benchmarks/gpu.sh --dry-run, 9 stages each a process
    "test_train.py",  # ~47
    "test_multiprocess.py",  # ~44: two-process jax.distributed runs
    "test_compile.py",  # ~43: train and decode steps compiled for TPU topologies (libtpu)
    "test_faults.py",  # ~38: signals and kills of run.py processes
    "test_decode.py",  # ~37: 21 tests of cached decoding
    "test_seq2seq_convert.py",  # ~29: four encoder-decoders against transformers and exported back, a T5 fine-tuning
    "test_lora.py",  # ~27: LoRA runs of a tiny Llama and an encoder-decoder, peft, resume
    "test_gguf.py",  # ~26: SmolLM2-135M against transformers
    "test_sequence_parallel.py",  # ~26
    "test_accelerators.py",  # ~25
    "test_expert_parallel.py",  # ~25: 4 tiny MoE trainings on meshes, an MoE layer on 4 meshes
    "test_processes.py",  # ~23
    "test_moe.py",  # ~23
    "test_trackers.py",  # ~21: mlflow server start, 5 tiny trainings, a rerun
]


def pytest_unconfigure(config):
    if _MADE_CACHE:
        shutil.rmtree(os.environ[_SESSION_CACHE], ignore_errors=True)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order, then the rest
