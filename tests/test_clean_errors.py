"""Errors end cleanly: one line naming the problem (file and line) and the fix, nothing left in the workdir, no
abort at interpreter exit (a data thread still inside jax or numpy then is killed by a forced unwind: status 134);
values out of range are refused at the edge, before anything is read or written; a workdir trained on a 4-device
mesh is read on a 1-device machine without flags."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import pytest
from conftest import xla_flags
from test_train import TINY_FLAGS, TINY_MODEL

from txjax import config as config_lib
from txjax.data import prefetch
from txjax.experiment import load_workdir
from txjax.training import resume
from txjax.training.loop import train

REPO = Path(__file__).resolve().parents[1]

TINY = [*TINY_FLAGS, "--config.train.warmup_steps=0"]


def run_py(*args: str, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "run.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)


def test_a_diverged_run_exits_with_its_line_and_says_no_checkpoint_was_saved(tmp_path):
    result = run_py(
        "train",
        f"--workdir={tmp_path / 'run'}",
        *TINY,
        "--config.train.steps=200",
        "--config.train.learning_rate=1e30",
        "--config.train.log_every=1",
        "--config.train.checkpoint_every=1000",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "became NaN/inf" in errors[0], result.stderr[-2000:]
    assert "before any checkpoint was saved" in errors[0] and "step None" not in errors[0]
    assert "terminate called" not in result.stderr


@pytest.mark.parametrize(
    "flag, line",
    [
        ("--config.decode.prefill_chunk=-8", "config.decode.prefill_chunk=-8 must be >= 0"),
        ("--config.decode.top_k=-1", "config.decode.top_k=-1 must be >= 0"),
        ("--config.train.seed=99999999999999999999", "config.train.seed=99999999999999999999 must be in [0, "),
        ("--config.train.b2=1.5", "config.train.b2=1.5 must be in [0, 1)"),
        ("--config.data.val_fraction=1", "config.data.val_fraction=1.0 must be in (0, 1)"),
        ("--config.mesh.data=0", "config.mesh.data=0 must be >= 1"),
    ],
)
def test_a_value_out_of_range_is_refused_when_the_config_is_built(flag, line):
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(None, [flag])
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_saved_config_out_of_range_names_its_file_and_field_and_a_lower_train_steps_is_refused(tmp_path):
    """A config.json edited by hand is refused when a workdir is loaded (eval, generate, lm-eval), before any
    checkpoint is read; a resumed run whose train.steps ends before its checkpoint's step is refused."""
    config = config_lib.base_config()
    config.decode.prefill_chunk = -8
    config_lib.save(config, tmp_path)
    with pytest.raises(config_lib.ConfigError, match=r"config.json: config.decode.prefill_chunk=-8 must be >= 0"):
        load_workdir(tmp_path)
    config.decode.prefill_chunk, config.train.steps = 0, 4
    config_lib.save(config, tmp_path)
    with pytest.raises(config_lib.ConfigError, match="config.train.steps=4 is below step 6 of "):
        resume.resumed_changes(config.to_json(), tmp_path, start=6)
    assert resume.resumed_changes(config.to_json(), tmp_path, start=4) == {}


def _run_py_in_process(capsys, *argv: str) -> tuple[int, str]:
    """run.py's main in this process (no interpreter start): (exit status, stderr)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_py", REPO / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main(list(argv))
    return status, capsys.readouterr().err


def test_command_line_values_out_of_range_and_a_looping_workdir_are_one_line(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "back")
    (tmp_path / "back").symlink_to(loop)
    cases = [
        (["generate", "--workdir=w", "--prompt=1", "--seed=99999999999999999999"], "error: --seed=9999"),
        (["generate", f"--workdir={loop}", "--prompt=1"], f"error: {loop} is a loop of symbolic links"),
        (["train", f"--workdir={loop}", *TINY], f"error: {loop} is a loop of symbolic links"),
    ]
    if importlib.util.find_spec("lm_eval"):
        cases += [
            (["lm-eval", "--workdir=w", "--tasks=t", "--limit=0"], "error: --limit=0: give a number of documents"),
            (["lm-eval", "--workdir=w", "--tasks=t", "--num_fewshot=-1"], "error: --num_fewshot=-1 must be >= 0"),
        ]
    for argv, line in cases:
        status, err = _run_py_in_process(capsys, *argv)
        assert status == 2 and err.startswith(line) and err.count("\n") == 1, (argv, err)


def _workdir_config(folder, flags: list[str]) -> str:
    """A workdir holding only the config.json of `flags` (all that the refusals below read)."""
    folder.mkdir()
    config_lib.save(config_lib.from_command_line(None, flags), folder)
    return str(folder)


PREFIX_LM = ["--config.family=prefix_lm", "--config.data.kind=parallel", "--config.data.tokenizer=char"]


@pytest.mark.parametrize(
    "argv, line",
    [
        (  # a local window, blockwise attention: refused with the config, not at compile time after config.json
            ["train", *PREFIX_LM, "--config.model.attention_window=4"],
            "error: config.model.attention_window=4: family prefix_lm has no local attention",
        ),
        (
            ["train", *PREFIX_LM, "--config.model.attention_impl=blockwise"],
            "error: config.model.attention_impl='blockwise': family prefix_lm attends with a dense mask",
        ),
        (  # else trained, then `run.py eval --split=test` traced back in the decoder
            ["train", *PREFIX_LM, "--config.decode.prefill_chunk=8"],
            "error: config.decode.prefill_chunk=8: family prefix_lm reads its whole source in one prefill",
        ),
        (  # a source of another family than the experiment's (its data): once a KeyError 'parallel'
            ["train", f"--config={REPO / 'experiments/bible_en_es.py'}", "--config.train.init_from={lm}"],
            "error: train.init_from='{lm}' holds a decoder_lm model",
        ),
        (  # a text alone is no source: once a KeyError 'src' / 'prefix'
            ["eval", "--workdir={encoder_decoder}", "--text={pairs}"],
            "error: {encoder_decoder} is of family encoder_decoder: --text scores decoder-only LMs",
        ),
        (
            ["eval", "--workdir={prefix_lm}", "--text={pairs}"],
            "error: {prefix_lm} is of family prefix_lm: --text scores",
        ),
    ],
    ids=["window", "blockwise", "prefill_chunk", "init_from", "text_encoder_decoder", "text_prefix_lm"],
)
def test_a_setting_the_family_cannot_run_is_one_line_before_anything_is_written(
    argv, line, tmp_path, pairs_tsv, capsys
):
    """Each was a traceback (some after config.json or checkpoints were written): now one line naming the field and
    the fix; a new workdir is not created, an existing one is left as it was."""
    paths = {"pairs": str(pairs_tsv), "lm": _workdir_config(tmp_path / "lm", TINY)}  # an imported LM's family
    for family in ("encoder_decoder", "prefix_lm"):
        pairs = [f"--config.family={family}", "--config.data.kind=parallel", f"--config.data.path={pairs_tsv}"]
        paths[family] = _workdir_config(tmp_path / family, [*TINY_MODEL, *pairs, "--config.data.tokenizer=char"])
    argv = [arg.format(**paths) for arg in argv]
    if argv[0] == "train":
        argv += [f"--workdir={tmp_path / 'run'}", *TINY_MODEL, f"--config.data.path={pairs_tsv}"]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    status, err = _run_py_in_process(capsys, *argv)
    assert status == 2 and err.startswith(line.format(**paths)) and err.count("\n") == 1, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def _producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t is not threading.current_thread() and t.name.endswith("(produce)")]


def test_leaving_a_prefetch_early_stops_its_thread():
    """The loop leaves while the producer builds the next item (here: sleeps in it): close() and an exception in
    the consumer both wait for the producer to finish, so no thread outlives the loop into interpreter exit."""

    def slow():
        for i in range(100):
            time.sleep(0.2)
            yield i

    batches = prefetch(slow())
    assert next(batches) == 0
    batches.close()
    assert _producers() == []
    with pytest.raises(KeyError):
        for _ in prefetch(slow()):
            raise KeyError("the consumer fails")
    assert _producers() == []


def _text_config(path, *flags):
    return config_lib.from_command_line(
        None, [*TINY_MODEL, "--config.data.kind=text", f"--config.data.path={path}", "--config.data.seq_len=8", *flags]
    )


def test_a_sentencepiece_vocab_the_corpus_cannot_fill_is_one_line_and_writes_nothing(tmp_path):
    corpus = tmp_path / "small.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    config = _text_config(corpus, "--config.data.tokenizer=sentencepiece", "--config.data.vocab_size=8000")
    with pytest.raises(config_lib.ConfigError) as e:
        train(config, tmp_path / "run")
    assert str(e.value).startswith(f"SentencePiece vocab_size 8000 is more than {corpus} allows (at most ")
    assert "set --config.data.vocab_size=" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_invalid_utf8_names_the_file_line_and_byte(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("first line\nsecond line\nna\u00efve".encode("latin-1") + b"\n" * 40)
    for tokenizer in ("char", "sentencepiece"):
        with pytest.raises(config_lib.ConfigError) as e:
            train(_text_config(corpus, f"--config.data.tokenizer={tokenizer}"), tmp_path / "run")
        assert str(e.value).startswith(f"{corpus}:3: byte 0xef at offset 25 is not UTF-8"), str(e.value)
        assert "iconv -f latin1 -t utf-8" in str(e.value)
        assert not (tmp_path / "run").exists()


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (XLA_FLAGS set in conftest.py)")
def test_a_workdir_trained_on_4_devices_evaluates_on_one(tmp_path):
    """`run.py eval` on one device: it says so, prints the metrics and writes them, with the command, to a file."""
    workdir = tmp_path / "run"
    flags = [*TINY, "--config.train.steps=4", "--config.train.log_every=2", "--config.train.checkpoint_every=2"]
    train(config_lib.from_command_line(None, [*flags, "--config.mesh.data=4"]), workdir)
    one_device = {**os.environ, "XLA_FLAGS": xla_flags(devices=1)}
    evaluated = run_py("eval", f"--workdir={workdir}", env=one_device)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    written = json.loads((workdir / "eval_valid.json").read_text())
    assert metrics["step"] == 4 and metrics == {k: v for k, v in written.items() if k != "machine"}
    assert f"run.py eval --workdir={workdir}" in written["machine"]["command"] and written["machine"]["cpu_cores"] >= 1
    note = "note: the run's mesh (data, fsdp, sequence, tensor, expert) = (4, 1, 1, 1, 1) needs 4 devices and 1 are"
    assert note + " present" in evaluated.stderr
