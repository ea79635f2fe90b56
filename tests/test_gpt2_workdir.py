"""run.py import: a GPT-2 folder becomes a workdir that load_workdir, eval, generation and attention use."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

pytest.importorskip("tokenizers")

import test_gpt2_convert  # noqa: E402
from test_gpt2_convert import random_params  # noqa: E402

import run  # noqa: E402
from txjax.cli.eval import main as eval_main  # noqa: E402
from txjax.convert import save_gpt2  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 40
CFG = dataclasses.replace(test_gpt2_convert.CFG, vocab_size=300, max_len=32)  # the tiny GPT-2, a wider vocab


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(folder, params): a random GPT-2 saved with its tokenizer files, and a small text corpus next to it."""
    import tokenizers

    root = tmp_path_factory.mktemp("hf")
    params = random_params(CFG)
    folder = save_gpt2(root / "gpt2", CFG, params)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT], vocab_size=290, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(folder))
    (root / "text.txt").write_text(TEXT)
    return folder, params


def test_import_then_load_eval_generate(gpt2, tmp_path, capsys):
    folder, params = gpt2
    workdir = tmp_path / "run"
    assert (
        run.main(
            [
                "import",
                f"--from={folder}",
                f"--workdir={workdir}",
                f"--config.data.path={folder.parent / 'text.txt'}",
                "--config.data.seq_len=16",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["params"] == sum(a.size for a in jax.tree.leaves(params))
    loaded = load_workdir(workdir)
    assert loaded.step == 0 and loaded.tokenizer.kind == "byte_bpe" and loaded.model.cfg == CFG
    jax.tree.map(np.testing.assert_array_equal, loaded.params, params)
    eval_main([f"--workdir={workdir}"])
    assert json.loads((workdir / "eval_valid.json").read_text())["tokens"] > 0
    prompt = loaded.tokenizer.encode("the quick")
    out = generate(loaded.model, loaded.params, [prompt], max_new_tokens=5)
    assert len(out.ids[0]) == 5
    assert run.main(["attention", f"--workdir={workdir}", "--text=the lazy dog", "--head=1"]) == 0
    assert (workdir / "attention.png").read_bytes()[:4] == b"\x89PNG"
    # the import holds the parameters alone: no optimizer moments on disk
    manager = ocp.CheckpointManager(workdir / "checkpoints", item_handlers=ocp.StandardCheckpointHandler())
    saved = manager.item_metadata(0).tree
    assert not jax.tree.leaves(saved.get("opt_state"))
    assert len(jax.tree.leaves(saved["params"])) == len(jax.tree.leaves(params))
    # fine-tuning starts from the imported weights and config (no --config: the workdir's config.json), with fresh
    # moments: at learning rate 0 the parameters stay the imported ones (a fresh draw would not be them)
    frozen = ["--config.train.steps=1", "--config.train.eval_batches=1", "--config.train.learning_rate=0"]
    assert run.main(["train", f"--workdir={workdir}", *frozen]) == 0
    jax.tree.map(np.testing.assert_array_equal, load_workdir(workdir).params, params)
    assert (
        run.main(["train", f"--workdir={workdir}", "--config.train.steps=2", "--config.train.learning_rate=1e-3"]) == 0
    )
    tuned = load_workdir(workdir)
    assert tuned.step == 2 and tuned.model.cfg == CFG
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(params)))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--config.model.d_model=32"], "params"),
        (["--config.model.nope=1"], "nope"),
    ],
)
def test_bad_override_writes_nothing(gpt2, tmp_path, capsys, flags, message):
    folder, _ = gpt2
    assert run.main(["import", f"--from={folder}", f"--workdir={tmp_path / 'run'}", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_folder_without_tokenizer_writes_nothing(tmp_path, capsys):
    save_gpt2(tmp_path / "bare", CFG, random_params(CFG))
    assert run.main(["import", f"--from={tmp_path / 'bare'}", f"--workdir={tmp_path / 'run'}"]) == 2
    assert "tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_damaged_vocab_json_is_one_line_naming_it(gpt2, tmp_path, capsys):
    """Once json's traceback from the tokenizer's reader: one line naming the file, nothing written."""
    folder, _ = gpt2
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    vocab = damaged / "vocab.json"
    vocab.write_text(vocab.read_text()[:100])
    assert run.main(["import", f"--from={damaged}", f"--workdir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {vocab}: not valid JSON (") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
