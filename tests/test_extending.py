"""docs/extending.md, the map of where a new piece goes, points at files and names that exist: a renamed file,
function or list fails here instead of leaving the map stale."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"


def quoted() -> list[str]:
    """The page's `code` spans, a call's parentheses dropped (`direct()`)."""
    return [span.removesuffix("()") for span in re.findall(r"`([^`]+)`", PAGE.read_text())]


def test_every_path_on_the_map_exists():
    paths = [s for s in quoted() if "/" in s and " " not in s and "NAME" not in s]  # NAME: the new file's name
    assert len(paths) > 20
    assert [p for p in paths if not (REPO / p).exists()] == []


def test_every_name_on_the_map_is_in_the_code():
    code = "\n".join(p.read_text() for d in ("txjax", "tests") for p in (REPO / d).rglob("*.py"))
    names = [s for s in quoted() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", s) and "/" not in s]
    assert len(names) > 30
    missing = [n for n in names if not all(re.search(rf"\b{part}\b", code) for part in n.split("."))]
    assert missing == []
