"""The passkey task (txjax.data.synthetic) and its experiment (experiments/passkey.py): the answer is the passkey the
context hides, held-out contexts are never trained on, batches are reproducible, and the config validates."""

import json

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


def test_eval_feeds_a_long_context_in_chunks_and_decodes_what_the_one_call_prefill_does(tmp_path, monkeypatch, capsys):
    import importlib

    import run
    from txjax import decode
    from txjax.training.loop import train

    search = importlib.import_module("txjax.decode.search")  # the module (txjax.decode.search is also a function)

    flags = ["--config.data.min_digits=40", "--config.data.max_digits=40", "--config.data.eval_size=16"]
    flags += ["--config.train.steps=20", "--config.train.batch_size=16", "--config.train.learning_rate=3e-3"]
    flags += ["--config.train.checkpoint_every=20", "--config.model.attention_block_q=16"]
    flags += ["--config.model.attention_block_kv=16"]
    train(config_lib.from_command_line("experiments/passkey.py", flags, None), tmp_path)
    chunks, outputs = [], []  # the chunk size each prefill was given; what each eval decoded
    prefill_in_chunks, decode_all = search.prefill_in_chunks, decode.decode_all
    monkeypatch.setattr(search, "prefill_in_chunks", lambda *a: chunks.append(a[-1]) or prefill_in_chunks(*a))
    monkeypatch.setattr(decode, "decode_all", lambda *a, **k: outputs.append(decode_all(*a, **k)) or outputs[-1])
    printed = {}
    for chunk in (0, 8):
        assert run.main(["eval", f"--workdir={tmp_path}", f"--config.decode.prefill_chunk={chunk}"]) == 0
        printed[chunk] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert chunks == [None, 8]  # 44 prompt tokens: 8 tokens a call, left-padded to 48
    assert outputs[1].ids == outputs[0].ids and len(outputs[0].ids) == 16  # the half-trained model's guesses
    assert printed[8]["generated_exact_match"] == printed[0]["generated_exact_match"]
    assert printed[8]["exact_match"] == printed[0]["exact_match"]
    text_flags = ["--text=unused.txt", "--config.decode.prefill_chunk=8"]  # --text is scored: nothing decodes
    assert run.main(["eval", f"--workdir={tmp_path}", *text_flags]) == 2
    assert "--config.decode.prefill_chunk: only a translation split is decoded" in capsys.readouterr().err
