"""Every input format of `run.py prepare`, in one table (FORMATS: name -> how to plan its chunks and read their
documents), and which files an --input names.

  text, jsonl, tsv    byte ranges of the file (txjax.data.documents)
  parquet             row groups, read one record batch at a time (pyarrow); `field` is the text column
  arrow               Arrow IPC files, as Hugging Face `datasets` writes them (`save_to_disk`: a folder with
                      state.json and data-*.arrow); read with pyarrow, one record batch at a time
  jsonl.gz, jsonl.zst JSON lines in a gzip or zstandard stream, decompressed as they are read
A compressed stream or an Arrow file cannot be entered half-way: each file is one chunk (one worker), read in
batches, so memory does not grow with it. Every reader yields the same documents the JSONL of those texts gives
(non-empty strings, in order), so the shards are the same. pyarrow and zstandard are the `data` extra.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from txjax.data import documents as byte_formats
from txjax.data.documents import Chunk
from txjax.extras import require

BATCH_ROWS = 1024  # rows per record batch read from Parquet


class Format(NamedTuple):
    suffixes: tuple[str, ...]  # file names that have this format ("": any other name)
    plan: Callable[[Path, int, str], list[Chunk]]  # (path, chunk_bytes, delimiter) -> chunks
    read: Callable[[Chunk, str, str], Iterator]  # (chunk, delimiter, field) -> its documents
    unit: str  # what a chunk's start and stop count, for error messages ("": the whole file)
    field: bool  # whether --field picks the text


def _whole_file(path: Path, chunk_bytes: int, delimiter: str) -> list[Chunk]:
    return [Chunk(str(path), 0, 1, path.stat().st_size)]


def _byte_ranges(newline: bool) -> Callable[[Path, int, str], list[Chunk]]:
    """Chunks that end after a newline (jsonl, tsv) or the delimiter (text; none: the file is one document)."""
    return lambda path, chunk_bytes, delimiter: byte_formats.plan_bytes(
        path, b"\n" if newline else (delimiter.encode("utf-8") or None), chunk_bytes
    )


def _pyarrow():
    require("pyarrow", "reading Parquet and Arrow files")
    import pyarrow.ipc
    import pyarrow.parquet

    return pyarrow


def _damaged(where: str, e: Exception, kind: str) -> ValueError:
    reason = "".join(c for c in (str(e).splitlines() or [type(e).__name__])[0] if c.isprintable())
    return ValueError(f"{where}: cannot be read ({reason}); the file is damaged or not {kind}: write it again, or "
                      "leave it out of --input")  # fmt: skip


def _parquet_file(path: str):
    pa = _pyarrow()
    try:
        return pa.parquet.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise _damaged(path, e, "Parquet") from None


def _plan_parquet(path: Path, chunk_bytes: int, delimiter: str) -> list[Chunk]:
    """Consecutive row groups of about `chunk_bytes` (uncompressed) each; the footer's sizes, nothing else read."""
    meta = _parquet_file(str(path)).metadata
    chunks, start, size, stored = [], 0, 0, 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size += group.total_byte_size
        stored += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        if size >= chunk_bytes or i == meta.num_row_groups - 1:
            chunks.append(Chunk(str(path), start, i + 1, stored))
            start, size, stored = i + 1, 0, 0
    if chunks:  # the footer and headers too: the chunks add up to the file
        chunks[-1] = chunks[-1]._replace(nbytes=path.stat().st_size - sum(c.nbytes for c in chunks[:-1]))
    return chunks


def _text_column(schema, path: str, field: str) -> int:
    """The index of the string column `field`; ValueError naming the columns there are."""
    pa = _pyarrow()
    if field not in schema.names:
        raise ValueError(f"{path}: no column {field!r} (it has: {', '.join(schema.names)}); pass --field=NAME of the "
                         "text column")  # fmt: skip
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise ValueError(f"{path}: column {field!r} holds {kind}, not text; pass --field=NAME of a text column")
    return schema.names.index(field)


def _texts(column, where: Callable[[], str]) -> Iterator[str]:
    """The non-empty strings of an Arrow string column; a null is an error, as a JSONL line without the field is."""
    if column.null_count:
        raise ValueError(f"{where()}: {column.null_count} rows have no text (null); drop or fill those rows")
    yield from (t for t in column.to_pylist() if t.strip())


def _read_parquet(chunk: Chunk, delimiter: str, field: str) -> Iterator[str]:
    pa, f = _pyarrow(), _parquet_file(chunk.path)
    _text_column(f.schema_arrow, chunk.path, field)
    for group in range(chunk.start, chunk.stop):
        where = f"{chunk.path} (row group {group})"
        batches = f.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=[field], use_threads=False)
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as e:
                raise _damaged(where, e, "Parquet") from None
            if batch is None:
                break
            yield from _texts(batch.column(0), lambda where=where: where)


def parquet_values(chunk: Chunk, column: str) -> Iterator[tuple[str, object]]:
    """('file (row N)', the value) of each row's `column` in the chunk's row groups (a list or struct column as
    Python lists and dicts)."""
    pa, f = _pyarrow(), _parquet_file(chunk.path)
    if column not in f.schema_arrow.names:
        raise ValueError(f"{chunk.path}: no column {column!r} (it has: {', '.join(f.schema_arrow.names)})")
    row = sum(f.metadata.row_group(g).num_rows for g in range(chunk.start))
    batches = f.iter_batches(
        BATCH_ROWS, row_groups=list(range(chunk.start, chunk.stop)), columns=[column], use_threads=False
    )
    try:
        for batch in batches:
            for value in batch.column(0).to_pylist():
                yield f"{chunk.path} (row {row})", value
                row += 1
    except (pa.ArrowException, OSError) as e:
        raise _damaged(f"{chunk.path} (row {row})", e, "Parquet") from None


def _read_arrow(chunk: Chunk, delimiter: str, field: str) -> Iterator[str]:
    """An Arrow IPC stream (what `datasets` writes) or IPC file, one record batch in memory at a time (read, not
    memory-mapped: touched pages of a mapping stay in the resident set)."""
    pa = _pyarrow()
    with pa.OSFile(chunk.path) as source:
        try:
            if source.read(6) == b"ARROW1":  # the IPC file format's magic; a stream starts with a message
                source.seek(0)
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                source.seek(0)
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
            column = _text_column(reader.schema, chunk.path, field)
            for i, batch in enumerate(batches):
                yield from _texts(batch.column(column), lambda i=i: f"{chunk.path} (record batch {i})")
        except (pa.ArrowException, OSError) as e:
            raise _damaged(chunk.path, e, "Arrow IPC") from None


def _zstd_open(path: str):
    zstandard = require("zstandard", "reading .zst files")
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True))


def _read_compressed_jsonl(opener: Callable[[str], io.BufferedIOBase], errors: tuple[type[Exception], ...], kind: str):
    """JSON lines decompressed as they are read, with the errors of a JSONL file (by line) and of a damaged stream."""

    def read(chunk: Chunk, delimiter: str, field: str) -> Iterator[str]:
        line_number = 0
        try:
            with opener(chunk.path) as f:
                for line_number, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8").rstrip("\r\n")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"{chunk.path}:{line_number} (decompressed): not UTF-8 ({e.reason}); write "
                                         "the file as UTF-8") from None  # fmt: skip
                    where = lambda n=line_number: f"{chunk.path}:{n} (decompressed)"
                    if line.strip() and (text := byte_formats.record_text(line, field, where)):
                        yield text
        except errors as e:
            raise _damaged(f"{chunk.path} (after line {line_number})", e, kind) from None

    return read


def _zstd_errors() -> tuple[type[Exception], ...]:
    try:
        import zstandard
    except ImportError:  # _zstd_open names the extra
        return (OSError,)
    return (zstandard.ZstdError, OSError)


FORMATS = {
    "text": Format(("",), _byte_ranges(newline=False), byte_formats.text_documents, "bytes", False),
    "jsonl": Format((".jsonl", ".json"), _byte_ranges(newline=True), byte_formats.jsonl_documents, "bytes", True),
    "tsv": Format((".tsv",), _byte_ranges(newline=True), byte_formats.tsv_documents, "bytes", False),
    "parquet": Format((".parquet",), _plan_parquet, _read_parquet, "row groups", True),
    "arrow": Format((".arrow",), _whole_file, _read_arrow, "", True),
    "jsonl.gz": Format(
        (".jsonl.gz", ".json.gz"),
        _whole_file,
        _read_compressed_jsonl(gzip.open, (gzip.BadGzipFile, EOFError, zlib.error, OSError), "gzip"),
        "",
        True,
    ),
    "jsonl.zst": Format(
        (".jsonl.zst", ".json.zst", ".jsonl.zstd"),
        _whole_file,
        _read_compressed_jsonl(_zstd_open, _zstd_errors(), "zstandard"),
        "",
        True,
    ),
}


def documents(chunk: Chunk, fmt: str, delimiter: str = "", field: str = "text") -> Iterator[str | tuple[str, str]]:
    """The non-empty documents of a chunk, in order: strings, or (source, target) pairs for tsv."""
    return FORMATS[fmt].read(chunk, delimiter, field)


def plan_chunks(paths: list[Path], fmt: str, delimiter: str, chunk_bytes: int) -> list[Chunk]:
    """Each file cut into chunks of about `chunk_bytes` (as its format allows), in order."""
    return [c for path in paths for c in FORMATS[fmt].plan(path, chunk_bytes, delimiter)]


def where(chunk: Chunk, fmt: str) -> str:
    """The chunk for an error message: 'file (bytes 0-1000)', 'file (row groups 2-4)' or 'file'."""
    unit = FORMATS[fmt].unit
    return f"{chunk.path} ({unit} {chunk.start}-{chunk.stop})" if unit else chunk.path


def format_of(path: Path) -> str:
    """The format a file name says (the longest matching suffix; text for any other name)."""
    name = path.name.lower()
    matches = [(len(s), fmt) for fmt, f in FORMATS.items() for s in f.suffixes if s and name.endswith(s)]
    return max(matches)[1] if matches else "text"


def infer_format(paths: list[Path]) -> str:
    """The format the file names say; ValueError when they disagree."""
    formats = {format_of(p) for p in paths}
    if len(formats) > 1:
        raise ValueError(f"the inputs mix formats ({', '.join(sorted(formats))}); prepare each format on its own")
    return formats.pop()


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Absolute paths of the files that `patterns` (files, globs or folders) name, in order, each once; a one-line
    error for a pattern that names nothing, or a file that cannot be read."""
    paths: dict[Path, None] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise FileNotFoundError(
                f"--input={pattern}: no such file (pass existing files or a glob that matches some)"
            )
        for match in matches:
            path = Path(match).resolve()
            for file in _folder_files(path) if path.is_dir() else [path]:
                if not os.access(file, os.R_OK):
                    raise ValueError(f"--input: {file} cannot be read (permission denied); fix its permissions")
                paths[file] = None
    return list(paths)


def _folder_files(folder: Path) -> list[Path]:
    """A `datasets` save_to_disk folder's Arrow files (state.json's order), else every file under the folder."""
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits") or ["train"]
        raise ValueError(f"--input: {folder} holds several `datasets` splits ({', '.join(splits)}); pass one split's "
                         f"folder, e.g. --input={folder / splits[0]}")  # fmt: skip
    if (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file():
        state = json.loads((folder / "state.json").read_text())
        files = [folder / f["filename"] for f in state.get("_data_files", [])]
        if not files or not all(f.is_file() for f in files):
            raise ValueError(f"--input: {folder}/state.json lists Arrow files that are not there; save the dataset "
                             "again (Dataset.save_to_disk)")  # fmt: skip
        return files
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"--input: {folder} is a folder with no files; pass a folder of input files, or its files")
    return files
