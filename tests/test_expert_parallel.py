"""Expert parallelism (txjax.parallel.expert_parallel) on simulated CPU devices (tests/conftest.py asks XLA for 8): an
MoE layer's outputs, routing statistics and gradients on the meshes (expert=4), (data=2, fsdp=2, expert=2) and
(expert=2, sequence=2, tensor=2) equal the one-device layer's (and with a capacity on the first); 3 training steps of a
tiny MoE LM take the same losses, gradient norms and parameters on the first two meshes as on one device, and a
checkpoint written under expert=4 resumes on one device and ends where the uninterrupted run ends; a bad mesh.expert
is refused in one line. Across 2 processes: tests/test_multiprocess.py.

Tolerance (float32): the meshes sum the same products in another order (the router's and the loss's reductions over
sharded rows and embeddings, the gradients' over devices); losses are compared at rtol 1e-5 and parameters after 3
AdamW steps at rtol 2e-4, atol 2e-5 (tests/test_sharded_training.py's)."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sharded_training import EXPERIMENT, assert_same_run, char_lm_flags, train_losses, write_corpus

from txjax.config import from_command_line
from txjax.errors import ConfigError
from txjax.experiment import CHECKPOINT_DIR
from txjax.model.config import ModelConfig
from txjax.model.moe import MOE_STATS, MoE
from txjax.ops.metrics_log import read_metrics
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import batch_sharding, make_mesh, on_mesh, shardings_for
from txjax.training.loop import train

pytestmark = [
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS set in conftest.py)"),
]

STEPS = 3
MESHES = {"expert4": {"expert": 4}, "data2_fsdp2_expert2": {"data": 2, "fsdp": 2, "expert": 2}}
LAYER_MESHES = [*MESHES.values(), {"expert": 2, "sequence": 2, "tensor": 2}]  # the layer alone: every axis


def moe_lm_flags(text_path, mesh: dict) -> list[str]:
    """tests/test_sharded_training.py's char LM, shrunk (d_model 32, 2 layers) with 4 experts top-2 in every layer,
    STEPS steps with a checkpoint at step 2, on `mesh` (sizes of config.mesh's axes, the others 1)."""
    fields = {
        "model.d_model": 32,
        "model.num_heads": 2,
        "model.d_ff": 64,
        "model.num_experts": 4,
        "model.experts_per_token": 2,
        "model.moe_d_ff": 32,
        "train.steps": STEPS,
        **{f"mesh.{axis}": mesh.get(axis, 1) for axis in ("data", "fsdp", "expert")},
    }
    return char_lm_flags(text_path, (1, 1, 1)) + [f"--config.{name}={value}" for name, value in fields.items()]


def train_moe(text_path, mesh: dict, workdir) -> None:
    train(from_command_line(EXPERIMENT, moe_lm_flags(text_path, mesh)), workdir)


def assert_same_moe_run(workdir, reference) -> None:
    """Losses, gradient norms and final parameters as in `reference` (the one-device run)."""
    assert len(train_losses(workdir)) == STEPS
    norms = [[r["grad_norm"] for r in read_metrics(w) if r["split"] == "train"] for w in (workdir, reference)]
    np.testing.assert_allclose(*norms, rtol=1e-5)
    assert_same_run(workdir, reference)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The corpus and the one-device reference run in `one/`."""
    root = tmp_path_factory.mktemp("expert_parallel")
    write_corpus(root / "text.txt")
    train_moe(root / "text.txt", {}, root / "one")
    return root


@pytest.mark.parametrize("capacity", [0.0, 1.0], ids=["dropless", "capacity_1"])
def test_layer_on_meshes_equals_one_device(capacity):
    """The MoE layer's output, its sown statistics (expert loads, drops, aux losses) and the gradients of a loss of
    its output with respect to every parameter and to the input, on LAYER_MESHES, against one device. Capacity 1.0
    (on expert=4) drops assignments, the same ones: the capacity is the global batch's, decided before the exchange."""
    cfg = ModelConfig(
        vocab_size=8, max_len=8, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_experts=4, experts_per_token=2,
        use_bias=False, activation="swiglu", dtype="float32", moe_capacity_factor=capacity,
    )  # fmt: skip
    layer = MoE(cfg)
    x_BxLxD = jax.random.normal(jax.random.key(1), (8, 8, 16))
    params = layer.init(jax.random.key(0), x_BxLxD)["params"]

    def loss(p, x):
        y, stats = layer.apply({"params": p}, x, mutable=[MOE_STATS])
        return jnp.sum(y * jnp.sin(x)), stats

    grad = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (_, reference_stats), _ = want = jax.jit(grad)(params, x_BxLxD)
    assert (float(reference_stats[MOE_STATS]["dropped"]) > 0) == (capacity > 0)
    for mesh_sizes in LAYER_MESHES if capacity == 0 else LAYER_MESHES[:1]:  # the drops: one mesh is enough
        mesh = make_mesh(**mesh_sizes, devices=jax.devices()[: int(np.prod(list(mesh_sizes.values())))])
        param_shardings = shardings_for(jax.eval_shape(layer.init, jax.random.key(0), x_BxLxD)["params"], mesh)
        got = jax.jit(on_mesh(grad, mesh), in_shardings=(param_shardings, batch_sharding(mesh)))(params, x_BxLxD)
        assert param_shardings["experts"]["wi"].spec[0] == "expert"
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


@pytest.mark.parametrize("mesh", MESHES)
def test_training_on_mesh_equals_one_device(root, mesh):
    train_moe(root / "text.txt", MESHES[mesh], root / mesh)
    assert_same_moe_run(root / mesh, root / "one")


def test_checkpoint_of_expert_mesh_resumes_on_one_device(root):
    """Saved at step 2 under expert=4, resumed on one device: step 3 as in the uninterrupted one-device run."""
    if not (root / "expert4").is_dir():
        train_moe(root / "text.txt", MESHES["expert4"], root / "expert4")
    resumed = root / "resumed"
    shutil.copytree(root / "expert4", resumed)
    shutil.rmtree(resumed / CHECKPOINT_DIR / str(STEPS))
    train_moe(root / "text.txt", {}, resumed)
    assert_same_moe_run(resumed, root / "one")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--config.mesh.expert=2"], "config.mesh.expert=2 splits experts: set model.num_experts > 0"),
        (["--config.mesh.expert=3", "--config.model.num_experts=4"], "model.num_experts=4 must be divisible by"),
        (["--config.mesh.expert=0"], "config.mesh.expert"),
    ],
)
def test_bad_expert_axis_is_one_line(flags, words):
    with pytest.raises(ConfigError, match=words) as raised:
        from_command_line(None, ["--config.model.use_bias=false", *flags])
    assert "\n" not in str(raised.value)


def test_mesh_larger_than_the_devices_is_one_line():
    config = from_command_line(None, ["--config.model.use_bias=false", "--config.model.num_experts=16"])
    config.mesh.expert = 16
    with pytest.raises(ConfigError, match=r"mesh data\*fsdp\*expert\*sequence\*tensor = .* = 16 does not match"):
        run_mesh(config.mesh)
