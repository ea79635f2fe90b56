"""The evaluate wing: a trained model measured (a split's loss and BLEU, scores, lm-eval, probes, attention maps)."""
