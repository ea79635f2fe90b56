"""The baseline the shakespeare_char ablations ablate from, stated once so that a later change of the experiment's
defaults (experiments/shakespeare_char.py) does not change what a sweep measures: the experiment's defaults of
2026-11-30 (RoPE, ReLU, unscaled scores, lr 1e-3, nanoGPT's AdamW and schedule). A sweep's own settings override
these (txjax.sweep: experiment file, then fixed, then flags, then the sweep's settings)."""

SHAKESPEARE_CHAR = {
    "model.positional": "rope",
    "model.activation": "relu",
    "model.attention_scale": "none",
    "model.norm_placement": "pre",
    "model.num_heads": 4,
    "model.tie_embeddings": True,
    "train.learning_rate": 1e-3,
    "train.warmup_steps": 100,
    "train.b2": 0.99,
}


def shakespeare_char(steps: int) -> dict:
    """The sweep's `fixed` section: the baseline at `steps` steps."""
    return {"train.steps": steps, **SHAKESPEARE_CHAR}
