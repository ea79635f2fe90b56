"""Tests of txjax.data: tokenizers, datasets, packing, determinism and eval coverage."""

from pathlib import Path

import numpy as np
import pytest

from txjax import config as config_lib
from txjax.data import (
    TASKS,
    ByteTokenizer,
    CharTokenizer,
    ParallelDataset,
    SentencePieceTokenizer,
    SyntheticTask,
    TextLMDataset,
    first_fit,
    load_tokenizer,
    prefetch,
    task_tokenizer,
)

SHARED = Path(__file__).parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared corpora absent: {SHARED}")


def assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def differ(a, b):
    return any(not np.array_equal(a[key], b[key]) for key in a)


# ---------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trip(tmp_path):
    tok = ByteTokenizer()
    text = "héllo ☃\nworld"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
    loaded = load_tokenizer(tok.save(tmp_path / "tok"))
    assert isinstance(loaded, ByteTokenizer) and loaded.encode(text) == ids and loaded.vocab_size == 259


def test_char_tokenizer_round_trip_and_specials(tmp_path):
    tok = CharTokenizer.from_text("hello world\n")
    assert tok.vocab_size == 9 and tok.pad_id is None and tok.chars == sorted(set("hello world\n"))
    assert tok.decode(tok.encode("low hello")) == "low hello"
    with_specials = CharTokenizer.from_text("hello world\n", specials=True)
    assert with_specials.vocab_size == 12 and (with_specials.pad_id, with_specials.eos_id) == (9, 11)
    loaded = load_tokenizer(with_specials.save(tmp_path / "tok"))
    assert loaded.chars == with_specials.chars and loaded.eos_id == 11
    with pytest.raises(ValueError, match="'z'") as e:
        tok.encode("hez")
    assert "\n" not in str(e.value)


def test_sentencepiece_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    lines = [" ".join(rng.choice(words, size=8)) for _ in range(300)]
    tok = SentencePieceTokenizer.train(lines, vocab_size=28)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3) and tok.vocab_size == 28
    text = "gamma  beta\nzeta alpha"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.decode([tok.bos_id, *ids, tok.eos_id]) == text
    loaded = load_tokenizer(tok.save(tmp_path / "spm"))
    assert isinstance(loaded, SentencePieceTokenizer) and loaded.encode(text) == ids
    with pytest.raises(ValueError, match="'Q'"):
        tok.encode("alpha Q")


def test_missing_files_name_absolute_path_and_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        TextLMDataset("no/such.txt", ByteTokenizer(), 8)
    message = str(e.value)
    assert str(tmp_path / "no" / "such.txt") in message and "--config.data.path=" in message and "\n" not in message
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.tsv")):
        ParallelDataset("nope.tsv", CharTokenizer("ab", specials=True))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------- text LM


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(60)), encoding="utf-8")
    return path


def test_text_lm_batches_deterministic_and_shifted(text_file):
    ds = TextLMDataset(text_file, ByteTokenizer(), seq_len=16)
    a = ds.batch(seed=3, k=5, batch_size=4)
    assert_batches_equal(a, ds.batch(3, 5, 4))
    assert differ(a, ds.batch(3, 6, 4)) and differ(a, ds.batch(4, 5, 4))
    assert a["inputs"].shape == (4, 16) and a["inputs"].dtype == np.int32 and a["weights"].dtype == np.float32
    np.testing.assert_array_equal(a["inputs"][:, 1:], a["targets"][:, :-1])
    x = ds.tokens
    for row_in, row_tgt in zip(a["inputs"], a["targets"]):  # each row is a window of the split
        (start,) = [i for i in range(len(x) - 16) if np.array_equal(x[i : i + 16], row_in)][:1]
        np.testing.assert_array_equal(row_tgt, x[start + 1 : start + 17])


def test_text_split_and_eval_cover_every_token_once(text_file):
    tok = ByteTokenizer()
    all_ids = tok.encode(text_file.read_text())
    train = TextLMDataset(text_file, tok, seq_len=16, split="train")
    val = TextLMDataset(text_file, tok, seq_len=16, split="valid", val_fraction=0.1)
    cut = int(len(all_ids) * 0.9)
    assert train.tokens.tolist() == all_ids[:cut] and val.tokens.tolist() == all_ids[cut:]
    batches = list(val.eval_batches(batch_size=3))
    assert len(batches) == val.num_eval_batches(3) and all(b["inputs"].shape == (3, 16) for b in batches)
    w = np.concatenate([b["weights"].reshape(-1) for b in batches]) > 0
    targets = np.concatenate([b["targets"].reshape(-1) for b in batches])[w]
    inputs = np.concatenate([b["inputs"].reshape(-1) for b in batches])[w]
    np.testing.assert_array_equal(targets, val.tokens[1:])
    np.testing.assert_array_equal(inputs, val.tokens[:-1])
    segments = np.concatenate([b["segment_ids"].reshape(-1) for b in batches])
    np.testing.assert_array_equal(segments > 0, w)


# ---------------------------------------------------------------- parallel TSV


@pytest.fixture
def tsv_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "pairs.tsv"
    lines = [f"s{i}{'a' * rng.integers(0, 6)}\tt{i}{'b' * rng.integers(0, 9)}" for i in range(37)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, [line.split("\t") for line in lines]


def decoded_segments(tok, tokens_row, segments_row):
    return [tok.decode(tokens_row[segments_row == s]) for s in range(1, segments_row.max() + 1)]


def test_parallel_batches_and_truncation(tsv_file):
    path, pairs = tsv_file
    tok = CharTokenizer("0123456789abst", specials=True)
    ds = ParallelDataset(path, tok, max_src_len=6, max_tgt_len=12)
    a = ds.batch(0, 2, 5)
    assert_batches_equal(a, ds.batch(0, 2, 5))
    assert differ(a, ds.batch(0, 3, 5))
    assert a["src"].shape == (5, 6) and a["tgt_targets"].shape == (5, 12)
    assert all(len(s) <= 6 and s[-1] == tok.eos_id for s in ds.sources)
    assert ds.num_truncated == sum(len(s) + 1 > 6 or len(t) + 1 > 12 for s, t in pairs)
    np.testing.assert_array_equal(a["tgt_inputs"][:, 0], tok.bos_id)
    np.testing.assert_array_equal(
        a["tgt_inputs"][:, 1:][a["tgt_weights"][:, 1:] > 0], a["tgt_targets"][:, :-1][a["tgt_weights"][:, 1:] > 0]
    )
    # one epoch of batches visits every pair once (37 = 7 batches of 5 + 2 into the next epoch)
    seen = [tok.decode(row[row != tok.eos_id]) for k in range(7) for row in ds.batch(9, k, 5)["src"]]
    assert len(set(seen)) == 35


def test_packing_keeps_pairs_whole_with_restarted_positions(tsv_file):
    path, pairs = tsv_file
    tok = CharTokenizer("0123456789abst", specials=True)
    ds = ParallelDataset(path, tok, max_src_len=16, max_tgt_len=20, pack=True)
    targets_of = {s: t for s, t in pairs}
    batch = ds.batch(1, 0, 4)
    assert batch["src_segment_ids"].max() > 1  # something was packed
    for b in range(4):
        for side in ("src", "tgt"):
            seg, pos = batch[f"{side}_segment_ids"][b], batch[f"{side}_positions"][b]
            for s in range(1, seg.max() + 1):
                idx = np.flatnonzero(seg == s)
                np.testing.assert_array_equal(idx, np.arange(idx[0], idx[0] + len(idx)))  # contiguous
                np.testing.assert_array_equal(pos[idx], np.arange(len(idx)))
            assert (seg[seg == 0].size == 0) or (np.flatnonzero(seg == 0).min() > np.flatnonzero(seg > 0).max())
        sources = decoded_segments(tok, batch["src"][b], batch["src_segment_ids"][b])
        targets = decoded_segments(tok, batch["tgt_targets"][b], batch["tgt_segment_ids"][b])
        assert [targets_of[s] for s in sources] == targets  # segment j of src and tgt is the same pair
        inputs = decoded_segments(tok, batch["tgt_inputs"][b], batch["tgt_segment_ids"][b])
        assert inputs == targets  # BOS + target[:-1]: same text once BOS/EOS are dropped


@pytest.mark.parametrize("packed", [False, True])
def test_parallel_eval_covers_every_pair_once(tsv_file, packed):
    path, pairs = tsv_file
    tok = CharTokenizer("0123456789abst", specials=True)
    ds = ParallelDataset(path, tok, max_src_len=16, max_tgt_len=20)
    seen = []
    for batch in ds.eval_batches(batch_size=8, packed=packed):
        assert batch["src"].shape == (8, 16)
        np.testing.assert_array_equal(batch["tgt_weights"] > 0, batch["tgt_segment_ids"] > 0)
        for b in range(8):
            seen += decoded_segments(tok, batch["src"][b], batch["src_segment_ids"][b])
    assert sorted(seen) == sorted(s for s, _ in pairs)
    if not packed:
        assert seen == [s for s, _ in pairs] == [s for s, _ in ds.raw_pairs()]


def test_first_fit():
    lengths = np.array([[3, 3], [2, 4], [4, 1], [1, 1], [4, 4]])
    rows = first_fit(lengths, (5, 5))
    assert sorted(i for row in rows for i in row) == list(range(5))
    assert all((lengths[row].sum(axis=0) <= 5).all() for row in rows)
    assert rows == [[0, 3], [1], [2], [4]]
    assert first_fit(lengths, (5, 5), max_rows=2) == [[0, 3], [1]]


# ---------------------------------------------------------------- synthetic tasks


def test_addition_answers_are_right():
    task = SyntheticTask("add", form="lm", min_digits=1, max_digits=5)
    tok = task.tokenizer
    batch = task.batch(0, 7, 16)
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
        text = tok.decode(inputs)
        a, b = text.split("=")[0].split("+")
        answer = targets[weights > 0]
        assert answer[-1] == tok.eos_id
        assert int(tok.decode(answer)) == int(a) + int(b)
        assert inputs[0] == tok.bos_id
    prompts, answers = task.eval_examples(50, seed=1)
    for prompt, answer in zip(prompts, answers):
        a, b = tok.decode(prompt).rstrip("=").split("+")
        assert int(tok.decode(answer)) == int(a) + int(b)


@pytest.mark.parametrize("name", TASKS)
def test_tasks_in_both_forms(name):
    answer_of = {
        "copy": lambda x: x,
        "reverse": lambda x: x[::-1],
        "sort": lambda x: "".join(sorted(x)),
        "add": lambda x: str(sum(map(int, x.split("+")))),
        "passkey": lambda x: x.split("+")[1][:2],  # the 2 digits after the '+'
    }[name]
    shortest = 4 if name == "passkey" else 1  # a passkey context holds the '+' and the key
    lm = SyntheticTask(name, form="lm", min_digits=shortest, max_digits=6)
    s2s = SyntheticTask(name, form="seq2seq", min_digits=shortest, max_digits=6)
    tok = lm.tokenizer
    a = lm.batch(2, 0, 8)
    assert_batches_equal(a, lm.batch(2, 0, 8))
    assert differ(a, lm.batch(2, 1, 8))
    assert a["inputs"].shape == (8, lm.seq_len)
    np.testing.assert_array_equal(
        a["inputs"][:, 1:][a["segment_ids"][:, 1:] > 0], a["targets"][:, :-1][a["segment_ids"][:, 1:] > 0]
    )
    b = s2s.batch(2, 0, 8)
    assert b["src"].shape == (8, s2s.src_len) and b["tgt_targets"].shape == (8, s2s.tgt_len)
    for src, tgt, w in zip(b["src"], b["tgt_targets"], b["tgt_weights"]):
        assert tok.decode(tgt[w > 0]) == answer_of(tok.decode(src))
    prompts, answers = s2s.eval_examples()
    assert len(prompts) == s2s.eval_size and all(p[-1] == tok.eos_id for p in prompts)
    assert [tok.decode(x) for x in answers] == [answer_of(tok.decode(p)) for p in prompts]
    eval_batches = list(lm.eval_batches(batch_size=100))
    assert len(eval_batches) == -(-lm.eval_size // 100)
    assert (eval_batches[-1]["weights"][lm.eval_size % 100 :] == 0).all()


def test_batch_rows_are_slices_of_the_whole_batch(text_file, tsv_file):
    """A process that builds only its rows of batch k gets exactly those rows of the whole batch."""
    tok = CharTokenizer("0123456789abst", specials=True)
    datasets = [
        TextLMDataset(text_file, ByteTokenizer(), seq_len=16),
        SyntheticTask("add", "lm"),
        SyntheticTask("sort", "seq2seq"),
        ParallelDataset(tsv_file[0], tok, max_src_len=6, max_tgt_len=12),
        ParallelDataset(tsv_file[0], tok, max_src_len=12, max_tgt_len=24, pack=True),
    ]
    for ds in datasets:
        whole = ds.batch(1, 4, 8)
        for rows in (slice(0, 4), slice(4, 8), slice(2, 4)):
            assert_batches_equal(ds.batch(1, 4, 8, rows), {key: x[rows] for key, x in whole.items()})


def test_prefetch():
    assert list(prefetch(iter(range(10)), size=2)) == list(range(10))

    def failing():
        yield 1
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        list(prefetch(failing()))


# ---------------------------------------------------------------- shared corpora


@needs_shared
def test_tinyshakespeare_char_vocab_and_split():
    path = SHARED / "tinyshakespeare" / "input.txt"
    tok = CharTokenizer.from_text(path.read_text(encoding="utf-8"))
    assert tok.vocab_size == 65
    train = TextLMDataset(path, tok, seq_len=64)
    val = TextLMDataset(path, tok, seq_len=64, split="valid")
    assert (len(train.tokens), len(val.tokens)) == (1003854, 111540)  # nanoGPT's shakespeare_char counts
    assert train.batch(0, 0, 2)["inputs"].max() < 65


@needs_shared
def test_bible_tsv_with_sentencepiece():
    path = SHARED / "bible" / "valid.en-es.tsv"
    tok = SentencePieceTokenizer.train_from_files([path], vocab_size=800)
    ds = ParallelDataset(path, tok, max_src_len=64, max_tgt_len=64, pack=True)
    assert len(ds) == 238 and len(list(ds.raw_pairs())) == 238
    batch = ds.batch(0, 0, 8)
    assert batch["src"].shape == (8, 64) and batch["tgt_segment_ids"].max() >= 1
    source, _ = next(ds.raw_pairs())
    assert tok.decode(tok.encode(source)) == source


@pytest.mark.parametrize("name,form,experiment", [("reverse", "lm", "reverse"), ("add", "seq2seq", "add_seq2seq")])
def test_held_out_prompts_are_never_trained_on_and_valid_and_test_are_disjoint(name, form, experiment):
    """The eval sets of valid and test hold distinct prompts of their own splits, and none of them appears in any
    batch that the task's experiment trains on (experiments/reverse.py: 600 batches of 64, add_seq2seq.py 2,000)."""
    train_config = config_lib.from_command_line(f"experiments/{experiment}.py", []).train
    tok = task_tokenizer()
    valid, test = (SyntheticTask(name, form, eval_seed=7, split=split) for split in ("valid", "test"))
    decode_prompt = (lambda p: tok.decode(p)[:-1]) if form == "lm" else (lambda p: tok.decode(p))  # drop '=' / EOS
    held_out = {}
    for task in (valid, test):
        prompts = [decode_prompt(p) for p in task.eval_examples()[0]]
        assert len(prompts) == len(set(prompts)) == task.eval_size  # distinct, and the space is large enough
        held_out[task.split] = set(prompts)
    assert not held_out["valid"] & held_out["test"]
    key = "inputs" if form == "lm" else "src"
    for k in range(train_config.steps):
        rows = valid.batch(train_config.seed, k, train_config.batch_size)[key]
        trained = {tok.decode(row).split("=")[0] for row in rows} if form == "lm" else set(map(tok.decode, rows))
        assert not trained & (held_out["valid"] | held_out["test"]), k


def test_a_space_too_small_to_hold_out_is_a_one_line_error():
    with pytest.raises(ValueError, match="no valid prompts to draw: raise --config.data.max_digits"):
        SyntheticTask("sort", "lm", min_digits=1, max_digits=1, eval_size=4).eval_examples()  # no 1-digit one is
