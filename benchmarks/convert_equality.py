"""Each checkpoint converter against transformers, on a tiny random model of each of its families built by
transformers (tests/tiny_hf.py, the converter tests' builders: float32, 2 layers or 2+2 for an encoder-decoder, Gemma
3's 6 in its 5:1 pattern): the model is saved as a Hugging Face folder and imported with `run.py import`; the script
records the largest logit difference from transformers' (an encoder-decoder: a padded source batch with a target
prefix; a decoder LM: two rows of random tokens as long as its context), the largest logit, how many greedy tokens
equal `transformers.generate`'s (from each source, or from each 5-token prompt), the largest logit difference of the
folder `run.py export` writes, loaded by transformers, from the original, and, for the families llama.cpp stores
(FAMILIES' GGUF architecture), the largest logit difference of the .gguf file's import (tests/tiny_gguf.py writes it
as llama.cpp's converter does, F32) from the folder import of the same model (with the file's vocabulary).

    python benchmarks/convert_equality.py [--families=marian,llama3]
        # -> benchmarks/results/convert_equality_cpu.json (docs/pretrained.md's table of the families)

A family is one FAMILIES entry: its tiny_hf builder's kind, its GGUF architecture if llama.cpp stores it, and its
greedy decoding (sources or prompts, new tokens each).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from common import REPO, save

sys.path.insert(0, str(REPO / "tests"))  # the tiny-model builders the converter tests use
import tiny_gguf  # noqa: E402
import tiny_hf  # noqa: E402

import run  # noqa: E402
from txjax.convert.gguf import load_gguf  # noqa: E402
from txjax.convert.workdir import read_checkpoint  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

# family -> (family kind, the GGUF architecture llama.cpp stores it as (None: none that txjax reads), greedy
# decoding: how many sources / prompts, new tokens each)
FAMILIES = {
    "marian": ("encoder_decoder", None, 2, 40),
    "bart": ("encoder_decoder", None, 2, 40),
    "t5": ("encoder_decoder", None, 2, 40),
    "t5v1_1": ("encoder_decoder", None, 2, 40),
    "llama": ("decoder_lm", "llama", 2, 32),
    "llama3": ("decoder_lm", "llama", 2, 32),
    "mistral": ("decoder_lm", "llama", 2, 32),
    "mistral_window": ("decoder_lm", "llama", 2, 32),
    "qwen2": ("decoder_lm", "qwen2", 2, 32),
    "qwen3": ("decoder_lm", "qwen3", 2, 32),
    "qwen3_yarn": ("decoder_lm", None, 2, 32),  # llama.cpp's YaRN keys are not read (one line)
    "smollm3": ("decoder_lm", None, 2, 32),
    "gemma2": ("decoder_lm", "gemma2", 1, 40),
    "gemma3_text": ("decoder_lm", "gemma3", 1, 40),
    "mixtral": ("decoder_lm", None, 1, 40),
    "qwen2_moe": ("decoder_lm", None, 1, 40),
    "qwen3_moe": ("decoder_lm", None, 1, 40),
    "olmoe": ("decoder_lm", None, 1, 40),
    "gpt_oss": ("decoder_lm", None, 1, 40),
    "deepseek_v3": ("decoder_lm", None, 1, 40),
    "deepseek_v3_moe": ("decoder_lm", None, 1, 40),
    "llama4_text": ("decoder_lm", None, 1, 40),
    "qwen3_next": ("decoder_lm", None, 1, 40),
}
PROMPT = 5


def quiet_import(folder: Path, workdir: Path, *flags: str):
    with contextlib.redirect_stdout(io.StringIO()):
        assert run.main(["import", f"--from={folder}", f"--workdir={workdir}", *flags]) == 0
    return load_workdir(workdir)


def exported_difference(hf, workdir: Path, inputs: dict) -> float:
    """The largest logit difference of transformers on `run.py export`'s folder from transformers on the original."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert run.main(["export", f"--workdir={workdir}", f"--to={workdir.parent / 'exported'}"]) == 0
    auto = transformers.AutoModelForSeq2SeqLM if hf.config.is_encoder_decoder else transformers.AutoModelForCausalLM
    back = auto.from_pretrained(workdir.parent / "exported").eval()
    with torch.no_grad():
        return float((back(**inputs).logits - hf(**inputs).logits).abs().max())


def same_prefix(got: list[list[int]], want: list[list[int]]) -> list[int]:
    """Per row: how many leading tokens agree."""
    return [int(np.cumprod(np.array(g) == np.array(w[: len(g)])).sum()) for g, w in zip(got, want)]


def measure_seq2seq(kind: str, root: Path, sources: int, new: int) -> dict:
    hf = tiny_hf.save_tiny_seq2seq(kind, root / "hf")
    trained = quiet_import(root / "hf", root / "wd")
    tok = trained.tokenizer
    want, got = tiny_hf.seq2seq_logits(hf, trained.model, trained.params, tok)
    ids, src, mask = tiny_hf.sources(tok)
    ids, src_t, mask_t = ids[:sources], torch.tensor(src[:sources], dtype=torch.long), torch.tensor(mask[:sources])
    with torch.no_grad():
        out = hf.generate(input_ids=src_t, attention_mask=mask_t, do_sample=False, num_beams=1, max_new_tokens=new)
    gen = generate(
        trained.model, trained.params, ids, bos_id=tok.bos_id, pad_id=tok.pad_id, max_new_tokens=new, eos_id=tok.eos_id
    )
    decoder_ids = torch.tensor([[tok.bos_id, *tok.encode(tiny_hf.PAIRS[0][1])[:6]]] * len(ids))
    exported = exported_difference(
        hf, root / "wd", dict(input_ids=src_t, attention_mask=mask_t, decoder_input_ids=decoder_ids)
    )
    return {
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": same_prefix(gen.ids, out.numpy()[:, 1:].tolist()),
        "greedy_tokens": new,
        "export_max_abs_logit_difference": exported,
    }


def measure_decoder(kind: str, root: Path, arch: str | None, prompts: int, new: int) -> dict:
    hf = tiny_hf.save_decoder(kind, root / "hf")
    trained = quiet_import(root / "hf", root / "wd", "--config.data.seq_len=16")
    c = hf.config
    tokens = np.random.default_rng(0).integers(0, c.vocab_size, (2, c.max_position_embeddings))
    want = tiny_hf.torch_logits(hf, tokens)
    with torch.no_grad():
        out = hf.generate(torch.tensor(tokens[:prompts, :PROMPT]), max_new_tokens=new, do_sample=False)[:, PROMPT:]
    got = np.asarray(trained.model.apply({"params": trained.params}, tokens))
    gen = generate(trained.model, trained.params, tokens[:prompts, :PROMPT].tolist(), max_new_tokens=new)
    row = {
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": same_prefix(gen.ids, out.tolist()),
        "greedy_tokens": new,
        "export_max_abs_logit_difference": exported_difference(hf, root / "wd", dict(input_ids=torch.tensor(tokens))),
    }
    if arch is not None:
        row["gguf_max_abs_logit_difference"] = gguf_difference(kind, root / "gguf", arch)
    return row


def gguf_difference(kind: str, root: Path, arch: str) -> float:
    """The largest logit difference of a .gguf file's import from the folder import of the same random model (of the
    file's vocabulary: Gemma's SentencePiece, or else a byte-level BPE), on two rows as long as its context."""
    vocab = tiny_gguf.sentencepiece_bpe() if arch in tiny_gguf.GEMMA_ARCHS else tiny_gguf.byte_level_bpe()
    hf = tiny_hf.save_decoder(kind, root, vocab_size=len(vocab["tokens"]))
    scale = hf.config.query_pre_attn_scalar**-0.5 if arch == "gemma2" else None  # not head_dim**-0.5: stored
    path = tiny_gguf.write_gguf(root / "m.gguf", hf, vocab, arch, tiny_gguf.gguf.GGMLQuantizationType.F32, scale)
    (cfg, params, _), (want_cfg, want_params, _, _) = load_gguf(path), read_checkpoint(root)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, hf.config.max_position_embeddings))
    got = np.asarray(DecoderLM(cfg).apply({"params": params}, ids))
    return float(np.abs(got - np.asarray(DecoderLM(want_cfg).apply({"params": want_params}, ids))).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated FAMILIES keys")
    args = parser.parse_args()
    rows = []
    for family in args.families.split(","):
        kind, arch, prompts, new = FAMILIES[family]
        with tempfile.TemporaryDirectory() as tmp:
            if kind == "encoder_decoder":
                row = measure_seq2seq(family, Path(tmp), prompts, new)
            else:
                row = measure_decoder(family, Path(tmp), arch, prompts, new)
        rows.append({"family": family, **row, "transformers": transformers.__version__})
        print(rows[-1])
    print(f"wrote {save('convert_equality', {'rows': rows})}")


if __name__ == "__main__":
    main()
