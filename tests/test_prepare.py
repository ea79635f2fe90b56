"""Tests of `run.py prepare` (txjax.data.prepare): shard contents, parallel determinism, idempotence, atomicity and
one-line errors for bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import txjax.data.prepare as prepare_lib
import txjax.training.edge
from txjax import config as config_lib
from txjax.data import ByteTokenizer, CharTokenizer, ShardPairsDataset, load_tokenizer
from txjax.data.prepare import prepare as prepare_shards
from txjax.data.shards import INDEX_FILE, ShardLMDataset, TokenStream, fingerprint, read_index

REPO = Path(__file__).parents[1]


def prepare(*args, **kwargs):
    """run.py prepare in this process (one worker), a fifth of the documents valid, unless told otherwise."""
    return prepare_shards(*args, **{"workers": 1, "progress": False, "valid_fraction": 0.2, **kwargs})


def random_documents(n: int = 120, seed: int = 0) -> list[str]:
    """n distinct documents of 1-4 lines of random words (accents included, so a char vocab is not just ASCII)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzéñ"))
    word = lambda: "".join(rng.choice(letters, rng.integers(1, 8)))
    line = lambda: " ".join(word() for _ in range(rng.integers(1, 9)))
    return [f"doc {i}: " + "\n".join(line() for _ in range(rng.integers(1, 5))) for i in range(n)]


def write_text(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def split_documents(directory, split: str, stream: str = "tokens") -> list[list[int]]:
    """Each document of a split as the list of its token ids, read back through the reader's TokenStream."""
    tokens = TokenStream(directory, read_index(directory), split, stream)
    starts = np.asarray(tokens.doc_starts)
    return [tokens.read(a, b).tolist() for a, b in zip(starts[:-1], starts[1:])]


def assert_partition(expected: list[list[int]], directory, stream: str = "tokens") -> None:
    """The train and valid documents are exactly the expected ones, each split in input order."""
    where = {tuple(e): i for i, e in enumerate(expected)}
    assert len(where) == len(expected), "test documents must be distinct"
    train, valid = ([where[tuple(d)] for d in split_documents(directory, s, stream)] for s in ("train", "valid"))
    assert train == sorted(train) and valid == sorted(valid) and valid and train
    assert sorted(train + valid) == list(range(len(expected)))


@pytest.mark.parametrize("fmt,tokenizer", [("text", "char"), ("jsonl", "byte"), ("text", "sentencepiece")])
def test_shards_hold_the_in_memory_tokenization(tmp_path, monkeypatch, fmt, tokenizer):
    """Every document is in exactly one split, as tokenizer.encode(document) + EOS, in several shards (read back
    with at most 2 shard files open at once)."""
    monkeypatch.setattr(TokenStream, "MAX_OPEN", 2)
    docs = random_documents()
    if fmt == "jsonl":
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    else:
        path = write_text(tmp_path / "corpus.txt", docs)
    out = tmp_path / "shards"
    options = {"delimiter": "\n\n"} if fmt == "text" else {}  # each option where it is read (else refused)
    options |= {"vocab_size": 320} if tokenizer == "sentencepiece" else {}
    prepare([str(path)], out, tokenizer, **options, valid_fraction=0.2, shard_mb=0.002)
    tok = load_tokenizer(out / "tokenizer")
    if tokenizer == "char":
        assert tok.chars == sorted(set("".join(docs))) and tok.eos_id == len(tok.chars) + 2
    assert_partition([tok.encode(d) + [tok.eos_id] for d in docs], out)
    index = read_index(out)
    assert index["dtype"] == "uint16" and len(index["splits"]["train"]["streams"]["tokens"]["shards"]) > 2


def test_two_workers_write_the_same_shards_as_one(tmp_path):
    path = write_text(tmp_path / "corpus.txt", random_documents(200))
    for workers in (1, 2):
        prepare([str(path)], tmp_path / f"w{workers}", "char", delimiter="\n\n", shard_mb=0.002, workers=workers)
    files = sorted(p.relative_to(tmp_path / "w1") for p in (tmp_path / "w1").rglob("*") if p.is_file())
    assert len(files) > 8
    for name in files:
        a, b = (tmp_path / w / name for w in ("w1", "w2"))
        if name.name == INDEX_FILE:  # the same but for the worker count
            assert {**json.loads(a.read_text()), "workers": 0} == {**json.loads(b.read_text()), "workers": 0}
        else:
            assert a.read_bytes() == b.read_bytes(), name


def test_tsv_pairs_become_source_and_target_streams(tmp_path):
    docs = random_documents(80)
    pairs = [(d.replace("\n", " "), d.upper().replace("\n", " ")) for d in docs]
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    prepare([str(path)], tmp_path / "out", "byte", valid_fraction=0.3)
    assert read_index(tmp_path / "out")["kind"] == "pairs"
    tok = ByteTokenizer()
    for side, stream in enumerate(("src", "tgt")):  # no EOS: the reader truncates and appends it
        assert_partition([tok.encode(p[side]) for p in pairs], tmp_path / "out", stream)


def test_a_workdirs_tokenizer_is_used_as_it_is(tmp_path):
    docs = random_documents(40)
    path = write_text(tmp_path / "corpus.txt", docs)
    tokenizer = CharTokenizer("".join(docs) + "XYZ", specials=True)
    tokenizer.save(tmp_path / "workdir" / "tokenizer")
    prepare([str(path)], tmp_path / "out", str(tmp_path / "workdir"), delimiter="\n\n", valid_fraction=0.3)
    assert read_index(tmp_path / "out")["tokenizer"]["fingerprint"] == fingerprint(tokenizer)
    assert_partition([tokenizer.encode(d) + [tokenizer.eos_id] for d in docs], tmp_path / "out")


def test_a_rerun_does_nothing_and_changed_inputs_are_refused(tmp_path):
    path = write_text(tmp_path / "corpus.txt", random_documents(60))
    out = tmp_path / "out"
    assert not prepare([str(path)], out, "char", delimiter="\n\n")["up_to_date"]
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert prepare([str(path)], out, "char", delimiter="\n\n")["up_to_date"]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == written
    write_text(path, random_documents(61))
    with pytest.raises(ValueError, match=f"holds shards of other inputs or options \\({path} changed\\)"):
        prepare([str(path)], out, "char", delimiter="\n\n")
    with pytest.raises(ValueError, match=r"--valid_fraction 0.2 -> 0.5"):
        prepare([str(path)], out, "char", delimiter="\n\n", valid_fraction=0.5)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == written


def test_a_failed_prepare_leaves_nothing(tmp_path, monkeypatch):
    path = write_text(tmp_path / "corpus.txt", random_documents(60))
    tokenize = prepare_lib._tokenize_chunk

    def fail_on_third_chunk(task):
        if task[0] == 2:
            raise RuntimeError("disk full")
        return tokenize(task)

    monkeypatch.setattr(prepare_lib, "_tokenize_chunk", fail_on_third_chunk)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare([str(path)], tmp_path / "out", "char", delimiter="\n\n", shard_mb=0.001)
    assert list(tmp_path.iterdir()) == [path]


def test_a_killed_prepare_is_never_taken_for_a_finished_one(tmp_path):
    """SIGKILL a prepare after its second shard (it then sleeps): DIR does not exist, only DIR.partial-PID; a
    reader says so; the next prepare removes the partial folder and finishes."""
    path = write_text(tmp_path / "corpus.txt", random_documents(60))
    out = tmp_path / "out"
    script = (
        "import time, txjax.data.prepare as p\n"
        "tokenize = p._tokenize_chunk\n"
        "p._tokenize_chunk = lambda task: (tokenize(task), task[0] == 1 and time.sleep(600))[0]\n"
        f"p.prepare([{str(path)!r}], {str(out)!r}, 'char', delimiter='\\n\\n', shard_mb=0.001, workers=1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("out.partial-*/train/tokens-00001.bin")):
            assert proc.poll() is None and time.monotonic() < deadline, "prepare ended or hung before shard 1"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not out.exists() and len(list(tmp_path.glob("out.partial-*"))) == 1
    with pytest.raises(FileNotFoundError, match="out.partial-\\* folder is an interrupted prepare"):
        read_index(out)
    prepare([str(path)], out, "char", delimiter="\n\n", shard_mb=0.001)
    assert (out / INDEX_FILE).is_file() and not list(tmp_path.glob("out.partial-*"))


def one_line_error(error_type, message: str, *args, **kwargs) -> None:
    with pytest.raises(error_type, match=message) as e:
        prepare(*args, **kwargs)
    assert "\n" not in str(e.value)


def test_one_text_file_is_one_document_and_the_error_names_delimiter(tmp_path, capsys):
    """A text file without --delimiter is one document, never cut: an empty split's fix is --delimiter (no
    --valid_fraction could split one document); with --delimiter='\\n\\n' (as typed in a shell) it prepares."""
    import run

    text = write_text(tmp_path / "input.txt", random_documents())
    flags = [f"--input={text}", "--workers=1", "--valid_fraction=0.2"]
    assert run.main(["prepare", *flags, f"--output={tmp_path / 'one'}"]) == 2
    err = capsys.readouterr().err  # progress bars, then the error line
    assert err.endswith(
        "\nerror: the valid split has no documents (of 1): a text file is one document unless --delimiter splits it:"
        " give e.g. --delimiter='\\n\\n' (blank lines)\n"
    )
    assert "Traceback" not in err
    assert not list(tmp_path.glob("one*"))
    assert run.main(["prepare", *flags, f"--output={tmp_path / 'many'}", "--delimiter=\\n\\n"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    splits = read_index(summary["output"])["splits"]
    assert splits["train"]["documents"] + splits["valid"]["documents"] == 120 and splits["valid"]["documents"]
    other = write_text(tmp_path / "other.txt", random_documents(seed=1))  # several files: either fix may do
    one_line_error(ValueError, r"raise --valid_fraction=1e-09, or split the files into documents with --delimiter$",
                   [str(text), str(other)], tmp_path / "two", valid_fraction=1e-9)  # fmt: skip


def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path):
    missing = tmp_path / "absent.txt"
    one_line_error(FileNotFoundError, f"--input={missing}: no such file", [str(missing)], tmp_path / "o")
    one_line_error(ValueError, f"{tmp_path} is a folder with no files", [str(tmp_path)], tmp_path / "o")
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n  \n")
    one_line_error(ValueError, f"no documents in {blank}: the inputs are empty", [str(blank)], tmp_path / "o")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"text": "a"}\n\n{"id": 3, "body": "b"}\n')
    one_line_error(
        ValueError,
        f"{jsonl}:3: no string field 'text' \\(the line has: id, body\\); pass --field",
        [jsonl],
        tmp_path / "o",
    )
    jsonl.write_text('{"text": "a"}\n{"text": "b"\n')
    one_line_error(ValueError, f"{jsonl}:2: not a JSON object", [str(jsonl)], tmp_path / "o")
    tsv = tmp_path / "p.tsv"
    tsv.write_text("a\tb\nno tab here\n")
    one_line_error(ValueError, f"{tsv}:2: expected 'source<TAB>target'", [str(tsv)], tmp_path / "o")
    text = write_text(tmp_path / "t.txt", random_documents(5))
    one_line_error(ValueError, "valid split has no documents .* raise --valid_fraction", [text], tmp_path / "o",
                   delimiter="\n\n", valid_fraction=1e-9)  # fmt: skip
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    one_line_error(ValueError, "exists and is not a prepared folder", [str(text)], tmp_path / "taken")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("*.partial-*"))


def test_cli_reports_a_missing_input_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "run.py", "prepare", f"--input={tmp_path}/a.txt", f"--output={tmp_path}/o"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --input={tmp_path}/a.txt: no such file (pass existing files or a glob that matches some)"
    ]


def test_another_tokenizer_or_a_truncated_shard_is_refused(tmp_path):
    path = write_text(tmp_path / "corpus.txt", random_documents(60))
    out = tmp_path / "out"
    prepare([str(path)], out, "char", delimiter="\n\n", shard_mb=0.002)
    with pytest.raises(ValueError, match="tokenized by another tokenizer \\(char, .*\\) than this run's \\(byte"):
        ShardLMDataset(out, ByteTokenizer(), 16)
    with pytest.raises(ValueError, match="holds LM documents, not TSV pairs: .* --config.family=decoder_lm"):
        ShardPairsDataset(out, ByteTokenizer())
    ByteTokenizer().save(tmp_path / "run" / "tokenizer")  # a workdir made by a byte-tokenizer run
    config = config_lib.from_command_line(None, ["--config.data.kind=shards", f"--config.data.path={out}"])
    with pytest.raises(config_lib.ConfigError, match=f"{out}/index.json: the shards were tokenized by another"):
        txjax.training.edge.prepare_run(config, tmp_path / "run")
    shard = out / read_index(out)["splits"]["train"]["streams"]["tokens"]["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match=f"{shard}: .* the shard is truncated or was changed; delete {out}"):
        ShardLMDataset(out, load_tokenizer(out / "tokenizer"), 16)


def test_a_vocabulary_past_65536_ids_gets_uint32_shards(tmp_path):
    rng = np.random.default_rng(0)
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 70_000) if not 0xD800 <= c < 0xE000]  # CJK and beyond
    docs = ["".join(rng.choice(chars[-5000:], 30)) for _ in range(40)]  # ids above 65,535
    tokenizer = CharTokenizer(chars, specials=True)
    tokenizer.save(tmp_path / "tokenizer")
    prepare([str(write_text(tmp_path / "c.txt", docs))], tmp_path / "out", str(tmp_path), delimiter="\n\n")
    assert read_index(tmp_path / "out")["dtype"] == "uint32"
    assert_partition([tokenizer.encode(d) + [tokenizer.eos_id] for d in docs], tmp_path / "out")


@pytest.mark.parametrize(
    ("suffix", "flags", "line"),
    [
        (
            ".txt",
            ["--field=body", "--vocab_size=100"],
            "error: --field=body is read by --format jsonl, parquet, arrow, jsonl.gz, jsonl.zst, not --format=text; "
            "--vocab_size=100 is read by --tokenizer sentencepiece or bpe, not --tokenizer=char: leave them out "
            "(--field=text --vocab_size=8000, the defaults)",
        ),
        (
            ".parquet",
            ["--delimiter=\\n\\n"],
            "error: --delimiter='\\n\\n' is read by --format text, not --format=parquet: leave it out "
            "(--delimiter='', the default)",
        ),
        (
            ".txt",
            ["--tokenizer=byte", "--sample_mb=1"],
            "error: --sample_mb=1.0 is read by --tokenizer sentencepiece or bpe, not --tokenizer=byte: leave it out "
            "(--sample_mb=64.0, the default)",
        ),
    ],
)
def test_an_option_the_format_or_tokenizer_does_not_read_is_refused_in_one_line(tmp_path, capsys, suffix, flags, line):
    """--field off the formats with fields, --delimiter off text files, --vocab_size and --sample_mb with a tokenizer
    that is not trained: applied or refused (all in one line), never ignored; nothing is written."""
    import run

    path = tmp_path / f"input{suffix}"
    if suffix == ".parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table({"text": random_documents()}), path)
    else:
        write_text(path, random_documents())
    assert run.main(["prepare", f"--input={path}", f"--output={tmp_path / 'out'}", *flags]) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert not list(tmp_path.glob("out*"))
