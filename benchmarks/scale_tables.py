"""The scale table's generated tables (benchmarks/readme_tables.py renders them into docs/scaling.md): each cell
benchmarks/scale_table.py compiled (training steps, and decoding steps apart), and the estimator's trials and answer."""

from __future__ import annotations

import json
import re

from table_format import BENCH, machine_label, n, table

GiB = 2**30
# MaxText's published MFU for the same model and hardware (their measurements, not ours): README / benchmarks of
# github.com/AI-Hypercomputer/maxtext; Llama 2 70B's is on v5p-512, beside our v5p-128 row
MAXTEXT_MFU = {
    ("llama3_8b", "v6e-256"): "45.46% (Llama 3.1 8B, v6e-256)",
    ("llama3_70b", "v5p-128"): "65.4% (Llama 2 70B, v5p-512)",
    ("mixtral_8x7b", "v6e-256"): "35.23% (Mixtral 8x7B, v6e-256)",
}
SHORT = {
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "collective-permute": "CP",
}


def _cells(name: str) -> dict:
    path = BENCH / f"{name}_cpu.json"
    return json.loads(path.read_text())["cells"] if path.is_file() else {}


def _collectives(found: dict) -> str:
    """Bytes one chip's collectives move a step, by kind (GB), largest first."""
    kinds = sorted(((v["bytes"], k) for k, v in found.items() if k in SHORT), reverse=True)
    return ", ".join(f"{SHORT[k]} {n(b / 1e9)}" for b, k in kinds)


def _mesh(mesh: dict) -> str:
    return " x ".join(f"{axis} {size}" for axis, size in mesh.items() if size > 1)


DECODING = " --step=decode"  # the suffix of a decoding cell's name (benchmarks/scale_table.py)


def scale() -> list[str]:
    """Per model shape and TPU pod: what run.py compile reports (XLA's figures: estimates, not measurements)."""
    rows = []
    for name, cell in sorted((k, v) for k, v in _cells("scale_table").items() if not k.endswith(DECODING)):
        model, topology = name.split("@")
        r = cell["result"] or {}
        memory = r.get("hbm_per_chip_bytes") or {}
        fits = {True: "yes", False: "no"}.get(r.get("fits"), f"refused: {cell['error']}")
        fits += f" ({r['xla']})" if r.get("xla") else ""  # XLA refused it for the chip's HBM
        # XLA counts a loop's body once (scanned layers: one layer of the stack): its time is then a lower bound, and
        # the MFU it implies no figure at all
        seconds, mfu, once = (
            r.get("estimated_step_seconds"),
            r.get("estimated_mfu"),
            r.get("xla_counts_loop_bodies_once"),
        )
        seconds = (f">= {n(seconds)} (one layer)" if once else n(seconds)) if seconds else "none given"
        mfu = f"{mfu:.1%}" if mfu and not once else ""
        theirs = MAXTEXT_MFU.get((model, topology), "")
        rows.append([
            f"`{model}`", topology, _mesh(r.get("mesh", {})), n(r.get("tokens_per_step")), fits,
            f"{n(memory['total'] / GiB)} of {n(r['chip_hbm_bytes'] / GiB)}" if memory else "",
            _collectives(r.get("collectives", {})), seconds, mfu, theirs,
            f"{n(cell['wall_seconds'])} s, {n(cell['peak_rss_bytes'] / 1e9)} GB", machine_label(cell["machine"]),
        ])  # fmt: skip
    header = ["model", "pod", "mesh", "tokens a step", "fits", "HBM per chip (GiB)", "collectives a step (GB a chip)"]
    header += ["XLA's estimated step (s)", "estimated MFU", "MaxText's measured MFU", "compile (wall, RSS)", "measured"]
    return table(header, rows)


def scale_decode() -> list[str]:
    """Per model shape and TPU pod: one cached decoding step over the whole context's KV cache (run.py compile
    --step=decode; XLA's figures, its time and the tokens per second it implies estimates, not measurements)."""
    rows = []
    for name, cell in sorted((k, v) for k, v in _cells("scale_table").items() if k.endswith(DECODING)):
        model, topology = name.removesuffix(DECODING).split("@")
        r = cell["result"] or {}
        memory = r.get("hbm_per_chip_bytes") or {}
        fits = {True: "yes", False: "no"}.get(r.get("fits"), f"refused: {cell['error']}")
        fits += f" ({r['xla']})" if r.get("xla") else ""  # XLA refused it for the chip's HBM
        # one step's time: the loop XLA counts once is the decoding loop, one step a trip, and for_decoding unrolls
        # the layers (txjax/decode/cache.py)
        seconds, tokens = r.get("estimated_step_seconds"), r.get("tokens_per_second_estimate")
        context = re.search(r"--config\.model\.max_len=(\d+)", cell["command"])[1]
        rows.append([
            f"`{model}`", topology, _mesh(r.get("mesh", {})), n(r.get("tokens_per_step")), n(int(context)), fits,
            f"{n(memory['total'] / GiB)} of {n(r['chip_hbm_bytes'] / GiB)}" if memory else "",
            f"{r['kv_cache_bytes_per_chip']:,}" if "kv_cache_bytes_per_chip" in r else "",  # the formula's bytes
            n(seconds) if seconds else "none given", n(tokens) if tokens else "",
            f"{n(cell['wall_seconds'])} s, {n(cell['peak_rss_bytes'] / 1e9)} GB", machine_label(cell["machine"]),
        ])  # fmt: skip
    header = ["model", "pod", "mesh", "rows", "context", "fits", "HBM per chip (GiB)", "KV cache per chip (bytes)"]
    header += ["XLA's estimated step (s)", "estimated tokens/s", "compile (wall, RSS)", "measured"]
    return table(header, rows)


def scale_search() -> list[str]:
    """The estimator's trials (run.py compile --search) and its answer, per search benchmarks/scale_table.py ran."""
    rows = []
    for name, cell in _cells("scale_search").items():
        for t in [*cell["trials"], {"answer": True, **(cell["result"] or {})}]:
            tried = "answer: " if t.get("answer") else ""
            tried += f"batch {t['batch_size']}" if "batch_size" in t else f"remat {t.get('remat')}"
            hbm = t.get("hbm_per_chip_bytes")
            hbm = hbm["total"] if isinstance(hbm, dict) else hbm
            rows.append([f"`{name}`", tried, {True: "yes", False: "no"}[t["fits"]], n(hbm / GiB) if hbm else "",
                         t.get("xla", ""), machine_label(cell["machine"])])  # fmt: skip
    return table(["search", "trial", "fits", "HBM per chip (GiB)", "XLA's refusal", "measured"], rows)
