"""The summary of one benchmarks/gpu.sh run: its result folder's JSON files as a few lines and DIR/summary.json.

    python benchmarks/gpu_summary.py DIR

- stages: each stage's exit status and seconds (DIR/stages.tsv; 124 = it ran out of time);
- peak: TFLOP/s of bfloat16, float32 and TF32 products (the MFU denominator is the bfloat16 one);
- train: per file and variant ms/step, tokens/s, MFU and the first step's seconds (compile, or a persistent-cache
  load in train_loop_cached.json), with the XLA_FLAGS of the process;
- decode: txjax's tokens/s against transformers eager and static-cache, and the ratios;
- moe: the dense and MoE train steps' ms/step and the MoE / dense ratio (moe_step.json).
Reads only JSON (no jax), so it runs anywhere. Ends with one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def stages(folder: Path) -> list[dict]:
    path = folder / "stages.tsv"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [dict(zip(("stage", "rc", "seconds"), line.split("\t"))) for line in lines if line.strip()]


def train_rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("train_*.json")):
        result = json.loads(path.read_text())
        for row in result["rows"]:
            rows.append(
                {
                    "file": path.stem,
                    "shape": result["shape"],
                    "batch": result["config"]["train"]["batch_size"],
                    "dtype": row["dtype"],
                    "attention": f"{row['attention']} ({row.get('runs', row['attention'])})",
                    "layers": row["layers"],
                    "ms_per_step": row["ms_per_step"],
                    "tokens_per_s": row["target_tokens_per_s"],
                    "mfu": row["mfu"],
                    "first_step_s": row.get("first_step_s"),
                    "xla_flags": result["machine"].get("xla_flags", ""),
                }
            )
    return rows


def summary(folder: Path) -> dict:
    """{'machine', 'stages', 'peak_tflops', 'train', 'decode', 'moe'} of the files gpu.sh wrote into `folder`."""
    out: dict = {"stages": stages(folder)}
    peak_path = folder / "peak.json"
    if peak_path.is_file():
        peak = json.loads(peak_path.read_text())
        out["machine"] = peak["machine"]
        best = {}
        for row in peak["rows"]:
            best[row["variant"]] = max(best.get(row["variant"], 0.0), row["gflops_median"] / 1e3)
        out["peak_tflops"] = best
    out["train"] = train_rows(folder)
    decode_path = folder / "decode.json"
    out["decode"] = json.loads(decode_path.read_text())["rows"] if decode_path.is_file() else []
    moe_path = folder / "moe_step.json"
    moe_rows = json.loads(moe_path.read_text())["rows"] if moe_path.is_file() else []
    out["moe"] = [{k: row[k] for k in ("variant", "ms_per_step", "overhead", "first_step_s")} for row in moe_rows]
    return out


def table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    fmt = lambda v: f"{v:,.3g}" if isinstance(v, float) else ("" if v is None else str(v))
    cells = [[fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [columns, *cells])


def main():
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/gpu_summary.py DIR (a folder benchmarks/gpu.sh wrote)")
    folder = Path(sys.argv[1])
    result = summary(folder)
    machine = result.get("machine", {})
    print(f"device: {machine.get('device_kind')} ({machine.get('driver', '')}), jax {machine.get('jax')}")
    print("stages:\n" + table(result["stages"]))
    print(f"peak TFLOP/s: {json.dumps(result.get('peak_tflops'))}")
    print("train:\n" + table(result["train"]))
    print("decode:\n" + table(result["decode"]))
    print("moe:\n" + table(result["moe"]))
    (folder / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"stages": {s["stage"]: s["rc"] for s in result["stages"]}, "peak": result.get("peak_tflops")}))


if __name__ == "__main__":
    main()
