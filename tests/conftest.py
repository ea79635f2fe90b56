"""Test session setup: 8 simulated CPU devices (for the sharding tests), set before anything imports jax, the
measured matmul peak (txjax.peak) cached in a temporary folder, and a per-module persistent compilation cache fixture.

Every other test runs on the first device as it would on a one-device machine.
"""

import os

import pytest

_DEVICES_FLAG = "--xla_force_host_platform_device_count"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES_FLAG}=8".strip()


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
