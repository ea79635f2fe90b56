"""What a model config costs, from shapes alone (jax.eval_shape: nothing is allocated or compiled).

- parameters: one row per tensor, grouped by module; scanned layers carry a leading [num_layers] axis.
- FLOPs per token (Kaplan et al. 2020, table 1; nanoGPT's estimate_mfu): a matmul with a weight of N entries costs
  2N FLOPs per token forward and 4N backward, and attention's q k^T and probs v cost 2·T·d each per layer, so
      train  = 6N + 12·L·d·T          decode = 2N + 4·L·d·T   (one new token attending over a full context T)
  N counts the weights used as matmuls: all parameters but the position tables and the token tables that are only
  looked up (an untied head, a separate source table), and of a mixture of experts' routed experts the k of X a
  token uses (k/X of their weights: the active parameters per token). L is the number of attention layers.
  Encoder-decoder: a training token is one source plus one target token, L counts encoder self-attention and
  decoder self- and cross-attention; decoding a target token skips the encoder (its N and its L) and attends over T
  source tokens.
- FLOPs per training step (`train_flops_per_batch`, the training loop's MFU numerator) for a batch of B rows:
      B·(6·N_enc·S + 6·N_dec·T + 12·d·(L_enc·S² + L_self·T² + L_cross·T·S))    src [B, S], tgt [B, T]
  which for a decoder LM (no encoder: S = N_enc = L_enc = L_cross = 0) is B·T·(6N + 12·L·d·T)
  with N_enc the encoder's weights and N_dec = N - N_enc (every decoder weight, cross-attention's key and value
  included, counted once per target position). Every position counts, padding included.
- memory: parameters and gradients (float32), AdamW's two moments (2x the parameters), and the KV cache
  (keys, values and slot positions of every layer) at the given batch and context, in the compute dtype; and the
  bytes one token adds to one row's keys and values (MLA's latent and RoPE key), slot positions aside.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax

from txjax import families
from txjax.decode.cache import init_cache
from txjax.families import init_params
from txjax.model import kv_cache
from txjax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Summary:
    """Parameter rows (path, shape, count) and the cost figures; `.table()` formats them."""

    rows: tuple[tuple[str, tuple[int, ...], int], ...]
    total_params: int
    flop_params: int  # N in the FLOP formulas
    train_flops_per_token: int
    decode_flops_per_token: int
    param_bytes: int
    optimizer_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int  # what one more token adds to one row's cache: its keys and values in every layer
    batch_size: int
    context: int
    scanned: bool

    def table(self) -> str:
        """The parameter table by module, then totals, FLOPs and memory."""
        lines = [f"{'module / parameter':<52} {'shape':>22} {'params':>14}"]
        if self.scanned:
            lines.append("(scanned: the leading axis of a */layers/* shape is the layer)")
        for module, rows in _by_module(self.rows):
            lines.append(f"{module:<52} {'':>22} {sum(r[2] for r in rows):>14,}")
            lines += [f"  {name:<50} {'x'.join(map(str, shape)):>22} {count:>14,}" for name, shape, count in rows]
        lines += [
            "",
            f"total parameters                 {self.total_params:>16,}  ({_si(self.total_params)})",
            f"N (matmul weights, active)       {self.flop_params:>16,}  ({_si(self.flop_params)})",
            f"train FLOPs / token              {self.train_flops_per_token:>16,}  ({_si(self.train_flops_per_token)})"
            f"   6N + 12*L*d*T, T={self.context}",
            f"decode FLOPs / token             {self.decode_flops_per_token:>16,}  ({_si(self.decode_flops_per_token)})"
            f"   2N + 4*L*d*T at a full context",
            f"memory: parameters (f32)         {_bytes(self.param_bytes):>16}",
            f"memory: gradients (f32)          {_bytes(self.param_bytes):>16}",
            f"memory: AdamW moments (2x)       {_bytes(self.optimizer_bytes):>16}",
            f"memory: KV cache                 {_bytes(self.kv_cache_bytes):>16}   batch {self.batch_size} x "
            f"context {self.context}",
            f"memory: KV cache per token       {self.kv_bytes_per_token:>14,} B   keys and values (MLA: latent and "
            "RoPE key), every layer, one row",
        ]
        return "\n".join(lines)


def _by_module(rows):
    """[(module, [(param name, shape, count)])] in order of first appearance."""
    groups: dict[str, list] = {}
    for path, shape, count in rows:
        module, _, name = path.rpartition("/")
        groups.setdefault(module, []).append((name, shape, count))
    return list(groups.items())


def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:g}"


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def param_shapes(model) -> dict:
    """The unboxed parameter tree of `model` as ShapeDtypeStructs."""
    return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))


def _lookup_only(path: str, cfg: ModelConfig, family: str) -> bool:
    """A table only indexed, never multiplied: position tables, and token tables that are not the tied LM head."""
    if path.endswith("positions/embedding"):
        return True
    if path.endswith("tokens/embedding"):
        return not (cfg.tie_embeddings and path.split("/")[0] == families.get(family).head_table(cfg))
    return False


def _active_fraction(path: str, cfg: ModelConfig) -> float:
    """The share of a weight one token multiplies: k/X of a mixture of experts' routed experts, else all of it."""
    return cfg.experts_per_token / cfg.num_experts if "/experts/" in path else 1.0


@functools.lru_cache(maxsize=32)
def _param_rows(cfg: ModelConfig, family: str) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """(path, shape, count) of each parameter: one trace of the model's init per config, however many contexts and
    batches summarize is asked about (a training run asks for its step's FLOPs and for its memory check)."""
    leaves = jax.tree_util.tree_leaves_with_path(param_shapes(families.build(family, cfg)))
    return tuple(("/".join(k.key for k in path), tuple(s.shape), math.prod(s.shape)) for path, s in leaves)


def summarize(
    cfg: ModelConfig, family: str = families.DECODER_LM.name, batch_size: int = 1, context: int | None = None
) -> Summary:
    """Parameters, FLOPs per token and memory of a config; `context` (default max_len) is T and the cache length."""
    model = families.build(family, cfg)
    context = context or cfg.max_len
    rows = _param_rows(cfg, family)
    total = sum(r[2] for r in rows)
    active = [(p, c * _active_fraction(p, cfg)) for p, _, c in rows if not _lookup_only(p, cfg, family)]
    n = round(sum(c for _, c in active))
    once = families.get(family).source_modules  # run once per source: not per decoded token
    n_decode = n - round(sum(c for p, c in active if p.split("/")[0] in once))
    encoder_layers, self_layers, cross_layers = families.get(family).attention_layers(cfg)
    attn_layers, decode_attn_layers = encoder_layers + self_layers + cross_layers, self_layers + cross_layers
    src_len = context if encoder_layers else None
    cache = jax.eval_shape(lambda: init_cache(model, batch_size, context, src_len))
    return Summary(
        rows=rows,
        total_params=total,
        flop_params=n,
        train_flops_per_token=6 * n + 12 * attn_layers * cfg.num_heads * cfg.head_dim * context,
        decode_flops_per_token=2 * n_decode + 4 * decode_attn_layers * cfg.num_heads * cfg.head_dim * context,
        param_bytes=4 * total,
        optimizer_bytes=8 * total,
        kv_cache_bytes=sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(cache)),
        kv_bytes_per_token=kv_cache.bytes_per_token(cache, batch_size, context),
        batch_size=batch_size,
        context=context,
        scanned=cfg.scan_layers,
    )


def train_flops_per_batch(cfg: ModelConfig, family: str, batch: dict) -> int:
    """Model FLOPs of one training step on `batch` (arrays or shapes; only `.shape` is read):
    B·(6·N_enc·S + 6·N_dec·T + 12·d·(L_enc·S² + L_self·T² + L_cross·T·S)), which for a decoder LM (no encoder:
    S = N_enc = L_enc = L_cross = 0) is B·T·(6N + 12·L·d·T); d: the attention width heads x head_dim (d_model
    unless model.d_head sets it apart)."""
    b, s, t = families.batch_lengths(families.get(family), batch)
    summary = summarize(cfg, family, context=t)
    once = families.get(family).source_modules
    n_enc = round(sum(c * _active_fraction(p, cfg) for p, _, c in summary.rows if p.split("/")[0] in once))
    n_dec = summary.flop_params - n_enc
    encoder_layers, self_layers, cross_layers = families.get(family).attention_layers(cfg)
    attention = (
        12 * cfg.num_heads * cfg.head_dim * (encoder_layers * s * s + self_layers * t * t + cross_layers * t * s)
    )
    return b * (6 * n_enc * s + 6 * n_dec * t + attention)
