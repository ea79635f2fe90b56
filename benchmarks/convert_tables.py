"""The generated tables of the checkpoint importers (benchmarks/readme_tables.py registers them)."""

from __future__ import annotations

from table_format import bench, machine_label, n, table

FAMILIES = {"marian": "MarianMTModel", "bart": "BART", "t5": "T5 (ReLU, tied head)", "t5v1_1": "T5 v1.1 (gated GELU)"}
MOE_FAMILIES = {
    "mixtral": "Mixtral",
    "qwen2_moe": "Qwen2-MoE (gated shared expert, decoder_sparse_step 2)",
    "qwen3_moe": "Qwen3-MoE (norm_topk_prob)",
    "olmoe": "OLMoE (q/k norm over the projection)",
}


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


def moe_equality() -> list[str]:
    """benchmarks/moe_equality.py: each mixture-of-experts importer against transformers on a tiny random model."""
    d = bench("moe_equality") or {"rows": [], "machine": {}}
    rows = [
        [MOE_FAMILIES.get(r["family"], r["family"]), f"{r['max_abs_logit_difference']:.1e}", n(r["max_abs_logit"]),
         f"{r['greedy_tokens_equal']} of {r['greedy_tokens']}", f"{r['export_max_abs_logit_difference']:.1e}",
         r["transformers"], machine_label(d["machine"])]
        for r in d["rows"]
    ]  # fmt: skip
    header = ["family", "max abs logit difference", "max abs logit", "greedy tokens equal", "exported, reloaded: max"
              " abs logit difference", "transformers", "measured"]  # fmt: skip
    return table(header, rows)
