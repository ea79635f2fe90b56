"""Gemma 2 and Gemma 3 (text) interop against transformers' PyTorch Gemma2ForCausalLM and Gemma3ForCausalLM on tiny
random models built here: `run.py import` -> logits within 1e-4 (reference and blockwise attention) and the same 40
greedy tokens as transformers.generate (past the sliding window), `run.py export` -> transformers loads the folder
and gives the same logits, and a config txjax cannot represent is one line naming the field (skipped without the
`interop` extra)."""

import dataclasses

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("compilation_cache")  # tests/conftest.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import run  # noqa: E402
from txjax.convert.gemma import config_from_hf, window_pattern  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.config import ModelConfig  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 20
CTX, NEW_TOKENS = 64, 40
COMMON = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=CTX,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
MODELS = {
    # Gemma 2: alternating local/global layers, both soft caps binding, a score scale apart from 1/sqrt(d_k)
    "gemma2": lambda vocab: transformers.Gemma2Config(
        vocab_size=vocab,
        **COMMON,
        num_hidden_layers=2,
        sliding_window=6,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=8.0,
    ),
    # Gemma 3: its 5:1 pattern over 6 layers, q/k norms, the local base 1e4 and a linear x8 global RoPE, untied head
    "gemma3_text": lambda vocab: transformers.Gemma3TextConfig(
        vocab_size=vocab,
        **COMMON,
        num_hidden_layers=6,
        sliding_window=8,
        query_pre_attn_scalar=16,
        tie_word_embeddings=False,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


def randomized(config):
    """A transformers model whose logits are of order 10: the (1 + w) norms' w ~ N(0, 0.2^2), all else N(0, 0.3^2)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.2 if "norm" in name else 0.3)
    return model


def save_tiny(kind: str, folder):
    """A random `kind` model saved by transformers with a byte-level BPE fast tokenizer trained on TEXT."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT], vocab_size=120, special_tokens=["<s>", "</s>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>")
    model = randomized(MODELS[kind](bpe.get_vocab_size()))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(MODELS))
def imported(request, tmp_path_factory):
    """(kind, transformers model, the workdir `run.py import` wrote, root)"""
    root = tmp_path_factory.mktemp(request.param)
    model = save_tiny(request.param, root / "hf")
    (root / "text.txt").write_text(TEXT)
    flags = [f"--config.data.path={root / 'text.txt'}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}", *flags]) == 0
    return request.param, model, root / "wd", root


def torch_logits(model, tokens_BxL):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens_BxL))).logits.numpy()


def tokens(vocab):
    return np.random.default_rng(0).integers(0, vocab, (2, CTX))


def test_import_logits_and_greedy_tokens_match_transformers(imported):
    kind, model, workdir, _ = imported
    trained = load_workdir(workdir)
    cfg = trained.model.cfg
    assert (cfg.qk_norm, cfg.norm_placement, cfg.norm_offset) == (kind == "gemma3_text", "sandwich", True)
    assert cfg.window_pattern == {"gemma2": "LG", "gemma3_text": "LLLLLG"}[kind]
    ids = tokens(cfg.vocab_size)
    ref = torch_logits(model, ids)
    assert np.abs(ref).max() > 3.0  # not a trivially small signal
    got = np.asarray(trained.model.apply({"params": trained.params}, ids))
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    blocks = dataclasses.replace(cfg, attention_impl="blockwise", attention_block_q=16, attention_block_kv=16)
    blockwise = np.asarray(DecoderLM(blocks).apply({"params": trained.params}, ids))  # soft caps, windows by blocks
    np.testing.assert_allclose(blockwise, ref, atol=1e-4, rtol=0)
    prompt = ids[0, :5]
    with torch.no_grad():
        want = model.generate(torch.as_tensor(prompt[None]), max_new_tokens=NEW_TOKENS, do_sample=False)
    out = generate(trained.model, trained.params, [prompt.tolist()], max_new_tokens=NEW_TOKENS)
    assert out.ids[0] == want[0, 5:].tolist()  # 45 tokens: past the window of 6 / 8


def test_export_round_trip(imported):
    kind, model, workdir, root = imported
    assert run.main(["export", f"--workdir={workdir}", f"--to={root / 'out'}"]) == 0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(root / "out").eval()
    assert reloaded.config.model_type == kind
    ids = tokens(model.config.vocab_size)
    np.testing.assert_allclose(torch_logits(reloaded, ids), torch_logits(model, ids), atol=1e-5, rtol=0)


def test_layer_types_become_the_shortest_window_pattern():
    local, full = "sliding_attention", "full_attention"
    assert window_pattern([local, full] * 3) == "LG"
    assert window_pattern(([local] * 5 + [full]) * 4 + [local] * 2) == "LLLLLG"  # 26 layers: Gemma 3 1B's
    assert window_pattern([local] * 4) == ""  # every layer local: window_pattern's default
    assert window_pattern([full, local, local]) == "GLL"


GEMMA2 = {**COMMON, "model_type": "gemma2", "vocab_size": 64, "num_hidden_layers": 2}


def test_older_config_json_fields():
    """The Hub's configs from before transformers 5: top-level rope_theta / rope_scaling / rope_local_base_freq and
    sliding_window_pattern instead of rope_parameters and layer_types (Gemma 3 4B's text model; Gemma 2's)."""
    gemma3 = {**GEMMA2, "model_type": "gemma3_text", "num_hidden_layers": 8, "sliding_window": 1024}
    gemma3 |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    cfg = config_from_hf(gemma3 | {"sliding_window_pattern": 6, "query_pre_attn_scalar": 256}, has_head=False)
    assert (cfg.window_pattern, cfg.attention_window, cfg.layer_windows[4:]) == ("LLLLLG", 1024, (1024, 0, 1024, 1024))
    assert (cfg.rope_base, cfg.rope_scaling, cfg.rope_factor, cfg.rope_local_base) == (1e6, "linear", 8.0, 1e4)
    assert (cfg.attention_scale_dim, cfg.qk_norm, cfg.tie_embeddings) == (256, True, True)
    old2 = {**GEMMA2, "num_hidden_layers": 4, "sliding_window": 4096, "rope_theta": 1e4, "query_pre_attn_scalar": 16}
    cfg = config_from_hf(old2 | {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}, has_head=False)
    assert (cfg.window_pattern, cfg.attention_scale_dim, cfg.rope_local_base) == ("LG", 0, 0.0)
    assert (cfg.attention_softcap, cfg.logit_softcap) == (50.0, 30.0)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gemma3"}, "model_type"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
        (
            {
                "model_type": "gemma3_text",
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                },
            },
            "sliding_attention",
        ),
    ],
)
def test_unrepresentable_config_names_the_field(change, field):
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf({**GEMMA2, **change}, has_head=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(attention_softcap=50.0, attention_impl="fused"), "attention_impl"),
        (dict(attention_softcap=-1.0), "attention_softcap"),
        (dict(norm_offset=True), "norm_offset"),  # a LayerNorm model
        (dict(attention_scale_dim=24, attention_scale="none"), "attention_scale_dim"),
    ],
)
def test_model_config_refuses_what_no_path_computes(fields, named):
    with pytest.raises(ValueError, match=named) as e:
        ModelConfig(vocab_size=8, **fields)
    assert "\n" not in str(e.value)
