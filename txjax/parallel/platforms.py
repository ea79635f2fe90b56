"""Which of jax's backends a process starts. With libtpu installed (the tpu extra: run.py compile's compile-only TPU
devices, which need no TPU backend) on a host without TPU chips, jax still starts the TPU backend, and libtpu writes
its failed initialization to stderr (a handful of lines before every command's own output). There the process keeps
to the other backends: the CPU, unless a GPU plugin is installed (then jax's own choice is left alone)."""

from __future__ import annotations

import importlib.util

import jax

GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin", "jax_rocm6_plugin")


def leave_out_absent_tpu() -> None:
    """Sets jax_platforms to cpu where libtpu is installed, no TPU chip is present, no GPU plugin is installed and
    neither JAX_PLATFORMS nor jax_platforms chose; call it before jax starts a backend (run.py does, first)."""
    if jax.config.jax_platforms or importlib.util.find_spec("libtpu") is None:
        return
    if any(importlib.util.find_spec(name) for name in GPU_PLUGINS):
        return
    try:  # jax's own count of the host's TPU chips (PCI ids), which its TPU start-up reads
        from jax._src import hardware_utils

        chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    except (ImportError, AttributeError, OSError):
        return
    if chips == 0:
        jax.config.update("jax_platforms", "cpu")
