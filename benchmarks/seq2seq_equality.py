"""The encoder-decoder importers against transformers: for each family (Marian, BART, T5, T5 v1.1) a tiny random model
built by transformers (tests/test_seq2seq_convert.py's builder: 2+2 layers, d_model 32, a BPE tokenizer trained on
its pairs) is imported with `run.py import`; the script records the largest logit difference on a padded source
batch with a target prefix, the largest logit, and how many of 40 greedy tokens per source equal
`transformers.generate`'s.

    python benchmarks/seq2seq_equality.py     # -> benchmarks/results/seq2seq_equality_cpu.json (docs/pretrained.md)
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
spec = importlib.util.spec_from_file_location("seq2seq_models", REPO / "tests" / "test_seq2seq_convert.py")
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)

import run  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402

NEW_TOKENS = 40


def measure(kind: str, root: Path) -> dict:
    hf = models.save_tiny(kind, root / "hf")
    with contextlib.redirect_stdout(io.StringIO()):
        assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}"]) == 0
    trained = load_workdir(root / "wd")
    tok = trained.tokenizer
    ids, src, mask = models.sources(tok)
    tgt = np.array([[tok.bos_id, *tok.encode(models.PAIRS[0][1])[:6]]] * 2, np.int32)
    src_t, mask_t = torch.tensor(src, dtype=torch.long), torch.tensor(mask)
    with torch.no_grad():
        want = hf(input_ids=src_t, attention_mask=mask_t, decoder_input_ids=torch.tensor(tgt, dtype=torch.long))
        out = hf.generate(
            input_ids=src_t, attention_mask=mask_t, do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS
        ).numpy()[:, 1:]
    got = np.asarray(trained.model.apply({"params": trained.params}, src, tgt, src_segment_ids=mask))
    strategy = dict(max_new_tokens=NEW_TOKENS, eos_id=tok.eos_id)
    gen = generate(trained.model, trained.params, ids, bos_id=tok.bos_id, pad_id=tok.pad_id, **strategy)
    same = [int(np.cumprod(np.array(g[:NEW_TOKENS]) == o[: len(g)]).sum()) for g, o in zip(gen.ids, out.tolist())]
    return {
        "family": kind,
        "max_abs_logit_difference": float(np.abs(got - want.logits.numpy()).max()),
        "max_abs_logit": float(np.abs(want.logits.numpy()).max()),
        "greedy_tokens_equal": same,
        "greedy_tokens": NEW_TOKENS,
        "transformers": transformers.__version__,
    }


def main() -> None:
    rows = []
    for kind in models.MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(kind, Path(tmp)))
        print(rows[-1])
    print(f"wrote {save('seq2seq_equality', {'rows': rows})}")


if __name__ == "__main__":
    main()
