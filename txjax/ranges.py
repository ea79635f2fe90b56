"""The range of every number in a config's data, train, mesh and decode sections, checked by txjax.config.validate
when train, eval, generate or lm-eval start, before anything is read or written: a value out of range is one
ConfigError line naming the field and its range. The model section's ranges are ModelConfig's
(txjax.model.config), the decode section's the Strategy's (txjax.decode.strategy), the string fields' choices
config.validate's; mesh.sequence is config.validate_sequence_axis's. train.batch_size must split evenly into
grad_accum's micro-batches and over the mesh axes that split the batch's rows (check_batch_split).
"""

from __future__ import annotations

import math

import ml_collections

from txjax.decode.strategy import METHOD_OPTIONS, Strategy
from txjax.errors import ConfigError
from txjax.parallel.sharding import BATCH_AXES

SEED_MAX = 2**63 - 1  # a seed becomes an int64 (jax.random.key, numpy's generators); a negative one is refused there


def _at_least(lo: float) -> tuple:
    return lambda v: v >= lo, f">= {lo}"


def _within(lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> tuple:
    def ok(v):
        return (lo < v if open_lo else lo <= v) and (v < hi if open_hi else v <= hi)

    return ok, f"in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"


# "section.field" -> (whether a value is in range, the range in words); NaN is in no range
RANGES = {
    "data.min_digits": _at_least(1),
    "data.max_digits": _at_least(1),
    "data.eval_size": _at_least(1),
    "data.vocab_size": _at_least(1),
    "data.seq_len": _at_least(1),
    "data.val_fraction": _within(0, 1, open_lo=True, open_hi=True),
    "data.max_src_len": _at_least(1),
    "data.max_tgt_len": _at_least(1),
    "train.steps": _at_least(1),
    "train.batch_size": _at_least(1),
    "train.grad_accum": _at_least(1),
    "train.learning_rate": _at_least(0),  # inf is allowed: the run diverges and says so (a sweep's test of that)
    "train.decay_fraction": _within(0, 1, open_lo=True),
    "train.min_lr_ratio": _within(0, 1),
    "train.warmup_steps": _at_least(0),
    "train.weight_decay": _at_least(0),
    "train.b1": _within(0, 1, open_hi=True),
    "train.b2": _within(0, 1, open_hi=True),
    "train.grad_clip": (lambda v: v >= 0, ">= 0 (0 = off)"),
    "train.label_smoothing": _within(0, 1, open_hi=True),
    "train.z_loss": (lambda v: v >= 0, ">= 0 (0 = off)"),
    "train.seed": _within(0, SEED_MAX),
    "train.log_every": _at_least(1),
    "train.eval_every": (lambda v: v >= 0, ">= 0 (0 = only at the end)"),
    "train.eval_batches": (lambda v: v >= 0, ">= 0 (0 = the whole valid split)"),
    "train.checkpoint_every": _at_least(1),
    "train.keep_checkpoints": _at_least(1),
    "train.max_minutes": (lambda v: v >= 0, ">= 0 (0 = no budget)"),
    "train.eval_every_minutes": (lambda v: v >= 0, ">= 0 (0 = by steps only)"),
    "mesh.data": _at_least(1),
    "mesh.fsdp": _at_least(1),
    "mesh.tensor": _at_least(1),
    "mesh.expert": _at_least(1),
}


def check_numbers(config: ml_collections.ConfigDict) -> None:
    """ConfigError naming the first field of RANGES out of its range, then the decode section's (check_decode)."""
    for name, (ok, words) in RANGES.items():
        section, _, field = name.partition(".")
        value = config[section][field]
        try:
            good = not (isinstance(value, float) and math.isnan(value)) and ok(value)
        except TypeError:
            good = False
        if not good or isinstance(value, bool):
            raise ConfigError(f"config.{name}={value!r} must be {words}")
    if config.data.min_digits > config.data.max_digits:
        raise ConfigError(
            f"config.data.min_digits={config.data.min_digits} must be <= data.max_digits={config.data.max_digits}"
        )
    check_decode(config.decode)


def check_batch_split(config: ml_collections.ConfigDict) -> None:
    """train.batch_size a multiple of grad_accum (its micro-batches) and of the mesh axes that split the batch's
    rows (sharding.BATCH_AXES: data x fsdp x expert), the train and eval batches alike: jax refuses an uneven split
    only once a batch is placed, after the workdir is written. The sizes suggested keep both whole."""
    size, accum = config.train.batch_size, config.train.grad_accum
    shards = math.prod(config.mesh[axis] for axis in BATCH_AXES)
    if size % accum:
        raise ConfigError(f"config.train.batch_size={size} must be divisible by grad_accum={accum}")
    if size % shards == 0:
        return
    unit = math.lcm(shards, accum)
    below, above = size // unit * unit, (size // unit + 1) * unit
    axes = " x ".join(f"mesh.{axis}" for axis in BATCH_AXES)
    raise ConfigError(
        f"config.train.batch_size={size} must be a multiple of {axes} = {shards} (the batch's rows are split over "
        f"them): set --config.train.batch_size={above}" + (f" (or {below})" if below else "")
    )


def check_decode(decode: ml_collections.ConfigDict) -> None:
    """Every option of the decode section in its range, whichever method reads it: each method's Strategy built
    from the section (temperature 0 checked with the method that samples only when it is the section's)."""
    chunk = decode.get("prefill_chunk", 0)
    if not isinstance(chunk, int) or chunk < 0:
        raise ConfigError(f"config.decode.prefill_chunk={chunk!r} must be >= 0 (0 = the whole prompt in one call)")
    for method, names in METHOD_OPTIONS.items():
        options = {name: decode[name] for name in names}
        if method != decode.method and options.get("temperature") == 0:
            options["temperature"] = None  # not the method in use: 0 would only mean greedy
        try:
            Strategy(max_new_tokens=decode.max_new_tokens, method=method, prefill_chunk=chunk or None, **options)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"config.decode.{e}") from None
