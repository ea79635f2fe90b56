"""Every parameter of every family and option carries the role its module declared (txjax.model.roles), and the
roles say what the optimizers need: weight decay on matrices, embeddings and the head only; Muon's matrices and
their axes; muP's hidden weights. The expectations are written here from the parameters' place in the model, so a
module that creates a parameter without a role, or with a wrong one, fails."""

import flax.linen as nn
import jax
import optax.contrib
import pytest

from txjax import families
from txjax.model import roles
from txjax.model.config import ModelConfig
from txjax.state.optim import decayed, muon_dimensions

SMALL = dict(vocab_size=11, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=8)
OPTIONS = {  # every option that adds, removes or reshapes parameters
    "plain": {},
    "untied, biases, learned positions, layernorm": dict(tie_embeddings=False, use_bias=True),
    "rope, rmsnorm, gated, qkv biases, qk norm": dict(
        positional="rope", norm="rmsnorm", activation="swiglu", qkv_bias=True, qk_norm=True
    ),
    "offset rmsnorm, qk norm over all heads, sandwich": dict(
        norm="rmsnorm", norm_offset=True, qk_norm=True, norm_placement="sandwich"
    ),
    "T5 buckets, logits bias, embedding norm": dict(
        positional="relative_buckets", final_logits_bias=True, embed_norm=True, tie_embeddings=False
    ),
    "MoE: sigmoid router, shared experts and gate, every other layer": dict(
        num_experts=4, router="sigmoid", num_shared_experts=1, shared_expert_gate=True, moe_every=2
    ),
    "layers not scanned, GQA": dict(scan_layers=False, num_heads=4, num_kv_heads=2),
    "attention sinks": dict(attention_sinks=True),
    "multi-token prediction": dict(mtp_depth=1),
    "MLA with a query latent": dict(
        positional="rope",
        attention="mla",
        q_lora_rank=4,
        kv_lora_rank=6,
        qk_nope_head_dim=4,
        qk_rope_head_dim=2,
        v_head_dim=3,
    ),
    "Gated DeltaNet and gated full layers": dict(layer_types="LF", linear_v_heads=4, attention_output_gate=True),
}
# what each parameter is, from its name and its module's: the test's own reading, independent of the library's
QKV, OUT = {"query", "key", "value", "q", "q_up", "key_up", "value_up"}, {"out"}  # MLA's [latent or D, heads, K]
QKV |= {"gate"}  # a Gated DeltaNet's output gate z [D, heads, V], gated attention's W^G [D, heads, K]
# a Gated DeltaNet layer's own: b and a [D, heads] matrices; the convolution's taps vector-like (decayed, never Muon's);
# A_log and dt_bias per head and the gated norm's gain not decayed
LINEAR = {"beta": (True, "matrix"), "decay": (True, "matrix"), "conv": (True, None), "A_log": (False, None)}
LINEAR |= {"dt_bias": (False, None), "norm": (False, None)}
MATRICES = {"wi", "wi_gate", "wo", "router", "shared_expert_gate", "proj"}  # Dense kernels, expert weights by module
LATENT_DOWN = {"q_down", "kv_down"}  # MLA's [D, latent]
NOT_DECAYED = {"scale", "bias", "sinks"}  # sinks: a logit per head, added (GPT-OSS's are not decayed)


def expected(path, ndim):
    """(decayed, Muon's dimension numbers or None) of the parameter at `path` with `ndim` axes."""
    keys = [getattr(k, "key", None) for k in path]
    name, parent = keys[-1], keys[-2]
    if parent == "linear_attention" and name in LINEAR:
        is_decayed, kind = LINEAR[name]
        return is_decayed, optax.contrib.MuonDimensionNumbers(ndim - 2, ndim - 1) if kind else None
    if name in NOT_DECAYED or name.endswith("_bias"):
        return False, None
    if name in QKV:  # [..., D, heads, K]
        return True, optax.contrib.MuonDimensionNumbers(ndim - 3, (ndim - 2, ndim - 1))
    if name in OUT:  # [..., H, K, D]
        return True, optax.contrib.MuonDimensionNumbers((ndim - 3, ndim - 2), ndim - 1)
    if (name == "kernel" and parent in MATRICES) or parent == "experts" or name in LATENT_DOWN:
        return True, optax.contrib.MuonDimensionNumbers(ndim - 2, ndim - 1)
    assert name in ("embedding", "relative_table") or parent == "lm_head", path  # the embeddings and the head
    return True, None


@pytest.mark.parametrize("family", list(families.FAMILIES))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_parameter_has_the_role_its_place_says(family, option):
    model = families.build(family, ModelConfig(**SMALL | OPTIONS[option]))
    if family == "prefix_lm" and "layer_types" in OPTIONS[option]:  # a recurrence cannot read the source both ways
        with pytest.raises(ValueError, match="family prefix_lm reads its source both ways"):
            families.param_roles(model)
        return
    model_roles = families.param_roles(model)  # refuses a parameter without a role
    shapes = jax.eval_shape(lambda: families.init_params(model, jax.random.key(0)))
    assert jax.tree.structure(model_roles) == jax.tree.structure(shapes)
    muon = muon_dimensions(model_roles)(shapes)
    flat = zip(
        jax.tree_util.tree_leaves_with_path(shapes),
        jax.tree.leaves(decayed(model_roles)),
        jax.tree.leaves(muon, is_leaf=lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)),
        strict=True,
    )
    for (path, shape), is_decayed, dims in flat:
        assert (is_decayed, dims) == expected(path, shape.ndim), jax.tree_util.keystr(path)


def test_a_parameter_created_without_a_role_is_refused():
    class Bare(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
            g = self.param("g", roles.init(nn.initializers.ones, ("embed",), roles.NORM), (x.shape[-1],))
            return x * w * g

    boxed = jax.eval_shape(lambda: Bare().init(jax.random.key(0), jax.numpy.ones((2, 3)))["params"])
    with pytest.raises(ValueError, match=r"parameter \['w'\] has no role: create it with txjax.model.roles.init"):
        roles.roles_of(boxed)
    assert roles.roles_of({"g": boxed["g"]}) == {"g": roles.NORM}
