"""What the generated tables share (benchmarks/readme_tables.py): where result files are, how a figure and the
machine it was measured on are printed, a markdown table."""

from __future__ import annotations

import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "results"
RUNS = REPO / "experiments" / "results"


def n(x, digits: int = 3) -> str:
    """A figure as the pages print it: 3 significant digits, thousands separated, '' when missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def machine_label(machine: dict) -> str:
    """'AMD EPYC 9B45, 2 cores, 2026-12-01' (+ the load when other work shared the cores: timings noisy)."""
    cpu = machine.get("cpu_model") or "CPU model not recorded"
    label = f"{cpu}, {machine.get('cpu_cores', '?')} cores, {machine.get('date', '?')[:10]}"
    load = machine.get("load_average_1min") or 0.0
    return label + (f", load {load:.1f}" if load > 1.5 * machine.get("cpu_cores", 1) else "")


def bench(name: str) -> dict | None:
    path = BENCH / f"{name}_cpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def target_tokens_per_s(row: dict) -> float:
    """A train benchmark row's target tokens/s (files written before issue 16 named it tokens_per_s)."""
    return row["target_tokens_per_s"] if "target_tokens_per_s" in row else row["tokens_per_s"]


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
