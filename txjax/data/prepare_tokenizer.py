"""The tokenizers `run.py prepare` builds from its inputs, one table keyed by kind (RECIPES; --tokenizer=KIND):

  char           the inputs' characters (a first pass over all of them) + pad/bos/eos
  byte           UTF-8 bytes, nothing to learn
  sentencepiece  `vocab_size` pieces trained on the lines of about `sample_mb` of documents, with byte fallback
  bpe            byte-level BPE (GPT-2's pipeline, Hugging Face `tokenizers`) of `vocab_size` ids trained on about
                 `sample_mb` of documents; saved as the byte_bpe kind (vocab.json + merges.txt)
The samples are documents from chunks spread evenly over the inputs. A tokenizer of a workdir (its path) is used as
it is (txjax.data.prepare).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from txjax.data import readers
from txjax.data import tokenizers as tok_lib

BATCH_CHARS = 1 << 22  # characters of documents handled at once: a chunk of any size is read in such batches


class TokenizerInputs(NamedTuple):
    """What a tokenizer is built from: the chunks of the inputs, how to read them, and a map over chunks (a pool's
    imap, or map) with its progress bar."""

    chunks: list
    fmt: str
    delimiter: str
    field: str
    chunk_bytes: int
    run: Callable
    bar: Callable


class Kind(NamedTuple):
    build: Callable[[TokenizerInputs, int, float], tok_lib.Tokenizer]  # (source, vocab_size, sample_mb) -> tokenizer
    trained: bool  # reads --vocab_size and --sample_mb


def texts(documents) -> list[str]:
    """Every text of documents (both sides of a pair)."""
    return [t for d in documents for t in (d if isinstance(d, tuple) else (d,))]


def batches(documents: Iterator, chars: int = BATCH_CHARS) -> Iterator[list]:
    """Documents in lists of about `chars` characters, so that a chunk of any size is held a batch at a time."""
    batch, size = [], 0
    for d in documents:
        batch.append(d)
        size += sum(map(len, d)) if isinstance(d, tuple) else len(d)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def closing(bar, results):
    """`results`, closing the progress bar after the last one or at an error (so an error line starts a line)."""
    with bar:
        yield from results


def _char(source: TokenizerInputs, vocab_size: int, sample_mb: float) -> tok_lib.CharTokenizer:
    """The characters of every document (a first pass over the inputs), with pad/bos/eos."""
    present = np.zeros(0x110000, bool)
    bar = source.bar("characters")
    tasks = [(c, source.fmt, source.delimiter, source.field) for c in source.chunks]
    for chunk, codes in zip(source.chunks, closing(bar, source.run(chunk_codes, tasks))):
        present[codes] = True
        bar.update(chunk.nbytes)
    return tok_lib.CharTokenizer([chr(c) for c in np.flatnonzero(present)], specials=True)


def chunk_codes(task) -> np.ndarray:
    """The code points in a chunk's documents (a worker's task)."""
    chunk, fmt, delimiter, field = task
    present = np.zeros(0x110000, bool)
    for batch in batches(readers.documents(chunk, fmt, delimiter, field)):
        present[np.frombuffer("".join(texts(batch)).encode("utf-32-le", "surrogatepass"), np.uint32)] = True
    return np.flatnonzero(present)


def sample(source: TokenizerInputs, sample_mb: float) -> list[str]:
    """The documents of about sample_mb of chunks spread evenly over the inputs (of each chunk, its documents up to
    chunk_bytes characters: all of a byte range, part of a whole compressed file)."""
    sizes = np.array([c.nbytes for c in source.chunks])
    wanted = max(1, min(len(source.chunks), math.ceil(sample_mb * 2**20 / max(sizes.mean(), 1))))
    picked = np.unique(np.linspace(0, len(source.chunks) - 1, wanted).round().astype(int))
    out = []
    for i in picked:
        size = 0
        for text in texts(readers.documents(source.chunks[i], source.fmt, source.delimiter, source.field)):
            out.append(text)
            size += len(text)
            if size >= source.chunk_bytes:
                break
    if not out:
        raise ValueError("no documents in the inputs: they are empty (or blank)")
    return out


def _sentencepiece(source: TokenizerInputs, vocab_size: int, sample_mb: float) -> tok_lib.SentencePieceTokenizer:
    """SentencePiece trained on the lines of the sample; with byte fallback, so that characters the sample lacks
    encode as their UTF-8 bytes."""
    lines = [line for text in sample(source, sample_mb) for line in text.split("\n") if line.strip()]
    if not lines:
        raise ValueError("no documents in the inputs: they are empty (or blank)")
    try:
        return tok_lib.SentencePieceTokenizer.train(lines, vocab_size, byte_fallback=True)
    except RuntimeError as e:
        raise ValueError(
            f"SentencePiece could not train {vocab_size} pieces on the sample ({e}); lower --vocab_size"
        ) from None


def _bpe(source: TokenizerInputs, vocab_size: int, sample_mb: float) -> tok_lib.ByteLevelBPETokenizer:
    """Byte-level BPE trained on the documents of the sample (every byte encodes: nothing is out of vocabulary)."""
    return tok_lib.ByteLevelBPETokenizer.train(sample(source, sample_mb), vocab_size)


RECIPES = {
    "char": Kind(_char, trained=False),
    "byte": Kind(lambda source, vocab_size, sample_mb: tok_lib.ByteTokenizer(), trained=False),
    "sentencepiece": Kind(_sentencepiece, trained=True),
    "bpe": Kind(_bpe, trained=True),
}
