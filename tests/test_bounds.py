"""Bounds: a train step that cannot fit the device is refused before compiling (txjax.ops.memory), XLA's out of memory
is one line, and generation streams its tokens as they are produced (txjax.decode.stream)."""

from __future__ import annotations

import re
import threading
import types

import pytest
from jax.errors import JaxRuntimeError
from test_decode import EOS, LM_PROMPTS, lm

import run
import txjax.cli.generate
from txjax import config as config_lib
from txjax import decode
from txjax.config import ConfigError
from txjax.data import CharTokenizer
from txjax.decode.stream import generate_stream, stream_steps
from txjax.experiment import TrainedRun
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

    monkeypatch.setattr(run.importlib, "import_module", lambda name: types.SimpleNamespace(main=main))
    if not one_line:  # anything else is a bug: its traceback stays
        with pytest.raises(JaxRuntimeError):
            run.main(["eval"])
        return
    assert run.main(["eval"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: out of memory on the cpu device (RESOURCE_EXHAUSTED: Out of memory while trying")
    assert "lower config.train.batch_size" in line


# ---------------------------------------------------------------- streaming generation


@pytest.mark.parametrize(
    "new, strategy", [(40, {"method": "greedy"}), (19, {"method": "sample", "temperature": 1.5, "top_k": 5})]
)
def test_the_stream_is_what_generate_returns_past_the_context_too(new, strategy):
    model, params = lm("rope")  # max_len 24, a prompt of 6: 19 new tokens fill the context, 40 slide past it
    prompt, run = list(LM_PROMPTS[1]), dict(max_new_tokens=new, eos_id=EOS, seed=3, **strategy)
    (expected,) = decode.generate_windowed(model, params, prompt, **run)
    assert len(expected) == new  # no EOS: every window streams
    # generate's loop compiled with its stream callback (which only reads the chosen tokens): the same logits, and
    # random_params' peaked distributions keep argmax and sampling off float rounding (tests/test_decode.py)
    assert list(generate_stream(model, params, prompt, **run)) == expected


def test_tokens_come_while_the_generation_runs_and_closing_stops_it(monkeypatch, capfd):
    model, params = lm("rope")
    monkeypatch.setattr(decode.stream, "STEPS_AHEAD", 1)  # the loop waits for the reader: closing catches it
    release = threading.Event()

    def run_two():  # the second generate starts only once the first one's tokens were read
        decode.generate(model, params, [LM_PROMPTS[0]], max_new_tokens=5)
        assert release.wait(20), "the stream held the tokens back until the generation ended"
        decode.generate(model, params, [LM_PROMPTS[0]], max_new_tokens=5)

    steps = stream_steps(run_two)
    first = [next(steps) for _ in range(5)]
    release.set()
    assert [t for (t,) in first] == decode.generate(model, params, [LM_PROMPTS[0]], max_new_tokens=5).ids[0]
    next(steps)
    steps.close()  # the second loop ends at its next step; the listener is free for the next stream
    assert capfd.readouterr().err == ""  # not jax's report of the error that ended the loop
    assert list(generate_stream(model, params, LM_PROMPTS[0], max_new_tokens=5)) == [t for (t,) in first]


def test_run_py_generate_prints_as_it_goes_and_says_when_it_passes_the_context(monkeypatch, capsys):
    model, params = lm("rope")
    config = config_lib.base_config()
    config.decode.update(max_new_tokens=40)
    fake_run = TrainedRun(config, model, CharTokenizer("0123456789", specials=True), params, 0)
    monkeypatch.setattr(txjax.cli.generate, "load_workdir", lambda workdir, average=1: fake_run)
    printed = []
    monkeypatch.setattr(txjax.cli.generate, "stream_from_workdir", lambda *a, **k: (p for p in printed.extend(
        decode.stream.stream_from_workdir(*a, **k)) or printed))  # fmt: skip
    assert run.main(["generate", "--workdir=unused", "--prompt=3141"]) == 0
    out, err = capsys.readouterr()
    assert out == "".join(printed) + "\n"  # the text is what generate_windowed gives (test above)
    assert printed[0] == "3141" and len(printed) == 41 and all(len(piece) == 1 for piece in printed[1:])
    assert err.startswith("note: --max_new_tokens=40 runs past the context (max_len=24): up to 4 windows")
