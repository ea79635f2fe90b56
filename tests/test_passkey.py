"""The passkey task (txjax.data.synthetic) and its experiment (experiments/passkey.py): the answer is the passkey the
context hides, held-out contexts are never trained on, batches are reproducible, and the config validates."""

import numpy as np
import pytest

from txjax import config as config_lib
from txjax.data import SyntheticTask, task_tokenizer
from txjax.data.synthetic import PASSKEY_DIGITS


def test_the_answer_is_the_digits_after_the_one_plus_anywhere_in_the_context():
    task, rng, positions = SyntheticTask("passkey", min_digits=64, max_digits=64), np.random.default_rng(0), set()
    for _ in range(200):
        context, answer = task.sample(rng)
        assert len(context) == 64 and context.count("+") == 1 and len(answer) == PASSKEY_DIGITS
        at = context.index("+")
        assert context[at + 1 : at + 1 + PASSKEY_DIGITS] == answer
        positions.add(at)
    assert min(positions) < 8 and max(positions) > 64 - PASSKEY_DIGITS - 9  # the whole context, both ends


def test_an_lm_batch_weighs_the_passkey_and_eos_only():
    task, tok = SyntheticTask("passkey", min_digits=32, max_digits=32), task_tokenizer()
    batch = task.batch(seed=0, k=0, batch_size=4)
    assert batch["inputs"].shape == (4, task.seq_len) == (4, 32 + PASSKEY_DIGITS + 2)
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
        context = tok.decode(inputs).split("=")[0]
        at = context.index("+")
        weighted = targets[weights > 0].tolist()
        assert weighted == [*tok.encode(context[at + 1 : at + 1 + PASSKEY_DIGITS]), task.eos_id]


def test_batches_are_seeded_and_eval_splits_are_disjoint_from_training():
    task = SyntheticTask("passkey", min_digits=48, max_digits=48, eval_size=32)
    a, b, other = task.batch(3, 5, 16), task.batch(3, 5, 16), task.batch(4, 5, 16)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert not np.array_equal(a["inputs"], other["inputs"])
    tok, held_out = task_tokenizer(), {}
    for split in ("valid", "test"):
        prompts = SyntheticTask("passkey", min_digits=48, max_digits=48, eval_size=32, split=split).eval_examples()[0]
        held_out[split] = {tok.decode(p)[:-1] for p in prompts}
        assert len(held_out[split]) == 32
    assert not held_out["valid"] & held_out["test"]
    trained = {tok.decode(row).split("=")[0] for k in range(20) for row in task.batch(0, k, 16)["inputs"]}
    assert not trained & (held_out["valid"] | held_out["test"])


def test_the_context_must_hold_the_passkey():
    with pytest.raises(ValueError, match="passkey's context holds"):
        SyntheticTask("passkey", min_digits=PASSKEY_DIGITS, max_digits=8)


def test_the_experiment_validates_at_its_context_and_at_the_curriculum_s_first():
    config = config_lib.from_command_line("experiments/passkey.py", [])
    assert (config.data.task, config.data.max_digits, config.model.attention_impl) == ("passkey", 8192, "blockwise")
    assert config.model.max_len == SyntheticTask("passkey", min_digits=8192, max_digits=8192).seq_len
    short = ["--config.data.min_digits=256", "--config.data.max_digits=256"]
    assert config_lib.from_command_line("experiments/passkey.py", short).model.max_len == config.model.max_len
