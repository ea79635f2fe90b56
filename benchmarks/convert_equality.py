"""Each checkpoint converter against transformers, on a tiny random model of its family built by transformers
(tests/tiny_hf.py: 2 layers, or 2+2 for an encoder-decoder, float32): the model is saved as a Hugging Face folder and
imported with `run.py import`; the script records the largest logit difference from transformers' (an
encoder-decoder: a padded source batch with a target prefix; a decoder LM: two rows of 64 random tokens), the
largest logit, how many greedy tokens equal `transformers.generate`'s (40 per source; 32 after a 5-token prompt),
the largest logit difference of the folder `run.py export` writes, loaded by transformers, from the original, and,
for the families llama.cpp stores (FAMILIES' GGUF architecture), the largest logit difference of the .gguf
file's import (tests/tiny_gguf.py writes it as llama.cpp's converter does, F32) from the folder import's.

    python benchmarks/convert_equality.py [--families=marian,llama3]
        # -> benchmarks/results/convert_equality_cpu.json (docs/pretrained.md's table of the families)

A family is one FAMILIES entry: its tiny_hf builder's kind and, if llama.cpp stores it, its GGUF architecture.
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
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402

# family -> (family kind of the model, GGUF architecture llama.cpp stores it as, None: no GGUF)
FAMILIES = {
    "marian": ("encoder_decoder", None),
    "bart": ("encoder_decoder", None),
    "t5": ("encoder_decoder", None),
    "t5v1_1": ("encoder_decoder", None),
    "llama": ("decoder_lm", "llama"),
    "llama3": ("decoder_lm", "llama"),
    "mistral": ("decoder_lm", "llama"),
    "mistral_window": ("decoder_lm", "llama"),
    "qwen2": ("decoder_lm", "qwen2"),
    "qwen3": ("decoder_lm", "qwen3"),
    "qwen3_yarn": ("decoder_lm", None),  # llama.cpp's YaRN keys are not read (one line)
}
SEQ2SEQ_TOKENS, LM_TOKENS, PROMPT = 40, 32, 5


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


def measure_seq2seq(kind: str, root: Path) -> dict:
    hf = tiny_hf.save_tiny_seq2seq(kind, root / "hf")
    trained = quiet_import(root / "hf", root / "wd")
    tok = trained.tokenizer
    want, got = tiny_hf.seq2seq_logits(hf, trained.model, trained.params, tok)
    ids, src, mask = tiny_hf.sources(tok)
    src_t, mask_t = torch.tensor(src, dtype=torch.long), torch.tensor(mask)
    with torch.no_grad():
        out = hf.generate(
            input_ids=src_t, attention_mask=mask_t, do_sample=False, num_beams=1, max_new_tokens=SEQ2SEQ_TOKENS
        ).numpy()[:, 1:]
    strategy = dict(max_new_tokens=SEQ2SEQ_TOKENS, eos_id=tok.eos_id)
    gen = generate(trained.model, trained.params, ids, bos_id=tok.bos_id, pad_id=tok.pad_id, **strategy)
    decoder_ids = torch.tensor([[tok.bos_id, *tok.encode(tiny_hf.PAIRS[0][1])[:6]]] * 2)
    exported = exported_difference(
        hf, root / "wd", dict(input_ids=src_t, attention_mask=mask_t, decoder_input_ids=decoder_ids)
    )
    return {
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": same_prefix(gen.ids, out.tolist()),
        "greedy_tokens": SEQ2SEQ_TOKENS,
        "export_max_abs_logit_difference": exported,
    }


def measure_decoder(kind: str, root: Path, arch: str | None) -> dict:
    bpe = tiny_gguf.byte_level_bpe()
    hf = tiny_hf.random_decoder(kind, vocab_size=len(bpe["tokens"]))
    hf.save_pretrained(root / "hf")
    tiny_hf.byte_level_tokenizer(tiny_gguf.TEXT, len(bpe["tokens"])).save_pretrained(root / "hf")
    (root / "text.txt").write_text(tiny_gguf.TEXT)
    trained = quiet_import(root / "hf", root / "wd", f"--config.data.path={root / 'text.txt'}")
    tokens = np.random.default_rng(0).integers(0, len(bpe["tokens"]), (2, tiny_hf.LM_CTX))
    with torch.no_grad():
        want = hf(torch.tensor(tokens)).logits.numpy()
        out = hf.generate(torch.tensor(tokens[:, :PROMPT]), max_new_tokens=LM_TOKENS, do_sample=False)[:, PROMPT:]
    got = np.asarray(trained.model.apply({"params": trained.params}, tokens))
    gen = generate(trained.model, trained.params, tokens[:, :PROMPT].tolist(), max_new_tokens=LM_TOKENS)
    row = {
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": same_prefix(gen.ids, out.tolist()),
        "greedy_tokens": LM_TOKENS,
        "export_max_abs_logit_difference": exported_difference(hf, root / "wd", dict(input_ids=torch.tensor(tokens))),
    }
    if arch is not None:
        path = tiny_gguf.write_gguf(root / "m.gguf", hf, bpe, arch, tiny_gguf.gguf.GGMLQuantizationType.F32)
        cfg, params, _ = load_gguf(path)
        from_gguf = np.asarray(type(trained.model)(cfg).apply({"params": params}, tokens))
        row["gguf_max_abs_logit_difference"] = float(np.abs(from_gguf - got).max())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated FAMILIES keys")
    args = parser.parse_args()
    rows = []
    for family in args.families.split(","):
        kind, arch = FAMILIES[family]
        with tempfile.TemporaryDirectory() as tmp:
            if kind == "encoder_decoder":
                row = measure_seq2seq(family, Path(tmp))
            else:
                row = measure_decoder(family, Path(tmp), arch)
        rows.append({"family": family, **row, "transformers": transformers.__version__})
        print(rows[-1])
    print(f"wrote {save('convert_equality', {'rows': rows})}")


if __name__ == "__main__":
    main()
