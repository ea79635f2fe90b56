"""The three families on one task at matched parameter counts and equal training time (issue 53.5): English ->
Spanish Bible verses (experiments/bible_en_es.py: d_model 256, 4 heads, FFN 1,024 ReLU^2, RoPE, bfloat16, 8 packed
rows of 128 source + 128 target tokens per step, an 8,000-piece SentencePiece model).

- encoder-decoder: 3 + 3 layers, 7,561,728 parameters (each decoder layer has its cross-attention);
- prefix LM (`family=prefix_lm`): one stack of 7 layers over [source ; target], the source read both ways, the loss
  on the target only: 7,560,704 parameters (the same embeddings; 7 x 786,432 = the encoder's 3 and the decoder's 3);
- decoder-only LM: the same 7-layer stack read causally throughout (`model.prefix_attention=causal`, T5's "LM").
A decoder-only stack runs every layer over source and target, so its step costs more than the encoder-decoder's,
whose encoder runs 3 layers over the source and decoder 3 over the target: at equal time it takes fewer steps.

Equal time, on a shared machine: each setting trains for the steps its budget holds at its own step rate (`python
benchmarks/family_step.py --sweep=experiments/ablations/family_comparison.py`: the settings' step times interleaved
in one process, so their ratios hold under load; benchmarks/results/family_step_family_comparison_cpu.json) with the
encoder-decoder's rate alone on this machine anchoring the minutes (experiments/results/bible_en_es: 3,277 steps in
20 minutes, AMD EPYC, 2 cores). A time budget (train.max_minutes) would instead give each run whatever the other
jobs on the cores left it. BUDGET_MINUTES is the experiment's 20 (the 6 runs take about 2.3 hours of 2 shared cores;
a checkpoint every 500 steps lets the sweep resume across stops). WSD schedule over the steps (decay over the last
20%), peak lr 1e-3, no dropout; 2 seeds trained together in one vmapped program per setting. Test BLEU and chrF with
beam 4 (length penalty 0.6) by the probe test_split, after training.

    python run.py sweep --sweep=experiments/ablations/family_comparison.py --workdir=runs/sweeps/family_comparison
"""

BUDGET_MINUTES = 20.0
ENCODER_DECODER_STEPS_PER_MINUTE = 3277 / 20  # experiments/results/bible_en_es (the anchor: module docstring)
# a decoder-only step's time in encoder-decoder steps: benchmarks/family_step.py's relative medians 2.02 (prefix LM)
# and 2.11 (decoder-only LM) under load 8; the two programs differ only in the mask's values, so one time, their mean
DECODER_ONLY_STEP_TIME = 2.06
EVALS = 5  # valid loss at 5 points of each run's budget, for the curves


def comparison(experiment: str, budget_steps: float, decoder_only_step_time: float, sizes: dict) -> dict:
    """The sweep of the three settings on `experiment`: `sizes` {field: (encoder-decoder's value, the two decoder-only
    stacks')} (their matched parameter counts; num_encoder_layers None in the prefix LMs, which have no encoder); the
    encoder-decoder trains `budget_steps` steps, the decoder-only stacks the steps of the same time (each step
    `decoder_only_step_time` encoder-decoder steps long)."""
    steps = [round(budget_steps / t / EVALS) * EVALS for t in (1.0, decoder_only_step_time, decoder_only_step_time)]
    zipped = {
        "family": ["encoder_decoder", "prefix_lm", "prefix_lm"],
        "model.prefix_attention": ["bidirectional", "bidirectional", "causal"],
        "train.steps": steps,
        "train.eval_every": [n // EVALS for n in steps],
        "train.warmup_steps": [n // 16 for n in steps],  # the same share of each budget (bible_en_es: 200 of 3,277)
    }
    zipped |= {field: [ours, theirs, theirs] for field, (ours, theirs) in sizes.items()}
    return {
        "experiment": experiment,
        "fixed": {
            "train.max_minutes": 0.0,
            "train.eval_every_minutes": 0.0,
            "train.decay_start": "steps",
            "train.checkpoint_every": 500,  # the sweep resumes each run from its last checkpoint, across stops
            "train.eval_generation": False,  # the probe measures test BLEU (beam 4) or exact match once, at the end
        },
        "zip": zipped,
        "seeds": [0, 1],
        "metrics": ["valid_loss", "test_loss", "test_bleu", "test_chrf"],
        "probes": ["test_split"],
    }


def get_sweep():
    budget = BUDGET_MINUTES * ENCODER_DECODER_STEPS_PER_MINUTE
    return comparison(
        "experiments/bible_en_es.py",
        budget,
        DECODER_ONLY_STEP_TIME,
        {"model.num_layers": (3, 7), "model.num_encoder_layers": (3, None)},
    )
