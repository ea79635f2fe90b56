"""What every Hugging Face folder conversion shares: reading config.json and the safetensors weights (one file or
shards, with a progress bar), checking params against DecoderLM's tree, writing a folder atomically, and the fast
tokenizer's files. (An encoder-decoder's params are checked against EncoderDecoder's tree: `family`.)

Headers are not believed: the model a config (or GGUF header) describes must fit in memory (check_fits), and the
converter runs once on the tensors' headers alone (check_headers), before any tensor is read; then the weights,
`Stored` tensors known by their header, are each read when the converter asks for it (Tensors.get), in their stored
dtype, and converted to float32 there, so one tensor at a time is in flight. A tensor stored as an integer (a
quantized checkpoint's int8: cast, it would be a different model) is refused by its header, and one holding NaN or
infinity when it is read (a damaged file would import, then score NaN). Every problem is a one-line ValueError
naming the file or tensor; writing goes to a temporary folder renamed into place, so a failure leaves nothing at the
target.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from txjax.data.hf_tokenizer import HFTokenizer, added_around, chat_template, pipeline_adding_around
from txjax.extras import require
from txjax.families import DECODER_LM, Family, init_params
from txjax.model.config import ModelConfig
from txjax.model.models import stack_layers
from txjax.ops import storage
from txjax.ops.memory import device_bytes

HF_CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HF_INDEX_FILE = "model.safetensors.index.json"


def read_config(folder: Path) -> dict:
    """config.json of a Hugging Face checkpoint folder, as a dict."""
    path = folder / HF_CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{folder}: no {HF_CONFIG_FILE} (not a Hugging Face checkpoint folder)")
    return read_json(path)


def read_json(path: Path) -> dict:
    """A JSON object file of a checkpoint folder (config.json, the tokenizer's files), as a dict; one that is cut
    short or not JSON is a one-line ValueError naming it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}): the file is damaged or cut short; download it again") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a JSON {type(value).__name__}, not an object: download it again")
    return value


def load_decoder_folder(folder, config_from_hf: Callable, params_from_hf: Callable) -> tuple[ModelConfig, dict]:
    """A save_pretrained decoder-LM folder -> (ModelConfig, params as float32 numpy), by the family's
    config_from_hf(hf, has_head) and params_from_hf(tensors, cfg): the model config.json describes checked to fit
    before any tensor is read (check_fits), every tensor's header against it before any is converted (check_headers)."""
    folder = Path(folder).expanduser()
    hf = read_config(folder)
    check_fits(config_from_hf(hf, has_head=True), folder)  # before gigabytes of weights are read
    tensors = read_tensors(folder)
    cfg = config_from_hf(hf, has_head="lm_head.weight" in tensors)
    check_headers(params_from_hf, tensors, cfg)
    return cfg, params_from_hf(tensors, cfg)


def write_folder(folder: Path, hf_config: Mapping, tensors: Mapping[str, np.ndarray]) -> None:
    """config.json + model.safetensors into `folder`, as save_pretrained writes them (from_pretrained loads them)."""
    (folder / HF_CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(dict(tensors), folder / WEIGHTS_FILE, metadata={"format": "pt"})


def integers(hf: Mapping, *names: str) -> None:
    """Each of config.json's `names` is an integer, else a ValueError naming the field (before a size is believed)."""
    for name in names:
        if not isinstance(hf.get(name), int):
            raise ValueError(f"config.json: {name}={hf.get(name)!r} must be an integer")


FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # the safetensors dtypes an import converts to float32


@dataclass(frozen=True)
class Stored:
    """A tensor in a file, known by its header: its shape (NumPy's order), bytes, how to read it (in its stored
    dtype; Tensors.get converts it) and its safetensors dtype (None: float once read, as a GGUF tensor, dequantized
    on purpose)."""

    shape: tuple[int, ...]
    nbytes: int
    read: Callable[[], np.ndarray]
    dtype: str | None = None


def check_fits(cfg: ModelConfig, source, family: Family = DECODER_LM) -> None:
    """A ValueError when the `family` model `cfg` describes (read from a header) cannot be imported in this machine's
    memory: about three float32 copies of its parameters (the tensors as read, as converted, and the parameters
    run.py import writes), before any tensor is read."""
    shapes = jax.tree.leaves(expected_shapes(cfg, family))
    params = sum(math.prod(s.shape) for s in shapes)
    need, available = 3 * 4 * params, device_bytes()
    if need > available:
        raise ValueError(
            f"{source}: its header describes a model of {params:,} parameters (d_model {cfg.d_model}, "
            f"{cfg.num_layers} layers, vocab {cfg.vocab_size}); importing it needs about {need / 2**30:.1f} GiB "
            f"(its float32 parameters three times over, read and converted), more than the "
            f"{available / 2**30:.1f} GiB available"
        )


def check_headers(convert: Callable, tensors: Mapping[str, Stored], cfg: ModelConfig) -> None:
    """convert(tensors, cfg) run on the headers alone, abstractly (jax.eval_shape; each tensor a zeros of its
    header's shape): a missing, extra or misshapen tensor is its ValueError before any tensor is read."""
    headers = {k: Stored(v.shape, 0, lambda s=v.shape: jnp.zeros(s, jnp.float32), v.dtype) for k, v in tensors.items()}
    jax.eval_shape(lambda: convert(headers, cfg))


def same(a, b) -> bool:
    """np.array_equal of two tensors; in check_headers' pass (values unknown) True: their shapes were checked."""
    return isinstance(a, jax.core.Tracer) or np.array_equal(a, b)


def read_tensors(folder: Path) -> dict[str, Stored]:
    """Every tensor of model.safetensors, or of the shards model.safetensors.index.json lists, by its header (read
    when Tensors.get asks: bfloat16 and float16 too, through safetensors' flax reader, which knows bfloat16)."""
    if (folder / WEIGHTS_FILE).is_file():
        files = [folder / WEIGHTS_FILE]
    elif (folder / HF_INDEX_FILE).is_file():
        files = sorted({folder / f for f in json.loads((folder / HF_INDEX_FILE).read_text())["weight_map"].values()})
    else:
        raise ValueError(f"{folder}: no {WEIGHTS_FILE} or {HF_INDEX_FILE} (not a Hugging Face safetensors checkpoint)")
    tensors = {}
    for path in files:
        try:
            with safe_open(path, framework="flax") as f:
                for key in f.keys():
                    header = f.get_slice(key)
                    shape, dtype = tuple(header.get_shape()), header.get_dtype()
                    size = _DTYPE_BYTES.get(dtype, 4) * math.prod(shape)
                    tensors[key] = Stored(shape, size, lambda p=path, k=key: _read(p, k), dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path}: unreadable safetensors file ({e}); is it complete?") from None
    return tensors


_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _read(path: Path, key: str) -> np.ndarray:
    try:
        with safe_open(path, framework="flax") as f:
            return f.get_tensor(key)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: tensor {key} is unreadable ({e}); is the file complete?") from None


class Tensors:
    """A checkpoint's tensors (arrays, or Stored ones read here one at a time) handed out by name and expected shape,
    float32; the names used are remembered, so that a tensor nothing asked for is an error too (`finish`)."""

    def __init__(self, tensors: Mapping[str, np.ndarray | Stored], prefix: str):
        self.prefix = prefix
        self.named = {k.removeprefix(prefix): v for k, v in tensors.items()}
        self.used = set()
        stored = sum(v.nbytes for v in self.named.values() if isinstance(v, Stored))
        # a bar in a terminal (disable=None: none when stderr is a file or pipe, so errors stay one line)
        self.bar = tqdm(total=stored, unit="B", unit_scale=True, disable=None if stored else True, desc="reading")

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
        value = self.named[name]
        if isinstance(value, Stored):
            if value.dtype not in (None, *FLOAT_DTYPES):  # in check_headers' pass too: before any tensor is read
                raise ValueError(
                    f"{WEIGHTS_FILE}: tensor {self.prefix}{name} is stored as {value.dtype}; txjax imports float "
                    f"tensors ({', '.join(FLOAT_DTYPES)}): dequantize the checkpoint to one of them first"
                )
            value = value.read()
            if tuple(np.shape(value)) != shape:
                raise ValueError(f"{WEIGHTS_FILE}: {name} holds shape {np.shape(value)}, its header says {shape}")
            self.bar.update(self.named[name].nbytes)
        if isinstance(value, jax.core.Tracer):  # check_headers' pass
            return value
        value = np.asarray(value, np.float32)
        if not np.isfinite(value).all():
            raise ValueError(
                f"tensor {self.prefix}{name} holds {np.count_nonzero(~np.isfinite(value)):,} NaN or infinite values "
                f"(of {value.size:,}): the checkpoint is damaged; nothing was imported"
            )
        return value

    def finish(
        self, params: dict, cfg: ModelConfig, buffers: tuple[str, ...] = (), family: Family = DECODER_LM
    ) -> dict:
        """The params (looped layers_i, stacked when cfg.scan_layers), once every tensor but `buffers` (name
        suffixes of non-parameters) was used and the tree is the `family` model's (DecoderLM(cfg)'s)."""
        self.bar.close()
        extra = sorted(k for k in self.named if k not in self.used and not k.endswith(buffers))
        if extra:
            raise ValueError(f"{WEIGHTS_FILE}: unexpected tensor {extra[0]!r} ({len(extra)} unused)")
        params = stack_layers(params) if cfg.scan_layers else params
        check_params(params, cfg, family)
        return params


@functools.lru_cache(maxsize=8)
def expected_shapes(cfg: ModelConfig, family: Family = DECODER_LM):
    """The param tree of the `family` model (DecoderLM, EncoderDecoder) of cfg, as ShapeDtypeStructs (nothing is
    computed). Remembered per (cfg, family) (a Family is hashed by identity: one instance each, in
    txjax.families.FAMILIES): an import asks for it in check_fits, in check_headers' abstract run of
    the converter and in the converter's own check_params, and tracing the model's init is most of that cost."""
    return jax.eval_shape(lambda: init_params(family.module(cfg), jax.random.key(0)))


def check_params(params: Mapping, cfg: ModelConfig, family: Family = DECODER_LM) -> None:
    """The params have exactly the `family` model's tree and shapes (DecoderLM(cfg)'s by default), else a
    ValueError naming the first difference."""
    shapes = expected_shapes(cfg, family)
    want = {jax.tree_util.keystr(p): s.shape for p, s in jax.tree_util.tree_leaves_with_path(shapes)}
    got = {jax.tree_util.keystr(p): np.shape(a) for p, a in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(params))}
    for path in sorted(want.keys() | got.keys()):
        if want.get(path) != got.get(path):
            raise ValueError(f"params{path}: shape {got.get(path)}, the {family.name} model expects {want.get(path)}")


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
    tokenizer_config.json (or chat_template.jinja); ids config.json names are the fallback. What goes around a text
    is what the pipeline's own post-processor adds (hf_tokenizer.added_around: Llama's BOS, BART's <s> ... </s>)."""
    tokenizers = require("tokenizers", "a pretrained model's tokenizer.json")
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no tokenizer.json (save the model's fast tokenizer with it)")
    read_json(path)  # a file cut short: named here, in Python's words
    try:
        pipeline = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 -- the tokenizers library raises a bare Exception for a pipeline it cannot read
        raise ValueError(f"{path}: not a tokenizer the tokenizers library reads ({e}): download it again") from None
    config_path = folder / "tokenizer_config.json"
    tok_config = read_json(config_path) if config_path.is_file() else {}
    template, template_path = tok_config.get("chat_template"), config_path
    if template is None and (folder / "chat_template.jinja").is_file():
        template_path = folder / "chat_template.jinja"
        template = template_path.read_text()
    if template is not None:  # compiled now, so a broken one is refused at import, not at the first --chat
        chat_template(template, str(template_path), "correct it, or remove the chat template to import without one")

    def special(name):
        text = _token_text(tok_config.get(f"{name}_token"))
        fallback = hf_config.get(f"{name}_token_id")
        fallback = fallback[0] if isinstance(fallback, list) else fallback  # Llama 3 lists several EOS ids
        return pipeline.token_to_id(text) if text is not None else fallback

    before, after = added_around(pipeline)
    ids = {f"{name}_id": special(name) for name in ("bos", "eos", "pad")}
    return HFTokenizer(pipeline, **ids, before=before, after=after, chat_template=template)


def write_tokenizer(folder: Path, tokenizer: HFTokenizer, max_len: int) -> None:
    """tokenizer.json + tokenizer_config.json that transformers' AutoTokenizer loads, adding around a text what
    the tokenizer records (hf_tokenizer.pipeline_adding_around)."""
    pipeline_adding_around(tokenizer).save(str(folder / "tokenizer.json"))
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
