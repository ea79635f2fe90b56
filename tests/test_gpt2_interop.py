"""GPT-2 interop against transformers' PyTorch GPT2LMHeadModel (skipped without the `interop` extra)."""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from txjax.convert import load_gpt2, load_gpt2_tokenizer, save_gpt2  # noqa: E402
from txjax.data import load_tokenizer  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

VOCAB, CTX = 300, 64


@pytest.fixture(scope="module")
def hf_model():
    """A small random GPT-2 with logits of order 10: LayerNorm gains ~ N(1, 0.3^2), every other weight (biases too)
    ~ N(0, 0.3^2), so a mis-mapped tensor shows."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=CTX, bos_token_id=None, eos_token_id=None
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if ".ln_" in name and name.endswith(".weight") else 0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def hf_folder(hf_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    hf_model.save_pretrained(folder)
    return folder


def torch_logits(model, tokens_BxL):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens_BxL))).logits.numpy()


def txjax_logits(cfg, params, tokens_BxL):
    return np.asarray(DecoderLM(cfg).apply({"params": params}, jnp.asarray(tokens_BxL)))


def random_tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


def test_logits_match_pytorch(hf_model, hf_folder):
    """txjax's float32 logits against the exact ones: transformers in float64, whose sums, whatever its kernels,
    threads and data alignment (MKL picks code paths by alignment), are exact to ~1e-14.

    The yardstick: how far the logits move when every parameter moves by one float32 ulp (seeded random directions).
    Evaluating the forward pass in float32, in any summation order, errs like O(1)-ulp perturbations of its operands,
    so its error is a small multiple of that (measured: 0.9x); the large random weights amplify both alike. A mapping
    error does not: a LayerNorm epsilon of 1e-6 for 1e-5 or the exact GELU for GPT-2's tanh one moves the logits by
    ~30 and ~90 yardsticks, and the test checks that both stay outside twice the tolerance.
    """
    cfg, params = load_gpt2(hf_folder)
    tokens = random_tokens((3, CTX))
    exact = torch_logits(copy.deepcopy(hf_model).double(), tokens)
    assert np.abs(exact).max() > 5.0  # not a trivially small signal
    ours = txjax_logits(cfg, params, tokens)
    rng = np.random.default_rng(0)
    direction = lambda p: np.where(rng.random(p.shape) < 0.5, -np.inf, np.inf).astype(p.dtype)
    nudged = jax.tree_util.tree_map(lambda p: np.nextafter(p, direction(p)), jax.device_get(params))
    tolerance = 5 * np.abs(txjax_logits(cfg, nudged, tokens) - ours).max()
    np.testing.assert_allclose(ours, exact, atol=tolerance, rtol=0)
    for mistake in ({"norm_eps": 1e-6}, {"activation": "gelu"}):  # what the check is there to catch
        assert np.abs(txjax_logits(dataclasses.replace(cfg, **mistake), params, tokens) - exact).max() > 2 * tolerance


def test_greedy_matches_generate(hf_model, hf_folder):
    """txjax.decode (KV cache, a batch of left-padded prompts) picks what transformers' greedy generate picks."""
    cfg, params = load_gpt2(hf_folder)
    prompts = [random_tokens(5, seed=1).tolist(), random_tokens(9, seed=2).tolist()]
    out = generate(DecoderLM(cfg), params, prompts, max_new_tokens=20)
    for prompt, ids in zip(prompts, out.ids):
        with torch.no_grad():
            ref = hf_model.generate(torch.as_tensor([prompt]), do_sample=False, max_new_tokens=20)[0].tolist()
        assert ids == ref[len(prompt) :]


def test_sharded_checkpoint_imports(hf_model, hf_folder, tmp_path):
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _, sharded = load_gpt2(tmp_path)
    _, single = load_gpt2(hf_folder)
    np.testing.assert_array_equal(
        sharded["decoder"]["layers"]["ffn"]["wi"]["kernel"], single["decoder"]["layers"]["ffn"]["wi"]["kernel"]
    )


def test_export_loads_in_transformers(hf_model, hf_folder, tmp_path):
    cfg, params = load_gpt2(hf_folder)
    save_gpt2(tmp_path / "out", cfg, params)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    tokens = random_tokens((2, 16), seed=2)
    np.testing.assert_allclose(torch_logits(reloaded, tokens), torch_logits(hf_model, tokens), atol=1e-5, rtol=0)
    exact = torch_logits(reloaded.double(), tokens)  # as in test_logits_match_pytorch
    np.testing.assert_allclose(txjax_logits(cfg, params, tokens), exact, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    """A tiny GPT-2-style byte-level BPE (vocab.json + merges.txt), trained here: no download."""
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("bpe")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog"] * 5, vocab_size=290, special_tokens=["<|endoftext|>"]
    )
    bpe.save_model(str(folder))
    return folder


@pytest.mark.parametrize("saved_by", ["gpt2_files", "transformers"])
def test_tokenizer_matches_transformers(bpe_folder, tmp_path, saved_by):
    hf = transformers.GPT2Tokenizer.from_pretrained(bpe_folder)
    if saved_by == "transformers":  # transformers 5 writes only tokenizer.json
        hf.save_pretrained(tmp_path)
        bpe_folder = tmp_path
    tok = load_gpt2_tokenizer(bpe_folder)
    text = "the lazy fox<|endoftext|> jumps ünïcode 日本 \U0001f600\n  over"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.eos_id == hf.eos_token_id
    tok.save(tmp_path / "txjax_tok")
    restored = load_tokenizer(tmp_path / "txjax_tok")
    assert restored.encode(text) == tok.encode(text)
    assert restored.decode(restored.encode(text)) == text.replace("<|endoftext|>", "")
