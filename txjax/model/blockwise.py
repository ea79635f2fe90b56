"""Blockwise (flash) attention: softmax(mask(q k^T * scale + bias)) v without an L x S matrix, O(L) memory.

Queries in blocks of block_q; for each, a loop over the key/value blocks of block_kv keeps the online softmax
(Milakov & Gimelshein 2018; Dao et al. 2022, Algorithm 1) of the block's scores s_j:
    m' = max(m, rowmax(s_j)),  l' = e^(m - m') l + rowsum(e^(s_j - m')),  o' = e^(m - m') o + e^(s_j - m') v_j
and returns o / l, saving logsumexp = m + log l. Under a causal mask a query block's loop stops at the key block
holding its last query: the blocks above the diagonal are never computed. The backward pass (a custom VJP; Dao
2023, Algorithm 2) recomputes each block's probabilities p = exp(s - logsumexp) from q, k and the saved logsumexp:
    dv_j += p^T do,  dp = do v_j^T,  ds = p * (dp - rowsum(do * o)),  dq += ds k_j * scale,  dk_j += ds^T q * scale
so that training holds q, k, v, o and logsumexp per layer, never the probabilities. Soft-capped scores (Gemma 2),
s = c tanh(q k^T * scale / c), multiply ds by the cap's derivative 1 - tanh^2 = 1 - (s / c)^2 on the way back.

The mask is made block by block by txjax.model.masks from segment ids (`Segments`: the same nonzero segment) and
positions: causal (key position <= query position), a local window (key position > query position - window) and
chunked attention's blocks (the same block of positions);
ALiBi's bias -m_h |i - j| from the positions too. Under a window a query block's loop also starts at the key block
holding its first query's oldest visible key, so time and memory are O(L window), not O(L^2). Skipping by block
index assumes positions grow along the sequence within a segment (as txjax's inputs do, and as the fused kernels'
is_causal assumes). A query with no key to attend to returns zeros, as the reference does.

Public API, for callers that compose blocks themselves (ring attention, txjax.model.ring_attention, merges the
results of key shards): `Plan` (the static block sizes and mask kind), `flash_forward` (o and logsumexp of queries
already in blocks against keys in blocks) and `flash_backward` (dq, dk, dv of the same from the final o and logsumexp).
`attention` is the whole op for [B, L, H, K] inputs.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import einops
import jax
import jax.numpy as jnp

from txjax.model import masks, precision, score
from txjax.model.masks import NEG_INF


class Segments(NamedTuple):
    """A mask in O(L) values: query and key segment ids [B, L], [B, S] (0 = padding); dense it is
    masks.segment_mask(q, k)."""

    q: jax.Array
    k: jax.Array


class Plan(NamedTuple):
    """Static (the custom VJP's non-differentiable argument): the mask kind, the scale and the block sizes."""

    causal: bool
    scale: float
    block_q: int
    block_kv: int
    aligned: bool = True  # queries and keys are one sequence: causal skips the key blocks past a query block's last
    softcap: float = 0.0  # c > 0: scores c tanh(s / c) (activations.soft_cap)


def attention(
    q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, segments, q_pos, k_pos, *, causal, heads_H, scale, block_q, block_kv, window=0,
    softcap=0.0, chunk=0,
):  # fmt: skip
    """softmax(mask(q k^T * scale + bias)) v in blocks: q [B, L, H, K], k/v [B, S, G, K] (H a multiple of G: query head
    h reads K/V head h // (H/G)); segments: Segments or None (all attend); q_pos [B, L], k_pos [B, S]; heads_H: the
    scores' per-head terms, {name: [H]} (score.head_terms: ALiBi's slopes); window: a local window (masks.window_mask;
    an int or a traced scalar, 0 = global); softcap: c > 0 caps the scores (before ALiBi's bias) at c tanh(. / c);
    chunk: chunked attention's blocks (masks.chunk_mask; an int or a traced scalar, 0 = none).
    Returns [B, L, H, K] in v's dtype. A last block shorter than block_q (block_kv) is padded with segment 0, which
    nothing attends to."""
    b, l, h, _ = q_BxLxHxK.shape
    s, g = k_BxSxGxK.shape[1], k_BxSxGxK.shape[2]
    if segments is None:
        segments = Segments(jnp.ones((b, l), jnp.int32), jnp.ones((b, s), jnp.int32))
    bq, bk = min(block_q, l), min(block_kv, s)
    nq, nk = -(-l // bq), -(-s // bk)

    def blocks(t, n, size, pattern, **axes):  # pad the sequence axis (1) to n * size and put the block axis first
        t = jnp.pad(t, [(0, 0), (0, n * size - t.shape[1])] + [(0, 0)] * (t.ndim - 2))
        return einops.rearrange(t, pattern, n=n, **axes)

    q = blocks(q_BxLxHxK, nq, bq, "b (n q) (g r) k -> n b q g r k", g=g)
    k, v = (blocks(t, nk, bk, "b (n s) g k -> n b s g k") for t in (k_BxSxGxK, v_BxSxGxK))
    q_seg, q_p = (blocks(t, nq, bq, "b (n q) -> n b q") for t in (segments.q, q_pos))
    k_seg, k_p = (blocks(t, nk, bk, "b (n s) -> n b s") for t in (segments.k, k_pos))
    heads = {name: t.reshape(g, h // g) for name, t in heads_H.items()}
    window, chunk = (None if masks.is_global(t) else jnp.asarray(t, jnp.int32) for t in (window, chunk))
    out = _flash(Plan(causal, scale, bq, bk, softcap=softcap), q, k, v, q_seg, k_seg, q_p, k_p, heads, window, chunk)
    return einops.rearrange(out, "n b q g r k -> b (n q) (g r) k")[:, :l]


def _kv_blocks(plan: Plan, i, nk: int, window):
    """The key blocks [first, last) query block i reads: all, or over one sequence under a causal mask those up to
    its last query's, and under a window (> 0) those from its first query's oldest visible key on."""
    last = jnp.asarray(nk)  # a traced count: a while loop (XLA:CPU builds every block's mask ahead of a fixed loop)
    if plan.causal and plan.aligned:
        last = jnp.minimum(nk, ((i + 1) * plan.block_q - 1) // plan.block_kv + 1)
    if window is None or not plan.aligned:
        return 0, last
    oldest = jnp.maximum(i * plan.block_q - window + 1, 0)  # the first query's oldest visible key
    return jnp.where(window > 0, oldest // plan.block_kv, 0), last


def _scores(plan: Plan, q_i, k_j, q_seg, k_seg, q_pos, k_pos, heads, window, chunk):
    """One tile's scores (txjax.model.score.tile): q_i [B, bq, G, R, K], k_j [B, bk, G, K] -> s [B, G, R, bq, bk]
    float32, allowed [B, 1, 1, bq, bk], and the soft cap's derivative."""
    raw = precision.einsum("bqgrk,bsgk->bgrqs", q_i, k_j, out_dtype=jnp.float32)
    terms = dict(causal=plan.causal, window=window, heads=heads, chunk=chunk)
    return score.tile(plan.scale, plan.softcap, raw, q_seg, k_seg, q_pos, k_pos, **terms)


def flash_forward(plan: Plan, q, k, v, q_seg, k_seg, q_pos, k_pos, heads=None, window=None, chunk=None):
    """Queries in blocks q [nq, B, bq, G, R, K] against keys and values in blocks k/v [nk, B, bk, G, K] (segment ids and
    positions [nq, B, bq] / [nk, B, bk]; heads: the per-head terms {name: [G, R]} or None; window: None = global, or a
    traced int32; chunk: None = none, or a traced int32) -> o [nq, B, bq, G, R, K] in v's dtype and logsumexp
    [nq, B, G, R, bq] float32 (NEG_INF where a query has no key to attend to: ring attention merges the results of
    key shards by their logsumexp)."""
    nk = k.shape[0]

    def query_block(xs):
        i, q_i, seg_i, pos_i = xs

        def step(j, carry):
            m, l, o = carry  # running max and sum [B, G, R, bq], unnormalized output [B, G, R, bq, K]
            s, ok, _ = _scores(plan, q_i, k[j], seg_i, k_seg[j], pos_i, k_pos[j], heads, window, chunk)
            m_new = jnp.maximum(m, jnp.where(ok, s, NEG_INF).max(-1))
            p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
            correction = jnp.exp(m - m_new)
            pv = precision.einsum("bgrqs,bsgk->bgrqk", p.astype(v.dtype), v[j], out_dtype=jnp.float32)
            return m_new, correction * l + p.sum(-1), correction[..., None] * o + pv

        shape = (q_i.shape[0], *q_i.shape[2:4], q_i.shape[1])
        init = (*score.online_start(heads, shape), jnp.zeros((*shape, v.shape[-1])))
        m, l, o = jax.lax.fori_loop(*_kv_blocks(plan, i, nk, window), step, init)
        attended = l > 0  # False: no key to attend to -> zeros
        o = o / jnp.where(attended, l, 1.0)[..., None]
        lse = jnp.where(attended, m + jnp.log(jnp.where(attended, l, 1.0)), NEG_INF)  # no mass: none to merge
        return einops.rearrange(o, "b g r q k -> b q g r k").astype(v.dtype), lse

    return jax.lax.map(query_block, (jnp.arange(q.shape[0]), q, q_seg, q_pos))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk):
    return flash_forward(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk)[0]


def _flash_fwd(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk):
    o, lse = flash_forward(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk)
    return o, (q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk, o, lse)


def _flash_bwd(plan, saved, do):
    q, k, v, q_seg, k_seg, q_pos, k_pos, heads, window, chunk, o, lse = saved
    dq, dk, dv = flash_backward(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, o, lse, do, heads, window, chunk)
    delta = (do.astype(jnp.float32) * o.astype(jnp.float32)).sum(-1)  # rowsum(do * o) [n, B, bq, G, R]
    d_heads = score.head_grads(heads, einops.rearrange(lse, "n b g r q -> n b q g r"), delta)
    return dq, dk, dv, None, None, None, None, d_heads, None, None


def flash_backward(plan: Plan, q, k, v, q_seg, k_seg, q_pos, k_pos, o, lse, do, heads=None, window=None, chunk=None):
    """dq, dk, dv (in q's, k's, v's dtypes) of flash_forward's arguments from its o and logsumexp and the output's
    cotangent do (o's layout), each block's probabilities recomputed from the logsumexp (the equations above)."""
    nk, f32 = k.shape[0], jnp.float32
    delta = einops.rearrange((do.astype(f32) * o.astype(f32)).sum(-1), "n b q g r -> n b g r q")  # rowsum(do * o)
    mm = partial(precision.einsum, out_dtype=f32)

    def query_block(carry, xs):
        i, q_i, do_i, lse_i, delta_i, seg_i, pos_i = xs
        do_i = do_i.astype(q.dtype)

        def step(j, c):
            dq_i, dk, dv = c
            s, ok, capped = _scores(plan, q_i, k[j], seg_i, k_seg[j], pos_i, k_pos[j], heads, window, chunk)
            p = jnp.where(ok, jnp.exp(s - lse_i[..., None]), 0.0)
            dv_j = mm("bgrqs,bqgrk->bsgk", p.astype(q.dtype), do_i)
            dp = mm("bqgrk,bsgk->bgrqs", do_i, v[j].astype(q.dtype))
            ds = (p * (dp - delta_i[..., None]) * capped * plan.scale).astype(q.dtype)
            dq_i = dq_i + mm("bgrqs,bsgk->bqgrk", ds, k[j])
            return dq_i, dk.at[j].add(mm("bgrqs,bqgrk->bsgk", ds, q_i)), dv.at[j].add(dv_j)

        dq_i, dk, dv = jax.lax.fori_loop(*_kv_blocks(plan, i, nk, window), step, (jnp.zeros(q_i.shape, f32), *carry))
        return (dk, dv), dq_i

    zeros = jnp.zeros(k.shape, f32), jnp.zeros(v.shape, f32)
    xs = (jnp.arange(q.shape[0]), q, do, lse, delta, q_seg, q_pos)
    (dk, dv), dq = jax.lax.scan(query_block, zeros, xs)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_flash.defvjp(_flash_fwd, _flash_bwd)
