"""How tokens are chosen: one frozen, hashable Strategy, part of the compiled program."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How tokens are chosen; static (hashable), so it is part of the compiled program.

    temperature 0 is greedy; top_k 0 and top_p 1 are off. beam_size None samples; W >= 1 runs beam search (W=1 with
    length_penalty 0 is greedy). num_samples > 1 draws that many continuations per prompt (sampling only).
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    beam_size: int | None = None
    length_penalty: float = 0.0  # GNMT alpha
    eos_id: int | None = None
    num_samples: int = 1

    def __post_init__(self):
        checks = [
            (self.max_new_tokens >= 1, f"max_new_tokens={self.max_new_tokens} must be >= 1"),
            (self.temperature >= 0, f"temperature={self.temperature} must be >= 0 (0 = greedy)"),
            (self.top_k >= 0, f"top_k={self.top_k} must be >= 0 (0 = off)"),
            (0 < self.top_p <= 1, f"top_p={self.top_p} must be in (0, 1]"),
            (self.beam_size is None or self.beam_size >= 1, f"beam_size={self.beam_size} must be >= 1"),
            (self.length_penalty >= 0, f"length_penalty={self.length_penalty} must be >= 0"),
            (self.num_samples >= 1, f"num_samples={self.num_samples} must be >= 1"),
            (self.beam_size is None or self.num_samples == 1, "num_samples > 1 needs sampling, not beam search"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def rows_per_prompt(self) -> int:
        """W: cache rows per prompt (beams or samples)."""
        return self.beam_size or self.num_samples


def is_eos(strategy: Strategy, tokens):
    """bool, shaped like `tokens`: the token is the strategy's EOS (never, without one)."""
    return jnp.zeros(tokens.shape, bool) if strategy.eos_id is None else tokens == strategy.eos_id
