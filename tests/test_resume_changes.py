"""Settings changed on resume are applied or refused, never silently ignored (txjax.training.resume): a changed
learning rate and schedule length apply from the resume step and are recorded; a tokenizer built for other data is
refused; a rerun of a finished run keeps its recorded results (also after `run.py eval`)."""

import json

import pytest
from test_train import tiny_config

import run
from txjax import config as config_lib
from txjax.experiment import build_tokenizer
from txjax.ops.metrics_log import read_metrics
from txjax.state.optim import learning_rate_at
from txjax.training.loop import train

FLAGS = ["--config.train.log_every=1", "--config.train.steps=4"]


def logged_learning_rates(workdir) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in read_metrics(workdir) if r["split"] == "train"}


def test_a_changed_learning_rate_applies_from_the_resume_step_and_is_recorded(tmp_path):
    """Trained 4 steps, resumed to 8 with another learning rate: steps 1-4 keep the old schedule's rates, steps
    5-8 take the new config's schedule (the restored optimizer state's injected rate replaced), and config.json's
    history and metrics.jsonl record the change at step 4. A rerun of the finished run returns the run's result
    (its last train loss, step times and compile counts too, not those of a process that trained no step) and
    rewrites none of its records."""
    train(tiny_config(*FLAGS), tmp_path)
    changed = ["--config.train.steps=8", "--config.train.learning_rate=3e-3"]
    result = train(tiny_config(*FLAGS, *changed), tmp_path)
    t = tiny_config(*FLAGS, *changed).train
    lr = logged_learning_rates(tmp_path)
    for step in range(1, 9):  # the rate a step applies is the schedule's at the steps done before it
        old_or_new = (1e-3, 4) if step <= 4 else (3e-3, 8)
        expected = learning_rate_at(step - 1, old_or_new[0], t.warmup_steps, t.min_lr_ratio, old_or_new[1])
        assert lr[step] == pytest.approx(float(expected), rel=1e-5), step
    changes = {"train.learning_rate": [1e-3, 3e-3], "train.steps": [4, 8]}
    assert config_lib.history(tmp_path) == [{"step": 4, "changes": changes}]
    assert [r for r in read_metrics(tmp_path) if r["split"] == "config"] == [
        {"step": 4, "split": "config", "changes": changes}
    ]
    assert config_lib.load(tmp_path).train.learning_rate == 3e-3  # the history key is no config field

    recorded = {p: p.read_text() for p in (tmp_path / "eval_valid.json", tmp_path / "metrics.jsonl")}
    again = train(tiny_config(*FLAGS, *changed, "--config.train.eval_every=3"), tmp_path)
    assert again == result and result["train_step_compiles"] == 1 and result["ms_per_step_median"] > 0
    assert result["train_loss"] == [r["loss"] for r in read_metrics(tmp_path) if r["split"] == "train"][-1]
    assert (tmp_path / "eval_valid.json").read_text() == recorded[tmp_path / "eval_valid.json"]
    metrics = (tmp_path / "metrics.jsonl").read_text()
    assert metrics.startswith(recorded[tmp_path / "metrics.jsonl"])
    valid_steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "valid"]
    assert valid_steps == [4, 8]  # one final eval per finished run, none added by the rerun
    assert config_lib.history(tmp_path)[-1] == {"step": 8, "changes": {"train.eval_every": [0, 3]}}
    # after `run.py eval` rewrote eval_valid.json (its own metrics, no train_minutes), a rerun still returns the
    # training's result (docs/experiments.md's "run the same command again" after README's eval)
    assert run.main(["eval", f"--workdir={tmp_path}"]) == 0
    assert train(tiny_config(*FLAGS, *changed, "--config.train.eval_every=3"), tmp_path) == result


def test_a_tokenizer_built_for_other_data_is_refused_until_rebuilt(tmp_path):
    """What a kill right after tokenizer training leaves (tokenizer/, no checkpoint): a rerun with another
    vocab_size is refused by name, not trained with the old vocabulary; with the folder deleted it is rebuilt."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over {i * 7} lazy dogs\n" for i in range(300)))
    text = ["--config.data.kind=text", f"--config.data.path={corpus}", "--config.data.tokenizer=sentencepiece"]
    config = config_lib.from_command_line(None, [*text, "--config.data.vocab_size=60"])
    assert build_tokenizer(config, tmp_path / "run").vocab_size == 60
    other = config_lib.from_command_line(None, [*text, "--config.data.vocab_size=70"])
    with pytest.raises(
        config_lib.ConfigError, match=r"tokenizer was built for other data \(data.vocab_size 60 -> 70\)"
    ):
        build_tokenizer(other, tmp_path / "run")
    assert build_tokenizer(config, tmp_path / "run").vocab_size == 60  # the settings it was built with
    built_with = tmp_path / "run" / "tokenizer" / "built_with.json"
    assert json.loads(built_with.read_text())["data.vocab_size"] == 60
    for path in sorted((tmp_path / "run" / "tokenizer").iterdir()):
        path.unlink()
    assert build_tokenizer(other, tmp_path / "run").vocab_size == 70
