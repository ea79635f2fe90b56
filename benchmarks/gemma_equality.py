"""The Gemma 2 / Gemma 3 importer against transformers: for each family a tiny random model built by transformers
(tests/test_gemma_convert.py's builder: Gemma 2 with 2 layers alternating local and global, both soft caps binding;
Gemma 3 with 6 layers in its 5:1 pattern, q/k norms, a linear x8 global RoPE; d_model 32, windows 6 and 8) is imported
with `run.py import`; the script records the largest logit difference over 2 x 64 tokens, the largest logit, and how
many of 40 greedy tokens (from a 5-token prompt, so past the window) equal `transformers.generate`'s.

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
spec = importlib.util.spec_from_file_location("gemma_models", REPO / "tests" / "test_gemma_convert.py")
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)

import run  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402


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
