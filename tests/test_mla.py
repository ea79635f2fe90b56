"""Multi-head latent attention (model.attention=mla, txjax.model.latent): one layer against its equations written in
NumPy here, the cache's bytes per token against kv_lora_rank + qk_rope_head_dim (what `run.py inspect` prints), and
the refusals in one line. Blockwise = reference and cached decoding (the absorbed form) = the full forward pass run
in tests/test_score_everywhere.py (OPTIONS' mla); DeepSeek-V3 = transformers in tests/test_deepseek_convert.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import config as config_lib
from txjax.decode.cache import init_cache
from txjax.errors import ConfigError
from txjax.families import init_params
from txjax.model import kv_cache, positional
from txjax.model.config import ModelConfig
from txjax.model.latent import LatentAttention
from txjax.model.models import DecoderLM
from txjax.ops.summary import summarize
from txjax.parallel.sharding import make_mesh, shardings_for

SIZES = dict(kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)


def np_rms(x, g, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g


def np_rotate(x_LxHxR, pos_L, base=10000.0):
    """RoPE on pairs (2i, 2i+1) by angle p * base^(-2i/R)."""
    r = x_LxHxR.shape[-1]
    angle = pos_L[:, None, None] * base ** (-np.arange(0, r, 2) / r)  # [L, 1, R/2]
    even, odd = x_LxHxR[..., 0::2], x_LxHxR[..., 1::2]
    out = np.empty_like(x_LxHxR)
    out[..., 0::2], out[..., 1::2] = (
        even * np.cos(angle) - odd * np.sin(angle),
        even * np.sin(angle) + odd * np.cos(angle),
    )
    return out


def test_one_layer_matches_its_equations_in_numpy():
    """q = RMSNorm(x W^DQ) W^UQ; [c ; k^R] = x W^DKV, c RMSNorm'd; k_h = [RoPE(k^R) ; c W^UK_h], v_h = c W^UV_h;
    causal softmax(q_h k_h / sqrt(d_k)) v_h, W^O: one row of 5 tokens, 2 heads, written out per head."""
    r, n, c_dim, v_dim, heads = 2, 4, 6, 3, 2
    layer = LatentAttention(
        num_heads=heads, num_kv_heads=heads, head_dim=r + n, rope=positional.Rope(), q_lora_rank=4,
        kv_lora_rank=c_dim, rope_dim=r, v_head_dim=v_dim,
    )  # fmt: skip
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype(np.float32)
    pos = jnp.arange(5)[None]
    shapes = nn.meta.unbox(jax.eval_shape(lambda: layer.init(jax.random.key(0), x, None, q_pos=pos))["params"])
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), shapes)
    got = jax.jit(lambda p: layer.apply({"params": p}, x, None, q_pos=pos, causal=True))(params)

    p = jax.tree.map(np.asarray, params)
    q = np.einsum("lq,qhk->lhk", np_rms(x[0] @ p["q_down"], p["q_norm"]["scale"]), p["q_up"])
    latent = x[0] @ p["kv_down"]
    c, k_rope = np_rms(latent[:, :c_dim], p["kv_norm"]["scale"]), np_rotate(latent[:, None, c_dim:], np.arange(5))
    q_rope, q_nope = np_rotate(q[..., :r], np.arange(5)), q[..., r:]
    out = np.zeros((5, 8))
    for h in range(heads):
        k_nope, v = c @ p["key_up"][:, h], c @ p["value_up"][:, h]
        s = (q_nope[:, h] @ k_nope.T + q_rope[:, h] @ k_rope[:, 0].T) / np.sqrt(r + n)
        s = np.where(np.tri(5, dtype=bool), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        out += (w / w.sum(-1, keepdims=True)) @ v @ p["out"][h]
    np.testing.assert_allclose(got[0], out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cache_holds_the_latent_and_the_rope_key_per_token_and_layer(dtype):
    """(kv_lora_rank + qk_rope_head_dim) x dtype bytes x layers per token, measured from the cache decoding
    allocates and printed by `run.py inspect` (summarize), against 2 x heads x d_k for multi-head attention."""
    fields = dict(vocab_size=16, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=8, positional="rope")
    mla = ModelConfig(**fields, attention="mla", dtype=dtype, **SIZES)
    cache = jax.eval_shape(lambda: init_cache(DecoderLM(mla), 3, 8))
    names = {path[-1].key for path, _ in jax.tree_util.tree_leaves_with_path(cache)}
    assert kv_cache.KEYS not in names and {kv_cache.LATENT, kv_cache.ROPE_KEY} <= names
    per_token = (6 + 2) * jnp.dtype(dtype).itemsize * 2
    assert kv_cache.bytes_per_token(cache, 3, 8) == per_token
    summary = summarize(mla, batch_size=3, context=8)
    assert summary.kv_bytes_per_token == per_token and f"{per_token:,} B" in summary.table()
    mha = summarize(ModelConfig(**fields, dtype=dtype), batch_size=3, context=8)
    assert mha.kv_bytes_per_token == 2 * 4 * 4 * jnp.dtype(dtype).itemsize * 2


def test_parameters_map_onto_a_mesh():
    """Every MLA parameter's logical axes map onto a mesh (no axis named twice: the latent axes are unsharded), as a
    run's state and run.py import need."""
    cfg = ModelConfig(vocab_size=16, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=8, positional="rope",
                      attention="mla", q_lora_rank=4, **SIZES)  # fmt: skip
    boxed = jax.eval_shape(lambda: init_params(DecoderLM(cfg), jax.random.key(0), boxed=True))
    shardings = shardings_for(boxed, make_mesh(devices=jax.devices()[:1]))
    assert set(shardings["decoder"]["layers"]["self_attention"]) >= {"q_down", "q_up", "kv_down", "key_up"}


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(attention="mla", positional="rope", num_kv_heads=2, **SIZES), "model.num_kv_heads=None"),
        (dict(attention="mla", positional="learned", **SIZES), "model.positional=rope"),
        (dict(attention="mla", positional="rope", attention_bias=True, **SIZES), "attention_bias=false"),
        (dict(attention="mla", positional="rope", attention_impl="fused", **SIZES), "attention_impl=reference"),
        (dict(attention="mla", positional="rope", **(SIZES | dict(kv_lora_rank=0))), "model.kv_lora_rank > 0"),
        (dict(kv_lora_rank=6), "read by model.attention=mla only"),
        (dict(attention="gqa"), "model.attention='gqa' is not one of mha, mla"),
        (dict(positional="rope", rope_mscale_all_dim=1.0), "model.rope_scaling=yarn"),
    ],
)
def test_bad_settings_are_one_line_naming_the_fix(fields, says):
    model = dict(vocab_size=16, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=8) | fields
    with pytest.raises(ConfigError) as e:
        config_lib.model_config(model)
    assert says in str(e.value) and "\n" not in str(e.value)
