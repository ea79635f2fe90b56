"""Attention masks from explicit positions and segment ids: boolean [batch, 1, n_q, n_k] (the 1 broadcasts over
heads), True = may attend. One definition each, read by the reference attention (txjax.model.attention), the
blockwise kernel block by block (txjax.model.blockwise) and the KV caches; and NEG_INF, the score a masked key
gets."""

from __future__ import annotations

import jax.numpy as jnp

NEG_INF = -1e30  # the score of a masked key: exp() underflows to exactly 0 in float32, no inf - inf = NaN


def causal_mask(q_pos, k_pos):
    """j <= i on explicit positions: q_pos [B, Lq], k_pos [B, Lk] -> [B, 1, Lq, Lk]."""
    return k_pos[:, None, None, :] <= q_pos[:, None, :, None]


def window_mask(q_pos, k_pos, window):
    """Local (sliding-window) attention: a key at position j is visible to a query at i iff j > i - window, so that
    with the causal mask i - window < j <= i: the query and the window - 1 keys before it (Beltagy et al. 2020;
    transformers' sliding_window_overlay, as Mistral and Gemma 2/3 use it). window <= 0: global (all True).
    q_pos [B, Lq], k_pos [B, Lk]; window an int or a traced scalar (a scanned layer's) -> [B, 1, Lq, Lk]."""
    return (k_pos[:, None, None, :] > q_pos[:, None, :, None] - window) | (window <= 0)


def chunk_mask(q_pos, k_pos, chunk):
    """Chunked local attention (Llama 4's attention_chunk_size): a key at position j is visible to a query at i iff
    both lie in the same block of `chunk` positions, j // chunk = i // chunk, so that with the causal mask a query
    sees the keys from its block's start to itself: blocks, not a sliding window. chunk <= 0: global (all True).
    q_pos [B, Lq], k_pos [B, Lk]; chunk an int or a traced scalar (a scanned layer's) -> [B, 1, Lq, Lk]."""
    c = jnp.maximum(chunk, 1)
    return (k_pos[:, None, None, :] // c == q_pos[:, None, :, None] // c) | (chunk <= 0)


def is_global(window) -> bool:
    """Whether a window is statically global (the int 0): no band to build, today's attention bit for bit."""
    return isinstance(window, int) and window <= 0


def padding_mask(q_valid, k_valid):
    """Both query and key are real tokens: q_valid [B, Lq], k_valid [B, Lk] bool -> [B, 1, Lq, Lk]."""
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]


def segment_mask(q_seg, k_seg):
    """Packed rows: attend only inside your own segment, never to padding (segment 0).

    q_seg [B, Lq], k_seg [B, Lk] int -> [B, 1, Lq, Lk].
    """
    same = q_seg[:, None, :, None] == k_seg[:, None, None, :]
    return same & padding_mask(q_seg > 0, k_seg > 0)


def prefix_mask(q_pos, k_pos, q_prefix, k_prefix):
    """A prefix LM's order (Raffel et al. 2020, T5, fig. 3 "prefix LM"; Tay et al. 2022, UL2): bidirectional inside
    the prefix, causal after it. A key j is visible to a query i iff j <= i (causal_mask on explicit positions) or
    both are prefix tokens, so a prefix token reads the whole prefix and nothing after it, and a later token reads
    the prefix and the tokens before it. q_prefix [B, Lq], k_prefix [B, Lk] bool -> [B, 1, Lq, Lk]; documents are
    kept apart by segment_mask, with which a caller combines it."""
    both = q_prefix[:, None, :, None] & k_prefix[:, None, None, :]
    return causal_mask(q_pos, k_pos) | both
