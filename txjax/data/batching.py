"""Batch assembly (fixed shapes, the keys of txjax/families), deterministic rngs and a background prefetcher.

segment_ids: 0 = padding, 1..n = sequence number inside a (possibly packed) row; positions restart at 0 per segment.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

SPLITS = ("train", "valid", "test")  # the splits a run reads (a dataset serves train and valid, some test)

Batch = dict[str, np.ndarray]


def batch_rng(seed: int, k: int) -> np.random.Generator:
    """The rng of batch k: batch k is a pure function of (seed, k)."""
    return np.random.default_rng((seed, k))


def require_ids(tokenizer, *names: str) -> list[int]:
    """The tokenizer's special ids `names` (e.g. 'bos_id', 'eos_id'); ValueError if it has none."""
    ids = [getattr(tokenizer, n) for n in names]
    if any(i is None for i in ids):
        raise ValueError(
            f"this {tokenizer.kind} tokenizer has no {'/'.join(names)}; build it with specials "
            "(e.g. CharTokenizer(..., specials=True)) for seq2seq or synthetic tasks"
        )
    return ids


def lm_batch(sequences: Sequence[np.ndarray], loss_starts: Sequence[int], length: int, pad_id: int) -> Batch:
    """LM rows from whole sequences: inputs = seq[:-1], targets = seq[1:] (one segment per row).

    weights are 1 on targets at index >= loss_starts[b] (e.g. only the answer of a task) and 0 on padding.
    Each sequence must have at most length + 1 tokens; an empty one makes an all-padding row.
    """
    B = len(sequences)
    tokens_BxL1 = np.full((B, length + 1), pad_id, dtype=np.int32)
    n_B = np.array([max(len(s) - 1, 0) for s in sequences])  # predicted tokens per row
    for b, s in enumerate(sequences):
        tokens_BxL1[b, : len(s)] = s
    pos_L = np.arange(length)
    valid_BxL = pos_L[None, :] < n_B[:, None]
    return {
        "inputs": np.where(valid_BxL, tokens_BxL1[:, :-1], pad_id).astype(np.int32),
        "targets": tokens_BxL1[:, 1:],
        "weights": (valid_BxL & (pos_L[None, :] >= np.asarray(loss_starts)[:, None])).astype(np.float32),
        "positions": np.where(valid_BxL, pos_L[None, :], 0).astype(np.int32),
        "segment_ids": valid_BxL.astype(np.int32),
    }


def packed_lm_rows(rows: Sequence[Sequence[np.ndarray]], length: int, pad_id: int, masks=None) -> Batch:
    """LM rows of whole pieces side by side: piece s of a row (tokens t, n + 1 of them) is segment s + 1, inputs
    t[:-1], targets t[1:], positions 0..n-1. weights: 1 on every target, or the piece's mask of its tokens (bool[n + 1],
    masks[b][s]) read at the targets; 0 on padding."""
    R = len(rows)
    out = {k: np.zeros((R, length), np.int32) for k in ("inputs", "targets", "positions", "segment_ids")}
    out["inputs"][:], out["targets"][:] = pad_id, pad_id
    out["weights"] = np.zeros((R, length), np.float32)
    for b, pieces in enumerate(rows):
        at = 0
        for s, t in enumerate(pieces):
            n = len(t) - 1
            out["inputs"][b, at : at + n], out["targets"][b, at : at + n] = t[:-1], t[1:]
            out["positions"][b, at : at + n], out["segment_ids"][b, at : at + n] = np.arange(n), s + 1
            out["weights"][b, at : at + n] = 1.0 if masks is None else masks[b][s][1:]
            at += n
    return out


def _place(pieces: Sequence[np.ndarray], tokens_row, positions_row=None, segments_row=None) -> None:
    """Writes pieces side by side at the start of a row; positions restart at 0 and segments count from 1."""
    if not pieces:
        return
    lengths = [len(p) for p in pieces]
    n = sum(lengths)
    tokens_row[:n] = np.concatenate(pieces)
    if positions_row is not None:
        positions_row[:n] = np.concatenate([np.arange(m) for m in lengths])
        segments_row[:n] = np.repeat(np.arange(1, len(pieces) + 1), lengths)


def seq2seq_batch(
    rows: Sequence[Sequence[int]],
    sources: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    src_len: int,
    tgt_len: int,
    pad_id: int,
    bos_id: int,
) -> Batch:
    """Seq2seq rows: row b holds examples rows[b] (several when packed, none for a padding row) side by side.

    targets[i] already ends with EOS; tgt_inputs = BOS + target[:-1] per segment (teacher forcing, shifted right).
    """
    B = len(rows)
    out = {k: np.zeros((B, src_len), np.int32) for k in ("src", "src_positions", "src_segment_ids")}
    out |= {
        k: np.zeros((B, tgt_len), np.int32) for k in ("tgt_inputs", "tgt_targets", "tgt_positions", "tgt_segment_ids")
    }
    out["src"][:] = pad_id
    out["tgt_inputs"][:] = pad_id
    out["tgt_targets"][:] = pad_id
    for b, row in enumerate(rows):
        tgts = [targets[i] for i in row]
        _place([sources[i] for i in row], out["src"][b], out["src_positions"][b], out["src_segment_ids"][b])
        _place(tgts, out["tgt_targets"][b], out["tgt_positions"][b], out["tgt_segment_ids"][b])
        _place([np.concatenate([[bos_id], t[:-1]]) for t in tgts], out["tgt_inputs"][b])
    out["tgt_weights"] = (out["tgt_segment_ids"] > 0).astype(np.float32)
    return out


def chunk_rows(rows: Sequence[Sequence[int]], batch_size: int) -> Iterator[list[Sequence[int]]]:
    """Rows in groups of batch_size; the last group is filled up with empty (all-padding, weight 0) rows."""
    for start in range(0, len(rows), batch_size):
        group = list(rows[start : start + batch_size])
        yield group + [()] * (batch_size - len(group))


def prefetch(iterator: Iterable, size: int = 2) -> Iterator:
    """Yields the items of `iterator`, produced up to `size` ahead in a background thread.

    An exception in the producer is re-raised in the consumer. Leaving the loop early (break, an exception, close())
    stops the producer and waits for it to finish the item it is building: a thread still inside jax or numpy when
    the interpreter exits is killed there by a forced unwind, which aborts the process ("terminate called after
    throwing an instance of ''", status 134).
    """
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in iterator:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:  # re-raised in the consumer
            put((done, e))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
        thread.join()
