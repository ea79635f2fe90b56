"""The fields a run's settings leave unread, top-level as config and families both ask (every setting is either applied
or refused, never ignored: issue 48).

A data kind reads some of config.data's fields (txjax.data.KINDS: each form's `reads`), and the
optimizer and schedule read some of config.train's (txjax.state.optim). txjax.config.validate refuses a field none of
them reads when it is set: when its value differs from what the user did not set (base_config() under an
experiment file; a workdir's saved config when a run resumes from it, so a config saved before this rule loads as
it was).

vocab_size is read only with data.tokenizer='sentencepiece'. Shards bring their own tokenizer, yet data.tokenizer
is not refused there: experiments/shakespeare_shards.py inherits shakespeare_char's 'char', and a workdir's
tokenizer/built_with.json records it. A synthetic task's vocabulary is its own: data.tokenizer stays 'task'.
"""

from __future__ import annotations

import ml_collections

from txjax import families
from txjax.data.kinds import KINDS

SCHEDULE_FREE = "schedule_free_adamw"


def unread_fields(config: ml_collections.ConfigDict) -> dict[str, tuple[str, str]]:
    """{"section.field": (the setting that leaves it unread, why)} for a validated config."""
    d, t = config.data, config.train
    kind = KINDS[d.kind]
    form_reads = kind.forms[families.get(config.family).data_kinds[d.kind]].reads
    sentencepiece = d.tokenizer == "sentencepiece"
    reads = [name for name in form_reads if name != "vocab_size" or sentencepiece]
    by_family = len({form.reads for form in kind.forms.values()}) > 1  # its forms read different fields
    setting = f"data.kind={d.kind!r}" + f" with family={config.family!r}" * by_family
    skip = ("kind", *reads, *("tokenizer",) * (kind.tokenizer is not None))  # see the module docstring
    out = {f"data.{name}": (setting, f"it reads data.{', '.join(reads)}") for name in d if name not in skip}
    if "vocab_size" in form_reads and not sentencepiece:
        out["data.vocab_size"] = (
            f"data.tokenizer={d.tokenizer!r}",
            "only sentencepiece is trained to a vocabulary size",
        )
    if t.optimizer == SCHEDULE_FREE:
        why = (f"train.optimizer={SCHEDULE_FREE!r}", "it keeps the learning rate constant after the warmup")
        out |= dict.fromkeys(("train.schedule", "train.decay_fraction", "train.min_lr_ratio"), why)
    elif t.schedule != "wsd":
        out["train.decay_fraction"] = (f"train.schedule={t.schedule!r}", "only wsd decays over a fraction of the steps")
        if t.schedule == "constant":
            out["train.min_lr_ratio"] = ("train.schedule='constant'", "it stays at train.learning_rate")
    if config.model.num_experts == 0:
        why = ("model.num_experts=0", "a dense model has no router")
        out |= dict.fromkeys(("train.moe_aux_weight", "train.moe_z_weight", "train.moe_bias_rate"), why)
    elif config.model.router != "sigmoid":
        out["train.moe_bias_rate"] = (f"model.router={config.model.router!r}", "only the sigmoid router has a bias")
    return out


def refusal(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> str | None:
    """One line naming the first unread field `config` sets to another value than `defaults`', or None."""
    for name, (setting, why) in unread_fields(config).items():
        section, field = name.split(".")
        value = config[section][field]
        if value != defaults[section][field]:
            return f"config.{name}={value!r} is not read by {setting} ({why}): remove it"
    return None
