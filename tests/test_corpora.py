"""`run.py prepare` from corpora as researchers keep them (txjax.data.readers): Parquet, Arrow folders of Hugging
Face `datasets`, gzip/zstandard JSONL, globs and folders give the shards the JSONL of the same documents gives; bad
files are one line naming the file; the byte-level BPE tokenizer trained in prepare round-trips and trains."""

import gzip
import json
import math
from pathlib import Path

import pytest
from test_prepare import prepare, random_documents, split_documents

from txjax import config as config_lib
from txjax.data import load_tokenizer
from txjax.data.shards import INDEX_FILE, read_index
from txjax.extras import MissingExtra

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

UNICODE = ["naïve café ☕ — 日本語のテキスト", "emoji 🙂🚀 and Ελληνικά", "tab\tand\r\nnewlines"]


def documents(n: int = 90) -> list[str]:
    return random_documents(n) + [f"{u} {i}" for i, u in enumerate(UNICODE)]


def jsonl(docs: list[str]) -> bytes:
    """JSON lines with the text and another field, and a blank-text line (skipped as every format skips it)."""
    lines = [json.dumps({"id": i, "text": d}, ensure_ascii=False) for i, d in enumerate(docs)]
    return ("\n".join([*lines[:3], json.dumps({"id": -1, "text": "  "}), *lines[3:]]) + "\n").encode()


def table(docs: list[str]):
    return pa.table({"id": list(range(len(docs))), "text": docs})


def write(path: Path, fmt: str, docs: list[str]) -> Path:
    """`docs` as one file of `fmt` (Parquet: row groups of 16 rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_bytes(jsonl(docs))
    elif fmt == "jsonl.gz":
        path.write_bytes(gzip.compress(jsonl(docs)))
    elif fmt == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(jsonl(docs)))
    else:
        pq.write_table(table(docs), path, row_group_size=16)
    return path


def shard_files(directory: Path) -> dict[str, bytes]:
    """Every file prepare wrote but index.json (it names the inputs), by relative path."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != INDEX_FILE)
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


def assert_same_shards(a: Path, b: Path) -> None:
    files = shard_files(a)
    assert any(name.endswith(".bin") for name in files) and files == shard_files(b)
    index_a, index_b = read_index(a), read_index(b)
    assert index_a["splits"] == index_b["splits"] and index_a["tokenizer"] == index_b["tokenizer"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.gz", "jsonl.zst", "arrow"])
def test_each_format_gives_the_shards_of_its_jsonl(tmp_path, fmt):
    """One file, three files by a glob, and their folder: the same shard files, byte for byte, as the JSONL of the
    same documents (Parquet in several row groups; Arrow as `datasets` saves it)."""
    docs = documents()
    parts = [docs[i::3] for i in range(3)]
    for k, part in enumerate(parts):
        write(tmp_path / "jsonl" / f"part-{k}.jsonl", "jsonl", part)
    prepare([str(tmp_path / "jsonl" / "part-0.jsonl")], tmp_path / "ref-one", "byte")
    prepare([str(tmp_path / "jsonl" / "*.jsonl")], tmp_path / "ref-all", "byte")
    if fmt == "arrow":
        datasets = pytest.importorskip("datasets")
        for k, part in enumerate(parts):
            datasets.Dataset.from_dict(table(part).to_pydict()).save_to_disk(str(tmp_path / fmt / f"part-{k}"))
        one, many, folder = tmp_path / fmt / "part-0", [str(tmp_path / fmt / "part-*")], None
        # a folder of several data-*.arrow files: a shard each, the documents of the JSONL in the same order
        datasets.Dataset.from_dict(table(docs).to_pydict()).save_to_disk(str(tmp_path / "split"), max_shard_size="1KB")
        assert len(list((tmp_path / "split").glob("data-*.arrow"))) > 1
        prepare([str(write(tmp_path / "all.jsonl", "jsonl", docs))], tmp_path / "ref-whole", "byte")
        prepare([str(tmp_path / "split")], tmp_path / "split-out", "byte")
        for split in ("train", "valid"):
            assert split_documents(tmp_path / "split-out", split) == split_documents(tmp_path / "ref-whole", split)
    else:
        for k, part in enumerate(parts):
            write(tmp_path / fmt / f"part-{k}.{fmt}", fmt, part)
        one, many, folder = tmp_path / fmt / f"part-0.{fmt}", [str(tmp_path / fmt / f"*.{fmt}")], tmp_path / fmt
    prepare([str(one)], tmp_path / "one", "byte")
    assert_same_shards(tmp_path / "ref-one", tmp_path / "one")
    prepare(many, tmp_path / "glob", "byte")
    assert_same_shards(tmp_path / "ref-all", tmp_path / "glob")
    if folder:
        prepare([str(folder)], tmp_path / "folder", "byte")
        assert_same_shards(tmp_path / "ref-all", tmp_path / "folder")
    assert read_index(tmp_path / "glob")["options"]["format"] == fmt


def test_parquet_row_groups_are_chunks_of_the_same_stream(tmp_path):
    """With a tiny --shard_mb every few row groups are a shard (and a worker's task): the documents of each split,
    in order, are still those of the JSONL (its chunks cut elsewhere)."""
    docs = documents(150)
    write(tmp_path / "c.jsonl", "jsonl", docs)
    write(tmp_path / "c.parquet", "parquet", docs)
    assert pq.ParquetFile(tmp_path / "c.parquet").metadata.num_row_groups == math.ceil(len(docs) / 16)
    prepare([str(tmp_path / "c.jsonl")], tmp_path / "ref", "byte")
    prepare([str(tmp_path / "c.parquet")], tmp_path / "out", "byte", shard_mb=0.002)
    assert len(read_index(tmp_path / "out")["splits"]["train"]["streams"]["tokens"]["shards"]) > 3
    for split in ("train", "valid"):
        assert split_documents(tmp_path / "out", split) == split_documents(tmp_path / "ref", split)


def one_line(error_type, match: str, inputs, out: Path, **kwargs) -> str:
    with pytest.raises(error_type, match=match) as e:
        prepare([str(p) for p in inputs], out, "byte", **kwargs)
    assert "\n" not in str(e.value) and not out.exists()
    return str(e.value)


def test_bad_files_are_one_line_errors_naming_the_file_and_the_fix(tmp_path, monkeypatch):
    docs = documents(40)
    good = write(tmp_path / "good.parquet", "parquet", docs)
    one_line(ValueError, f"{good}: no column 'body' \\(it has: id, text\\); pass --field=NAME", [good],
             tmp_path / "o", field="body")  # fmt: skip
    one_line(ValueError, f"{good}: column 'id' holds int64, not text; pass --field", [good], tmp_path / "o", field="id")
    pq.write_table(pa.table({"text": ["a b", None, "c"]}), tmp_path / "nulls.parquet")
    one_line(ValueError, "nulls.parquet \\(row group 0\\): 1 rows have no text \\(null\\); drop or fill",
             [tmp_path / "nulls.parquet"], tmp_path / "o")  # fmt: skip
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-100])
    one_line(ValueError, f"{truncated}: cannot be read .*; the file is damaged or not Parquet: write it again",
             [truncated], tmp_path / "o")  # fmt: skip
    data = bytearray(good.read_bytes())  # the footer intact, the pages of row group 1 overwritten
    column = pq.ParquetFile(good).metadata.row_group(1).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    one_line(ValueError, f"{damaged} \\(row group 1\\): cannot be read .*; the file is damaged", [damaged],
             tmp_path / "o")  # fmt: skip
    gz = write(tmp_path / "c.jsonl.gz", "jsonl.gz", docs)
    gz.write_bytes(gz.read_bytes()[:-200])
    one_line(ValueError, f"{gz} \\(after line \\d+\\): cannot be read .* the file is damaged", [gz], tmp_path / "o")
    zst = tmp_path / "c.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n{"body": "b"}\n'))
    one_line(ValueError, f"{zst}:2 \\(decompressed\\): no string field 'text' \\(the line has: body\\)", [zst],
             tmp_path / "o")  # fmt: skip
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    one_line(ValueError, f"holds several `datasets` splits \\(train, test\\); pass one split's folder, e.g. "
             f"--input={tmp_path}/dd/train", [tmp_path / "dd"], tmp_path / "o")  # fmt: skip
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)
    write(tmp_path / "z" / "c.jsonl.zst", "jsonl.zst", docs)
    message = one_line(MissingExtra, "zstandard", [tmp_path / "z" / "c.jsonl.zst"], tmp_path / "o")
    assert message == "reading .zst files needs the 'zstandard' package (the data extra): pip install -e '.[data]'"


def test_bpe_trained_in_prepare_round_trips_unicode_and_trains(tmp_path):
    """--tokenizer=bpe: a byte-level BPE of --vocab_size ids trained on the corpus, saved with the shards; it
    round-trips text it never saw (any bytes encode), the shards hold its encoding of every document plus EOS, and
    a tiny model trains from them (its workdir keeps the same tokenizer)."""
    pytest.importorskip("tokenizers")
    docs = documents(120)
    write(tmp_path / "c.parquet", "parquet", docs)
    prepare([str(tmp_path / "c.parquet")], tmp_path / "out", "bpe", vocab_size=400)
    tok = load_tokenizer(tmp_path / "out" / "tokenizer")
    assert tok.kind == "byte_bpe" and tok.vocab_size == 400 and tok.eos_id == 0
    unseen = "Ünïcödé ≠ ASCII: 漢字かな交じり文 🧪 𝔘𝔫𝔦\n\ttabs  and  spaces "
    assert tok.decode(tok.encode(unseen)) == unseen
    common = "doc 1: the cat"  # merges learnt from the corpus make its text shorter than its bytes
    assert len(tok.encode(common)) < len(common.encode())
    expected = {tuple(tok.encode(d) + [tok.eos_id]) for d in docs}
    found = [tuple(d) for split in ("train", "valid") for d in split_documents(tmp_path / "out", split)]
    assert sorted(found) == sorted(expected)
    from txjax.training.loop import train

    flags = ["--config.data.kind=shards", f"--config.data.path={tmp_path / 'out'}", "--config.data.seq_len=32",
             "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
             "--config.model.num_heads=2", "--config.train.steps=30", "--config.train.batch_size=8",
             "--config.train.learning_rate=1e-2", "--config.train.warmup_steps=5", "--config.train.log_every=10",
             "--config.train.eval_every=0", "--config.train.eval_batches=2"]  # fmt: skip
    metrics = train(config_lib.from_command_line(None, flags), tmp_path / "run")
    assert load_tokenizer(tmp_path / "run" / "tokenizer").encode(unseen) == tok.encode(unseen)
    assert metrics["valid_loss"] < math.log(400) - 0.5, metrics  # learnt something beyond the uniform 5.99
