"""Bounds: a train step that cannot fit the device is refused before compiling (txjax.ops.memory), and XLA's out of
memory is one line."""

from __future__ import annotations

import re
import types

import pytest
from jax.errors import JaxRuntimeError

import run
from txjax.config import ConfigError
from txjax.model.models import ModelConfig
from txjax.ops import memory

CFG = ModelConfig(vocab_size=65, max_len=100_000, d_model=64, num_heads=4, d_ff=256, num_layers=2)


def test_the_estimate_grows_with_batch_and_length_and_remat_lowers_it():
    at = lambda cfg, b, t: memory.train_step_bytes(cfg, "decoder_lm", b, 0, t)
    assert at(CFG, 8, 1024) < at(CFG, 16, 1024) < at(CFG, 16, 2048)
    assert at(CFG, 8, 4096) > 4 * 8 * 4 * 2 * 4096**2  # the reference attention's B·H·T² float32, two layers
    remat = ModelConfig(**{**CFG.__dict__, "remat": True})
    assert at(remat, 8, 4096) < at(CFG, 8, 4096) / 1.5


def test_a_step_that_cannot_fit_is_refused_with_the_largest_that_fit(monkeypatch):
    monkeypatch.setattr(memory, "device_bytes", lambda: 2 * 10**9)
    memory.check_train_step(CFG, "decoder_lm", 8, 0, 1024)  # fits: nothing said
    with pytest.raises(ConfigError) as e:
        memory.check_train_step(CFG, "decoder_lm", 32, 0, 100_000)
    message = str(e.value)
    assert "\n" not in message and "batch 32 x length 100000 needs at least" in message
    longest, batch = map(int, re.search(r"longest length that fits is (\d+).*? (?:batch is (\d+)|not even)", message)
                         .groups(default="0"))  # fmt: skip
    fits = lambda b, t: memory.train_step_bytes(CFG, "decoder_lm", b, 0, t) <= 2 * 10**9
    assert fits(32, longest) and not fits(32, longest + 1)
    assert batch == 0 and not fits(1, 100_000)
    memory.check_train_step(CFG, "decoder_lm", 1, 0, longest * 4, devices=4, sequence=4)  # a quarter each: fits
    with pytest.raises(ConfigError, match=r"at length 2048 the largest batch is (\d+);") as e:
        memory.check_train_step(CFG, "decoder_lm", 256, 0, 2048)
    batch = int(e.value.args[0].split("the largest batch is ")[1].split(";")[0])
    assert 0 < batch < 256 and fits(batch, 2048) and not fits(batch + 1, 2048)


@pytest.mark.parametrize(
    "message, one_line",
    [
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 22.0TiB.\nBufferAssignment ...", True),
        ("INTERNAL: something else", False),
    ],
)
def test_xla_out_of_memory_is_one_line(monkeypatch, capsys, message, one_line):
    def main(argv):
        raise JaxRuntimeError(message)

    # run.py's name only: importlib.import_module patched would stay in a library first imported inside (sacrebleu)
    monkeypatch.setattr(
        run, "importlib", types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(main=main))
    )
    if not one_line:  # anything else is a bug: its traceback stays
        with pytest.raises(JaxRuntimeError):
            run.main(["eval"])
        return
    assert run.main(["eval"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: out of memory on the cpu device (RESOURCE_EXHAUSTED: Out of memory while trying")
    assert "lower config.train.batch_size" in line
