"""Reading prepared shards (`run.py prepare`, txjax.data.prepare): language-model batches through grain.

A split of DIR is one flat token stream: its shards, of which a batch reads only the tokens it needs (positioned
reads; nothing of the corpus stays in memory, see TokenStream), and `{stream}-documents.npy` (memory-mapped), where
each document starts. Every document ends with EOS (when the tokenizer has one).

Training batch k is a pure function of (seed, k), built row by row through a grain MapDataset, so a process builds
only its rows (`rows`) and a resumed run, under any process count, reads the same global batches without saving
any iterator state:
  windows (pack=False, nanoGPT): global row r = k B + b is the L + 1 tokens at a uniform random start
      a_r ~ U[0, N - L) (grain random_map, rng from (seed, r)); inputs x[a:a+L], targets x[a+1:a+L+1]; rows cross
      document boundaries, as nanoGPT's do.
  packed (pack=True): each document (tokens + EOS, n tokens) is cut into ceil((n - 1) / L) pieces of at most L + 1
      tokens (consecutive pieces share one token, so every token but the document's first is a target once).
      The pieces are shuffled by grain (a fresh permutation per epoch, no permutation array in memory); batch k
      first-fit packs the C = ceil(B * pieces_per_row) pieces at positions [kC, (k+1)C) of that order into B rows
      (pieces that fit no row are skipped). Each piece is one segment: segment ids 1..n along the row, positions
      restarting at 0, so with the model's segment mask no token attends across documents.
Conversations (prepare --chat) carry a second stream, `mask`, read with the tokens: a target's weight is its mask
(1 on the assistant's tokens), in windows, packed rows and evaluation alike.
Evaluation reads the valid split in order, as consecutive windows of L targets, in fixed-shape [B, L] batches
(the last padded with weight-0 rows); with pack=True the segments and positions restart at each document and a
target in the next document gets weight 0.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import grain
import numpy as np

from txjax.data.batching import Batch, packed_lm_rows
from txjax.data.packing import first_fit
from txjax.data.tokenizer_base import TOKENIZER_DIR, Tokenizer
from txjax.data.tokenizers import load_tokenizer

INDEX_FILE = "index.json"


def shard_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def fingerprint(tokenizer: Tokenizer) -> str:
    """SHA-256 of the tokenizer's saved files (tokenizer.json and its model files): equal iff same tokenizer."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as directory:
        tokenizer.save(directory)
        for path in sorted(Path(directory).rglob("*")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def read_index(directory: str | os.PathLike) -> dict:
    """DIR/index.json; FileNotFoundError with the fix when DIR is not (or not yet) a prepared folder."""
    path = Path(directory).expanduser().resolve() / INDEX_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no shards at {path.parent} ({INDEX_FILE} not found; a {path.parent.name}.partial-* folder is an "
            f"interrupted prepare): run `python run.py prepare --input=FILES --output={path.parent}`"
        )
    return json.loads(path.read_text())


def load_shards_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """The tokenizer a prepared folder was tokenized with (DIR/tokenizer/)."""
    read_index(directory)
    return load_tokenizer(Path(directory).expanduser().resolve() / TOKENIZER_DIR)


def check_shards_tokenizer(directory: str | os.PathLike, index: dict, tokenizer: Tokenizer) -> None:
    """ValueError unless `tokenizer` is the one the shards were tokenized with."""
    saved = index["tokenizer"]
    if saved["fingerprint"] != fingerprint(tokenizer):
        raise ValueError(
            f"{Path(directory) / INDEX_FILE}: the shards were tokenized by another tokenizer ({saved['kind']}, "
            f"{saved['vocab_size']} ids) than this run's ({tokenizer.kind}, {tokenizer.vocab_size} ids): prepare "
            "them with --tokenizer=THIS_WORKDIR, or train in a new --workdir (it takes the shards' tokenizer)"
        )


class TokenStream:
    """One stream of one split: its shards as one array of N tokens, and documents' starts (int64[D + 1]).

    Tokens are read with positioned reads (os.pread) of the bytes a batch needs: unlike a memory map, whose pages
    (and the kernel's readahead around them) stay in the process's resident memory once touched, nothing of the
    corpus stays resident. At most MAX_OPEN shard files are open at once (a large corpus has thousands).
    """

    MAX_OPEN = 64

    def __init__(self, directory: str | os.PathLike, index: dict, split: str, name: str = "tokens"):
        directory = Path(directory).expanduser().resolve()
        self.dtype = np.dtype(index.get("dtypes", {}).get(name, index["dtype"]))
        info = index["splits"][split]["streams"][name]
        self.paths = [directory / shard["file"] for shard in info["shards"]]
        for path, shard in zip(self.paths, info["shards"]):
            size, expected = (path.stat().st_size if path.is_file() else 0), shard["tokens"] * self.dtype.itemsize
            if size != expected:
                raise ValueError(
                    f"{path}: {size} bytes where {INDEX_FILE} says {shard['tokens']} tokens ({expected} bytes): the "
                    f"shard is truncated or was changed; delete {directory} and run `run.py prepare` again"
                )
        self.shard_starts = np.cumsum([0] + [shard["tokens"] for shard in info["shards"]])
        self._open: OrderedDict[int, int] = OrderedDict()  # shard -> file descriptor, the least recently used first
        self._lock = threading.Lock()  # a reader thread may not close a file another one is reading
        documents = directory / split / f"{name}-documents.npy"
        self.doc_starts = np.load(documents, mmap_mode="r")
        if len(self.doc_starts) != index["splits"][split]["documents"] + 1 or self.doc_starts[-1] != len(self):
            raise ValueError(f"{documents} does not match {INDEX_FILE}; delete {directory} and prepare again")

    def __len__(self) -> int:
        return int(self.shard_starts[-1])

    def __del__(self):
        for fd in getattr(self, "_open", {}).values():
            os.close(fd)

    def _file(self, shard: int) -> int:
        if shard in self._open:
            self._open.move_to_end(shard)
        else:
            if len(self._open) >= self.MAX_OPEN:
                os.close(self._open.popitem(last=False)[1])
            self._open[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return self._open[shard]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream as int32 (a read may span shards)."""
        shard = int(np.searchsorted(self.shard_starts, start, "right")) - 1
        pieces = []
        while start < stop:
            offset = start - int(self.shard_starts[shard])
            count = min(stop, int(self.shard_starts[shard + 1])) - start
            with self._lock:
                data = os.pread(self._file(shard), count * self.dtype.itemsize, offset * self.dtype.itemsize)
            pieces.append(np.frombuffer(data, self.dtype))
            start += count
            shard += 1
        return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)

    def document_of(self, positions: np.ndarray) -> np.ndarray:
        """The document each stream position belongs to."""
        return np.searchsorted(self.doc_starts, positions, "right") - 1


class _PieceSpans:
    """grain RandomAccessDataSource: piece p (documents cut into pieces of at most L + 1 tokens) as (start, stop)."""

    def __init__(self, doc_starts: np.ndarray, seq_len: int, block: int = 1 << 20):
        self.doc_starts, self.seq_len = doc_starts, seq_len
        self.piece_starts = np.zeros(len(doc_starts), np.int64)  # 8 bytes per document, built a block at a time
        for a in range(0, len(doc_starts) - 1, block):
            n_E = np.diff(doc_starts[a : a + block + 1])  # a document of n tokens: ceil((n - 1) / L) pieces
            pieces_E = np.maximum(n_E - 1 + seq_len - 1, 0) // seq_len
            self.piece_starts[a + 1 : a + 1 + len(n_E)] = self.piece_starts[a] + np.cumsum(pieces_E)

    def __len__(self) -> int:
        return int(self.piece_starts[-1])

    def __getitem__(self, p: int) -> tuple[int, int]:
        d = int(np.searchsorted(self.piece_starts, p, "right")) - 1
        start = int(self.doc_starts[d]) + (p - int(self.piece_starts[d])) * self.seq_len
        return start, min(start + self.seq_len + 1, int(self.doc_starts[d + 1]))


class ShardLMDataset:
    """One split of a prepared folder as language-model batches: windows, or packed documents (module docstring)."""

    def __init__(
        self, directory: str | os.PathLike, tokenizer: Tokenizer, seq_len: int, split: str = "train", pack=False
    ):
        self.directory = Path(directory).expanduser().resolve()
        index = read_index(self.directory)
        if index["kind"] == "pairs":
            raise ValueError(f"{self.directory} holds TSV pairs: train on them with --config.family=encoder_decoder")
        check_shards_tokenizer(self.directory, index, tokenizer)
        self.tokenizer, self.seq_len, self.split, self.pack = tokenizer, seq_len, split, pack
        self.stream = TokenStream(self.directory, index, split)
        # conversations (prepare --chat): the loss only on targets the mask marks (the assistant's tokens)
        self.mask = TokenStream(self.directory, index, split, "mask") if index["kind"] == "chat" else None
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        if len(self.stream) < seq_len + 1:
            raise ValueError(
                f"{self.directory}: the {split} split has {len(self.stream)} tokens, fewer than seq_len + 1 = "
                f"{seq_len + 1}; lower --config.data.seq_len or prepare more text"
            )
        self._pipelines: dict[int, grain.MapDataset] = {}
        if pack:
            self._spans = _PieceSpans(self.stream.doc_starts, seq_len)
            mean = (len(self.stream) - len(self.stream.doc_starts) + 1) / len(self._spans)  # targets per piece
            self.pieces_per_row = max(1.0, 0.9 * seq_len / mean)

    def _pipeline(self, seed: int) -> grain.MapDataset:
        """Element r: the start of window r (windows), or the span of the r-th piece of the shuffled order (packed)."""
        seed %= 2**32  # grain's seeds are 32-bit
        if seed not in self._pipelines:
            if self.pack:
                self._pipelines[seed] = grain.MapDataset.source(self._spans).shuffle(seed=seed)
            else:
                high = len(self.stream) - self.seq_len
                self._pipelines[seed] = grain.MapDataset.range(2**62).random_map(
                    lambda _, rng: int(rng.integers(0, high)), seed=seed
                )
        return self._pipelines[seed]

    def batch(self, seed: int, k: int, batch_size: int, rows: slice = slice(None)) -> Batch:
        """Training batch k: a pure function of (seed, k); only its `rows` (one process's share) are read."""
        ds, B, L = self._pipeline(seed), batch_size, self.seq_len
        if not self.pack:
            starts = [ds[k * B + b] for b in range(B)[rows]]
            tokens_RxL1 = np.stack([self.stream.read(a, a + L + 1) for a in starts])
            ones_RxL = np.ones((len(starts), L), np.int32)
            positions_RxL = np.broadcast_to(np.arange(L, dtype=np.int32), ones_RxL.shape).copy()
            weights_RxL = (
                np.stack([self.mask.read(a + 1, a + L + 1) for a in starts]) if self.mask is not None else ones_RxL
            )
            return {
                "inputs": tokens_RxL1[:, :-1],
                "targets": tokens_RxL1[:, 1:],
                "weights": weights_RxL.astype(np.float32),
                "positions": positions_RxL,
                "segment_ids": ones_RxL,
            }
        count = math.ceil(B * self.pieces_per_row)
        spans = [ds[k * count + c] for c in range(count)]
        lengths_Ex1 = np.array([[stop - start - 1] for start, stop in spans])
        packed = first_fit(lengths_Ex1, (L,), max_rows=B)
        packed = (packed + [[]] * (B - len(packed)))[rows]
        masks = [[self.mask.read(*spans[i]) for i in row] for row in packed] if self.mask is not None else None
        return packed_lm_rows([[self.stream.read(*spans[i]) for i in row] for row in packed], L, self.pad_id, masks)

    def num_eval_batches(self, batch_size: int) -> int:
        return math.ceil(math.ceil((len(self.stream) - 1) / self.seq_len) / batch_size)

    def eval_batches(self, batch_size: int, max_batches: int | None = None) -> Iterator[Batch]:
        """The whole split (or its first max_batches batches) in order, read batch by batch."""
        num_batches = self.num_eval_batches(batch_size)
        for j in range(num_batches if max_batches is None else min(num_batches, max_batches)):
            yield self._eval_batch(j * batch_size * self.seq_len, batch_size)

    def _eval_batch(self, first: int, batch_size: int) -> Batch:
        """B consecutive windows of L targets from stream position `first`: each target once, padding weight 0."""
        L, N = self.seq_len, len(self.stream)
        tokens = np.full(batch_size * L + 1, self.pad_id, np.int32)
        read = self.stream.read(first, min(first + batch_size * L + 1, N))
        tokens[: len(read)] = read
        pos_BxL = first + np.arange(batch_size * L).reshape(batch_size, L)
        valid_BxL = pos_BxL < N - 1
        if self.pack:  # segments restart at each document; a target in the next document does not count
            doc_BxL = self.stream.document_of(np.minimum(pos_BxL, N - 1))
            weights_BxL = valid_BxL & (self.stream.document_of(np.minimum(pos_BxL + 1, N - 1)) == doc_BxL)
            segments_BxL = np.where(valid_BxL, doc_BxL - doc_BxL[:, :1] + 1, 0)
            starts_BxL = np.maximum(np.asarray(self.stream.doc_starts)[doc_BxL], pos_BxL[:, :1])
            positions_BxL = np.where(valid_BxL, pos_BxL - starts_BxL, 0)
        else:
            weights_BxL, segments_BxL = valid_BxL, valid_BxL.astype(np.int32)
            positions_BxL = np.where(valid_BxL, pos_BxL - pos_BxL[:, :1], 0)
        if self.mask is not None:  # conversations: the targets the mask marks
            marked = np.zeros(batch_size * L, bool)
            read = self.mask.read(first + 1, min(first + batch_size * L + 1, N))
            marked[: len(read)] = read
            weights_BxL = weights_BxL & marked.reshape(batch_size, L)
        return {
            "inputs": np.where(valid_BxL, tokens[:-1].reshape(batch_size, L), self.pad_id),
            "targets": np.where(weights_BxL, tokens[1:].reshape(batch_size, L), self.pad_id),
            "weights": weights_BxL.astype(np.float32),
            "positions": positions_BxL.astype(np.int32),
            "segment_ids": segments_BxL.astype(np.int32),
        }
