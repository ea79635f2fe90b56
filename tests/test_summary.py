"""run.py inspect's numbers: parameter counts, FLOPs and memory from shapes alone."""

import dataclasses

import jax

from txjax.convert.gpt2 import GPT2_SMALL  # noqa: E402
from txjax.decode import init_cache
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder
from txjax.ops.summary import summarize

TINY = ModelConfig(vocab_size=40, d_model=16, num_heads=4, num_kv_heads=2, d_ff=32, num_layers=2, max_len=12)


def test_gpt2_small_counts():
    s = summarize(GPT2_SMALL, batch_size=8)
    assert s.total_params == 124_439_808  # GPT-2 small as published by Hugging Face
    assert s.flop_params == 124_439_808 - 1024 * 768  # minus the position table
    assert s.train_flops_per_token == 6 * s.flop_params + 12 * 12 * 768 * 1024
    assert s.kv_cache_bytes >= 2 * 12 * 8 * 1024 * 768 * 4  # keys and values, float32
    assert "decoder/layers/self_attention" in s.table()


def test_tiny_counts_by_hand():
    d, ff, layers = TINY.d_model, TINY.d_ff, TINY.num_layers
    attention = d * 4 * 4 + 2 * d * 2 * 4 + 4 * 4 * d  # query, key and value (2 kv heads), out; no biases
    per_layer = attention + 2 * d * ff + 2 * 2 * d  # + FFN, + two LayerNorms (scale and bias)
    assert summarize(TINY).total_params == 40 * d + 12 * d + layers * per_layer + 2 * d


def test_cache_bytes_match_init_cache():
    for family, model_cls, cfg in [
        ("decoder_lm", DecoderLM, TINY),
        ("encoder_decoder", EncoderDecoder, dataclasses.replace(TINY, scan_layers=False)),
    ]:
        s = summarize(cfg, family, batch_size=3, context=10)
        cache = init_cache(model_cls(cfg), 3, 10, 10 if family == "encoder_decoder" else None)
        assert s.kv_cache_bytes == sum(a.nbytes for a in jax.tree.leaves(cache))
        assert s.param_bytes == 4 * s.total_params and s.optimizer_bytes == 2 * s.param_bytes


def test_untied_head_counts_in_flops_but_lookups_do_not():
    tied, untied = summarize(TINY), summarize(dataclasses.replace(TINY, tie_embeddings=False))
    head = TINY.vocab_size * TINY.d_model
    assert untied.total_params == tied.total_params + head
    assert untied.flop_params == tied.flop_params  # the head replaces the tied table as the matmul
