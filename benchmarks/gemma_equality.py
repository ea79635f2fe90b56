"""The Gemma 2 / Gemma 3 importer against transformers: for each family a tiny random model built by transformers
(tests/test_gemma_convert.py's builder: Gemma 2 with 2 layers alternating local and global, both soft caps binding;
Gemma 3 with 6 layers in its 5:1 pattern, q/k norms, a linear x8 global RoPE; d_model 32, windows 6 and 8) is imported
with `run.py import`; the script records the largest logit difference over 2 x 64 tokens, the largest logit, and how
many of 40 greedy tokens (from a 5-token prompt, so past the window) equal `transformers.generate`'s; and the largest
logit difference of the .gguf file of the same builder's model (tests/tiny_gguf.py writes it as llama.cpp's converter
does, F32, with a SentencePiece vocabulary; Gemma 2's query_pre_attn_scalar of 24 as `gemma2.attention.scale`) from
that model's folder import.

    python benchmarks/gemma_equality.py     # -> benchmarks/results/gemma_equality_cpu.json (docs/pretrained.md)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from common import save

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the tiny-model builders the converter tests use
import tiny_gguf  # noqa: E402

spec = importlib.util.spec_from_file_location("gemma_models", REPO / "tests" / "test_gemma_convert.py")
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)

import run  # noqa: E402
from txjax.convert.gemma import load_gemma  # noqa: E402
from txjax.convert.gguf import load_gguf  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402


def gguf_difference(kind: str, root: Path) -> float:
    """The largest logit difference of a .gguf file's import from the folder import of the same random model."""
    spm = tiny_gguf.sentencepiece_bpe()
    hf = models.randomized(models.MODELS[kind](len(spm["tokens"])))
    hf.save_pretrained(root / "gguf_hf")
    scale = hf.config.query_pre_attn_scalar**-0.5 if kind == "gemma2" else None  # not head_dim**-0.5: stored
    f32 = tiny_gguf.gguf.GGMLQuantizationType.F32
    path = tiny_gguf.write_gemma_gguf(root / "m.gguf", hf, spm, f32, attention_scale=scale)
    (cfg, params, _), (want_cfg, want_params) = load_gguf(path), load_gemma(root / "gguf_hf")
    ids = models.tokens(cfg.vocab_size)
    got = np.asarray(DecoderLM(cfg).apply({"params": params}, ids))
    return float(np.abs(got - np.asarray(DecoderLM(want_cfg).apply({"params": want_params}, ids))).max())


def measure(kind: str, root: Path) -> dict:
    hf = models.save_tiny(kind, root / "hf")
    (root / "text.txt").write_text(models.TEXT)
    flags = [f"--config.data.path={root / 'text.txt'}", "--config.data.seq_len=16"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}", *flags]) == 0
    trained = load_workdir(root / "wd")
    ids = models.tokens(trained.model.cfg.vocab_size)
    want = models.torch_logits(hf, ids)
    got = np.asarray(trained.model.apply({"params": trained.params}, ids))
    prompt, n = ids[0, :5], models.NEW_TOKENS
    with torch.no_grad():
        ref = hf.generate(torch.as_tensor(prompt[None]), max_new_tokens=n, do_sample=False)[0, 5:].numpy()
    out = np.array(generate(trained.model, trained.params, [prompt.tolist()], max_new_tokens=n).ids[0][:n])
    return {
        "family": kind,
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": int(np.cumprod(out == ref[: len(out)]).sum()),
        "greedy_tokens": n,
        "window": trained.model.cfg.attention_window,
        "gguf_max_abs_logit_difference": gguf_difference(kind, root),
        "transformers": transformers.__version__,
    }


def main() -> None:
    rows = []
    for kind in models.MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(kind, Path(tmp)))
        print(rows[-1])
    print(f"wrote {save('gemma_equality', {'rows': rows})}")


if __name__ == "__main__":
    main()
