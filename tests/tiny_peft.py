"""peft's reading of txjax's LoRA adapter folders, for the converter tests: a tiny transformers model with random
adapters written by txjax's peft writer and loaded by peft (the interop extra's peft)."""

from __future__ import annotations

import numpy as np

from txjax.convert.peft_adapter import write_adapter
from txjax.families import param_roles
from txjax.model.models import DecoderLM
from txjax.state import lora


def peft_loaded(hf_model, model, params, params_to_hf, folder, targets=lora.TARGETS[:-1]):
    """(peft.PeftModel of a copy of `hf_model` with the adapter txjax's peft writer wrote into `folder`, txjax's merged
    params): rank-2 adapters on `params` of txjax's `model` at `targets`, A as training draws it and B random (not
    0, so that they change the model); `params_to_hf` the format's converter."""
    import copy

    import jax
    import peft

    config = lora.LoraConfig(lora_rank=2, lora_alpha=4.0, lora_targets=tuple(targets))
    adapted = lora.adapted(params, param_roles(model), config, jax.random.key(1))
    rng = np.random.default_rng(2)
    adapted = adapted.replace(lora=jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape), adapted.lora))
    family = "decoder_lm" if isinstance(model, DecoderLM) else "encoder_decoder"
    fields = {f: getattr(config, f) for f in ("lora_rank", "lora_alpha", "lora_scaling", "lora_dropout")}
    folder.mkdir(parents=True, exist_ok=True)
    write_adapter(folder, jax.device_get(adapted), model.cfg, params_to_hf, fields, family, "the base")
    return peft.PeftModel.from_pretrained(copy.deepcopy(hf_model), folder).eval(), lora.model_params(adapted)
