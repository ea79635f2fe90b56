"""Long prompts in decoding: a prompt fed in chunks (Strategy.prefill_chunk) generates what the one-call prefill does,
and holds chunk x cache attention scores instead of prompt x cache."""

import jax
import numpy as np
import pytest
from test_decode import PAD, lm, random_ids

from txjax import decode


def run(model, params, prompts, chunk, **strategy):
    prompt_BxP, lengths_B = decode.pad_batch(prompts, PAD, left=True)
    s = decode.Strategy(max_new_tokens=10, prefill_chunk=chunk, **strategy)
    return decode.generate_ids(model, params, s, PAD, prompt_BxP, lengths_B, None, jax.random.key(3))


@pytest.mark.parametrize("impl", ["reference", "blockwise"])
@pytest.mark.parametrize("strategy", [{}, {"method": "sample", "temperature": 1.5, "num_samples": 2}])
def test_chunked_prefill_generates_what_one_call_does(impl, strategy):
    """Prompts of 17 and 9 tokens (left-padded), chunks of 4 (17 is padded to 20: a ragged first chunk), 5 and 16."""
    model, params = decode.for_decoding(*lm("rope", max_len=40, attention_impl=impl), rows=2)
    prompts = [random_ids(1, 17).tolist(), random_ids(2, 9).tolist()]
    whole_CxT, whole_C, _ = run(model, params, prompts, None, **strategy)
    for chunk in (4, 5, 16):
        tokens_CxT, scores_C, _ = run(model, params, prompts, chunk, **strategy)
        np.testing.assert_array_equal(tokens_CxT, whole_CxT, err_msg=f"chunk {chunk}")
        np.testing.assert_allclose(scores_C, whole_C, rtol=1e-5, atol=1e-5)


def test_a_chunked_prefill_holds_less_than_the_whole_prompts_scores():
    """XLA's temporaries of the compiled generation: a 1,024-token prompt in chunks of 64 against one call (whose
    scores alone are 4 heads x 1,024 x 1,024 float32 = 16 MiB per layer)."""
    model, params = decode.for_decoding(*lm("rope", max_len=1040))
    prompt_BxP, lengths_B = decode.pad_batch([random_ids(4, 1024).tolist()], PAD, left=True)

    def temp_bytes(chunk):
        s = decode.Strategy(max_new_tokens=4, prefill_chunk=chunk)
        args = (model, params, s, PAD, prompt_BxP, lengths_B, None, jax.random.key(0))
        return decode.generate_ids.lower(*args).compile().memory_analysis().temp_size_in_bytes

    whole, chunked = temp_bytes(None), temp_bytes(64)
    assert whole > 16 * 2**20 and chunked < whole / 4, (whole, chunked)


def test_prefill_chunk_must_be_positive():
    with pytest.raises(ValueError, match="prefill_chunk=0 must be >= 1"):
        decode.Strategy(max_new_tokens=1, prefill_chunk=0)
