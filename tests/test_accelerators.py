"""What runs differently on an accelerator, checked on a CPU: the attention implementation `auto` picks, cuDNN's
fused attention as the CUDA program would call it (lowered for CUDA here with jax.export), the fused causal path
against the reference, float32 matmul precision, the suite's XLA flags and the persistent compilation cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import _accepted
from jax import export

from txjax.model import attention
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(vocab_size=50, d_model=64, num_heads=4, num_kv_heads=2, d_ff=96, num_layers=2, max_len=32)
CUDNN_CALLS = ("__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward")


def packed_batch(b=2, l=16, seed=0):
    """Tokens with two documents per row (segments 1 and 2, positions restarting) and right padding (segment 0)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG["vocab_size"], (b, l)).astype(np.int32)
    segments = np.zeros((b, l), np.int32)
    positions = np.zeros((b, l), np.int32)
    for row, (first, second) in enumerate([(6, 7), (9, 4)][:b]):
        segments[row, :first], segments[row, first : first + second] = 1, 2
        positions[row, :first], positions[row, first : first + second] = np.arange(first), np.arange(second)
    return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments)


def test_auto_resolves_per_backend(monkeypatch):
    assert attention.resolve_impl("auto", jnp.bfloat16, 64) == "reference"  # this CPU
    monkeypatch.setattr(attention, "cuda_available", lambda: True)
    assert attention.resolve_impl("auto", jnp.bfloat16, 64) == "cudnn"
    assert attention.resolve_impl("auto", jnp.float32, 64) == "reference"  # cuDNN's kernel is 16-bit
    assert attention.resolve_impl("auto", jnp.bfloat16, 256) == "reference"  # past its head dim
    assert attention.resolve_impl("fused", jnp.bfloat16, 64) == "fused"


def test_cudnn_without_a_gpu_is_one_line():
    with pytest.raises(ValueError, match="needs an NVIDIA GPU") as e:
        attention.resolve_impl("cudnn", jnp.bfloat16, 64)
    assert "\n" not in str(e.value)


def loss_fn(model, tokens, positions, segments):
    def loss(params):
        logits = model.apply({"params": params}, tokens, positions, segments)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * (segments > 0))

    return loss


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_causal_equals_the_reference(dtype):
    """The fused path applies causality as is_causal on top of the segment mask: with packed documents, restarting
    positions and padding, logits and gradients equal the reference's (padding rows zero in both)."""
    tokens, positions, segments = packed_batch()
    models = {impl: DecoderLM(ModelConfig(**CFG, dtype=dtype, attention_impl=impl)) for impl in ("reference", "fused")}
    # jitted: op by op, each primitive of the init, the passes and their gradients compiled on its own
    params = jax.jit(lambda: models["reference"].init(jax.random.key(0), tokens)["params"])()
    tol = 1e-5 if dtype == "float32" else 2e-2
    apply = {
        impl: jax.jit(lambda p, t, m=m: m.apply({"params": p}, t, positions, segments)) for impl, m in models.items()
    }
    ref, fused = (apply[impl](params, tokens) for impl in models)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(ref), atol=tol * np.abs(ref).max())
    grads = [jax.jit(jax.grad(loss_fn(m, tokens, positions, segments)))(params) for m in models.values()]
    for g_ref, g_fused in zip(jax.tree_util.tree_leaves(grads[0]), jax.tree_util.tree_leaves(grads[1]), strict=True):
        np.testing.assert_allclose(np.asarray(g_fused), np.asarray(g_ref), atol=tol * np.abs(g_ref).max() + 1e-9)
    # and the causal order is there: changing a later token of a document leaves earlier logits alone
    later = tokens.at[0, 5].set((tokens[0, 5] + 1) % CFG["vocab_size"])
    changed = apply["fused"](params, later)
    # exact by construction: the same program on other tokens, and a masked key adds an exact 0 to earlier queries
    np.testing.assert_array_equal(np.asarray(changed[0, :5]), np.asarray(fused[0, :5]))
    assert not np.allclose(np.asarray(changed[0, 5]), np.asarray(fused[0, 5]))


def cuda_program(monkeypatch, module, *args) -> str:
    """The StableHLO of the loss's gradient as jax would run it on CUDA (jax.export, lowered here on a CPU)."""
    import jax._src.cudnn.fused_attention_stablehlo as cudnn_attention

    monkeypatch.setattr(cudnn_attention, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(attention, "cuda_available", lambda: True)
    params = jax.eval_shape(lambda: module.init(jax.random.key(0), *args)["params"])

    def loss(p):
        return jnp.sum(module.apply({"params": p}, *args).astype(jnp.float32))

    checks = [export.DisabledSafetyCheck.custom_call(name) for name in CUDNN_CALLS]
    exported = export.export(jax.jit(jax.grad(loss)), platforms=["cuda"], disabled_checks=checks)(params)
    return exported.mlir_module()


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_auto_on_cuda_calls_cudnn_flash_attention_causally(monkeypatch, impl):
    """A bfloat16 LM's train gradient on CUDA: with auto, cuDNN's fused attention forward and backward with a CAUSAL
    mask type (is_causal, not a mask array in the kernel's place); with reference, no cuDNN call at all."""
    tokens, positions, segments = packed_batch()
    model = DecoderLM(ModelConfig(**CFG, dtype="bfloat16", attention_impl=impl))
    text = cuda_program(monkeypatch, model, tokens, positions, segments)
    calls = set(re.findall(r"custom_call @(\S+)\(", text))
    if impl == "reference":
        assert not any("cudnn" in c for c in calls)
        return
    assert set(CUDNN_CALLS) <= calls
    assert set(re.findall(r"mask_type\\22: \\22(\w+)", text)) == {"CAUSAL"}


def test_encoder_decoder_on_cuda_is_causal_only_in_the_decoder(monkeypatch):
    """Encoder self-attention and cross-attention are not causal: their cuDNN calls have no CAUSAL mask type."""
    src, positions, segments = packed_batch()
    model = EncoderDecoder(ModelConfig(**CFG, dtype="bfloat16", attention_impl="auto"))
    text = cuda_program(monkeypatch, model, src, src[:, :8])
    kinds = re.findall(r"mask_type\\22: \\22(\w+)", text)
    assert "CAUSAL" in kinds and "NO_MASK" in kinds


@pytest.mark.parametrize("precision", ["highest", "default"])
def test_float32_matmul_precision(precision):
    """model.matmul_precision reaches every float32 product of the model (the default, highest: float32 on a GPU
    whose XLA default is TF32), whatever precision surrounds it; a bfloat16 model's products keep the surrounding
    one (here the backend's default)."""
    tokens, positions, segments = packed_batch()
    for dtype in ("float32", "bfloat16"):
        model = DecoderLM(ModelConfig(**CFG, dtype=dtype, matmul_precision=precision))
        params = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), tokens)["params"])
        forward = jax.jit(lambda p, m=model: m.apply({"params": p}, tokens, positions, segments))
        with jax.default_matmul_precision("default"):  # the suite's own default is highest (tests/conftest.py)
            text = forward.lower(params).as_text()
        dots = re.findall(r"stablehlo.dot_general.*", text)
        assert len(dots) >= 2 * CFG["num_layers"]
        highest = [d for d in dots if "HIGHEST" in d]
        expected = dots if (precision == "highest" and dtype == "float32") else []
        assert highest == expected


def test_suite_flags_are_probed():
    """tests/conftest.py passes an XLA flag only where a child XLA starts with it (an unknown one aborts XLA)."""
    assert _accepted({"--xla_force_host_platform_device_count": "2"})
    assert not _accepted({"--xla_no_such_flag_anywhere": "1"})


def test_second_run_compiles_from_the_persistent_cache(tmp_path):
    """run.py train keeps its compiled programs in TXJAX_CACHE_DIR/jax: an identical second run loads its train
    step from there (jax logs each hit), the first compiles it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= {"TXJAX_CACHE_DIR": str(tmp_path / "cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    env |= {"JAX_LOG_COMPILES": "1"}
    flags = ["--config.train.steps=2", "--config.data.eval_size=8", "--config.model.num_layers=1"]
    flags += ["--config.train.batch_size=4", "--config.model.d_model=32", "--config.model.d_ff=32"]
    hits = []
    for run in ("first", "second"):
        command = [sys.executable, "run.py", "train", f"--workdir={tmp_path / run}", *flags]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        hits.append(re.findall(r"Persistent compilation cache hit for '(\w+)'", done.stderr))
    assert (tmp_path / "cache" / "jax").is_dir()
    assert "jit_train_step" not in hits[0] and "jit_train_step" in hits[1], hits


def test_decode_steps_on_cuda_read_the_cache_with_the_reference(monkeypatch):
    """auto's cuDNN kernel is for whole sequences: a cached decode step (one query against the cache, read by
    txjax.decode.kernels as every txjax decode step is) lowers for CUDA without it, while the same model's training
    pass uses it."""
    import jax._src.cudnn.fused_attention_stablehlo as cudnn_attention

    from txjax.decode import kernels

    monkeypatch.setattr(cudnn_attention, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(attention, "cuda_available", lambda: True)
    model = DecoderLM(ModelConfig(**CFG, dtype="bfloat16", attention_impl="auto"))
    with kernels.installed():
        variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((2, 8), jnp.int32), decode=True))
        step = jax.jit(lambda v, t: model.apply(v, t, decode=True, mutable=["cache"]))
        shapes = (variables, jax.ShapeDtypeStruct((2, 1), jnp.int32))
        text = export.export(step, platforms=["cuda"])(*shapes).mlir_module()
    assert "cudnn" not in text


def test_one_row_kernels_out_major_only_on_a_cpu(monkeypatch):
    """for_decoding's [out, in] kernels are an XLA:CPU matrix-vector layout: on another backend one row keeps
    training's [in, out] (fused projections and unrolled layers stay)."""
    from txjax.decode import for_decoding

    model = DecoderLM(ModelConfig(**CFG))
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
    assert "kernel_t" in for_decoding(model, params, 1)[1]["decoder"]["layers_0"]["ffn"]["wo"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    decoding_model, decoding = for_decoding(model, params, 1)
    layer = decoding["decoder"]["layers_0"]
    assert "qkv" in layer["self_attention"] and not decoding_model.cfg.scan_layers and "kernel" in layer["ffn"]["wo"]
