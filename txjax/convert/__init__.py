"""Checkpoint interop with other codebases.

gpt2: Hugging Face GPT-2 folders (config.json + model.safetensors) <-> DecoderLM
      load_gpt2(folder) -> (ModelConfig, params);  save_gpt2(folder, cfg, params, bos_id=None, eos_id=None)
      load_gpt2_tokenizer(folder) -> txjax.data.tokenizers.ByteLevelBPETokenizer
"""

from txjax.convert.gpt2 import load_gpt2, load_gpt2_tokenizer, save_gpt2

__all__ = ["load_gpt2", "load_gpt2_tokenizer", "save_gpt2"]
