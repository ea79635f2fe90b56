"""The baselines the shakespeare_char and bible_en_es ablations ablate from, stated once so that a later change
of the experiments' defaults (experiments/shakespeare_char.py, bible_en_es.py) does not change what a sweep
measures: shakespeare_char's defaults of 2026-11-30 (RoPE, ReLU, unscaled scores, lr 1e-3, nanoGPT's AdamW and
schedule), bible_en_es's of 2026-12-01 (cosine schedule in steps). A sweep's own settings override these
(txjax.sweep.spec: experiment file, then fixed, then flags, then the sweep's settings)."""

SHAKESPEARE_CHAR = {
    "model.positional": "rope",
    "model.activation": "relu",
    "model.attention_scale": "none",
    "model.norm_placement": "pre",
    "model.num_heads": 4,
    "model.tie_embeddings": True,
    "model.qk_norm": False,
    "model.logit_softcap": 0.0,
    "train.z_loss": 0.0,
    "train.optimizer": "adamw",
    "train.schedule": "cosine",
    "train.learning_rate": 1e-3,
    "train.warmup_steps": 100,
    "train.b2": 0.99,
}


BIBLE_EN_ES = {  # experiments/bible_en_es.py of 2026-12-01, its schedule sized in steps
    "model.num_layers": 3,
    "model.num_encoder_layers": 3,
    "model.d_model": 256,
    "model.num_heads": 4,
    "model.d_ff": 1024,
    "model.positional": "sinusoidal",
    "model.norm_placement": "pre",
    "model.dtype": "bfloat16",
    "data.vocab_size": 8000,
    "data.pack": True,
    "train.batch_size": 16,
    "train.optimizer": "adamw",
    "train.schedule": "cosine",
    "train.decay_start": "steps",  # the experiment now sizes a WSD by its budget (txjax.training.budget)
    "train.warmup_steps": 200,
    "train.label_smoothing": 0.1,
}


def shakespeare_char(steps: int) -> dict:
    """The sweep's `fixed` section: the baseline at `steps` steps."""
    return {"train.steps": steps, **SHAKESPEARE_CHAR}


def bible_en_es(steps: int) -> dict:
    """The sweep's `fixed` section: bible_en_es at `steps` steps, no time budget, an eval every 500 steps."""
    timing = {"train.max_minutes": 0.0, "train.eval_every_minutes": 0.0, "train.eval_every": 500}
    return {"train.steps": steps, "train.checkpoint_every": 500, **timing, **BIBLE_EN_ES}
