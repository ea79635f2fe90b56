"""A config field's metadata, declared where the field is (`setting()`), and the readers of one section's fields.

Each setting of a config section is one dataclass field: its default, its range (a number) or choices (a string),
whether a resumed run may change it (else it is refused: txjax.training.resume), and the settings that read it
(`ReadBy`: a field another setting leaves unread is refused when set, txjax.unread). txjax.sections.schema derives
base_config's values, the checks and the policies from these, so no second list names a field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any, NamedTuple


class Range(NamedTuple):
    """Whether a number is in range, and the range in words (NaN is in no range)."""

    ok: Callable[[Any], bool]
    words: str


def at_least(lo: float, note: str = "") -> Range:
    return Range(lambda v: v >= lo, f">= {lo}{note}")


def within(lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> Range:
    def ok(v):
        return (lo < v if open_lo else lo <= v) and (v < hi if open_hi else v <= hi)

    return Range(ok, f"in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}")


class ReadBy(NamedTuple):
    """The field is read only where another setting (`setting`: "section.field", "family", or "data.form": the form
    the family reads data.kind in, txjax.data.kinds) takes one of `values` (or passes `values`, a predicate); `why`
    says why the others leave it unread."""

    setting: str
    values: tuple | Callable[[Any], bool]
    why: str

    def reads(self, value) -> bool:
        return self.values(value) if callable(self.values) else value in self.values


def setting(
    default,
    *,
    bounds: Range | None = None,
    choices: Collection | None = None,
    resume: bool = True,
    read_by: tuple[ReadBy, ...] = (),
):
    """A section's field: `resume` False when a resumed run may not change it (what batch k is, what the
    optimizer state holds); `read_by`: the settings it needs, all of them (none: every run reads it)."""
    meta = {"bounds": bounds, "choices": choices, "resume": resume, "read_by": read_by}
    return dataclasses.field(default=default, metadata=meta)


def resumable(field: dataclasses.Field) -> bool:
    """Whether a resumed run may change the field (a field without setting()'s metadata may not: ModelConfig's)."""
    return field.metadata.get("resume", False)
