"""With libtpu installed (the tpu extra) on a host without TPU chips, run.py keeps jax off the TPU backend, whose
failed start-up libtpu writes to stderr before every command's own lines (txjax.parallel.platforms)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed (pip install -e '.[tpu]')")
def test_a_host_without_tpu_chips_starts_no_tpu_backend_and_prints_nothing_of_it(tmp_path):
    from jax._src import hardware_utils

    if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
        pytest.skip("this host has TPU chips: jax's own choice stands")
    code = "import jax; from txjax.parallel import platforms; platforms.leave_out_absent_tpu(); print(jax.devices())"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "CpuDevice" in done.stdout, done.stderr
    assert "TPU" not in done.stderr and "libtpu" not in done.stderr, done.stderr
