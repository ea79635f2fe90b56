"""family_comparison.py's three families on experiments/add_seq2seq.py (multi-digit addition, greedy exact match
on the test split): the encoder-decoder's 2 + 2 layers (d_model 128, FFN 512: 923,776 parameters) against one stack
of 5 layers of FFN 464 (928,384; benchmarks/results/family_step_family_comparison_add_cpu.json), read as a prefix LM
and as a decoder-only LM. Equal time as there: the encoder-decoder's steps are the experiment's 2,000, each other
setting the steps its relative step time fits in the same time
(`python benchmarks/family_step.py --sweep=experiments/ablations/family_comparison_add.py`).

    python run.py sweep --sweep=experiments/ablations/family_comparison_add.py \\
        --workdir=runs/sweeps/family_comparison_add
"""

from experiments.ablations.family_comparison import comparison

# benchmarks/family_step.py's relative medians 1.56 (prefix LM) and 1.47 (decoder-only LM) under load 17: their mean
DECODER_ONLY_STEP_TIME = 1.52


def get_sweep():
    sweep = comparison(
        "experiments/add_seq2seq.py",
        2000,
        DECODER_ONLY_STEP_TIME,
        {"model.num_layers": (2, 5), "model.num_encoder_layers": (2, None), "model.d_ff": (512, 464)},
    )
    return sweep | {"metrics": ["valid_loss", "test_loss", "test_exact_match", "test_generated_exact_match"]}
