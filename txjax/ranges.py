"""The range of every number in a config's data, train, mesh and decode sections, checked by txjax.config.validate
when train, eval, generate or lm-eval start, before anything is read or written: a value out of range is one
ConfigError line naming the field and its range. The data, train and mesh ranges are their fields' (txjax.sections),
the model section's ModelConfig's own checks (txjax.model.config), the decode section's the Strategy's
(txjax.decode.strategy); mesh.sequence is config.validate_sequence_axis's. train.batch_size must split evenly into
grad_accum's micro-batches and over the mesh axes that split the batch's rows (check_batch_split).
"""

from __future__ import annotations

import math

import ml_collections

from txjax.decode.strategy import METHOD_OPTIONS, Strategy
from txjax.errors import ConfigError
from txjax.parallel.sharding import BATCH_AXES
from txjax.sections import schema

RANGES = schema.ranges()  # "section.field" -> (whether a value is in range, the range in words); NaN in none


def check_numbers(config: ml_collections.ConfigDict) -> None:
    """ConfigError naming every field of RANGES out of its range (one line), then the decode section's
    (check_decode)."""
    bad = []
    for name, (ok, words) in RANGES.items():
        section, _, field = name.partition(".")
        value = config[section][field]
        try:
            good = not (isinstance(value, float) and math.isnan(value)) and ok(value)
        except TypeError:
            good = False
        if not good or isinstance(value, bool):
            bad.append(f"config.{name}={value!r} must be {words}")
    if bad:
        raise ConfigError("; ".join(bad))
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
