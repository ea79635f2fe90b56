"""How tokens are chosen: one frozen, hashable Strategy, part of the compiled program.

One method per strategy, and each option belongs to one method (METHOD_OPTIONS):
    greedy   the argmax at every step
    sample   softmax(filtered logits / temperature): top_k, top_p (nucleus), num_samples continuations per prompt
    beam     beam search with beam_size beams and the GNMT length_penalty (beam_size 1 with alpha 0 is greedy)
An option of another method is an error, not silently ignored (`Strategy(temperature=0.8)` does not sample).

Temperature 0 is greedy, as in vLLM, llama.cpp and transformers' server (`transformers serve` turns do_sample off):
`Strategy(method="sample", temperature=0)` becomes `Strategy(method="greedy")` (equal, so the same compiled greedy
program runs, never a division by zero). Greedy ignores top_k and top_p (as vLLM and `generate(do_sample=False)` do);
num_samples > 1 would be that many copies of one text, so it is an error.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

METHODS = ("greedy", "sample", "beam")
METHOD_OPTIONS = {
    "greedy": (),
    "sample": ("temperature", "top_k", "top_p", "num_samples"),
    "beam": ("beam_size", "length_penalty"),
}
# Each option's default, the one definition: the Python API's Strategy takes it for an option left None, and the
# config's decode section (txjax.config.base_config, what run.py uses) is built from it. Length penalty 0.6: the GNMT
# alpha (Wu et al. 2016) and Flax wmt's default, what every committed beam result used (bible_en_es's alphas 0.3,
# 0.6 and 1.0 within 0.5 BLEU: docs/experiments.md); at 0 beam search prefers short hypotheses.
OPTION_DEFAULTS = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "num_samples": 1,
    "beam_size": 4,
    "length_penalty": 0.6,
}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How tokens are chosen; static (hashable), so it is part of the compiled program. Options left None take
    their method's default (OPTION_DEFAULTS; top_k 0 and top_p 1 are off)."""

    max_new_tokens: int
    method: str = "greedy"
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    num_samples: int | None = None
    beam_size: int | None = None
    length_penalty: float | None = None  # GNMT alpha
    eos_id: int | None = None
    prefill_chunk: int | None = None  # not a choice of tokens: the prompt is fed this many tokens per call (None: all
    # at once; search.prefill_in_chunks), so that a long prompt's attention scores are chunk x cache, not prompt x cache

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not one of {', '.join(METHODS)}")
        if self.temperature == 0 and self.method in ("greedy", "sample"):
            self._become_greedy()
        for name in OPTION_DEFAULTS:
            if getattr(self, name) is not None and name not in METHOD_OPTIONS[self.method]:
                owner = next(m for m, options in METHOD_OPTIONS.items() if name in options)
                raise ValueError(f"{name} applies to method={owner!r}, not method={self.method!r}")
        checks = [
            (self.max_new_tokens >= 1, f"max_new_tokens={self.max_new_tokens} must be >= 1"),
            (self.prefill_chunk is None or self.prefill_chunk >= 1, f"prefill_chunk={self.prefill_chunk} must be >= 1"),
            (self.option("temperature") > 0, f"temperature={self.temperature} must be >= 0 (0 = greedy)"),
            (self.option("top_k") >= 0, f"top_k={self.top_k} must be >= 0 (0 = off)"),
            (0 < self.option("top_p") <= 1, f"top_p={self.top_p} must be in (0, 1]"),
            (self.option("num_samples") >= 1, f"num_samples={self.num_samples} must be >= 1"),
            (self.option("beam_size") >= 1, f"beam_size={self.beam_size} must be >= 1"),
            (self.option("length_penalty") >= 0, f"length_penalty={self.length_penalty} must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def _become_greedy(self) -> None:
        """temperature 0: method greedy without sampling options (top_k, top_p dropped; num_samples must be 1)."""
        if self.option("num_samples") != 1:
            raise ValueError(
                f"temperature=0 is greedy, one text per prompt: num_samples={self.num_samples} must be 1"
                " (or sample with a temperature > 0)"
            )
        for name in METHOD_OPTIONS["sample"]:
            object.__setattr__(self, name, None)  # frozen: set once, here, before anything reads it
        object.__setattr__(self, "method", "greedy")

    def option(self, name: str):
        """The option's value, or its method's default when left None."""
        value = getattr(self, name)
        return OPTION_DEFAULTS[name] if value is None else value

    @property
    def rows_per_prompt(self) -> int:
        """W: cache rows per prompt (beams or samples)."""
        return {"greedy": 1, "sample": self.option("num_samples"), "beam": self.option("beam_size")}[self.method]


def is_eos(strategy: Strategy, tokens):
    """bool, shaped like `tokens`: the token is the strategy's EOS (never, without one)."""
    return jnp.zeros(tokens.shape, bool) if strategy.eos_id is None else tokens == strategy.eos_id
