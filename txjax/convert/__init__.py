"""Checkpoint interop with other codebases.

gpt2: Hugging Face GPT-2 folders (config.json + model.safetensors) <-> DecoderLM
      load_gpt2(folder) -> (ModelConfig, params);  save_gpt2(folder, cfg, params, bos_id=None, eos_id=None)
"""

from txjax.convert.gpt2 import load_gpt2, save_gpt2

__all__ = ["load_gpt2", "save_gpt2"]
