"""The fields a run's settings leave unread, top-level as config and families both ask (every setting is either applied
or refused, never ignored: issue 48).

Which settings read a field is the field's own metadata (`read_by`, txjax.sections): a data field is read by the
forms of the data kinds that name it, b1 and b2 by the optimizers with moments of their own, decay_fraction by
train.schedule=wsd, the MoE weights by an MoE model, RoPE's fields by positional=rope, ... txjax.config.validate
refuses every field none of them reads when it is set: when its value differs from what the user did not set
(base_config() under an experiment file; a workdir's saved config when a run resumes from it, so a config saved
before this rule loads as it was), all of them in one line naming the value to set instead.
"""

from __future__ import annotations

import ml_collections

from txjax import families
from txjax.data.kinds import KINDS
from txjax.sections import schema


def setting_value(config: ml_collections.ConfigDict, name: str):
    """The value of a setting that a field's ReadBy names: "family", "section.field", or "data.form" (the form the
    config's family reads its data.kind in)."""
    if name == "data.form":
        return families.get(config.family).data_kinds[config.data.kind]
    section, _, field = name.rpartition(".")
    return config[section][field] if section else config[field]


def _form_reads(readers: dict, form: str) -> list[str]:
    """The data fields a form reads (its kind's, whatever else they need: vocab_size only with sentencepiece)."""
    out = []
    for name, read_by in readers.items():
        by_form = [r for r in read_by if r.setting == "data.form"]
        if name.startswith("data.") and by_form and all(r.reads(form) for r in by_form):
            out.append(name.partition(".")[2])
    return out


def _data_words(config: ml_collections.ConfigDict, form: str, readers: dict) -> tuple[str, str]:
    """How an unread data field's message names the kind (with the family where its forms read different fields)
    and what the form reads."""
    forms = KINDS[config.data.kind].forms
    by_family = len({tuple(_form_reads(readers, f)) for f in forms}) > 1
    setting = f"data.kind={config.data.kind!r}" + f" with family={config.family!r}" * by_family
    return setting, f"it reads data.{', '.join(_form_reads(readers, form))}"


def unread_fields(config: ml_collections.ConfigDict) -> dict[str, tuple[str, str, tuple]]:
    """{"section.field": (the setting that leaves it unread, why, the values of that setting that would read it)}
    for a validated config (the values: () where they are no list, e.g. model.num_experts > 0)."""
    readers = schema.readers()
    out = {}
    for name, read_by in readers.items():
        for r in read_by:
            value = setting_value(config, r.setting)
            if r.reads(value):
                continue
            if r.setting == "data.form":
                setting, why = _data_words(config, value, readers)
            else:
                setting, why = f"{r.setting}={value!r}", r.why
            out[name] = (setting, why, () if callable(r.values) else r.values)
            break
    return out


def flag_text(value) -> str:
    """A value as a --config flag spells it (txjax.config.apply_override reads it back)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def _one_of(values) -> str:
    """'a, b or c'."""
    words = [str(v) for v in values]
    return ", ".join(words[:-1]) + " or " * (len(words) > 1) + words[-1]


def refusal(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict, saved: bool = False) -> str | None:
    """One line naming every unread field `config` sets to another value than `defaults`' (grouped by the setting
    that leaves them unread), each with the flag that sets it back and the values that would read it; or None.
    `saved`: `defaults` is a workdir's config, not base_config()."""
    groups: dict[tuple, list[str]] = {}
    for name, unread in unread_fields(config).items():
        if setting_value(config, name) != setting_value(defaults, name):
            groups.setdefault(unread, []).append(name)
    parts = []
    for (setting, why, values), names in groups.items():
        many = len(names) > 1
        sets = " and ".join(f"config.{name}={setting_value(config, name)!r}" for name in names)
        back = " ".join(f"--config.{name}={flag_text(setting_value(defaults, name))}" for name in names)
        whose = f"{'their' if many else 'its'} {'saved value' if saved else 'default'}{'s' * many}"
        reader = setting.partition("=")[0]
        other = f", or use {reader} {_one_of(values)}" if values and reader != "data.kind" else ""
        parts.append(f"{sets} {'are' if many else 'is'} not read by {setting} ({why}): set {back} ({whose}){other}")
    return "; ".join(parts) or None
