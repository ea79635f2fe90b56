"""The byte-range formats (text, jsonl, tsv): their documents, read in byte ranges (chunks) that parallel workers
can take one each. txjax.data.readers puts them in one table with the columnar and compressed formats.

  text    plain UTF-8: the whole file is one document, or (with a delimiter, e.g. "\\n\\n") documents are the
          pieces between delimiters
  jsonl   one JSON object per line; the document is its `field` (a string)
  tsv     `source<TAB>target` lines (the translation task): each line is one document of two texts
Empty (whitespace-only) documents are skipped. A chunk never cuts a document: it ends right after a delimiter
(text) or a newline (jsonl, tsv). Bad input raises ValueError naming the file (and line) and the fix: one line, as
`config.user_errors` reports it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple


class Chunk(NamedTuple):
    """Part [start, stop) of input file `path`, in its format's units (bytes, row groups; (0, 1): the whole file);
    `nbytes`: how much of the file that is (the progress bar's)."""

    path: str
    start: int
    stop: int
    nbytes: int


def plan_bytes(path: Path, sep: bytes | None, chunk_bytes: int) -> list[Chunk]:
    """The file cut into chunks of about `chunk_bytes`, each ending right after `sep` (or at the file's end)."""
    chunks, size, start = [], path.stat().st_size, 0
    with path.open("rb") as f:
        while start < size:
            stop = size if sep is None else _boundary(f, start + chunk_bytes, sep, size)
            chunks.append(Chunk(str(path), start, stop, stop - start))
            start = stop
    return chunks


def _boundary(f, target: int, sep: bytes, size: int, window: int = 1 << 16) -> int:
    """The end of the first `sep` that ends after `target` (the file's size if there is none)."""
    pos = max(target - len(sep) + 1, 0)
    while pos < size:
        f.seek(pos)
        data = f.read(window + len(sep) - 1)
        found = data.find(sep)
        if found >= 0:
            return min(pos + found + len(sep), size)
        pos += window
    return size


def line_number(path: str, offset: int) -> int:
    """The 1-based line of byte `offset` of `path` (only computed for an error message)."""
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def _where(chunk: Chunk, i: int) -> str:
    """'file:line' of the chunk's i-th line."""
    return f"{chunk.path}:{line_number(chunk.path, chunk.start) + i}"


def read_chunk(chunk: Chunk) -> str:
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        data = f.read(chunk.stop - chunk.start)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = line_number(chunk.path, chunk.start + e.start)
        raise ValueError(
            f"{chunk.path}:{line}: not UTF-8 ({e.reason} at byte {chunk.start + e.start}); convert the file "
            "to UTF-8 (e.g. iconv -t utf-8)"
        ) from None


def text_documents(chunk: Chunk, delimiter: str, field: str) -> Iterator[str]:
    text = read_chunk(chunk)
    yield from (d for d in (text.split(delimiter) if delimiter else [text]) if d.strip())


def tsv_documents(chunk: Chunk, delimiter: str, field: str) -> Iterator[tuple[str, str]]:
    for i, line in _lines(chunk):
        source, tab, target = line.partition("\t")
        if not tab:
            raise ValueError(f"{_where(chunk, i)}: expected 'source<TAB>target', found no tab; fix or remove the line")
        yield source, target


def jsonl_documents(chunk: Chunk, delimiter: str, field: str) -> Iterator[str]:
    for i, line in _lines(chunk):
        if text := record_text(line, field, lambda i=i: _where(chunk, i)):
            yield text


def _lines(chunk: Chunk) -> Iterator[tuple[int, str]]:
    """(index, line) of the chunk's non-blank lines."""
    for i, line in enumerate(read_chunk(chunk).split("\n")):
        line = line.rstrip("\r")
        if line.strip():
            yield i, line


def json_records(chunk: Chunk) -> Iterator[tuple[str, object]]:
    """('file:line', its parsed JSON) of each non-blank line of a chunk."""
    first = line_number(chunk.path, chunk.start)
    for i, line in _lines(chunk):
        where = f"{chunk.path}:{first + i}"
        yield where, _parsed(line, lambda where=where: where)


def _parsed(line: str, where: Callable[[], str]):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where()}: not a JSON object ({e.msg}); fix or remove the line") from None


def record_text(line: str, field: str, where: Callable[[], str]) -> str:
    """The string `field` of one JSON line ("" when blank); ValueError naming `where()` ('file:line') and the fix."""
    record = _parsed(line, where)
    value = record.get(field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"{where()}: no string field {field!r} (the line has: {keys}); pass --field=NAME of the text field, or "
            "fix the line"
        )
    return value if value.strip() else ""


def in_valid_split(text: str, fraction: float) -> bool:
    """Whether a document goes to the valid split: blake2b(its text) / 2^64 < fraction, a pure function of the text
    (of how `run.py prepare` chunks the inputs and of its workers too)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64
