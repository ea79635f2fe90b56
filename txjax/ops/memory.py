"""Memory bounds: a train step that cannot fit the device is refused before it compiles, and XLA's out-of-memory
errors are one line.

`train_step_bytes` is a lower bound of what one training step holds at its peak, in closed form: parameters,
gradients and optimizer state (txjax.ops.summary), the activations the backward pass reads (per layer about
B·T·(4·d_model + 2·d_ff) values of the compute dtype; with any model.remat policy only each layer's input) and, for the
reference attention, the B·H·T² float32 probabilities per attention layer, and the float32 logits B·T·V. A lower
bound, so that a refusal is never wrong: `check_train_step` refuses when it exceeds what the device has
(a GPU's bytes_limit; on CPU the machine's MemAvailable) and names the longest length at this batch and the largest
batch at this length that would fit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from txjax import families
from txjax.errors import ConfigError
from txjax.model.attention import resolve_impl
from txjax.model.models import ModelConfig
from txjax.ops.summary import summarize

GB = 1e9


def state_bytes(cfg: ModelConfig, family: str) -> int:
    """Parameters, their gradients and the optimizer state."""
    summary = summarize(cfg, family)
    return summary.param_bytes * 2 + summary.optimizer_bytes


def train_step_bytes(cfg: ModelConfig, family: str, b: int, s: int, t: int, state: int | None = None) -> int:
    """A lower bound of a train step's peak bytes for a micro-batch of b rows, source length s (0 without an
    encoder) and target length t, on one device (`state`: state_bytes, when known)."""
    state = state_bytes(cfg, family) if state is None else state
    remat = cfg.remat != "none"  # a policy that saves more than the block's input only raises the true figure
    width = cfg.d_model if remat else 4 * cfg.d_model + 2 * cfg.d_ff
    encoder_layers, self_layers, cross_layers = families.get(family).attention_layers(cfg)
    dtype_bytes = jnp.dtype(cfg.dtype).itemsize
    activations = b * width * dtype_bytes * (encoder_layers * s + self_layers * t)
    if resolve_impl(cfg.attention_impl, cfg.dtype, cfg.head_dim, cfg.attention_softcap) == "reference":
        pairs = encoder_layers * s * s + self_layers * t * t + cross_layers * t * s
        activations += 4 * b * cfg.num_heads * (pairs if not remat else max(s * s, t * t, t * s))
    return state + activations + 4 * b * t * cfg.vocab_size


def device_bytes() -> int:
    """What one device can hold: a GPU's (or TPU's) bytes_limit, else the machine's available memory."""
    stats = jax.local_devices()[0].memory_stats() or {}  # a device of this process (others are not addressable)
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def largest(fits, high: int, low: int = 0) -> int:
    """The largest n in [low, high] with fits(n) (fits is monotonic, fits(low) true or low 0), by bisection."""
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def check_train_step(
    cfg: ModelConfig, family: str, b: int, s: int, t: int, devices: int = 1, sequence: int = 1
) -> None:
    """ConfigError when a step of b rows x length t cannot fit one device: the rows split over devices / sequence
    data-parallel devices, the length over `sequence` of them (mesh.sequence: each holds t / sequence tokens)."""
    rows, state, have = -(-b // (devices // sequence)), state_bytes(cfg, family), device_bytes()
    fits = lambda b, s, t: train_step_bytes(cfg, family, b, s, -(-t // sequence), state) <= have
    if fits(rows, s, t):
        return
    need = train_step_bytes(cfg, family, rows, s, -(-t // sequence), state)
    longest = largest(lambda n: fits(rows, n * s // t, n), t)  # a source scaled with the target
    batch = largest(lambda n: fits(n, s, t), rows) * (devices // sequence)
    where = f"{jax.devices()[0].platform} device" + ("" if jax.devices()[0].platform != "cpu" else " (MemAvailable)")
    at_length = f"the largest batch is {batch}" if batch else "not even one row fits"
    raise ConfigError(
        f"a train step of batch {b} x length {t} needs at least {need / GB:.1f} GB, more than the {have / GB:.1f} GB "
        f"of this {where}: at batch {b} the longest length that fits is {longest}, at length {t} {at_length}; "
        "lower config.data.seq_len (or the synthetic task's lengths) or config.train.batch_size"
        + ("" if cfg.remat != "none" else ", or set config.model.remat=full")
    )


def out_of_memory_line(error: BaseException) -> str | None:
    """One line for XLA's out-of-memory error (RESOURCE_EXHAUSTED at compile or run time), else None."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (
        f"out of memory on the {jax.devices()[0].platform} device ({first[:200]}): lower config.train.batch_size or "
        "config.data.seq_len (or generate's --max_new_tokens / --num_samples)"
    )
