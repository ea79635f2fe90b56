"""LoRA's adapters on a mesh (8 simulated CPU devices, tests/conftest.py): each adapter and its AdamW moments lie
as its weight does (A [..., I, r] on W's leading and input axes, B [..., r, O] on its leading and output axes, r
on none), and a LoRA run on an (fsdp, tensor) mesh takes the same steps as on one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from txjax.config import from_command_line
from txjax.experiment import build_model, load_workdir
from txjax.families import init_params, param_roles
from txjax.ops.metrics_log import read_metrics
from txjax.parallel.sharding import make_mesh
from txjax.state import lora
from txjax.state.optim import OptimConfig
from txjax.state.train_state import optimizer, state_shardings
from txjax.training.loop import train

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS set in conftest.py)")

MODEL = {"num_layers": 2, "d_model": 32, "num_heads": 4, "num_kv_heads": 2, "d_ff": 64, "vocab_size": 16, "max_len": 24}
LORA = {"lora_rank": 2, "lora_alpha": 4.0}


def config(mesh: dict, **fields):
    """A tiny decoder LM with LoRA on every target, on the reverse task, laid out on `mesh` ({axis: size})."""
    flags = {f"model.{k}": v for k, v in MODEL.items()} | {f"train.{k}": v for k, v in LORA.items()}
    flags |= {f"mesh.{k}": v for k, v in mesh.items()} | fields
    return from_command_line(None, [f"--config.{k}={v}" for k, v in flags.items()])


def expected(weight: NamedSharding, ndim: int, role, x: str) -> P:
    """Adapter `x`'s spec from its weight's: the mesh axes of W's leading axes, and those of its input axes (A) or
    output axes (B) in order, on the flattened axis; r on none."""
    spec = (*weight.spec, *(None,) * (ndim - len(weight.spec)))
    lead, ins, outs = ndim - role.inputs - role.outputs, ndim - role.outputs, ndim
    group = spec[lead:ins] if x == "a" else spec[ins:outs]
    axes = [a for d in group for a in ((d,) if isinstance(d, str) else d or ())]
    flat = tuple(axes) if len(axes) > 1 else (axes[0] if axes else None)
    return P(*spec[:lead], flat, None) if x == "a" else P(*spec[:lead], None, flat)


@pytest.mark.parametrize("experts", [0, 4])
def test_adapters_and_their_moments_lie_as_their_weights(experts):
    """On (fsdp, expert, tensor) = (2, 2, 2), or (4, 1, 2) without experts: every adapter's sharding, and its two AdamW
    moments', is the one computed here from its weight's; some on fsdp, some on tensor (and expert)."""
    mesh_axes = {"fsdp": 2, "expert": 2, "tensor": 2} if experts else {"fsdp": 4, "tensor": 2}
    cfg = config(mesh_axes, **({"model.num_experts": experts, "model.experts_per_token": 2} if experts else {}))
    model, lora_config = build_model(cfg), lora.LoraConfig.of(cfg.train)
    mesh = make_mesh(**mesh_axes)
    got = state_shardings(model, optimizer(model, OptimConfig.of(cfg.train), lora_config), 0, mesh, lora_config)
    weights = traverse_util.flatten_dict(got.params.base)
    shapes = traverse_util.flatten_dict(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
    roles = lora.targeted(param_roles(model), lora_config)
    want = {
        (*path, x): NamedSharding(mesh, expected(weights[path], len(shapes[path].shape), role, x))
        for path, role in roles.items()
        for x in "ab"
    }
    adapters = traverse_util.flatten_dict(got.params.lora)
    assert adapters.keys() == want.keys()
    for path, sharding in adapters.items():
        assert sharding.is_equivalent_to(want[path], len(want[path].spec)), (path, sharding.spec)
    split = {a for s in want.values() for d in s.spec for a in ((d,) if isinstance(d, str) else d or ())}
    assert split == set(mesh_axes)  # the expected shardings are not all replicated: the test can fail
    opt_state = jax.tree_util.tree_flatten_with_path(got.opt_state)[0]
    opt_state = [(tuple(getattr(k, "key", None) for k in path), sharding) for path, sharding in opt_state]
    moments = [(path, sharding) for keys, sharding in opt_state for path in want if keys[-len(path) :] == path]
    assert len(moments) == 2 * len(want)  # AdamW's mu and nu of each adapter
    for path, sharding in moments:
        assert sharding.is_equivalent_to(want[path], len(want[path].spec)), (path, sharding.spec)


TRAIN = {"train.steps": 3, "train.batch_size": 8, "train.warmup_steps": 0, "train.learning_rate": 1e-2}
TRAIN |= {"train.log_every": 1, "train.eval_every": 0, "train.checkpoint_every": 3}
TRAIN |= {"train.eval_batches": 1, "data.max_digits": 4, "data.eval_size": 16}


def test_a_lora_run_on_a_mesh_takes_the_one_device_runs_steps(tmp_path):
    """The same LoRA run on one device and on (fsdp, tensor) = (2, 2): per-step losses and the trained
    adapters within float tolerance (sums run in another order), the adapters moved from B = 0."""
    for name, mesh_axes in [("one", {}), ("mesh", {"fsdp": 2, "tensor": 2})]:
        train(config(mesh_axes, **TRAIN), tmp_path / name)
    losses = [[r["loss"] for r in read_metrics(tmp_path / n) if r["split"] == "train"] for n in ("one", "mesh")]
    assert len(losses[0]) == TRAIN["train.steps"]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    one, on_mesh = (load_workdir(tmp_path / n, merge=False).params for n in ("one", "mesh"))
    close = lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5)
    jax.tree.map(close, on_mesh.lora, one.lora)
    jax.tree.map(np.testing.assert_array_equal, on_mesh.base, one.base)
    assert all(np.abs(np.asarray(b)).max() > 0 for p, b in traverse_util.flatten_dict(one.lora).items() if p[-1] == "b")
