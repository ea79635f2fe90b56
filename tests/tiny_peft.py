"""peft's reading of txjax's LoRA adapter folders, for the converter tests: a tiny transformers model with random
adapters written by txjax's peft writer and loaded by peft (the interop extra's peft), and the folder read back."""

from __future__ import annotations

import json

import jax
import numpy as np
from safetensors.numpy import load_file

from txjax.convert.peft_adapter import CONFIG_FILE, WEIGHTS_FILE, read_adapter, write_adapter
from txjax.families import param_roles
from txjax.model.models import DecoderLM
from txjax.state import lora


def peft_loaded(hf_model, model, params, params_to_hf, folder, targets=lora.TARGETS[:-1], variant="lora"):
    """(peft.PeftModel of a copy of `hf_model` with the adapter txjax's peft writer wrote into `folder`, txjax's merged
    params): rank-2 adapters on `params` of txjax's `model` at `targets`, A as training draws it and B random (not
    0, so that they change the model), DoRA's m (`variant`) ||W|| moved by noise too; `params_to_hf` the format's
    converter."""
    import copy

    import peft

    config = lora.LoraConfig(lora_rank=2, lora_alpha=4.0, lora_targets=tuple(targets), lora_variant=variant)
    adapted = lora.adapted(params, param_roles(model), config, jax.random.key(1))
    rng = np.random.default_rng(2)
    adapted = adapted.replace(lora=jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape), adapted.lora))
    write(folder, model, jax.device_get(adapted), config, params_to_hf)
    return peft.PeftModel.from_pretrained(copy.deepcopy(hf_model), folder).eval(), lora.model_params(adapted)


def write(folder, model, adapted, config: lora.LoraConfig, params_to_hf) -> None:
    """txjax's peft writer's folder of the adapters `adapted` of txjax's `model` (LoRA settings `config`)."""
    family = "decoder_lm" if isinstance(model, DecoderLM) else "encoder_decoder"
    fields = {f: getattr(config, f) for f in ("lora_rank", "lora_alpha", "lora_scaling", "lora_dropout")}
    folder.mkdir(parents=True, exist_ok=True)
    write_adapter(folder, adapted, model.cfg, params_to_hf, fields, family, "the base")


def assert_adapter_reads_back(folder, model, params, params_to_hf, merged) -> None:
    """The adapter folder `folder` read back onto `params` of txjax's `model` (txjax.convert.peft_adapter.read_adapter:
    `run.py import --from=ADAPTER --base=WORKDIR`) gives the merged params `merged`, and written again the same files:
    every tensor equal, the same adapter_config.json."""
    again, config = read_adapter(folder, params, param_roles(model), model.cfg, params_to_hf)
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    jax.tree.map(close, lora.model_params(again), merged)
    write(folder / "again", model, again, config, params_to_hf)
    assert json.loads((folder / "again" / CONFIG_FILE).read_text()) == json.loads((folder / CONFIG_FILE).read_text())
    first, twice = load_file(folder / WEIGHTS_FILE), load_file(folder / "again" / WEIGHTS_FILE)
    assert first.keys() == twice.keys() and all(np.array_equal(first[k], twice[k]) for k in first)
