"""A pretrained checkpoint <-> a txjax workdir: `run.py import --from=PATH --workdir=DIR` and `run.py export`.

Import reads a Hugging Face GPT-2 folder, a Llama/Mistral/Qwen2/Qwen3 or Gemma 2/3 folder (txjax.convert.gpt2,
.llama, .gemma), a Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE folder (txjax.convert.moe), a dense DeepSeek-V3 folder
(txjax.convert.deepseek), a Marian, BART or T5 encoder-decoder folder (txjax.convert.marian, .bart, .t5) or a .gguf
file (txjax.convert.gguf) and writes what `run.py train` writes (txjax.experiment.load_workdir reads it):
config.json (the resolved config, its model section and family the checkpoint's), tokenizer/ (the model's own) and
checkpoints/ holding step 0 (the imported parameters alone: training makes its optimizer state when it starts). So
`run.py eval`, `generate`, `attention` and `inspect` work on it, and training from it (or from
`train.init_from=DIR`) fine-tunes the model. The data and train sections default to a small fine-tuning run on
tinyshakespeare (nanoGPT's finetune_shakespeare, shortened for a CPU; an encoder-decoder's on ../shared/data/bible's
English-Spanish pairs); `--config=FILE` and `--config.a.b=value` change them. Everything is read and checked before
the workdir appears; a failure leaves nothing behind.

Export writes a workdir's latest parameters as a Hugging Face folder (GPT-2, Llama/Qwen2/Mistral/Qwen3, Gemma 2/3,
Mixtral/Qwen-MoE/OLMoE, DeepSeek-V3 (dense), Marian, BART or T5: config.json, model.safetensors, the tokenizer's
files) that transformers' from_pretrained loads, whole or not at all: a field the format cannot express or a
parameter its writer does not read is one line naming them, and nothing is written (txjax.convert.exportable).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections

from txjax import config as config_lib
from txjax.convert import bart, deepseek, gemma, gguf, gpt2, llama, llama4, marian, moe, qwen3_next, t5
from txjax.convert.hf_folder import check_params, read_config, read_tokenizer, write_atomically, write_tokenizer
from txjax.convert.peft_adapter import read_adapter, write_adapter
from txjax.data import TOKENIZER_DIR
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.data.tokenizers import ByteLevelBPETokenizer
from txjax.experiment import CHECKPOINT_DIR, build_model, load_workdir
from txjax.families import DECODER_LM, ENCODER_DECODER, Family, family_of, init_params, param_roles
from txjax.model.config import ModelConfig
from txjax.model.models import unstack_layers
from txjax.state.checkpoint import Checkpointer
from txjax.state.lora import Adapted
from txjax.state.train_state import TrainState


def read_checkpoint(source) -> tuple[ModelConfig, dict, object, Family]:
    """(ModelConfig, params, tokenizer, family) of a GPT-2, Llama-family, Marian, BART or T5 folder or a .gguf file."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        return (*gguf.load_gguf(path), DECODER_LM)
    if not path.is_dir():
        raise ValueError(f"{path}: no such folder or .gguf file")
    hf = read_config(path)
    if hf.get("model_type") == "gpt2":
        return (*gpt2.load_gpt2(path), gpt2.load_gpt2_tokenizer(path), DECODER_LM)
    if hf.get("model_type") in marian.MODEL_TYPES:
        return (*marian.load_marian(path), marian.FAMILY)
    if hf.get("model_type") in bart.MODEL_TYPES:
        return (*bart.load_bart(path), bart.FAMILY)
    if hf.get("model_type") in t5.MODEL_TYPES:
        return (*t5.load_t5(path), t5.FAMILY)
    if hf.get("model_type") in deepseek.MODEL_TYPES:
        return (*deepseek.load_deepseek(path), read_tokenizer(path, hf), DECODER_LM)
    if hf.get("model_type") in moe.MODEL_TYPES:
        return (*moe.load_moe(path), read_tokenizer(path, hf), DECODER_LM)
    if hf.get("model_type") in llama4.MODEL_TYPES:
        return (*llama4.load_llama4(path), read_tokenizer(path, hf), DECODER_LM)
    if hf.get("model_type") in qwen3_next.MODEL_TYPES:
        return (*qwen3_next.load_qwen3_next(path), read_tokenizer(path, hf), DECODER_LM)
    if hf.get("model_type") in (*gemma.MODEL_TYPES, "gemma3"):  # gemma3, the multimodal model, refused in one line
        return (*gemma.load_gemma(path), read_tokenizer(path, hf), DECODER_LM)
    return (*llama.load_llama(path), read_tokenizer(path, hf), DECODER_LM)


def _lm_data(cfg: ModelConfig) -> dict:
    return {"kind": "text", "path": "../shared/data/tinyshakespeare/input.txt", "seq_len": min(256, cfg.max_len)}


def _pairs_data(cfg: ModelConfig) -> dict:
    bible, longest = "../shared/data/bible/{}.en-es.tsv", min(128, cfg.max_len)
    paths = {"path": bible.format("train"), "valid_path": bible.format("valid"), "test_path": bible.format("test")}
    return {"kind": "parallel", **paths, "max_src_len": longest, "max_tgt_len": longest}


# the data section of an imported model's fine-tuning run without an experiment file, by the checkpoint's family
_FINETUNE_DATA = {DECODER_LM: _lm_data, ENCODER_DECODER: _pairs_data}


def run_config(
    cfg: ModelConfig, tokenizer, experiment: str | None = None, overrides=(), family: Family = DECODER_LM
) -> ml_collections.ConfigDict:
    """The run config of an imported model: model = cfg, then the experiment's data/train sections and overrides."""
    config = config_lib.load_config(experiment) if experiment else config_lib.base_config()
    if not experiment:
        config.data.update(_FINETUNE_DATA[family](cfg))
        config.train.update(steps=20, batch_size=4, learning_rate=3e-5, warmup_steps=2, weight_decay=0.0)
        config.train.update(eval_every=0, eval_batches=8, checkpoint_every=20, log_every=5)
    config.family = family.name
    config.data.tokenizer = tokenizer.kind  # restored from the workdir's tokenizer/, never rebuilt
    config.model.update(dataclasses.asdict(cfg))
    for flag in overrides:
        config_lib.apply_override(config, flag)
    return config


def import_model(source, workdir, experiment: str | None = None, overrides=()) -> dict:
    """Writes the workdir; returns a summary (workdir, parameter count, vocab size, context)."""
    hf_cfg, params, tokenizer, family = read_checkpoint(source)
    if tokenizer.vocab_size > hf_cfg.vocab_size:
        raise ValueError(
            f"{source}: the tokenizer has {tokenizer.vocab_size} ids, more than the model's "
            f"vocab_size={hf_cfg.vocab_size}"
        )
    config = run_config(hf_cfg, tokenizer, experiment, overrides, family)
    cfg = config_lib.model_config(config.model.to_dict())
    if not cfg.scan_layers:
        params = unstack_layers(params)
    check_params(params, cfg, family)  # an override that changes a shape is an error here, before anything is written
    model = build_model(config)
    params = jax.tree.map(jnp.asarray, params)
    # parameters only: a run that trains from them (train.init_from) makes its optimizer state when it starts
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None)
    expected = jax.eval_shape(lambda: init_params(model, jax.random.key(config.train.seed)))
    if jax.tree.structure(params) != jax.tree.structure(expected):
        raise ValueError("the imported parameters do not have the structure `run.py train` builds")

    path = _write_workdir(workdir, config, tokenizer, state)
    return {
        "workdir": str(path),
        "params": sum(a.size for a in jax.tree.leaves(params)),
        "vocab_size": cfg.vocab_size,
        "max_len": cfg.max_len,
        "num_layers": cfg.num_layers,
    }


def _write_workdir(workdir, config: ml_collections.ConfigDict, tokenizer, state: TrainState) -> Path:
    """A new workdir holding `config`, `tokenizer` and `state` as step 0, atomically."""

    def write(tmp: Path):
        config_lib.save(config, tmp)
        tokenizer.save(tmp / TOKENIZER_DIR)
        ckpt = Checkpointer(tmp / CHECKPOINT_DIR, config.train.keep_checkpoints)
        try:
            ckpt.save(0, state, advice=f"nothing was written to {workdir}: free space or choose another --workdir")
        finally:
            ckpt.close()

    return write_atomically(workdir, write)


def import_adapter(adapter, base, workdir) -> dict:
    """A peft LoRA adapter folder (txjax.convert.peft_adapter.read_adapter) onto the model of the workdir `base`
    (imported, or trained without LoRA) -> a new workdir: base's config with the adapter's LoRA settings, its
    tokenizer, and step 0 holding base's parameters and the adapters, which eval, generate and export read as a LoRA
    run's (merged; `run.py export` writes the adapter back)."""
    run = load_workdir(base)
    if run.config.train.lora_rank:
        raise ValueError(f"--base={base}: a LoRA run's workdir; give the workdir of the model its adapters were on")
    family = family_of(run.model)
    params = jax.device_get(run.params)
    params_to_hf = (_decoder_format(run.model.cfg) if family == DECODER_LM else _seq2seq_format(run)).params_to_hf
    adapted, lora = read_adapter(adapter, params, param_roles(run.model), run.model.cfg, params_to_hf)
    config = run.config
    config.train.update(lora_rank=lora.lora_rank, lora_alpha=lora.lora_alpha, lora_scaling=lora.lora_scaling)
    config.train.update(lora_variant=lora.lora_variant)
    config.train.lora_targets = list(lora.lora_targets)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=jax.tree.map(jnp.asarray, adapted), opt_state=None)
    path = _write_workdir(workdir, config, run.tokenizer, state)
    adapters = sum(a.size for a in jax.tree.leaves(adapted.lora))
    return {
        "workdir": str(path),
        "adapter_params": adapters,
        "lora_rank": lora.lora_rank,
        "targets": config.train.lora_targets,
    }


def _write_gpt2_tokenizer(folder: Path, tokenizer: ByteLevelBPETokenizer) -> None:
    """GPT-2's vocab.json + merges.txt, as GPT2Tokenizer reads them."""
    (folder / "vocab.json").write_text(json.dumps(tokenizer.vocab, ensure_ascii=False), encoding="utf-8")
    merges = "".join(f"{a} {b}\n" for a, b in tokenizer.merges)
    (folder / "merges.txt").write_text("#version: 0.2\n" + merges, encoding="utf-8")


def export_workdir(workdir, target, merged: bool = False, base_model: str | None = None) -> dict:
    """A workdir's latest parameters -> a new Hugging Face folder (GPT-2 when the model has a learned position table,
    Qwen3-Next with Gated DeltaNet layers or gated attention, an MoE architecture when it has experts, Gemma 2/3 with
    sandwich norms, else Llama / Qwen2); its tokenizer's files with them when it is a GPT-2 or a pretrained model's one.
    A LoRA run's: its adapters as a peft adapter folder (txjax.convert.peft_adapter, adapter_config.json's
    base_model_name_or_path `base_model`, default its train.init_from), or with `merged` its merged weights as that
    folder."""
    run = load_workdir(workdir, merge=merged)
    family = family_of(run.model)
    if family not in _EXPORTERS:
        raise ValueError(f"{workdir}: family {family.name!r} cannot be exported (a decoder-only LM can)")
    if merged and not run.config.train.lora_rank:
        raise ValueError(f"--merged: {workdir} has no LoRA adapters to merge (train.lora_rank=0); drop --merged")
    if isinstance(run.params, Adapted):
        fields, base = run.config.train, base_model or run.config.train.init_from
        params_to_hf = (_decoder_format(run.model.cfg) if family == DECODER_LM else _seq2seq_format(run)).params_to_hf
        adapted = jax.device_get(run.params)
        write = lambda tmp: write_adapter(tmp, adapted, run.model.cfg, params_to_hf, fields, family.name, base)
        path = write_atomically(target, write)
        return {"folder": str(path), "step": run.step, "files": sorted(p.name for p in path.iterdir())}
    return _EXPORTERS[family](run, target)


def _decoder_format(cfg: ModelConfig):
    """The converter of a DecoderLM's format, by its fields."""
    return (
        gpt2 if cfg.positional == "learned"
        else deepseek if cfg.attention == "mla"
        else llama4 if cfg.moe_gate_input
        else qwen3_next if cfg.attention_output_gate or "L" in cfg.layer_types
        else moe if cfg.num_experts
        else gemma if cfg.norm_placement == "sandwich"
        else llama
    )  # fmt: skip


_WRITERS = {
    gpt2: gpt2.write_gpt2,
    deepseek: deepseek.write_deepseek,
    llama4: llama4.write_llama4,
    qwen3_next: qwen3_next.write_qwen3_next,
    moe: moe.write_moe,
    gemma: gemma.write_gemma,
    llama: llama.write_llama,
}


def _export_decoder_lm(run, target) -> dict:
    """A DecoderLM -> a GPT-2, MoE, Gemma or Llama folder, by its fields."""
    cfg, tokenizer = run.model.cfg, run.tokenizer
    write_model = _WRITERS[_decoder_format(cfg)]
    params = jax.device_get(run.params)

    def write(tmp: Path):
        write_model(tmp, cfg, params, tokenizer.bos_id, tokenizer.eos_id)
        if isinstance(tokenizer, HFTokenizer):
            write_tokenizer(tmp, tokenizer, cfg.max_len)
        elif isinstance(tokenizer, ByteLevelBPETokenizer):
            _write_gpt2_tokenizer(tmp, tokenizer)

    path = write_atomically(target, write)
    return {"folder": str(path), "step": run.step, "files": sorted(p.name for p in path.iterdir())}


# an encoder-decoder's converter, by the positions that tell its family apart
_ENCODER_DECODER_FORMATS = {"sinusoidal_halves": marian, "learned": bart, "relative_buckets": t5}
_ENCODER_DECODER_WRITERS = {marian: marian.write_marian, bart: bart.write_bart, t5: t5.write_t5}


def _seq2seq_format(run):
    """The converter of a Marian-, BART- or T5-shaped EncoderDecoder (told apart by model.positional) with a
    pretrained tokenizer; ValueError for another."""
    found = _ENCODER_DECODER_FORMATS.get(run.model.cfg.positional)
    if found is None or not isinstance(run.tokenizer, HFTokenizer):
        raise ValueError(
            f"model.positional={run.model.cfg.positional!r} with a {run.tokenizer.kind!r} tokenizer cannot be "
            "exported: an encoder-decoder imported from Marian, BART or T5 can (positional "
            f"{', '.join(_ENCODER_DECODER_FORMATS)} with its pretrained tokenizer)"
        )
    return found


def _export_encoder_decoder(run, target) -> dict:
    """A Marian-, BART- or T5-shaped EncoderDecoder (each writer refuses a field its family lacks in one line) ->
    a MarianMTModel, BART or T5 folder."""
    write = _ENCODER_DECODER_WRITERS[_seq2seq_format(run)]
    params = jax.device_get(run.params)
    path = write_atomically(target, lambda tmp: write(tmp, run.model.cfg, params, run.tokenizer))
    return {"folder": str(path), "step": run.step, "files": sorted(p.name for p in path.iterdir())}


_EXPORTERS = {DECODER_LM: _export_decoder_lm, ENCODER_DECODER: _export_encoder_decoder}  # by the workdir's family
