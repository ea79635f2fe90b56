"""What every Hugging Face folder conversion shares: reading config.json and the safetensors weights (one file or
shards, with a progress bar), checking params against DecoderLM's tree, writing a folder atomically, and the fast
tokenizer's files.

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

from txjax.data.hf_tokenizer import HFTokenizer
from txjax.extras import require
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, stack_layers, unstack_layers
from txjax.ops import storage

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
    # a bar in a terminal (disable=None: none when stderr is a file or pipe, so errors stay one line)
    with tqdm(
        total=sum(f.stat().st_size for f in files if f.is_file()), unit="B", unit_scale=True, disable=None
    ) as bar:
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


class Tensors:
    """A checkpoint's tensors handed out by name and expected shape, float32; the names used are remembered, so that
    a tensor nothing asked for is an error too (`finish`)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str):
        self.named = {k.removeprefix(prefix): v for k, v in tensors.items()}
        self.used = set()

    def __contains__(self, name: str) -> bool:
        return name in self.named

    def get(self, name: str, shape: tuple) -> np.ndarray:
        if name not in self.named:
            raise ValueError(f"{WEIGHTS_FILE}: tensor {name!r} is missing")
        if tuple(self.named[name].shape) != shape:
            raise ValueError(
                f"{WEIGHTS_FILE}: {name} has shape {tuple(self.named[name].shape)}, the config implies {shape}"
            )
        self.used.add(name)
        return np.asarray(self.named[name], np.float32)

    def finish(self, params: dict, cfg: ModelConfig, buffers: tuple[str, ...] = ()) -> dict:
        """The params (looped layers_i, stacked when cfg.scan_layers), once every tensor but `buffers` (name
        suffixes of non-parameters) was used and the tree is DecoderLM(cfg)'s."""
        extra = sorted(k for k in self.named if k not in self.used and not k.endswith(buffers))
        if extra:
            raise ValueError(f"{WEIGHTS_FILE}: unexpected tensor {extra[0]!r} ({len(extra)} unused)")
        params = stack_layers(params) if cfg.scan_layers else params
        check_params(params, cfg)
        return params


def looped_numpy(params: Mapping, cfg: ModelConfig) -> tuple[dict, dict]:
    """(params, decoder with layers_0 .. layers_{N-1}) as float32 NumPy, checked against DecoderLM(cfg): what the
    exporters read."""
    check_params(params, cfg)
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), nn.meta.unbox(params))
    return params, unstack_layers(params["decoder"]) if cfg.scan_layers else params["decoder"]


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
    """Runs write(tmp_dir) and renames tmp_dir to `target`; on any error nothing is left at `target`, and a full or
    read-only disk is a StorageError naming `target` (txjax.ops.storage).

    `target` must not exist or be an empty folder.
    """
    target = Path(target).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} exists and is not an empty folder; choose a new one")
    with storage.writing(
        str(target), "nothing of it was kept: free space there or choose a writable folder, then rerun"
    ):
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


# ----------------------------------------------------------------------------------------------------------------
# tokenizer files: tokenizer.json (the `tokenizers` pipeline), tokenizer_config.json (special tokens, chat template)


def _token_text(value) -> str | None:
    """tokenizer_config.json spells a special token as a string or as an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def read_tokenizer(folder: Path, hf_config: Mapping) -> HFTokenizer:
    """The fast tokenizer of a save_pretrained folder: tokenizer.json, with BOS/EOS/pad and the chat template from
    tokenizer_config.json (or chat_template.jinja); ids config.json names are the fallback. The model expects BOS
    first when the pipeline's own post-processor puts it there."""
    tokenizers = require("tokenizers", "a pretrained model's tokenizer.json")
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder}: no tokenizer.json (save the model's fast tokenizer with it)")
    pipeline = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = tok_config.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()

    def special(name):
        text = _token_text(tok_config.get(f"{name}_token"))
        fallback = hf_config.get(f"{name}_token_id")
        fallback = fallback[0] if isinstance(fallback, list) else fallback  # Llama 3 lists several EOS ids
        return pipeline.token_to_id(text) if text is not None else fallback

    bos = special("bos")
    add_bos = bos is not None and pipeline.encode("a").ids[:1] == [bos]
    return HFTokenizer(
        pipeline, bos_id=bos, eos_id=special("eos"), pad_id=special("pad"), add_bos=add_bos, chat_template=template
    )


def write_tokenizer(folder: Path, tokenizer: HFTokenizer, max_len: int) -> None:
    """tokenizer.json + tokenizer_config.json that transformers' AutoTokenizer loads."""
    tokenizer.tok.save(str(folder / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "add_bos_token": tokenizer.add_bos,
        "clean_up_tokenization_spaces": False,
        **{f"{n}_token": tokenizer.token(getattr(tokenizer, f"{n}_id")) for n in ("bos", "eos", "pad")},
    }
    if tokenizer.chat_template:
        tok_config["chat_template"] = tokenizer.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
