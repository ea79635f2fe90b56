"""The documents of input files, read in byte ranges (chunks) that parallel workers can take one each.

Formats:
  text    plain UTF-8: the whole file is one document, or (with a delimiter, e.g. "\\n\\n") documents are the
          pieces between delimiters
  jsonl   one JSON object per line; the document is its `field` (a string)
  tsv     `source<TAB>target` lines (the translation task): each line is one document of two texts
Empty (whitespace-only) documents are skipped. A chunk never cuts a document: it ends right after a delimiter
(text) or a newline (jsonl, tsv). Bad input raises ValueError (FileNotFoundError) naming the file (and line) and
the fix: one line, as `config.user_errors` reports it.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

FORMATS = ("text", "jsonl", "tsv")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv"}


class Chunk(NamedTuple):
    """Bytes [start, stop) of input file `path`."""

    path: str
    start: int
    stop: int


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Absolute paths of the files that `patterns` (paths or globs) name, in order, each once; a one-line error for
    a pattern that names nothing, a folder, or a file that cannot be read."""
    paths: dict[Path, None] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise FileNotFoundError(
                f"--input={pattern}: no such file (pass existing files or a glob that matches some)"
            )
        for match in matches:
            path = Path(match).resolve()
            if path.is_dir():
                raise ValueError(f"--input: {path} is a folder; pass its files, e.g. --input='{path}/*.txt'")
            if not os.access(path, os.R_OK):
                raise ValueError(f"--input: {path} cannot be read (permission denied); fix its permissions")
            paths[path] = None
    return list(paths)


def infer_format(paths: list[Path]) -> str:
    """The format the file names say (.jsonl/.json, .tsv, else text); ValueError when they disagree."""
    formats = {_EXTENSIONS.get(p.suffix, "text") for p in paths}
    if len(formats) > 1:
        raise ValueError(f"the inputs mix formats ({', '.join(sorted(formats))}); prepare each format on its own")
    return formats.pop()


def separator(fmt: str, delimiter: str) -> bytes | None:
    """What a chunk may end after: the delimiter, a newline, or None (a whole file is one document)."""
    if fmt != "text":
        return b"\n"
    return delimiter.encode("utf-8") if delimiter else None


def plan_chunks(paths: list[Path], sep: bytes | None, chunk_bytes: int) -> list[Chunk]:
    """Each file cut into chunks of about `chunk_bytes`, each ending right after `sep` (or at the file's end)."""
    chunks = []
    for path in paths:
        size = path.stat().st_size
        start = 0
        with path.open("rb") as f:
            while start < size:
                stop = size if sep is None else _boundary(f, start + chunk_bytes, sep, size)
                chunks.append(Chunk(str(path), start, stop))
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


def documents(chunk: Chunk, fmt: str, delimiter: str = "", field: str = "text") -> Iterator[str | tuple[str, str]]:
    """The non-empty documents of a chunk, in order: strings, or (source, target) pairs for tsv."""
    text = read_chunk(chunk)
    if fmt == "text":
        yield from (d for d in (text.split(delimiter) if delimiter else [text]) if d.strip())
        return
    for i, line in enumerate(text.split("\n")):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if fmt == "tsv":
            source, tab, target = line.partition("\t")
            if not tab:
                raise ValueError(
                    f"{_where(chunk, i)}: expected 'source<TAB>target', found no tab; fix or remove the line"
                )
            yield source, target
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{_where(chunk, i)}: not a JSON object ({e.msg}); fix or remove the line") from None
        value = record.get(field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"{_where(chunk, i)}: no string field {field!r} (the line has: {keys}); pass --field=NAME of the "
                "text field, or fix the line"
            )
        if value.strip():
            yield value
