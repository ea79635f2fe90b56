"""Reading data files, with one-line errors that say the absolute path and the fix."""

from __future__ import annotations

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
    return resolve_path(path).read_text(encoding="utf-8")


def read_tsv(path: PathLike) -> tuple[list[str], list[str]]:
    """`source<TAB>target` lines -> (sources, targets); blank lines are skipped.

    A line without a tab raises ValueError naming the file and line number.
    """
    p = resolve_path(path)
    sources, targets = [], []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            src, tab, tgt = line.partition("\t")
            if not tab:
                raise ValueError(f"{p}:{lineno}: expected 'source<TAB>target', found no tab")
            sources.append(src)
            targets.append(tgt)
    return sources, targets


def iter_fields(paths: list[PathLike]) -> Iterator[str]:
    """Every tab-separated field of every line of `paths` (plain text files give whole lines)."""
    for path in paths:
        with resolve_path(path).open(encoding="utf-8") as f:
            for line in f:
                for field in line.rstrip("\r\n").split("\t"):
                    if field:
                        yield field
