"""DeepSeek-V3 interop against transformers' DeepseekV3ForCausalLM (multi-head latent attention, dense or MoE):
logits within 1e-4 in float32, greedy generation by the latent cache (the absorbed form) equal to transformers',
the export round trip (skipped without the `interop` extra)."""

import dataclasses

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")

from tiny_hf import assert_logits_match, hf_greedy, randomized, torch_logits, txjax_logits  # noqa: E402

from txjax.convert.deepseek import load_deepseek, write_deepseek  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model import mtp  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

VOCAB, LAYERS = 64, 2
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS, num_attention_heads=4)
SHAPE |= dict(first_k_dense_replace=LAYERS, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
SHAPE |= dict(max_position_embeddings=32, bos_token_id=None, eos_token_id=None, pad_token_id=None)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8, mscale=1.0)
CASES = {  # dense, queries projected directly, rotate_half's RoPE; a query latent, YaRN with DeepSeek's mscale_all_dim
    # and 3 layers, the first dense and MoE from the second on (first_k_dense_replace=1): 8 experts in 4 groups, top-2
    # of the best 2 groups by sigmoid + bias, renormalised and scaled, one shared expert
    "dense, q_proj, rotate_half": dict(q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True),
    "q latent, yarn, moe": dict(
        q_lora_rank=8, rope_interleave=True, tie_word_embeddings=False, rope_parameters=YARN | dict(mscale_all_dim=0.8),
        num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16, routed_scaling_factor=2.5,
        norm_topk_prob=True,
    ),
}  # fmt: skip
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 32))


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    """(transformers model, txjax's ModelConfig and params read from the folder it saved) of a case."""
    config = transformers.DeepseekV3Config(**(SHAPE | CASES[request.param]))
    model, folder = randomized(transformers.AutoModelForCausalLM.from_config(config)), tmp_path_factory.mktemp("ds")
    for name, buffer in model.named_buffers():  # the routers' selection biases (zeros at init): some choices move
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    model.save_pretrained(folder)
    return model, *load_deepseek(folder)


def test_logits_match_transformers(converted):
    model, cfg, params = converted
    moe = model.config.first_k_dense_replace < model.config.num_hidden_layers
    assert cfg.attention == "mla" and cfg.kv_lora_rank == 12
    assert (cfg.num_experts, cfg.moe_dense_first, cfg.moe_groups, cfg.moe_routed_scale) == (
        (8, 1, 4, 2.5) if moe else (0, 0, 1, 1)
    )
    assert_logits_match(model, cfg, params, TOKENS)


def test_cached_greedy_decoding_matches_transformers(converted):
    """24 greedy tokens after an 8-token prompt past the YaRN case's original context of 8, decoded through the
    latent cache in the absorbed form, equal transformers' generate."""
    model, cfg, params = converted
    prompt = TOKENS[0, :8].tolist()
    got = generate(DecoderLM(cfg), params, [prompt], max_new_tokens=24, eos_id=None)
    assert got.ids[0] == hf_greedy(model, prompt, 24)


def test_export_round_trip(converted, tmp_path):
    """write_deepseek's folder, reloaded by transformers, gives the logits txjax gives; with YaRN also for txjax's own
    attention factor (rope_attention_factor=0: 0.1 ln(factor) + 1) beside mscale_all_dim."""
    _, cfg, params = converted
    variants = [cfg] + ([dataclasses.replace(cfg, rope_attention_factor=0.0)] if cfg.rope_scaling == "yarn" else [])
    for i, variant in enumerate(variants):
        (tmp_path / str(i)).mkdir()
        write_deepseek(tmp_path / str(i), variant, params)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / str(i)).eval()
        want = txjax_logits(variant, params, TOKENS)
        np.testing.assert_allclose(torch_logits(reloaded, TOKENS), want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def with_mtp(converted, tmp_path_factory):
    """(folder, transformers' MtpModel) of a case's checkpoint with DeepSeek-V3's MTP layer added as its release
    stores it, model.layers.{L}.*: enorm, hnorm, eh_proj, shared_head.norm, copies of the embedding and head, and a
    decoder layer (MoE in the MoE case, DeepSeek-V3's layer 61 being past its dense ones), layer L of a model of L + 1
    layers saved by transformers; MtpModel (transformers' generic MTP module) holds the same tensors."""
    from transformers.modeling_layers import MtpModel

    model, cfg, _ = converted
    folder, layers = tmp_path_factory.mktemp("ds_mtp"), model.config.num_hidden_layers
    dense = model.config.first_k_dense_replace if cfg.num_experts else layers + 1
    longer = transformers.DeepseekV3Config(**(model.config.to_dict() | dict(num_hidden_layers=layers + 1)))
    longer.first_k_dense_replace = dense
    longer = randomized(transformers.AutoModelForCausalLM.from_config(longer))
    for name, buffer in longer.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(2)) * 0.3)
    mtp_model = randomized(MtpModel(model, 1), keep=lambda name: name.startswith(("embed_tokens", "shared_head")))
    mtp_model.layers[0].mtp_block = longer.model.layers[layers]
    longer.save_pretrained(folder / "longer")
    model.save_pretrained(folder)
    tensors = safetensors.load_file(folder / "model.safetensors")
    prefix = f"model.layers.{layers}."
    state = {"embed_tokens.weight": model.get_input_embeddings().weight}
    state |= {"shared_head.head.weight": model.get_output_embeddings().weight}
    state |= {f"{n}.weight": getattr(mtp_model.layers[0], n).weight for n in ("enorm", "hnorm", "eh_proj")}
    state["shared_head.norm.weight"] = mtp_model.layers[0].post_norm.weight
    tensors |= {prefix + name: value.detach().clone() for name, value in state.items()}
    saved = safetensors.load_file(folder / "longer" / "model.safetensors")
    tensors |= {name: value for name, value in saved.items() if name.startswith(prefix)}
    safetensors.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder, mtp_model


def test_mtp_layer_logits_match_transformers_mtp_module(converted, with_mtp, tmp_path):
    """The checkpoint's MTP layer, read into model.mtp_depth=1's module (txjax.model.mtp), gives the depth-1 logits
    transformers' MtpModel gives from the model's last hidden state and the next tokens; written back by export, it
    reads back to the same parameters."""
    model, *_ = converted
    folder, mtp_model = with_mtp
    cfg, params = load_deepseek(folder)
    assert cfg.mtp_depth == 1
    _, sown = jax.jit(lambda p: DecoderLM(cfg).apply({"params": p}, TOKENS, mutable=[mtp.MTP]))(params)
    got = np.asarray(sown[mtp.MTP]["logits"][0])[:, :-1]  # position i predicts t_{i+2} from h_i and t_{i+1}
    with torch.no_grad():
        h = model.model(torch.as_tensor(TOKENS)).last_hidden_state[:, :-1]
        positions = torch.arange(1, TOKENS.shape[1]).expand(TOKENS.shape[0], -1)
        hidden = mtp_model.forward_layer(0, h, positions, None, input_ids=torch.as_tensor(TOKENS[:, 1:]))
        want = mtp_model._project_to_logits(hidden).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(want).max() > 1
    write_deepseek(tmp_path, cfg, params)
    back_cfg, back = load_deepseek(tmp_path)
    assert back_cfg == cfg
    jax.tree.map(np.testing.assert_array_equal, back, params)
