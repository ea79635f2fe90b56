"""Positional encodings against the papers' formulas, written here in NumPy."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from txjax.model import positional as P


@pytest.mark.parametrize("d_model", [8, 7])
def test_sinusoidal_matches_paper_formula(d_model):
    pos = np.array([[0, 1, 2, 3, 50], [0, 0, 1, 2, 3]])
    pe = np.asarray(P.sinusoidal(jnp.asarray(pos), d_model))
    assert pe.shape == (2, 5, d_model) and pe.dtype == np.float32
    for b, l, c in np.ndindex(*pe.shape):
        i = c // 2
        angle = pos[b, l] / 10000 ** (2 * i / d_model)  # PE(p, 2i) = sin, PE(p, 2i+1) = cos
        ref = math.sin(angle) if c % 2 == 0 else math.cos(angle)
        assert abs(pe[b, l, c] - ref) < 1e-5, (b, l, c)


def _rope_numpy(x, p, base=10000.0):
    """Rotate channel pair (2i, 2i+1) as the complex number x_2i + i x_2i+1 times exp(i p theta_i)."""
    k = x.shape[-1]
    theta = base ** (-np.arange(0, k, 2) / k)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * p * theta)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def test_rope_matches_complex_rotation_and_preserves_norm():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 100, 3, 0, 1]])
    out = np.asarray(P.apply_rope(jnp.asarray(x), jnp.asarray(pos)))
    for b, l in np.ndindex(2, 5):
        np.testing.assert_allclose(out[b, l], _rope_numpy(x[b, l].astype(np.float64), pos[b, l]), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(out[0, 0], x[0, 0], atol=1e-6)  # position 0 is the identity


def test_rope_scores_depend_only_on_relative_offset():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(1, 1, 2, 16)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 2, 16)), jnp.float32)

    def score(m, n):
        qm = P.apply_rope(q, jnp.array([[m]]))
        kn = P.apply_rope(k, jnp.array([[n]]))
        return np.asarray(jnp.einsum("blhk,blhk->h", qm, kn))

    for m, n in [(3, 1), (5, 5), (2, 9)]:
        base = score(m, n)
        for shift in (1, 17, 123):
            np.testing.assert_allclose(score(m + shift, n + shift), base, atol=1e-4)
    assert not np.allclose(score(3, 1), score(3, 2), atol=1e-3)  # but it does depend on the offset


def test_alibi_slopes_8_heads_and_non_power_of_two():
    np.testing.assert_allclose(P.alibi_slopes(8), [2.0**-i for i in range(1, 9)], rtol=1e-6)
    np.testing.assert_allclose(P.alibi_slopes(4), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], rtol=1e-6)
    # the paper's code for 6 heads: 4 slopes of the power of two below, then every other slope of 8 heads
    np.testing.assert_allclose(P.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], rtol=1e-6)


def test_alibi_bias():
    q_pos = jnp.array([[0, 1, 2, 3]])
    slopes = P.alibi_slopes(2)
    bias = np.asarray(P.alibi_bias(q_pos, q_pos, slopes))
    assert bias.shape == (1, 2, 4, 4)
    for h, i, j in np.ndindex(2, 4, 4):
        m = 2.0 ** (-8 * (h + 1) / 2)
        if j <= i:  # the paper's -m (i - j) on the keys a causal mask keeps
            assert abs(bias[0, h, i, j] + m * (i - j)) < 1e-6
        else:
            assert abs(bias[0, h, i, j] + m * (j - i)) < 1e-6  # symmetric for bidirectional attention
