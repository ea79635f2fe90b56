"""The mixture-of-experts importers against transformers: for each family (Mixtral, Qwen2-MoE with its gated shared
expert and a dense layer, Qwen3-MoE, OLMoE) a tiny random model built by transformers (tests/test_moe_convert.py's
builder: 2 layers, d_model 32, 4 experts top-2) is read by txjax.convert.moe; the script records the largest logit
difference on two rows of 48 tokens, the largest logit, how many of 40 greedy tokens equal `transformers.generate`'s
(batch 1), and the largest logit difference of the exported folder reloaded by transformers.

    python benchmarks/moe_equality.py     # -> benchmarks/results/moe_equality_cpu.json (docs/pretrained.md)
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from common import save

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
spec = importlib.util.spec_from_file_location("moe_models", REPO / "tests" / "test_moe_convert.py")
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)

from txjax.convert.moe import load_moe, save_moe  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

NEW_TOKENS = 40


def measure(kind: str, root: Path) -> dict:
    hf = models.random_model(kind)
    hf.save_pretrained(root / "hf")
    cfg, params = load_moe(root / "hf")
    want = models.torch_logits(hf, models.TOKENS)
    got = models.txjax_logits(cfg, params, models.TOKENS)
    prompt = models.TOKENS[0, :5]
    with torch.no_grad():
        ref = hf.generate(torch.as_tensor(prompt[None]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, 5:].tolist()
    ours = generate(DecoderLM(cfg), params, [prompt.tolist()], max_new_tokens=NEW_TOKENS).ids[0]
    exported = transformers.AutoModelForCausalLM.from_pretrained(save_moe(root / "out", cfg, params)).eval()
    return {
        "family": kind,
        "max_abs_logit_difference": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "greedy_tokens_equal": int(np.cumprod(np.array(ours) == np.array(ref)).sum()),
        "greedy_tokens": NEW_TOKENS,
        "export_max_abs_logit_difference": float(np.abs(models.torch_logits(exported, models.TOKENS) - want).max()),
        "transformers": transformers.__version__,
    }


def main() -> None:
    rows = []
    for kind in models.MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(kind, Path(tmp)))
        print(rows[-1])
    print(f"wrote {save('moe_equality', {'rows': rows})}")


if __name__ == "__main__":
    main()
