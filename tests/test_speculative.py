"""Self-speculative greedy decoding (txjax.decode.speculative): the MTP modules draft, one cached call verifies; the
tokens equal plain greedy decoding's on a random model (drafts mostly refused: the emptied slots), a random one of
DeepSeek-V3's shape (MLA, MoE) and one whose MTP modules were set to agree with it (drafts mostly accepted), and what
it cannot do is refused in one line."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from txjax.decode import generate
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM

sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from speculative import weights  # noqa: E402  (the benchmark's weights: random, or modules set to agree)

VOCAB, NEW = 48, 20  # past 16 rounds: the caches grow once
CFG = ModelConfig(
    vocab_size=VOCAB, d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=64, positional="rope", norm="rmsnorm",
    mtp_depth=2,
)  # fmt: skip
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(0, VOCAB, RNG.integers(1, 9)).tolist() for _ in range(16)]


# DeepSeek-V3's shape: MLA's latent cache, a dense layer then an MoE one, the module's block MoE
LATENT = dict(attention="mla", kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, mtp_depth=1)
LATENT |= dict(num_layers=2, num_experts=4, moe_dense_first=1, router="sigmoid", activation="swiglu")


@pytest.mark.parametrize("name, eos", [("random", None), ("agreeing", 3), ("latent", None)])
def test_tokens_equal_greedy(name, eos):
    """16 prompts of 1-8 tokens, 20 new tokens each (the agreeing model with an EOS: rows stop apart): ids, stops and
    log-probabilities equal plain greedy decoding's; the agreeing model's drafts are mostly accepted."""
    # the random model's learned positions end where the longest prompt's generation does (drafts fed past them)
    learned = dict(positional="learned", max_len=8 + NEW - 1)
    cfg = dataclasses.replace(CFG, **(LATENT if name == "latent" else learned if name == "random" else {}))
    model = DecoderLM(cfg)
    params = weights(cfg, "agreeing" if name == "agreeing" else "random", noise=0.5, scale=5.0)
    want = generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=eos)
    got = generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=eos, speculative=True)
    assert got.ids == want.ids and got.stopped == want.stopped
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-4, rtol=0)
    tokens = sum(map(len, want.ids))
    if name == "agreeing":
        assert got.accepted > tokens / 3 and got.steps < NEW / 2  # up to 3 tokens a round
    assert 0 <= got.accepted < tokens


def test_what_it_cannot_do_is_refused():
    with pytest.raises(ValueError, match="model.mtp_depth > 0"):
        generate(DecoderLM(dataclasses.replace(CFG, mtp_depth=0)), {}, [[1]], max_new_tokens=2, speculative=True)
    with pytest.raises(ValueError, match="method=greedy"):
        generate(DecoderLM(CFG), {}, [[1]], max_new_tokens=2, method="sample", speculative=True)
    with pytest.raises(ValueError, match="ring buffer"):
        local = DecoderLM(dataclasses.replace(CFG, attention_window=4))
        generate(local, {}, [[1]], max_new_tokens=2, speculative=True)
