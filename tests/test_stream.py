"""Streaming generation (txjax.decode.stream, search.stream_ids): the compiled loop run a chunk of steps a call from
the host, its tokens as each call ends; the same tokens as the generation run in one compiled call."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_decode import BOS, EOS, LM_PROMPTS, PAD, SOURCES, lm, seq2seq

import run
import txjax.cli.generate
from txjax import config as config_lib
from txjax import decode
from txjax.data import CharTokenizer
from txjax.decode import search
from txjax.decode.stream import generate_stream
from txjax.experiment import TrainedRun


@pytest.mark.parametrize(
    "new, strategy", [(40, {"method": "greedy"}), (19, {"method": "sample", "temperature": 1.5, "top_k": 5})]
)
def test_the_stream_is_what_generate_returns_past_the_context_too(new, strategy):
    model, params = lm("rope")  # max_len 24, a prompt of 6: 19 new tokens fill the context, 40 slide past it
    prompt, run = list(LM_PROMPTS[1]), dict(max_new_tokens=new, eos_id=EOS, seed=3, **strategy)
    (expected,) = decode.generate_windowed(model, params, prompt, **run)
    assert len(expected) == new  # no EOS: every window streams
    # the loop's steps compiled apart from generate_ids' one program: the same logits up to rounding, and
    # random_params' peaked distributions keep argmax and sampling off float rounding (tests/test_decode.py)
    assert list(generate_stream(model, params, prompt, **run)) == expected


STOP = 6  # a stop token that ends the sampled rows below at different steps


class Clock:
    """search.time's stand-in: every compiled call of a stream seems to take 1 ms, so CHUNK_SECONDS = 0.003 sizes
    each chunk at 3x the last (1, 3, 9, ... steps) whatever the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-3
        return self.now


@pytest.mark.parametrize("family", ["lm", "seq2seq"])
def test_a_batch_streams_its_rows_chunk_by_chunk_and_returns_what_generate_does(family, monkeypatch):
    """Rows of different lengths that stop at different steps (EOS, then pad; one LM row never stops and runs past
    the cache's first bucket of 64 slots into the next): the chunks put end to end are generate's tokens, and the
    returned Generation is generate's."""
    model, params = lm("rope", max_len=160) if family == "lm" else seq2seq("rope", max_len=160)
    inputs = LM_PROMPTS if family == "lm" else SOURCES[:3]
    run = dict(bos_id=BOS, pad_id=PAD, max_new_tokens=100, eos_id=STOP, method="sample", seed=1)
    expected = decode.generate(model, params, inputs, **run)
    assert len({len(ids) for ids in expected.ids}) == 3  # the rows stop at different steps
    assert expected.steps > 64 if family == "lm" else expected.steps < 100
    monkeypatch.setattr(search, "time", Clock())
    monkeypatch.setattr(search, "CHUNK_SECONDS", 0.003)  # chunks of 1, 3, 9, ... steps, each cut at a bucket's end
    steps = decode.generation_steps(model, params, inputs, stream=True, **run)
    chunks = []
    while True:
        try:
            chunks.append(next(steps))
        except StopIteration as end:
            out = end.value
            break
    tokens_CxN = np.concatenate(chunks, axis=1)
    cut = [row[: row.index(STOP) if STOP in row else len(row)] for row in tokens_CxN.tolist()]
    assert cut == expected.ids == out.ids and out.stopped == expected.stopped and out.steps == expected.steps
    np.testing.assert_allclose(out.scores, expected.scores, rtol=1e-5)  # two programs' sums of log-probs
    assert 2 < len(chunks) < tokens_CxN.shape[1]


def test_tokens_come_a_chunk_a_call_and_closing_stops_the_loop(monkeypatch):
    """The host runs the loop (no thread): with chunks of one step, the first five tokens are out after the prefill
    and four calls; closing the stream runs no more; a fresh one gives the same tokens. The first call runs one
    step, the next ones as many as take CHUNK_SECONDS at the last call's pace."""
    model, params = lm("rope")
    calls, run_steps = [], search.decode_steps

    def counted(*args):  # the steps each compiled call ran
        before = int(args[4].state.step)  # read before the call is given (donated) the loop
        loop = run_steps(*args)
        calls.append(int(loop.state.step) - before)
        return loop

    monkeypatch.setattr(search, "decode_steps", counted)
    monkeypatch.setattr(search, "CHUNK_SECONDS", 0.0)
    threads = threading.active_count()
    tokens = generate_stream(model, params, LM_PROMPTS[0], max_new_tokens=20)
    first = [next(tokens) for _ in range(5)]
    assert calls == [1, 1, 1, 1] and threading.active_count() == threads
    tokens.close()
    assert len(calls) == 4
    assert first == decode.generate(model, params, [LM_PROMPTS[0]], max_new_tokens=5).ids[0]
    monkeypatch.setattr(search, "time", Clock())
    monkeypatch.setattr(search, "CHUNK_SECONDS", 0.003)
    calls.clear()
    assert list(generate_stream(model, params, LM_PROMPTS[0], max_new_tokens=20))[:5] == first
    assert calls == [1, 3, 9, 6]  # 19 steps after the first choice: each chunk 3x the last, the last cut at 20


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
