"""Reading data files, with one-line errors that say the absolute path (and line) and the fix."""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from pathlib import Path

PathLike = str | os.PathLike


def resolve_path(path: PathLike, what: str = "data file", flag: str = "--config.data.path") -> Path:
    """Absolute path of an existing file, or FileNotFoundError naming the path looked for and the fix."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p} (pass {flag}=/path/to/file, or create the file)")
    return p


def read_text(path: PathLike) -> str:
    """Whole UTF-8 file as one string (newlines kept)."""
    p = resolve_path(path)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _not_utf8(p) from None


def text_pieces(path: PathLike, piece_chars: int = 1 << 20) -> Iterator[str]:
    """The UTF-8 text of `path` (newlines as read_text gives them) in pieces of `piece_chars` characters or more,
    each but the last ending right after a newline with a non-space character on either side, where the tokenizers
    here start a new token (text.encode_pieces checks it); a file without such a newline is one piece."""
    p = resolve_path(path)
    rest = ""
    with p.open(encoding="utf-8") as f:
        try:
            while chunk := f.read(piece_chars):
                rest += chunk
                cut = _last_cut(rest)
                if cut:
                    yield rest[:cut]
                    rest = rest[cut:]
        except UnicodeDecodeError:
            raise _not_utf8(p) from None
    if rest:
        yield rest


def _last_cut(text: str) -> int:
    """The end of the last newline of `text` between two non-space characters (0: none)."""
    at = len(text) - 1
    while (at := text.rfind("\n", 0, at)) > 0:
        if not (text[at - 1].isspace() or text[at + 1].isspace()):
            return at + 1
    return 0


def _not_utf8(path: Path, block_bytes: int = 1 << 20) -> ValueError:
    """The error for a file that is not UTF-8: its first bad byte, by line and offset (read a block at a time)."""
    decoder, offset, lines = codecs.getincrementaldecoder("utf-8")(), 0, 1
    with path.open("rb") as f:
        while True:
            block = f.read(block_bytes)
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                carried = len(e.object) - len(block)  # the start of a character the block before ended in
                line = lines + e.object.count(b"\n", 0, e.start)
                return ValueError(
                    f"{path}:{line}: byte 0x{e.object[e.start]:02x} at offset {offset - carried + e.start} is not UTF-8"
                    f" ({e.reason}); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8 {path.name} > "
                    f"{path.stem}.utf8{path.suffix})"
                )
            if not block:
                return ValueError(f"{path}: not UTF-8")
            offset, lines = offset + len(block), lines + block.count(b"\n")


def read_tsv(path: PathLike) -> tuple[list[str], list[str]]:
    """`source<TAB>target` lines -> (sources, targets); blank lines are skipped.

    A line without a tab raises ValueError naming the file and line number.
    """
    p = resolve_path(path)
    sources, targets = [], []
    for lineno, line in enumerate(_lines(p), 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        src, tab, tgt = line.partition("\t")
        if not tab:
            raise ValueError(f"{p}:{lineno}: expected 'source<TAB>target', found no tab")
        sources.append(src)
        targets.append(tgt)
    return sources, targets


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        try:
            yield from f
        except UnicodeDecodeError:
            raise _not_utf8(path) from None


def iter_fields(paths: list[PathLike]) -> Iterator[str]:
    """Every tab-separated field of every line of `paths` (plain text files give whole lines)."""
    for path in paths:
        for line in _lines(resolve_path(path)):
            for field in line.rstrip("\r\n").split("\t"):
                if field:
                    yield field
