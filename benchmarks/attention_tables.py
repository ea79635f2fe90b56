"""The attention benchmarks' generated tables (benchmarks/readme_tables.py renders them into the pages):
attention_time.py's blockwise against reference, local_attention.py's local against global."""

from __future__ import annotations

from table_format import bench, machine_label, n, table


def attention_time() -> list[str]:
    """The shakespeare_char attention layer's forward and backward, blockwise against the reference."""
    t = bench("attention_time_shakespeare_char")
    rows = [[f"{r['context']:,}", r["blocks"], t["dtype"], n(r["reference_ms"]), n(r["blockwise_ms"]),
             n(r["ratio"], 2), machine_label(t["machine"])] for r in (t or {"rows": []})["rows"]]  # fmt: skip
    header = ["context", "blocks", "dtype", "reference ms", "blockwise ms", "blockwise / reference", "measured"]
    return table(header, rows)


def local_attention() -> list[str]:
    """Blockwise attention's layer (forward and backward) local against global as the context grows."""
    t = bench("local_attention_shakespeare_char")
    rows = [[f"{r['context']:,}", str(r["window"] or "global"), f"{r['block_pairs']:,}", n(r["ms"]),
             n(r["temp_mib"]), machine_label(t["machine"])] for r in (t or {"rows": []})["rows"]]  # fmt: skip
    return table(["context", "window", "block pairs", "ms", "temporary MiB", "measured"], rows)
