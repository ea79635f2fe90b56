"""Checkpoint interop with other codebases.

gpt2:      Hugging Face GPT-2 folders (config.json + model.safetensors) <-> DecoderLM
           load_gpt2(folder) -> (ModelConfig, params);  save_gpt2(folder, cfg, params, bos_id=None, eos_id=None)
           load_gpt2_tokenizer(folder) -> txjax.data.tokenizers.ByteLevelBPETokenizer
llama:     Hugging Face Llama (2, 3.x) / Mistral / Qwen2 / Qwen3 folders <-> DecoderLM
           load_llama(folder) -> (ModelConfig, params);  save_llama(folder, cfg, params, bos_id=None, eos_id=None)
gemma:     Hugging Face Gemma 2 / Gemma 3 (text) folders <-> DecoderLM
           load_gemma(folder) -> (ModelConfig, params);  save_gemma(folder, cfg, params, bos_id=None, eos_id=None)
gguf:      llama.cpp's .gguf files (llama, qwen2, qwen3; gemma2, gemma3 through gguf_gemma) -> DecoderLM:
           load_gguf(path) -> (ModelConfig, params, HFTokenizer)
marian, bart, t5: Hugging Face MarianMT / BART / T5 folders <-> EncoderDecoder (load_*, write_*)
hf_folder: what the folder formats share (safetensors reading, tokenizer.json files, atomic writes)
exportable: export whole or refused (every writer's config read back, every parameter written)
workdir:   a checkpoint <-> a txjax workdir (`run.py import`, `run.py export`)
"""

from txjax.convert.gemma import load_gemma, save_gemma
from txjax.convert.gguf import load_gguf
from txjax.convert.gpt2 import load_gpt2, load_gpt2_tokenizer, save_gpt2
from txjax.convert.llama import load_llama, save_llama

__all__ = [
    "load_gemma",
    "load_gguf",
    "load_gpt2",
    "load_gpt2_tokenizer",
    "load_llama",
    "save_gemma",
    "save_gpt2",
    "save_llama",
]
