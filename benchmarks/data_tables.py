"""The tables of docs/data.md (benchmarks/readme_tables.py keeps them): `run.py prepare`'s speed and memory, and
training from shards, from the result files of benchmarks/data.py and benchmarks/prepare_memory.py."""

from __future__ import annotations

from table_format import bench, machine_label, n, table


def data() -> list[str]:
    d = bench("data")
    p, rss, loop = d["prepare"], d["peak_rss_mb"], d["loop_ms_per_step"]
    large_mb = p["workers_1"]["tokens"] / 1e6
    ratio = loop["shards"] / loop["memory"]
    rows = [
        [
            f"prepare, {w} worker{'s' * (w > 1)} ({n(large_mb)} M tokens)",
            f"{n(p[f'workers_{w}']['mb_per_s'])} MB/s, {n(p[f'workers_{w}']['tokens_per_s'] / 1e6)} M tokens/s",
            "",
        ]
        for w in (1, 2)  # fmt: skip
    ]
    rows += [
        [f"peak RSS of `run.py train` from shards, {d['corpus_gb']['small']} GB / {d['corpus_gb']['large']} GB corpus",
         f"{n(rss['small']['rss_mb'])} / {n(rss['large']['rss_mb'])} MB ({n(d['rss_gap_mb'])} MB apart)",
         "within 200 MB: " + ("met" if abs(d["rss_gap_mb"]) <= 200 else "missed")],
        [f"peak RSS of the in-memory loader (`data.kind=text`), {d['corpus_gb']['small']} GB corpus",
         f"{n(rss['text_in_memory_small']['rss_mb'])} MB", "(grows with the corpus)"],
        ["loader alone, windows / packed, tokens/s", f"{n(d['loader_tokens_per_s']['windows'])} / "
         f"{n(d['loader_tokens_per_s']['packed'])} ({n(d['loader_over_step'])}x the {n(d['step_tokens_per_s'])} the "
         "step consumes, packed)", ">= 20x: " + ("met" if d["loader_over_step"] >= 20 else "missed")],
        ["shakespeare_char training loop, ms/step, fed from shards / from memory",
         f"{n(loop['shards'])} / {n(loop['memory'])} ({ratio:.3f}x)", "within 5%: " + ("met" if ratio <= 1.05 else
         "missed")],
    ]  # fmt: skip
    return table(["what", "figure", "target", "measured"], [[*r, machine_label(d["machine"])] for r in rows])


def prepare_memory() -> list[str]:
    """benchmarks/prepare_memory.py: the peak resident memory of `run.py prepare` on Parquet corpora of two sizes."""
    d = bench("prepare_memory")
    header = ["Parquet corpus (text / file)", "documents", "peak RSS, prepare and its workers", "main process",
              "seconds", "measured"]  # fmt: skip
    if d is None:
        return table(header, [])
    label = machine_label(d["machine"])
    files = lambda r: f"{r['files']} file{'s' * (r['files'] > 1)}"
    rows = [
        [f"{n(r['text_mb'] / 1e3, 2)} GB / {n(r['parquet_mb'] / 1e3, 2)} GB, {files(r)}", f"{r['documents']:,}",
         f"{n(r['peak_rss_mb'])} MB", f"{n(r['peak_rss_main_mb'])} MB", n(r["seconds"]), label]
        for r in d["runs"]
    ]  # fmt: skip
    met = "met" if abs(d["rss_gap_mb"]) <= d["target_mb"] else "missed"
    rows.append(["largest - smallest", "", f"{n(d['rss_gap_mb'])} MB (target: within {d['target_mb']} MB: {met})", "",
                 "", label])  # fmt: skip
    return table(header, rows)
