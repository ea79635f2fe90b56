"""Matmuls in a low-precision compute dtype that accumulate in float32, forward and backward (mixed precision).

    y  = x W              bf16(x) bf16(W) summed in float32 (preferred_element_type), y in the compute dtype
    dx = dy W^T,  dW = x^T dy       bf16(dy) and the saved bf16 operands, summed in float32 again
Why not jnp.einsum(..., preferred_element_type=float32) alone: JAX transposes that dot with the float32 cotangent
and multiplies it with the bfloat16 operand as float32 x float32, so the backward pass (2/3 of training FLOPs)
runs at float32 speed; and a bfloat16 x bfloat16 -> bfloat16 dot does not accumulate in float32 at all. On a CPU
with AVX512_BF16 or AMX, bf16 x bf16 -> f32 is the fast path (benchmarks/peak.py measures both). Float32 operands
take plain jnp.einsum, unchanged.

Float32 matmuls run at `matmul_precision` (ModelConfig.matmul_precision): 'highest' multiplies float32 as float32
everywhere; 'high' and 'default' let a GPU use TF32 (and a TPU bfloat16 passes), which XLA's GPU default does
unasked. On a CPU the three compile to the same float32 product.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

PRECISIONS = ("highest", "high", "default")  # jax.default_matmul_precision's names: float32, TF32 / bf16x3, backend's


def matmul_precision(name: str, compute_dtype):
    """A context in which float32 matmuls run at `name` (one of PRECISIONS); a model computing in a 16-bit dtype
    has no float32 matmuls to set, and its products keep their own precision (nothing changes)."""
    if jnp.dtype(compute_dtype) != jnp.float32:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(name)


def einsum(spec: str, a, b, out_dtype=None):
    """jnp.einsum(spec, a, b) of two operands of one dtype, result in `out_dtype` (default: theirs).

    Low-precision operands accumulate in float32 in the forward and both backward products. Every index of `spec`
    must appear in at least two of its three terms (true of projections, attention scores and weighted sums), so
    that each gradient is itself an einsum of the other two terms.
    """
    out_dtype = out_dtype or a.dtype
    if a.dtype == jnp.float32:
        return jnp.einsum(spec, a, b).astype(out_dtype)
    return _einsum_f32(spec, a, b).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum_f32(spec, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(spec, a, b):
    return _einsum_f32(spec, a, b), (a, b)


def _einsum_f32_bwd(spec, saved, g):
    """d a = einsum(out, b -> a)(g, b),  d b = einsum(a, out -> b)(a, g), with g rounded to the operands' dtype."""
    a, b = saved
    inputs, out = spec.split("->")
    spec_a, spec_b = inputs.split(",")
    g = g.astype(a.dtype)
    da = jnp.einsum(f"{out},{spec_b}->{spec_a}", g, b, preferred_element_type=jnp.float32)
    db = jnp.einsum(f"{spec_a},{out}->{spec_b}", a, g, preferred_element_type=jnp.float32)
    return da.astype(a.dtype), db.astype(b.dtype)


_einsum_f32.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)
