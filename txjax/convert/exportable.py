"""Export is whole or refused: the one check every converter's writer goes through (`checked`), before anything is
written.

A format (LlamaForCausalLM, Gemma 2/3, Mixtral, GPT-2, Marian, BART, T5, ...) expresses some of ModelConfig's
fields and holds some of a model's parameters. A writer that copied the fields and tensors it knows and dropped the
rest wrote a folder of another function without a word (a Llama with norm_offset or attention_softcap: transformers'
logits 3.13 away, exit 0). So:

fields  the config.json the writer built is read back by the same converter's reader (its config_from_hf: what the
        format can say is derived from the code that reads it, not from a second list); every field that changes
        the function the parameters define must come back as it went. EXECUTION_FIELDS need not; `_function` spells
        settings that compute the same function one way (num_kv_heads None or num_heads, ...).
params  the writer reads the parameters through `Reads` (`looped`), which remembers the leaves it read; a leaf no
        tensor was made of has no place in the folder.

Either is one ConfigError line naming every offending field, or every leaf.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from txjax.convert import hf_folder
from txjax.convert.hf_folder import check_params
from txjax.errors import ConfigError
from txjax.families import DECODER_LM, Family
from txjax.model import moe_config
from txjax.model.config import ModelConfig
from txjax.model.linear_config import linear_sizes
from txjax.model.models import unstack_layers

# fields that change how a model computes (precision, kernels, memory, layout) or trains (dropout, the initial
# scale), not the function its trained parameters define at inference: no format needs to express them. An MoE's
# capacity is a batch's compute budget (which tokens it drops depends on the other rows of the batch): the function
# it approximates is dropless routing, which every MoE format writes (docs/moe.md)
EXECUTION_FIELDS = frozenset(
    {
        "dtype",
        "attention_impl",
        "attention_block_q",
        "attention_block_kv",
        "matmul_precision",
        "scan_layers",
        "remat",
        "dropout",
        "attention_dropout",
        "init_std",
        "moe_capacity_factor",
        "linear_chunk",  # Gated DeltaNet's chunks: the delta rule computed in pieces of that many tokens
    }
)
REFUSED = "export is refused; nothing was written"


class Reads(Mapping):
    """A parameter tree (looped float32 NumPy) handed out by key, which remembers the leaves read from it."""

    def __init__(self, tree: Mapping, path: tuple = (), read: set | None = None):
        self._tree, self._path = tree, path
        self.read = set() if read is None else read

    def __getitem__(self, key):
        value, path = self._tree[key], (*self._path, key)
        if isinstance(value, Mapping):
            return Reads(value, path, self.read)
        self.read.add(path)
        return value

    def __contains__(self, key) -> bool:
        return key in self._tree

    def __iter__(self) -> Iterator:
        return iter(self._tree)

    def __len__(self) -> int:
        return len(self._tree)

    def unread(self) -> list[tuple]:
        """The paths of the leaves nothing read."""
        paths = [tuple(k.key for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(self._tree)]
        return [(*self._path, *p) for p in paths if (*self._path, *p) not in self.read]


def looped(params: Mapping, cfg: ModelConfig, family: Family = DECODER_LM) -> Reads:
    """The `family` model's params (scanned or looped), checked against cfg, as float32 NumPy with layers_0 ..
    layers_{N-1}, in a Reads: what the writers read (a Reads given is returned as it is). float64 stays float64:
    peft_adapter.placements probes the writers with entry indices, exact in float64 and not above 2^24 in float32
    (SmolLM2's stacked FFN weights hold 26.5M entries)."""
    if isinstance(params, Reads):
        return params
    check_params(params, cfg, family)
    exact = lambda a: np.asarray(a, np.float64 if np.asarray(a).dtype == np.float64 else np.float32)
    return Reads(unstack_layers(jax.tree.map(exact, nn.meta.unbox(params))))


def _windows(cfg: ModelConfig) -> tuple[int, ...]:
    """Each decoder layer's window, a window that covers the context being global (0)."""
    return tuple(0 if w >= cfg.max_len else w for w in cfg.layer_windows)


def _function(cfg: ModelConfig) -> dict:
    """cfg's fields but EXECUTION_FIELDS, with settings that compute one function spelt one way."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in EXECUTION_FIELDS}
    out |= {"num_kv_heads": cfg.kv_heads, "d_head": cfg.head_dim, "num_encoder_layers": cfg.encoder_layers}
    out |= {"attention_window": _windows(cfg), "window_pattern": _windows(cfg)}
    out["rope_layers"] = tuple(layer.rope for layer in cfg.layer_attention)  # RN on 4 layers is RNRN
    if cfg.num_experts:  # which layers are MoE, however moe_every and moe_dense_first spell it
        out |= {
            "moe_d_ff": cfg.expert_d_ff,
            "moe_every": tuple(moe_config.is_moe(cfg, i) for i in range(cfg.num_layers)),
        }
        out["moe_dense_first"] = out["moe_every"]
    if "L" in cfg.layer_types:  # a linear layer's size 0 is the attention's
        sizes = dataclasses.asdict(linear_sizes(cfg))
        out |= {f"linear_{name}": sizes[name] for name in ("heads", "v_heads", "head_dim", "v_head_dim")}
    if cfg.router == "softmax_then_topk" and cfg.moe_norm_topk:  # the top k of the softmax, renormalised: Mixtral's
        out |= {"router": "topk_then_softmax", "moe_norm_topk": False}  # softmax over the top-k logits
    if not cfg.rope_local_base and cfg.rope_scaling == "none":  # local layers on the global RoPE, unscaled
        out["rope_local_base"] = cfg.rope_base
    return out


def check_fields(cfg: ModelConfig, hf_config: Mapping, read_back: Callable[[dict], ModelConfig]) -> None:
    """A ConfigError naming every field of cfg that `hf_config`, read back by its format's reader, does not hold."""
    target = hf_config["architectures"][0]
    try:
        back = read_back(json.loads(json.dumps(hf_config)))  # as from_pretrained would read the file
    except ValueError as e:
        raise ConfigError(
            f"export to {target}: the config.json it would write does not read back ({e}); {REFUSED}"
        ) from None
    want, got = _function(cfg), _function(back)
    lost = [name for name in want if want[name] != got[name]]
    if lost:
        raise ConfigError(
            f"export to {target} cannot express {', '.join(f'model.{n}={getattr(cfg, n)!r}' for n in lost)} (its "
            f"config.json reads back as {', '.join(f'{n}={getattr(back, n)!r}' for n in lost)}): {REFUSED}"
        )


def checked(
    cfg: ModelConfig,
    params: Mapping,
    hf_config: Mapping,
    read_back: Callable[[dict], ModelConfig],
    params_to_hf: Callable[[Reads, ModelConfig], dict],
    family: Family = DECODER_LM,
) -> dict[str, np.ndarray]:
    """The tensors params_to_hf(params, cfg) makes, once hf_config expresses every field of cfg (check_fields) and
    every parameter was read into them; else a ConfigError naming what would be lost."""
    check_fields(cfg, hf_config, read_back)
    tree = looped(params, cfg, family)
    tensors = params_to_hf(tree, cfg)
    unread = sorted({_workdir_path(path, cfg) for path in tree.unread()})
    if unread:
        target = hf_config["architectures"][0]
        leaves = f"parameter {unread[0]} has" if len(unread) == 1 else f"parameters {', '.join(unread)} have"
        raise ConfigError(f"{leaves} no place in a {target} folder (its writer does not read it): {REFUSED}")
    return tensors


@dataclasses.dataclass(frozen=True)
class DecoderFolder:
    """A decoder format's Hugging Face folder (config.json + model.safetensors, which its *ForCausalLM class's
    from_pretrained loads), written the one way every format is: config_to_hf(cfg, bos_id, eos_id) and
    params_to_hf's tensors, both `checked` by reading the config back with config_from_hf."""

    config_to_hf: Callable[..., dict]
    config_from_hf: Callable[..., ModelConfig]
    params_to_hf: Callable[[Reads, ModelConfig], dict]
    head_flag: bool = True  # config_from_hf asks whether the tensors hold lm_head (GPT-2's: always tied, never)

    def write(self, folder: Path, cfg: ModelConfig, params: Mapping, bos_id=None, eos_id=None) -> None:
        hf_config = self.config_to_hf(cfg, bos_id, eos_id)
        read_back = self.config_from_hf
        if self.head_flag:
            read_back = functools.partial(read_back, has_head=not cfg.tie_embeddings)
        hf_folder.write_folder(folder, hf_config, checked(cfg, params, hf_config, read_back, self.params_to_hf))

    def save(self, folder, cfg: ModelConfig, params: Mapping, *, bos_id=None, eos_id=None) -> Path:
        """write into a new folder, atomically: a failure (a config the format cannot hold) leaves nothing."""
        return hf_folder.write_atomically(folder, lambda tmp: self.write(tmp, cfg, params, bos_id, eos_id))


def _workdir_path(path: tuple, cfg: ModelConfig) -> str:
    """A looped leaf's path as the workdir's tree names it: layers_i is `layers` (dense_layers_i `dense_layers`) when
    the layers are scanned."""
    text = "/".join(str(k) for k in path)
    return re.sub(r"\b((?:dense_)?layers)_\d+\b", r"\1", text) if cfg.scan_layers else text
