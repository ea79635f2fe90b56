"""Greedy first-fit packing of items (documents, or (source, target) pairs) into fixed-capacity rows; no item is
ever split."""

from __future__ import annotations

import numpy as np


def first_fit(
    lengths_Ex2: np.ndarray, capacity: tuple[int, ...], max_rows: int | None = None, window: int = 64
) -> list[list[int]]:
    """Puts each item, in order, into the first row where all its lengths still fit.

    lengths_Ex2[i] = (source length, target length) of item i, each <= its capacity (or, with a 1-tuple capacity,
    the one length of a document). With max_rows, items that fit
    in none of the rows are left out. With max_rows=None a new row opens whenever none of the last `window` rows
    fits (older rows are closed, which keeps this linear), so every item is placed. Returns the rows as lists of item
    indices (items keep their order inside a row).
    """
    lengths_Ex2 = np.asarray(lengths_Ex2, dtype=np.int64).reshape(-1, len(capacity))
    cap = np.asarray(capacity, dtype=np.int64)
    if (lengths_Ex2 > cap).any():
        raise ValueError(f"an item is longer than the row capacity {tuple(capacity)}")
    limit = len(lengths_Ex2) if max_rows is None else max_rows
    free_Bx2 = np.empty((max(limit, 1), len(capacity)), dtype=np.int64)  # room left in each open row
    rows: list[list[int]] = []
    for i, need in enumerate(lengths_Ex2):
        first = 0 if max_rows is not None else max(0, len(rows) - window)
        fits_B = (free_Bx2[first : len(rows)] >= need).all(axis=1)
        if fits_B.any():
            r = first + int(fits_B.argmax())
        elif len(rows) < limit:
            r = len(rows)
            rows.append([])
            free_Bx2[r] = cap
        else:
            continue
        rows[r].append(i)
        free_Bx2[r] -= need
    return rows
