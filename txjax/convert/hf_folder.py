"""What every Hugging Face folder conversion shares: reading config.json and the safetensors weights (one file or
shards, with a progress bar), checking params against DecoderLM's tree, and writing a folder atomically.

Every problem is a one-line ValueError naming the file; writing goes to a temporary folder renamed into place, so a
failure leaves nothing at the target.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from txjax.models import DecoderLM, ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_config(folder: Path) -> dict:
    """config.json of a Hugging Face checkpoint folder, as a dict."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{folder}: no {CONFIG_FILE} (not a Hugging Face checkpoint folder)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """All tensors of model.safetensors, or of the shards model.safetensors.index.json lists, as float32 numpy
    (bfloat16 and float16 files too: safetensors' flax reader knows bfloat16, NumPy does not)."""
    if (folder / WEIGHTS_FILE).is_file():
        files = [folder / WEIGHTS_FILE]
    elif (folder / INDEX_FILE).is_file():
        files = sorted({folder / f for f in json.loads((folder / INDEX_FILE).read_text())["weight_map"].values()})
    else:
        raise ValueError(f"{folder}: no {WEIGHTS_FILE} or {INDEX_FILE} (not a Hugging Face safetensors checkpoint)")
    tensors = {}
    with tqdm(total=sum(f.stat().st_size for f in files if f.is_file()), unit="B", unit_scale=True) as bar:
        for path in files:
            bar.set_description(f"reading {path.name}")
            try:
                with safe_open(path, framework="flax") as f:
                    for key in f.keys():
                        stored = f.get_tensor(key)
                        tensors[key] = np.asarray(stored, np.float32)
                        bar.update(stored.nbytes)
            except (SafetensorError, OSError) as e:
                raise ValueError(f"{path}: unreadable safetensors file ({e}); is it complete?") from None
    return tensors


def expected_shapes(cfg: ModelConfig):
    """The param tree of DecoderLM(cfg), as ShapeDtypeStructs (nothing is computed)."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    variables = jax.eval_shape(lambda: DecoderLM(cfg).init(jax.random.key(0), tokens))
    return nn.meta.unbox(variables["params"])


def check_params(params: Mapping, cfg: ModelConfig) -> None:
    """The params have exactly DecoderLM(cfg)'s tree and shapes, else a ValueError naming the first difference."""
    want = {jax.tree_util.keystr(p): s.shape for p, s in jax.tree_util.tree_leaves_with_path(expected_shapes(cfg))}
    got = {jax.tree_util.keystr(p): np.shape(a) for p, a in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(params))}
    for path in sorted(want.keys() | got.keys()):
        if want.get(path) != got.get(path):
            raise ValueError(f"params{path}: shape {got.get(path)}, DecoderLM(cfg) expects {want.get(path)}")


def write_atomically(target, write: Callable[[Path], None]) -> Path:
    """Runs write(tmp_dir) and renames tmp_dir to `target`; on any error nothing is left at `target`.

    `target` must not exist or be an empty folder.
    """
    target = Path(target).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} exists and is not an empty folder; choose a new one")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            target.rmdir()
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
