"""Algorithmic tasks generated in code (copy, reverse, sort, addition, passkey retrieval), as LM or seq2seq batches.

Symbols are decimal digits. A prompt is `max_digits`-bounded: copy/reverse/sort take a string of min_digits..max_digits
digits; add takes two numbers of min_digits..max_digits digits each, written "a+b", and answers str(a + b).
passkey is a long-context task (Mohtashami & Jaggi 2023's passkey retrieval): the prompt is a context of
min_digits..max_digits symbols, random digits with one '+' anywhere in it followed by the PASSKEY_DIGITS digits of the
passkey, and the answer is the passkey; the context is noise besides, so the model must find the '+' wherever it is.
- form='lm':      sequence = BOS prompt '=' answer EOS; inputs/targets are it shifted by one and weights are 1
                  only on the answer and EOS targets, so the LM learns to answer.  L = P + A + 2.
- form='seq2seq': src = prompt EOS, tgt = answer EOS (tgt_inputs = BOS answer).  S = P + 1, T = A + 1.
(P, A: the longest prompt and answer.)  `eval_examples` gives prompts + reference answers for exact match.

Held out means held out: every prompt belongs to one split, by a hash of (task, prompt) in [0, 1):
    [0, 0.05) valid,  [0.05, 0.10) test,  the rest train                     (HELD_OUT)
Training batches draw only train prompts (a draw of another split is drawn again), and a split's eval set holds
`eval_size` distinct prompts of that split, so no eval example is ever trained on and valid and test are disjoint.
Short strings are a small space: of the ten 1-digit strings, the hundred 2-digit ones, ... only about a tenth are
held out (for some lengths none), so the eval sets hold mostly the longer strings, and exact match is reported on
the strings that can be held out. A task whose whole space is too small to hold out eval_size strings gets a
smaller eval set; one with no held-out string at all is an error.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from txjax.data.batching import SPLITS, Batch, batch_rng, chunk_rows, lm_batch, seq2seq_batch
from txjax.data.tokenizers import CharTokenizer

TASKS = ("copy", "reverse", "sort", "add", "passkey")
PASSKEY_DIGITS = 2  # passkey: the answer's digits; chance is 10**-PASSKEY_DIGITS
SEPARATOR = "="
HELD_OUT = {"valid": (0.0, 0.05), "test": (0.05, 0.10)}  # a prompt's hash in [lo, hi): that split; else train
_DRAWS_PER_EXAMPLE = 200  # an eval set stops drawing after eval_size * this (a space too small to fill it)


def split_of(task: str, prompt: str) -> str:
    """The split a prompt belongs to, from the hash of (task, prompt): the same on every machine and run."""
    digest = hashlib.blake2b(f"{task}:{prompt}".encode(), digest_size=8).digest()
    h = int.from_bytes(digest, "big") / 2**64
    return next((split for split, (lo, hi) in HELD_OUT.items() if lo <= h < hi), "train")


def task_tokenizer() -> CharTokenizer:
    """The fixed vocabulary of all tasks: digits, '+', '=' and pad/bos/eos (15 ids)."""
    return CharTokenizer("0123456789+" + SEPARATOR, specials=True)


def _digits(rng: np.random.Generator, length: int, leading_nonzero: bool) -> str:
    d = rng.integers(0, 10, size=length)
    if leading_nonzero and length > 1:
        d[0] = rng.integers(1, 10)
    return "".join(map(str, d))


class SyntheticTask:
    """One task in one form; batch(seed, k, B) is a pure function of (seed, k)."""

    generated_metric = "exact_match"  # how txjax.evaluate.split scores its decoded outputs

    def __init__(
        self,
        name: str,
        form: str = "lm",
        min_digits: int = 1,
        max_digits: int = 8,
        eval_size: int = 512,
        eval_seed: int = 2**31 - 1,
        split: str = "valid",
    ):
        """split: whose prompts eval_batches / eval_examples hold; training batches hold train prompts only."""
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; choose one of {TASKS}")
        if form not in _FORMS:
            raise ValueError(f"form must be {' or '.join(map(repr, _FORMS))}, got {form!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if name == "passkey" and min_digits <= PASSKEY_DIGITS:
            raise ValueError(f"passkey's context holds '+' and {PASSKEY_DIGITS} digits: need min_digits > that")
        self.name, self.form, self.min_digits, self.max_digits = name, form, min_digits, max_digits
        self.eval_size, self.eval_seed, self.split = eval_size, eval_seed, split
        self.tokenizer = task_tokenizer()
        tok = self.tokenizer
        self.pad_id, self.bos_id, self.eos_id = tok.pad_id, tok.bos_id, tok.eos_id
        self.sep_id = tok.encode(SEPARATOR)[0]
        lengths = {"add": (2 * max_digits + 1, max_digits + 1), "passkey": (max_digits, PASSKEY_DIGITS)}
        prompt_len, answer_len = lengths.get(name, (max_digits, max_digits))
        self.seq_len = prompt_len + answer_len + 2  # LM: BOS prompt = answer EOS, minus the shift
        self.src_len, self.tgt_len = prompt_len + 1, answer_len + 1

    def sample(self, rng: np.random.Generator, split: str = "train") -> tuple[str, str]:
        """One (prompt, answer) pair of strings whose prompt belongs to `split` (drawn again until it does)."""
        for _ in range(self.eval_size * _DRAWS_PER_EXAMPLE):
            prompt, answer = self._draw(rng)
            if split_of(self.name, prompt) == split:
                return prompt, answer
        raise self._no_prompts(split)

    def _no_prompts(self, split: str) -> ValueError:
        return ValueError(
            f"task {self.name!r} with {self.min_digits}..{self.max_digits} digits has no {split} prompts to draw: "
            "raise --config.data.max_digits"
        )

    def _draw(self, rng: np.random.Generator) -> tuple[str, str]:
        lengths = rng.integers(self.min_digits, self.max_digits + 1, size=2)
        if self.name == "add":
            a, b = (_digits(rng, int(n), leading_nonzero=True) for n in lengths)
            return f"{a}+{b}", str(int(a) + int(b))
        if self.name == "passkey":
            key, filler = _digits(rng, PASSKEY_DIGITS, False), _digits(rng, int(lengths[0]) - PASSKEY_DIGITS - 1, False)
            at = int(rng.integers(0, len(filler) + 1))
            return f"{filler[:at]}+{key}{filler[at:]}", key
        x = _digits(rng, int(lengths[0]), leading_nonzero=False)
        answer = {"copy": x, "reverse": x[::-1], "sort": "".join(sorted(x))}[self.name]
        return x, answer

    def _encoded(self, pairs) -> list[tuple[np.ndarray, np.ndarray]]:
        return [tuple(self.tokenizer.encode_array(s) for s in pair) for pair in pairs]

    def _held_out(self, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Up to n distinct examples of this task's split, drawn with `seed` (fewer if its space is smaller)."""
        rng, pairs = np.random.default_rng(seed), {}
        for _ in range(n * _DRAWS_PER_EXAMPLE):
            if len(pairs) == n:
                break
            prompt, answer = self._draw(rng)
            if split_of(self.name, prompt) == self.split:
                pairs.setdefault(prompt, answer)
        if not pairs:
            raise self._no_prompts(self.split)
        return self._encoded(pairs.items())

    @functools.cached_property
    def eval_set(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The split's eval examples: eval_size distinct prompts (fewer when the task's space is too small)."""
        return self._held_out(self.eval_size, self.eval_seed)

    def _lm_sequence(self, prompt: np.ndarray, answer: np.ndarray) -> np.ndarray:
        return np.concatenate([[self.bos_id], prompt, [self.sep_id], answer, [self.eos_id]]).astype(np.int32)

    def _make_batch(self, examples: list[tuple[np.ndarray, np.ndarray]], batch_size: int) -> Batch:
        """Examples (fewer than batch_size: the rest are padding rows with weight 0) -> one batch of the form."""
        return _FORMS[self.form].batch(self, examples, batch_size)

    def _lm_batch(self, examples, batch_size: int) -> Batch:
        seqs = [self._lm_sequence(p, a) for p, a in examples]
        seqs += [np.zeros(0, np.int32)] * (batch_size - len(examples))
        prompt_lengths = [len(p) + 1 for p, _ in examples] + [0] * (batch_size - len(examples))
        return lm_batch(seqs, prompt_lengths, self.seq_len, self.pad_id)

    def _pairs_batch(self, examples, batch_size: int) -> Batch:
        sources = [np.append(p, self.eos_id) for p, _ in examples]
        targets = [np.append(a, self.eos_id) for _, a in examples]
        rows = next(chunk_rows([[i] for i in range(len(examples))], batch_size))
        return seq2seq_batch(rows, sources, targets, self.src_len, self.tgt_len, self.pad_id, self.bos_id)

    def batch(self, seed: int, k: int, batch_size: int, rows: slice = slice(None)) -> Batch:
        """Training batch k: a pure function of (seed, k); only its `rows` (one process's share) are built."""
        rng = batch_rng(seed, k)
        examples = self._encoded([self.sample(rng) for _ in range(batch_size)][rows])
        return self._make_batch(examples, len(examples))

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """The eval set once, teacher-forced; the last batch padded with weight-0 rows."""
        examples = self.eval_set
        for start in range(0, len(examples), batch_size):
            yield self._make_batch(examples[start : start + batch_size], batch_size)

    def eval_examples(self, n: int | None = None, seed: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
        """(prompts, answers) as id lists for exact-match evaluation by generation.

        A prompt is what the model is given: BOS prompt '=' for the LM form, prompt EOS for seq2seq. An answer is the
        reference without EOS: generation is right iff it yields exactly these ids and then EOS. The defaults give the
        examples of eval_batches; n and seed draw n other distinct ones of the same split.
        """
        examples = self.eval_set if n is None and seed is None else self._held_out(n or self.eval_size, seed or 0)
        prompt = _FORMS[self.form].prompt
        return [prompt(self, p.tolist()) for p, _ in examples], [a.tolist() for _, a in examples]

    def _lm_prompt(self, prompt: list[int]) -> list[int]:
        return [self.bos_id, *prompt, self.sep_id]

    def _pairs_prompt(self, prompt: list[int]) -> list[int]:
        return [*prompt, self.eos_id]


class _Form(NamedTuple):
    batch: Callable  # (task, examples, batch_size) -> Batch
    prompt: Callable  # (task, prompt ids) -> what the model is given


_FORMS = {  # see the module docstring
    "lm": _Form(SyntheticTask._lm_batch, SyntheticTask._lm_prompt),
    "seq2seq": _Form(SyntheticTask._pairs_batch, SyntheticTask._pairs_prompt),
}
