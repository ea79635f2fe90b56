"""The config's sections together, and everything derived from their fields' metadata (txjax.fields):
base_config's values, the numbers' ranges, the strings' choices, what a resumed run may change and which settings
read each field. A new setting is one field of its section's dataclass; nothing here names a field.

The sections: `family` (a name of txjax.families), `model` (ModelConfig: its own checks in __post_init__), `data`
(DataConfig), `train` (TrainConfig's fields, its OptimConfig's and its LoraConfig's), `mesh` (MeshShape) and
`decode` (the options of txjax.decode.strategy, checked by its Strategy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from txjax import families
from txjax.decode.strategy import METHOD_OPTIONS, METHODS, OPTION_DEFAULTS
from txjax.fields import Range, ReadBy, resumable
from txjax.model.config import ModelConfig
from txjax.sections.data import DataConfig
from txjax.sections.mesh import MeshShape
from txjax.sections.train import TrainConfig
from txjax.state.lora import LoraConfig
from txjax.state.optim import OptimConfig

SECTIONS = {
    "model": (ModelConfig,),
    "data": (DataConfig,),
    "train": (OptimConfig, LoraConfig, TrainConfig),
    "mesh": (MeshShape,),
}
_UNSET = {"vocab_size": 0, "max_len": 0}  # model: 0 is filled in from the tokenizer and the data's longest sequence


def section_fields(section: str) -> list[dataclasses.Field]:
    """The fields of a config section, in order (a nested value's, e.g. TrainConfig.optim, are its own section's)."""
    out = []
    for cls in SECTIONS[section]:
        out += [f for f in dataclasses.fields(cls) if f.default_factory is dataclasses.MISSING]  # not TrainConfig.optim
    return out


def _default(field: dataclasses.Field):
    value = field.default
    return list(value) if isinstance(value, tuple) else value  # a ConfigDict's list field takes a,b,c flags


def base_values() -> dict:
    """Every field of every section with its default: what txjax.config.base_config locks into a ConfigDict."""
    values = {"family": families.DECODER_LM.name}
    for section in SECTIONS:
        values[section] = {f.name: _default(f) for f in section_fields(section) if f.default is not dataclasses.MISSING}
    values["model"] |= _UNSET
    # txjax.decode.strategy: method greedy | sample | beam, each with its options (METHOD_OPTIONS), defined there
    values["decode"] = {"method": "greedy", "max_new_tokens": 64, **OPTION_DEFAULTS, "prefill_chunk": 0}
    return values


def ranges() -> dict[str, Range]:
    """{"section.field": its Range} of every number a section bounds (the model's: ModelConfig's own checks)."""
    return {
        f"{s}.{f.name}": f.metadata["bounds"] for s in SECTIONS for f in section_fields(s) if f.metadata.get("bounds")
    }


def choices() -> dict[str, Collection]:
    """{"family" or "section.field": its allowed values} of every string setting but the model's (ModelConfig's)."""
    out = {"family": tuple(families.FAMILIES), "decode.method": METHODS}
    for section in SECTIONS:
        out |= {
            f"{section}.{f.name}": f.metadata["choices"] for f in section_fields(section) if f.metadata.get("choices")
        }
    return out


def resume_refused(name: str) -> bool:
    """Whether a resumed run may not change the setting `name` ("section.field"; "family"): the family, a model
    field but the few setting() marks (the state's shapes stay), and the fields marked resume=False (what batch k
    is, what the optimizer state holds). The decode section's all apply."""
    section, _, field = name.partition(".")
    if section == "family":
        return True
    by_name = {f.name: f for f in section_fields(section)} if section in SECTIONS else {}
    return field in by_name and not resumable(by_name[field])


def resumable_fields(section: str) -> list[str]:
    """The fields of a section a resumed run may change (the model's: dtype, dropout, remat, ...)."""
    return [f.name for f in section_fields(section) if not resume_refused(f"{section}.{f.name}")]


def readers() -> dict[str, tuple[ReadBy, ...]]:
    """{"section.field": the settings it needs} of every field read only under some settings (a decode option: its
    method's, txjax.decode.strategy.METHOD_OPTIONS)."""
    out = {
        f"{s}.{f.name}": f.metadata["read_by"] for s in SECTIONS for f in section_fields(s) if f.metadata.get("read_by")
    }
    for method, options in METHOD_OPTIONS.items():
        out |= {f"decode.{name}": (ReadBy("decode.method", (method,), f"{method} reads it"),) for name in options}
    return out
