"""Conversations for supervised fine-tuning (data.kind=chat): the loss on the assistant's tokens only.

A conversation is the common `messages` form, one a JSONL line or a Parquet row:
    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
It is rendered with the tokenizer's chat template (txjax.data.hf_tokenizer: the jinja2 rendering of `generate
--chat`) and tokenized as apply_chat_template tokenizes it (special tokens written in the text read as such). A token
is an assistant token when it overlaps the characters of an assistant part (transformers' rule):
  a template with {% generation %} ... {% endgeneration %}: the parts it marks (transformers' assistant mask);
  one without: the characters each assistant turn adds when the conversation is rendered prefix by prefix, from
      messages[:i] with the generation prompt to messages[:i + 1] (the turn's content and end-of-turn marks, the
      header the prompt writes left out); a template that renders earlier turns differently as the conversation
      grows is refused, naming the markers as the fix.
A conversation longer than a row (capacity tokens) is cut at a turn boundary: its longest prefix of whole messages
ending with an assistant turn that fits; one with no assistant token left is dropped. Both are counted.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import grain
import numpy as np

from txjax.data import readers
from txjax.data.batching import chunk_rows, packed_lm_rows
from txjax.data.documents import in_valid_split, json_records
from txjax.data.packing import first_fit

ROLES = ("system", "user", "assistant")
FIELD = "messages"
_FORM = '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}'


class Conversation(NamedTuple):
    where: str  # 'file:line' (JSONL) or 'file (row N)' (Parquet), for error messages
    messages: list[dict]


class Tokens(NamedTuple):
    ids: np.ndarray  # int32[N]: the rendered conversation's tokens
    mask: np.ndarray  # bool[N]: its assistant tokens (the loss is on the targets that are)


def conversation(record, where: str) -> Conversation:
    """One record's messages, checked; ValueError naming `where` and the fix."""
    messages = record.get(FIELD) if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        has = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: no list {FIELD!r} of messages (the record has: {has}); write it as {_FORM}")
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {j} is not {{'role': ..., 'content': '...'}} (found {m!r:.80}); fix it")
        if m["role"] not in ROLES:
            raise ValueError(f"{where}: message {j} has role {m['role']!r}, not one of {', '.join(ROLES)}; fix it")
    return Conversation(where, [{"role": m["role"], "content": m["content"]} for m in messages])


def conversations(chunk: readers.Chunk, fmt: str) -> Iterator[Conversation]:
    """The conversations of a chunk of a JSONL or Parquet file (its `messages` field), in order."""
    if fmt == "jsonl":
        for where, record in json_records(chunk):
            yield conversation(record, where)
    elif fmt == "parquet":
        for where, value in readers.parquet_values(chunk, FIELD):
            yield conversation({FIELD: value}, where)
    else:
        raise ValueError(f"{chunk.path}: conversations are read from .jsonl or .parquet files, not {fmt}; convert it")


def read_conversations(path: str | Path) -> Iterator[Conversation]:
    """The conversations of a JSONL or Parquet file, in order."""
    path = Path(path)
    fmt = readers.format_of(path)
    for chunk in readers.plan_chunks([path], fmt, "", 2**62):
        yield from conversations(chunk, fmt)


def check_chat_inputs(fmt: str, tokenizer, name: str) -> None:
    """`run.py prepare --chat` reads JSONL or Parquet conversations and renders them with the chat template of the
    tokenizer --tokenizer=`name` is (None: a kind of tokenizer, which has none)."""
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"--chat reads conversations from jsonl or parquet files, not --format={fmt}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"--chat renders conversations with a chat template, and --tokenizer={name} has none: pass "
            "--tokenizer=WORKDIR of `run.py import` of a model with one"
        )


def in_valid(messages: list[dict], valid_fraction: float) -> bool:
    """Whether a conversation is in the valid split: that of its messages as JSON (as `run.py prepare` splits)."""
    return in_valid_split(json.dumps(messages, ensure_ascii=False, sort_keys=True), valid_fraction)


def assistant_spans(tokenizer, messages: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
    """(text, spans): the rendered conversation and the [start, stop) characters of its assistant parts."""
    try:
        text, spans = tokenizer.render_chat_spans(messages, add_generation_prompt=False)
        if tokenizer.marks_generation:
            return text, spans
        spans = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = tokenizer.render_chat(messages[:i], add_generation_prompt=True)
                after = tokenizer.render_chat(messages[: i + 1], add_generation_prompt=False)
                if not (after.startswith(before) and text.startswith(after)):
                    raise ValueError(
                        f"the chat template renders turn {i}'s prefix differently inside the whole conversation, so "
                        "its assistant tokens cannot be found turn by turn: mark the assistant's parts in the template "
                        "with {% generation %} ... {% endgeneration %}"
                    )
                spans.append((len(before), len(after)))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return text, spans


def tokens(tokenizer, messages: list[dict], where: str) -> Tokens:
    """The conversation's tokens and its assistant mask (a token overlapping an assistant part is one)."""
    text, spans = assistant_spans(tokenizer, messages, where)
    ids, offsets_Nx2 = tokenizer.encode_offsets(text)
    mask = np.zeros(len(ids), bool)
    for start, stop in spans:
        mask |= (offsets_Nx2[:, 1] > start) & (offsets_Nx2[:, 0] < stop)
    return Tokens(ids, mask)


def fit(tokenizer, c: Conversation, capacity: int) -> tuple[Tokens | None, bool]:
    """(tokens, cut): the whole conversation when it fits `capacity` tokens with an assistant token, else its
    longest prefix ending with an assistant turn that does (cut); (None, False) when none does (dropped)."""
    whole = tokens(tokenizer, c.messages, c.where)
    if len(whole.ids) <= capacity and whole.mask.any():
        return whole, False
    ends = [i + 1 for i, m in enumerate(c.messages) if m["role"] == "assistant" and i + 1 < len(c.messages)]
    for end in reversed(ends):
        part = tokens(tokenizer, c.messages[:end], c.where)
        if len(part.ids) <= capacity and part.mask.any():
            return part, True
    return None, False


def fit_all(tokenizer, conversations, capacity: int, counts: dict) -> list[Tokens]:
    """The conversations that keep an assistant token, each cut to `capacity` tokens (`fit`); counts["cut"] and
    counts["dropped"] count the others."""
    kept = []
    for c in conversations:
        fitted, cut = fit(tokenizer, c, capacity)
        counts["cut"] += cut
        counts["dropped"] += fitted is None
        kept += [fitted] if fitted is not None else []
    return kept


class ChatDataset:
    """One split of a conversations file as LM batches of rows of `seq_len` positions, the weights the assistant mask.

    Each kept conversation (at most seq_len + 1 tokens, `fit`) is one segment: inputs t[:-1], targets t[1:], weight 1
    where the target is an assistant token. A conversation is in the valid split iff `in_valid` says so (as `run.py
    prepare` splits documents). Training batch k is a pure function of (seed, k): the conversations in a fresh
    permutation per epoch (grain), one a row, or with pack=True the next ceil(B * per_row) of them first-fit packed
    into B rows (segment ids 1..n, positions restarting at 0: the model's segment mask keeps them apart; those that
    fit no row are skipped). Evaluation visits every conversation once in file order.
    """

    def __init__(self, path, tokenizer, seq_len: int, split: str, valid_fraction: float, pack: bool = False):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.kind=chat renders conversations with the tokenizer's chat template, and this run's "
                f"{tokenizer.kind} tokenizer has none: fine-tune a model imported with one "
                "(--config.train.init_from=WORKDIR of run.py import)"
            )
        self.path, self.seq_len, self.pack = Path(path), seq_len, pack
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        counts = {"cut": 0, "dropped": 0}
        ours = (c for c in read_conversations(path) if in_valid(c.messages, valid_fraction) == (split == "valid"))
        kept = fit_all(tokenizer, ours, seq_len + 1, counts)
        self.documents, self.masks = [t.ids for t in kept], [t.mask for t in kept]
        self.num_cut, self.num_dropped = counts["cut"], counts["dropped"]
        if self.num_cut or self.num_dropped:
            print(
                f"{self.path} ({split}): conversations cut at a turn boundary to fit data.seq_len={seq_len}: "
                f"{self.num_cut}; dropped (no assistant token fits): {self.num_dropped}",
                file=sys.stderr,
                flush=True,
            )
        if not self.documents:
            raise ValueError(
                f"{self.path}: the {split} split has no conversation with an assistant token within data.seq_len="
                f"{seq_len} ({self.num_dropped} dropped): raise data.seq_len, or give more conversations"
            )
        self.lengths_Ex1 = np.array([[len(d) - 1] for d in self.documents])
        self.per_row = max(1.0, 0.9 * seq_len / self.lengths_Ex1.mean())
        self._orders: dict[int, grain.MapDataset] = {}  # by seed: a fresh permutation each epoch

    def _order(self, seed: int):
        seed %= 2**32  # grain's seeds are 32-bit
        if seed not in self._orders:
            self._orders[seed] = grain.MapDataset.range(len(self.documents)).shuffle(seed=seed)
        return self._orders[seed]

    def __len__(self) -> int:
        return len(self.documents)

    def _rows(self, rows: list[list[int]]):
        return packed_lm_rows(
            [[self.documents[i] for i in row] for row in rows],
            self.seq_len,
            self.pad_id,
            [[self.masks[i] for i in row] for row in rows],
        )

    def batch(self, seed: int, k: int, batch_size: int, rows: slice = slice(None)):
        """Training batch k: a pure function of (seed, k); only its `rows` (one process's share) are built."""
        order = self._order(seed)
        if not self.pack:
            return self._rows([[order[k * batch_size + b]] for b in range(batch_size)[rows]])
        count = math.ceil(batch_size * self.per_row)
        candidates = [order[k * count + c] for c in range(count)]
        packed = first_fit(self.lengths_Ex1[candidates], (self.seq_len,), max_rows=batch_size)
        packed = [[candidates[j] for j in row] for row in packed]
        return self._rows((packed + [[]] * (batch_size - len(packed)))[rows])

    def eval_batches(self, batch_size: int, packed: bool | None = None) -> Iterator:
        """Every conversation once in file order (packed if `packed`, default self.pack); the last batch filled with
        all-padding rows (weight 0)."""
        if self.pack if packed is None else packed:
            rows = first_fit(self.lengths_Ex1, (self.seq_len,))
        else:
            rows = [[i] for i in range(len(self))]
        for group in chunk_rows(rows, batch_size):
            yield self._rows([list(row) for row in group])
