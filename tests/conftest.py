"""Test session setup: 8 simulated CPU devices (for the sharding tests) and XLA:CPU's cheapest code generation, all
set in XLA_FLAGS before anything imports jax (and inherited by run.py subprocesses); the measured matmul peak
(txjax.peak) cached in a temporary folder; a per-module persistent compilation cache fixture; a tiny parallel corpus.

The suite compiles some hundred small programs and runs each for a few steps: at LLVM's -O0
(--xla_backend_optimization_level=0) compiling a toy model's train step takes about a third less time, its few steps
run slower, and what the tests compare (runs against runs, against NumPy or transformers within tolerances) is
computed the same way on both sides. The suite also turns off XLA:CPU's MLIR fusion emitters
(--xla_cpu_use_fusion_emitters=false: the older emitter lowers each fusion to LLVM IR directly), which compiles that
train step about twice as fast again (benchmarks/compile.py measures both). Users' runs keep XLA's defaults.

Every other test runs on the first device as it would on a one-device machine.
"""

import os

import pytest

TEST_XLA_FLAGS = {
    "--xla_force_host_platform_device_count": "8",
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
}
for _flag, _value in TEST_XLA_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()


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


@pytest.fixture(scope="session")
def compilation_cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture(scope="module")
def compilation_cache(compilation_cache_dir):
    """Runs with equal steps compile them once: a persistent cache shared by the modules that ask for it (with
    `pytestmark = pytest.mark.usefixtures("compilation_cache")`), also for their `run.py` subprocesses."""
    import jax  # only now: XLA_FLAGS above must be set first

    directory = compilation_cache_dir
    options = {
        "jax_compilation_cache_dir": directory,
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    before = {name: getattr(jax.config, name) for name in options}
    for name, value in options.items():
        jax.config.update(name, value)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    del os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]


@pytest.fixture
def pairs_tsv(tmp_path):
    """Four English-Spanish pairs in data.kind=parallel's format (source TAB target, one pair per line)."""
    path = tmp_path / "pairs.tsv"
    path.write_text("a cat\tun gato\nthe dog\tel perro\na dog\tun perro\nthe cat\tel gato\n")
    return path
