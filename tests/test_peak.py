"""The MFU terms: model FLOPs of a training step (txjax.ops.summary) and the measured matmul peak, cached
(txjax.ops.peak)."""

import dataclasses
import json

import jax
import numpy as np

from txjax.model.config import ModelConfig
from txjax.ops import peak
from txjax.ops.summary import train_flops_per_batch

TINY = ModelConfig(vocab_size=40, d_model=16, num_heads=4, num_kv_heads=2, d_ff=32, num_layers=2, max_len=12)
D, FF, L, V = TINY.d_model, TINY.d_ff, TINY.num_layers, TINY.vocab_size
ATTENTION = D * 4 * 4 + 2 * D * 2 * 4 + 4 * 4 * D  # query, key and value (2 kv heads), out; no biases
NORM = 2 * D  # LayerNorm scale and bias


def shapes(**arrays):
    return {name: jax.ShapeDtypeStruct(shape, np.int32) for name, shape in arrays.items()}


def test_decoder_lm_flops_by_hand():
    n = V * D + L * (ATTENTION + 2 * D * FF + 2 * NORM) + NORM  # tied head; the position table is only looked up
    b, t = 3, 10
    assert train_flops_per_batch(TINY, "decoder_lm", shapes(inputs=(b, t))) == b * t * (6 * n + 12 * L * D * t)


def test_encoder_decoder_flops_by_hand():
    """B·(6·N_enc·S + 6·N_dec·T + 12·d·(L_enc·S² + L_dec·(T² + T·S))); the shared, tied table is the decoder's head."""
    cfg = dataclasses.replace(TINY, scan_layers=False)
    n_enc = L * (ATTENTION + 2 * D * FF + 2 * NORM) + NORM
    n_dec = V * D + L * (2 * ATTENTION + 2 * D * FF + 3 * NORM) + NORM
    b, s, t = 3, 7, 5
    expected = b * (6 * n_enc * s + 6 * n_dec * t + 12 * D * (L * s * s + L * (t * t + t * s)))
    assert train_flops_per_batch(cfg, "encoder_decoder", shapes(src=(b, s), tgt_inputs=(b, t))) == expected


def test_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TXJAX_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(quick, repeats, variants):
        calls.append((quick, repeats, tuple(variants)))
        return {"rows": [], "peak_gflops": {"float32": 100.0, "bfloat16": 200.0}}

    monkeypatch.setattr(peak, "measure", fake_measure)
    assert peak.peak_gflops() == {"float32": 100.0, "bfloat16": 200.0}
    assert calls == [(True, peak.QUICK_REPEATS[jax.devices()[0].platform], ("float32", "bfloat16"))]
    path = tmp_path / f"peak_{jax.devices()[0].device_kind}.json"
    assert peak.cache_path() == path and json.loads(path.read_text())["device_kind"] == jax.devices()[0].device_kind
    assert peak.peak_gflops() == {"float32": 100.0, "bfloat16": 200.0}
    assert len(calls) == 1 and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_float32_peak_multiplies_in_float32():
    """The float32 variant asks for float32 products (a GPU's default is TF32); its TF32 twin for TF32."""
    a = jax.ShapeDtypeStruct((8, 8), np.float32)
    text = {name: jax.jit(fn).lower(a, a).as_text() for name, fn in peak._matmul_fns(peak.VARIANTS).items()}
    assert "HIGHEST" in text["float32"] and "HIGHEST" not in text["tensorfloat32"] and "HIGH" in text["tensorfloat32"]
