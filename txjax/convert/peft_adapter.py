"""A LoRA run's adapters as a Hugging Face peft adapter folder (`run.py export` of a run with train.lora_rank > 0),
and a peft adapter folder read onto an imported base (`run.py import --from=ADAPTER_DIR --base=WORKDIR`).

adapter_config.json (peft's LoraConfig: r, lora_alpha, use_rslora, target_modules, base_model_name_or_path) and
adapter_model.safetensors, each adapted weight's pair named as peft names it,
`base_model.model.<the weight's module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r], so that
peft.PeftModel.from_pretrained(the model the base was imported from, FOLDER) runs W + s B_hf A_hf. A DoRA run's
(train.lora_variant=dora) sets use_dora and adds each weight's magnitude, `.lora_magnitude_vector` [out], in the
rows' order: peft runs m (W + s B_hf A_hf) / ||W + s B_hf A_hf||, the norm over `in` (dim 1).

Which Hugging Face tensor a txjax weight becomes, and how its entries move (Q/K's RoPE pairs permuted, [in, out]
transposed, heads flattened, layers unstacked), is the converter's params_to_hf: it is asked once, on a probe tree
whose adapted weights hold their own entries' indices (float64, exact). Each adapted weight must land as whole
rows and columns of 2-D tensors ([out, in], one per layer or expert), its input axis on the columns and its output
axis on the rows; then lora_A's columns are A's rows in the columns' order and lora_B's rows B's columns in the
rows' order. A weight the format fuses with others (GPT-2's c_attn) or stores otherwise (fused experts) is refused
in one line, naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from flax import traverse_util
from safetensors.numpy import load_file, save_file

from txjax.convert.hf_folder import read_json
from txjax.model.config import ModelConfig
from txjax.state.lora import TARGETS, Adapted, LoraConfig, matrix_sizes, targeted, weight_name

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_MAGNITUDE = "lora_magnitude_vector"  # peft's name of DoRA's m, a module's tensor beside lora_A and lora_B
_TASKS = {"decoder_lm": "CAUSAL_LM", "encoder_decoder": "SEQ_2_SEQ_LM"}


def placements(base: Mapping, sizes: Mapping, cfg: ModelConfig, params_to_hf: Callable) -> tuple[dict, list]:
    """({path: [(Hugging Face module, layer k, the input index of each column, the output index of each row)], or
    why it has none}, the names of every tensor of the format) of the weights of the flat tree `base` at `sizes`'
    paths ({path: (I, O)}: its input and output sizes), through the converter's `params_to_hf(params, cfg)`."""
    probe, starts, offset = {path: np.zeros(np.shape(w), np.float64) for path, w in base.items()}, {}, 1
    for path in sizes:  # entry j of the weight at `path` holds start + j: 0 is no probed weight's
        shape = np.shape(base[path])
        probe[path] = offset + np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
        starts[path], offset = offset, offset + math.prod(shape)
    landed, written = {path: [] for path in sizes}, params_to_hf(traverse_util.unflatten_dict(probe), cfg)
    for name, tensor in written.items():
        tensor = np.asarray(tensor, np.float64)
        if tensor.size and (top := tensor.max()) > 0:
            path = max((p for p in starts if starts[p] <= top), key=starts.get)
            landed[path].append((name, tensor - starts[path]))
    out = {}
    for path, (inputs, outputs) in sizes.items():
        try:
            out[path] = [_placement(name, index, inputs * outputs, outputs) for name, index in landed[path]]
            if sum(index.size for _, index in landed[path]) != np.size(base[path]):
                out[path] = "its entries are not all written"
        except ValueError as e:
            out[path] = str(e)
    return out, list(written)


def _placement(name: str, index: np.ndarray, rows: int, outputs: int) -> tuple:
    """(module, layer k, the input index of each column, the output index of each row) of the Hugging Face tensor
    `name` whose entries are the indices `index` of a weight of `rows` entries a layer and `outputs` outputs."""
    if index.ndim != 2 or not name.endswith(".weight") or index.size != rows or (index != np.round(index)).any():
        raise ValueError(f"{name} is not one Linear weight of one layer")
    index = index.astype(np.int64)
    k, inputs, outputs_of = index // rows, index % rows // outputs, index % outputs
    if (k != k[0, 0]).any() or (inputs != inputs[:1]).any() or (outputs_of != outputs_of[:, :1]).any():
        raise ValueError(f"{name} does not hold its inputs in columns and outputs in rows")
    return name.removesuffix(".weight"), int(k[0, 0]), inputs[0], outputs_of[:, 0]


def peft_tensors(adapted: Adapted, cfg: ModelConfig, params_to_hf: Callable) -> tuple[dict[str, np.ndarray], list]:
    """({peft tensor name: array} of the adapters of `adapted` (a run's saved parameters), the names of every tensor
    of the format); ValueError naming a weight that is not one Linear's weight per layer."""
    pairs = traverse_util.flatten_dict(adapted.lora, is_leaf=lambda _, x: "a" in x)
    sizes = {path: (ab["a"].shape[-2], ab["b"].shape[-1]) for path, ab in pairs.items()}
    placed, names = placements(traverse_util.flatten_dict(adapted.base), sizes, cfg, params_to_hf)
    out = {}
    for path, ab in pairs.items():
        if isinstance(placed[path], str):
            raise ValueError(
                f"the LoRA weight {'/'.join(path)} cannot be a peft adapter of this format ({placed[path]}); export "
                "the merged model with --merged, or train without it in train.lora_targets"
            )
        a, b = (np.asarray(ab[x], np.float32) for x in "ab")
        a, b = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
        for module, k, inputs, outputs in placed[path]:
            out[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a[k][inputs].T)
            out[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b[k][:, outputs].T)
            if "m" in ab:
                m = np.asarray(ab["m"], np.float32).reshape(-1, b.shape[-1])
                out[f"base_model.model.{module}.{_MAGNITUDE}"] = np.ascontiguousarray(m[k][outputs])
    return out, names


def write_adapter(
    folder: Path, adapted: Adapted, cfg: ModelConfig, params_to_hf: Callable, lora: Mapping, family: str, base: str
) -> None:
    """adapter_config.json + adapter_model.safetensors into `folder`; `lora`: the run's LoraConfig fields, `base`:
    base_model_name_or_path."""
    tensors, names = peft_tensors(adapted, cfg, params_to_hf)
    modules = sorted({_module(name) for name in tensors})
    config = {
        "peft_type": "LORA",
        "task_type": _TASKS[family],
        "base_model_name_or_path": base,
        "r": lora["lora_rank"],
        "lora_alpha": lora["lora_alpha"],
        "use_rslora": lora["lora_scaling"] == "rslora",
        "use_dora": any(name.endswith(_MAGNITUDE) for name in tensors),
        "lora_dropout": lora["lora_dropout"],
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": "gaussian",
        "inference_mode": True,
        "target_modules": _target_modules(modules, names),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, folder / WEIGHTS_FILE, metadata={"format": "pt"})


def _module(name: str) -> str:
    """The module a peft tensor adapts: its name less the prefix and the adapter's own part (lora_A.weight, ...)."""
    return name.removeprefix("base_model.model.").split(".lora_")[0]


def _target_modules(adapted: list[str], all_tensors: list[str]) -> list[str]:
    """The modules' last names (q_proj, ...) where they name the adapted modules alone, else their full names."""
    short = {m.rsplit(".", 1)[-1] for m in adapted}
    matched = {n.removesuffix(".weight") for n in all_tensors if n.removesuffix(".weight").rsplit(".", 1)[-1] in short}
    return sorted(short) if matched == set(adapted) else adapted


# peft's LoraConfig fields beyond plain LoRA, with their plain values: an adapter that sets one is refused
_PLAIN = {"bias": "none", "fan_in_fan_out": False, "modules_to_save": None}
_PLAIN |= {"layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}, "target_parameters": None}


def read_adapter(folder, params, roles, cfg: ModelConfig, params_to_hf: Callable) -> tuple[Adapted, LoraConfig]:
    """A peft LoRA adapter folder (trained elsewhere) on the model `params` of `roles` (txjax.families.param_roles),
    whose format's converter is `params_to_hf`: (its adapters as txjax's, its LoraConfig); a one-line ValueError for
    what txjax's LoRA cannot hold (trained biases, per-layer ranks, a module that is no weight of the model, a
    name adapted in some of its places only)."""
    folder = Path(folder)
    config = read_json(folder / CONFIG_FILE)
    odd = [f"{k}={config[k]!r}" for k, plain in _PLAIN.items() if config.get(k) not in (None, plain)]
    if config.get("peft_type") != "LORA" or odd:
        what = ", ".join(odd) or f"peft_type={config.get('peft_type')!r}"
        raise ValueError(
            f"{folder / CONFIG_FILE}: {what} is not plain LoRA, which txjax reads (r, lora_alpha, use_rslora, use_dora)"
        )
    tensors = load_file(folder / WEIGHTS_FILE)
    modules = {_module(name) for name in tensors}
    rank = int(config["r"])
    lora = LoraConfig(lora_rank=rank, lora_alpha=float(config["lora_alpha"]))
    lora = dataclasses.replace(lora, lora_scaling="rslora" if config.get("use_rslora") else "lora")
    lora = dataclasses.replace(lora, lora_variant="dora" if config.get("use_dora") else "lora")
    flat, flat_roles = traverse_util.flatten_dict(params), traverse_util.flatten_dict(roles)
    sizes = {p: matrix_sizes(np.shape(flat[p]), role) for p, role in flat_roles.items() if role.kind == "matrix"}
    placed, _ = placements(flat, sizes, cfg, params_to_hf)
    by_module = {m[0]: path for path, ms in placed.items() if not isinstance(ms, str) for m in ms}
    if unknown := sorted(modules - set(by_module)):
        raise ValueError(
            f"{folder}: {unknown[0]} ({len(unknown)} modules in all) is no weight matrix of the base model"
        )
    targets = {weight_name(by_module[m]) for m in modules}
    lora = dataclasses.replace(lora, lora_targets=tuple(name for name in TARGETS if name in targets))
    adapters = {}
    for path in targeted(roles, lora):
        inputs, outputs = sizes[path]
        shape, role = np.shape(flat[path]), flat_roles[path]
        batch = shape[: len(shape) - role.inputs - role.outputs]
        a, b = (
            np.zeros((math.prod(batch), inputs, rank), np.float32),
            np.zeros((math.prod(batch), rank, outputs), np.float32),
        )
        magnitudes = None  # DoRA's m: W's norms (a weight no tensor names stays W), then peft's where it has them
        if lora.lora_variant == "dora":
            w = np.asarray(flat[path], np.float32).reshape(-1, inputs, outputs)
            magnitudes = np.sqrt(np.square(w).sum(axis=-2))
        for module, k, cols, rows in [] if isinstance(placed[path], str) else placed[path]:
            if module not in modules:
                raise ValueError(f"{folder}: {module} is not adapted while other {weight_name(path)} weights are")
            a[k][cols] = tensors[f"base_model.model.{module}.lora_A.weight"].T
            b[k][:, rows] = tensors[f"base_model.model.{module}.lora_B.weight"].T
            if magnitudes is not None:
                if (name := f"base_model.model.{module}.{_MAGNITUDE}") not in tensors:
                    raise ValueError(f"{folder}: use_dora=true but {name} is not in {WEIGHTS_FILE}")
                magnitudes[k][rows] = tensors[name]
        adapters[(*path, "a")], adapters[(*path, "b")] = (
            a.reshape(*batch, inputs, rank),
            b.reshape(*batch, rank, outputs),
        )
        if magnitudes is not None:
            adapters[(*path, "m")] = magnitudes.reshape(*batch, outputs)
    return Adapted(params, traverse_util.unflatten_dict(adapters), lora.scale), lora
