"""The generated tables of the checkpoint importers (benchmarks/readme_tables.py registers them)."""

from __future__ import annotations

from table_format import bench, machine_label, n, table

FAMILIES = {"marian": "MarianMTModel", "bart": "BART", "t5": "T5 (ReLU, tied head)", "t5v1_1": "T5 v1.1 (gated GELU)"}
DECODERS = {"gemma2": "Gemma 2 (`gemma2`)", "gemma3_text": "Gemma 3 text (`gemma3_text`)"}


def seq2seq_equality() -> list[str]:
    """benchmarks/seq2seq_equality.py: each encoder-decoder importer against transformers on a tiny random model."""
    d = bench("seq2seq_equality") or {"rows": [], "machine": {}}
    rows = [
        [FAMILIES.get(r["family"], r["family"]), f"{r['max_abs_logit_difference']:.1e}", n(r["max_abs_logit"]),
         f"{' / '.join(map(str, r['greedy_tokens_equal']))} of {r['greedy_tokens']}", r["transformers"],
         machine_label(d["machine"])]
        for r in d["rows"]
    ]  # fmt: skip
    header = [
        "family",
        "max abs logit difference",
        "max abs logit",
        "greedy tokens equal, per source",
        "transformers",
        "measured",
    ]
    return table(header, rows)


def gemma_equality() -> list[str]:
    """benchmarks/gemma_equality.py: the Gemma 2 / 3 importer against transformers on tiny random models."""
    d = bench("gemma_equality") or {"rows": [], "machine": {}}
    rows = [
        [DECODERS.get(r["family"], r["family"]), f"{r['max_abs_logit_difference']:.1e}", n(r["max_abs_logit"]),
         f"{r['greedy_tokens_equal']} of {r['greedy_tokens']} (window {r['window']})", r["transformers"],
         machine_label(d["machine"])]
        for r in d["rows"]
    ]  # fmt: skip
    header = ["family", "max abs logit difference", "max abs logit", "greedy tokens equal", "transformers", "measured"]
    return table(header, rows)
