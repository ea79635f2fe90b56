"""muP width transfer (issue 20.4; Yang et al. 2022, "Tensor Programs V"): does the best learning rate found at one
width stay the best at 2x, 4x and 8x the width? Widths 64, 128, 256, 512 (d_ff = 4 d_model; 4 heads, so d_k = 16
to 128) at the shakespeare_char shape (4 layers, context 64, batch 12), 6 peak learning rates from 5e-4 to 1.6e-2
(32x), the standard parametrization (1/sqrt(d_k) scores) against muP with base width 128 (1/d_k scores: at width
128 the two differ only in that scaling), 2 seeds: 96 runs of 300 steps (warmup 100, cosine to lr/10), each scored
by its valid loss over the whole split at the end. Otherwise experiments/shakespeare_char.py (bfloat16 matmuls)
with the ablations' baseline (experiments/ablations/baseline.py: RoPE, ReLU, AdamW with b2 0.99).

Each (parametrization, width) is one vmapped program of its 12 runs (6 learning rates x 2 seeds): 8 programs.
CPU time on 2 cores: the 12 runs at width 512 took 7.2 s per step while another sweep shared the cores (load ~8);
the training FLOPs of a width scale as d_model^2 (6 x 12 d^2 x 4 layers per token), so the four widths together
take ~1.5x the widest, ~21 s per step for the whole sweep: ~105 minutes for 300 steps, plus ~15 for the final
evaluations (about 20 s per run at width 512), ~2 hours so loaded, about half on an idle machine.
results_lines.png: valid loss against learning rate, one line per width, a panel per parametrization;
results.md: the best learning rate per width (muP's claim: the same at every width; the standard one's drifts down).
"""

from experiments.ablations import baseline

SCORES = {"standard": "sqrt", "mup": "linear"}  # SP's 1/sqrt(d_k); muP's 1/d_k (model.parametrization=mup needs it)


def sweep(widths, learning_rates, steps, base_width, seeds=(0, 1)) -> dict:
    """The transfer sweep over `widths` x `learning_rates` x {standard, muP} x `seeds` at `steps` steps."""
    pairs = [(p, w) for p in SCORES for w in widths]  # (parametrization, width): varied together, one program each
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {
            **baseline.shakespeare_char(steps),
            "model.base_width": base_width,
            "train.eval_every": 0,
            "train.checkpoint_every": steps,
        },
        "zip": {
            "model.parametrization": [p for p, _ in pairs],
            "model.attention_scale": [SCORES[p] for p, _ in pairs],
            "model.d_model": [w for _, w in pairs],
            "model.d_ff": [4 * w for _, w in pairs],
        },
        "grid": {"train.learning_rate": list(learning_rates)},
        "seeds": list(seeds),
        "lines": {"x": "train.learning_rate", "series": "model.d_model", "panels": "model.parametrization"},
    }


def get_sweep():
    return sweep([64, 128, 256, 512], [5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], steps=300, base_width=128)
