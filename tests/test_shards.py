"""Tests of training from prepared shards (txjax.data.shards): windows and packed rows, per-process rows, no
attention across documents, evaluation weights, and a SIGKILLed run resuming bit for bit."""

import signal
from pathlib import Path

import jax
import numpy as np
import pytest
from test_faults import faulty
from test_prepare import random_documents, write_text
from test_train import assert_trees_equal, params_of

import run
from txjax import config as config_lib
from txjax.data import ByteTokenizer, ParallelDataset, ShardPairsDataset, load_tokenizer
from txjax.data.prepare import prepare
from txjax.data.shards import ShardLMDataset
from txjax.evaluate.split import evaluate, make_eval_step
from txjax.families import init_params
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.state.checkpoint import Checkpointer
from txjax.training.loop import train

L = 24  # seq_len: the documents are ~5-60 tokens, so packed rows hold several


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    docs = [d[: 5 + i % 56] for i, d in enumerate(random_documents(400))]  # 5-60 characters
    write_text(root / "corpus.txt", docs)
    prepare([str(root / "corpus.txt")], root / "out", "char", delimiter="\n\n", valid_fraction=0.2, shard_mb=0.002,
            workers=1, progress=False)  # fmt: skip
    return root / "out"


def dataset(shards, split="train", pack=False) -> ShardLMDataset:
    return ShardLMDataset(shards, load_tokenizer(shards / "tokenizer"), L, split, pack)


def concat(a, b):
    return {k: np.concatenate([a[k], b[k]]) for k in a}


@pytest.mark.parametrize("pack", [False, True], ids=["windows", "packed"])
def test_batches_are_a_pure_function_and_processes_read_only_their_rows(shards, pack):
    """Batch k is the same whenever it is built; rows [0, 4) and [4, 8), read by two 'processes', concatenate to
    the one-process batch, and the token spans they read are disjoint and together what the whole batch reads."""
    data = dataset(shards, pack=pack)
    reads = []
    read = data.stream.read
    data.stream.read = lambda a, b: reads.append((a, b)) or read(a, b)
    whole = data.batch(3, 5, 8)
    whole_reads, reads[:] = sorted(reads), []
    first = data.batch(3, 5, 8, slice(0, 4))
    first_reads, reads[:] = set(reads), []
    second = data.batch(3, 5, 8, slice(4, 8))
    assert first_reads.isdisjoint(reads) and sorted(first_reads | set(reads)) == whole_reads
    for key, value in concat(first, second).items():
        np.testing.assert_array_equal(value, whole[key])
        np.testing.assert_array_equal(value, ShardLMDataset.batch(dataset(shards, pack=pack), 3, 5, 8)[key])
    assert any(not np.array_equal(whole[k], data.batch(3, 6, 8)[k]) for k in whole)
    assert any(not np.array_equal(whole[k], data.batch(4, 5, 8)[k]) for k in whole)


def test_windows_are_stretches_of_the_stream(shards):
    data = dataset(shards)
    stream = data.stream.read(0, len(data.stream))
    windows = np.lib.stride_tricks.sliding_window_view(stream, L + 1)
    batch = data.batch(0, 0, 16)
    for inputs, targets in zip(batch["inputs"], batch["targets"]):
        row = np.append(inputs, targets[-1])
        assert (windows == row).all(axis=1).any() and np.array_equal(inputs[1:], targets[:-1])
    assert batch["weights"].all() and (batch["positions"] == np.arange(L)).all()


def test_packed_rows_are_whole_pieces_of_documents(shards):
    """Each segment is one stretch of one document (tokens + EOS), positions 0.., inputs/targets shifted by one;
    segments 1..n left to right, then padding (segment 0, weight 0); rows hold several documents."""
    data = dataset(shards, pack=True)
    stream = data.stream.read(0, len(data.stream))
    starts = np.asarray(data.stream.doc_starts)
    documents = [stream[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]
    batch = data.batch(0, 2, 16)
    segments_per_row = []
    for b in range(16):
        seg = batch["segment_ids"][b]
        used = seg > 0
        assert used[: used.sum()].all() and np.array_equal(batch["weights"][b], used)
        assert np.array_equal(np.unique(seg[used]), np.arange(1, seg.max() + 1)) and (np.diff(seg[used]) >= 0).all()
        for s in range(1, seg.max() + 1):
            here = seg == s
            assert np.array_equal(batch["positions"][b][here], np.arange(here.sum()))
            piece = batch["inputs"][b][here].tolist() + [int(batch["targets"][b][here][-1])]
            assert batch["targets"][b][here][:-1].tolist() == piece[1:-1]
            assert any(_contains(doc, piece) for doc in documents), piece
        segments_per_row.append(seg.max())
    assert max(segments_per_row) >= 2


def _contains(sequence: list, piece: list) -> bool:
    return any(sequence[i : i + len(piece)] == piece for i in range(len(sequence) - len(piece) + 1))


def test_packed_rows_never_attend_across_documents(shards):
    """Change the tokens of one document in a packed row (training, and evaluation): the logits of every other
    document do not move (and they do when the same row is read as one segment, which shows the test can fail)."""
    vocab_size = load_tokenizer(shards / "tokenizer").vocab_size
    model = DecoderLM(ModelConfig(vocab_size=vocab_size, max_len=L, num_layers=2, num_heads=2, d_model=32, d_ff=64,
                                  positional="rope"))  # fmt: skip
    params = init_params(model, jax.random.key(0))
    logits = jax.jit(lambda tokens, positions, segments: model.apply({"params": params}, tokens, positions, segments))
    train, valid = dataset(shards, "train", pack=True), dataset(shards, "valid", pack=True)
    for batch in (train.batch(0, 1, 8), next(iter(valid.eval_batches(8)))):
        b = int(np.argmax(batch["segment_ids"].max(axis=1)))
        inputs, positions, seg = (batch[k][b : b + 1] for k in ("inputs", "positions", "segment_ids"))
        assert seg.max() >= 2
        changed = np.where(seg == 1, (inputs + 7) % vocab_size, inputs)
        others = seg > 1
        before, after = logits(inputs, positions, seg), logits(changed, positions, seg)
        np.testing.assert_array_equal(np.asarray(before)[others], np.asarray(after)[others])
        ones = np.ones_like(seg)
        before, after = logits(inputs, positions, ones), logits(changed, positions, ones)
        assert not np.allclose(np.asarray(before)[others], np.asarray(after)[others])


@pytest.mark.parametrize("pack", [False, True], ids=["windows", "packed"])
def test_eval_counts_every_target_once_whatever_the_batch_size(shards, pack):
    """Weighted (input, target) pairs of the valid split: every consecutive pair of the stream once (packed: but
    those that cross into the next document); packed, the loss over batches of 3 and of 7 rows is the same."""
    data = dataset(shards, "valid", pack)
    stream = data.stream.read(0, len(data.stream))
    expected = np.ones(len(stream) - 1, bool)
    if pack:
        expected[np.asarray(data.stream.doc_starts)[1:-1] - 1] = False  # EOS -> next document's first token
    for batch_size in (3, 7):
        batches = list(data.eval_batches(batch_size))
        assert len(batches) == data.num_eval_batches(batch_size) and batches[-1]["weights"].shape == (batch_size, L)
        w = np.concatenate([x["weights"].reshape(-1) for x in batches])[: len(stream) - 1].astype(bool)
        assert np.array_equal(w, expected)
        assert sum(x["weights"].sum() for x in batches) == expected.sum()
        targets = np.concatenate([x["targets"].reshape(-1) for x in batches])[: len(stream) - 1]
        assert np.array_equal(targets[w], stream[1:][w])
    assert len(list(data.eval_batches(3, max_batches=2))) == 2
    if not pack:
        return
    model = DecoderLM(ModelConfig(vocab_size=data.tokenizer.vocab_size, max_len=L, num_layers=1, num_heads=2,
                                  d_model=16, d_ff=32))  # fmt: skip
    params, eval_step = init_params(model, jax.random.key(0)), make_eval_step(model)
    by = {bs: evaluate(eval_step, params, data.eval_batches(bs)) for bs in (3, 7)}
    assert by[3]["tokens"] == by[7]["tokens"] == expected.sum()
    np.testing.assert_allclose(by[3]["loss"], by[7]["loss"], rtol=1e-6)


KILLED_RUN_FLAGS = [  # 60 steps of a toy model, a checkpoint every 20
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.train.steps=60",
    "--config.train.batch_size=8",
    "--config.train.checkpoint_every=20",
    "--config.train.log_every=20",
    "--config.train.eval_every=0",
]


def test_sigkill_while_training_from_shards_then_rerun_is_bit_exact(shards, tmp_path, capsys):
    """`run.py train` from packed shards, SIGKILLed inside its second checkpoint save (step 40, its files written,
    not committed; tests/fault_driver.py), then run again: it resumes from step 20 and ends with the parameters of
    a run that was never interrupted (batch k is a function of (seed, k): no iterator state)."""
    shards_flags = [f"--config.data.path={shards}", f"--config.data.seq_len={L}", "--config.data.pack=true"]
    flags = [*KILLED_RUN_FLAGS, "--config.data.kind=shards", *shards_flags]
    reference = tmp_path / "reference"
    train(config_lib.from_command_line(None, flags), reference)
    args = ["train", f"--workdir={tmp_path / 'killed'}", *flags]
    killed = faulty("KILL", "save", 2, *args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert Checkpointer(tmp_path / "killed" / "checkpoints", 3).latest_step() == 20
    assert run.main(args) == 0 and "resuming" in capsys.readouterr().out  # the rerun here, in this process
    assert_trees_equal(params_of(reference), params_of(tmp_path / "killed"))


@pytest.mark.parametrize("pack", [False, True], ids=["one_pair_per_row", "packed"])
def test_prepared_pairs_batch_as_the_tsv_in_memory(tmp_path, pack):
    """ShardPairsDataset's eval batches equal ParallelDataset's on a TSV of the same pairs (truncation, EOS,
    packing); its training batches are pure in (seed, k) and split by rows."""
    pairs = [(d.replace("\n", " "), d[::-1].replace("\n", " ")) for d in random_documents(90)]
    (tmp_path / "all.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    prepare([str(tmp_path / "all.tsv")], tmp_path / "out", "byte", valid_fraction=0.2, workers=1, progress=False)
    shards = ShardPairsDataset(tmp_path / "out", ByteTokenizer(), 24, 20, "train", pack)
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in shards.raw_pairs()))
    memory = ParallelDataset(tmp_path / "train.tsv", ByteTokenizer(), max_src_len=24, max_tgt_len=20, pack=pack)
    assert len(shards) == len(memory) < len(pairs) and shards.num_truncated == memory.num_truncated > 0
    for a, b in zip(shards.eval_batches(8), memory.eval_batches(8), strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    whole = shards.batch(1, 3, 8)
    for key, value in concat(shards.batch(1, 3, 8, slice(0, 4)), shards.batch(1, 3, 8, slice(4, 8))).items():
        np.testing.assert_array_equal(value, whole[key])
