"""The generated tables of two ablations with their own shape (benchmarks/readme_tables.py): local against global
attention (docs/experiments.md) and RoPE scaling as context extension (docs/long_context.md), from their results
folders under experiments/ablations/results/."""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict

from table_format import REPO, machine_label, n, table

RESULTS = REPO / "experiments" / "ablations" / "results"


def mean_sd(values: list[float]) -> str:
    """A loss over runs: its mean ± sd, 3 decimals."""
    return f"{statistics.mean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def local_global() -> list[str]:
    """experiments/ablations/local_global.py's sweep: per setting, the valid loss (whole split) and the training
    rate in target tokens/s, mean ± sd over seeds."""
    folder = RESULTS / "local_global"
    runs = [r for r in csv.DictReader((folder / "results.csv").open()) if r["status"] == "done"]
    machine = machine_label(json.loads((folder / "results.json").read_text())["machine"])
    groups = defaultdict(list)
    for r in runs:
        groups[(int(r["attention_window"]), r["window_pattern"])].append(r)
    rows = []
    for (window, pattern), rs in sorted(groups.items()):
        layers = f"{pattern} (window {window})" if window else "all global"
        rate = n(statistics.mean(float(r["target_tokens_per_s"]) for r in rs))  # the seeds trained as one program
        rows.append([layers, len(rs), mean_sd([float(r["valid_loss"]) for r in rs]), rate, machine])
    return table(["layers", "seeds", "valid loss (mean ± sd)", "target tokens/s", "measured"], rows)


def rope_extension() -> list[str]:
    """experiments/ablations/evals/rope_extension.py: the valid loss of the models trained at context 256 evaluated at
    1,024 per RoPE scaling, over the whole window and per quarter of it, mean ± sd over the trained runs."""
    folder = RESULTS / "rope_extension"
    rows = list(csv.DictReader((folder / "results.csv").open()))
    report = json.loads((folder / "results.json").read_text())
    low, high = report["load_average_1min_range"]
    machine = f"{machine_label({**report['machine'], 'load_average_1min': 0})}, load {low:.0f}-{high:.0f}"
    out = []
    for scaling in dict.fromkeys(r["scaling"] for r in rows):
        mine = [r for r in rows if r["scaling"] == scaling]
        overall = {r["run"]: float(r["overall_loss"]) for r in mine}
        quarters = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # quarter -> run -> [loss sum, tokens]
        for r in mine:
            cell = quarters[int(r["from"]) // 256][r["run"]]
            cell[0] += float(r["loss"]) * int(r["tokens"])
            cell[1] += int(r["tokens"])
        cells = [mean_sd([s / t for s, t in quarters[q].values()]) if q in quarters else "" for q in range(4)]
        out.append([scaling, mine[0]["context"], len(overall), mean_sd(list(overall.values())), *cells, machine])
    header = ["RoPE scaling", "context", "runs", "valid loss", "positions 0-255", "256-511", "512-767", "768-1023"]
    return table([*header, "measured"], out)


def local_global_step() -> list[str]:
    """The train step of each local_global setting (`benchmarks/train.py`, written to the sweep's results folder as
    step_time_windowW.json): blockwise and reference attention interleaved in one process, median, min and CPU ms."""
    rows = []
    for path in sorted((RESULTS / "local_global").glob("step_time_window*.json"), key=lambda p: int(p.stem[16:])):
        report, window = json.loads(path.read_text()), int(path.stem[16:])
        by_impl = {r["attention"]: r for r in report["rows"]}
        b, ref = by_impl["blockwise"], by_impl["reference"]
        rows.append([f"LLLG (window {window})" if window else "all global", n(b["ms_per_step"]), n(b["min_ms"]),
                     n(b["cpu_ms"]), n(ref["cpu_ms"]), f"`{report['machine']['command']}`",
                     machine_label(report["machine"])])  # fmt: skip
    header = ["layers", "blockwise ms (median)", "blockwise ms (min)", "blockwise CPU ms", "reference CPU ms"]
    return table([*header, "command", "measured"], rows)


FAMILY_TASKS = {  # the comparison's sweeps (experiments/ablations/family_comparison*.py) and what each one scores
    "family_comparison": ("bible en-es", {"test_bleu": "test BLEU (beam 4)", "test_chrf": "test chrF"}),
    "family_comparison_add": ("add_seq2seq", {"test_generated_exact_match": "test exact match (greedy)"}),
}


def family_label(run: dict) -> str:
    """The comparison's name of a run's setting: the prefix LM read causally is the decoder-only LM."""
    if run["family"] == "prefix_lm":
        return "decoder-only LM" if run["prefix_attention"] == "causal" else "prefix LM"
    return "encoder-decoder"


def family_comparison() -> list[str]:
    """The three families at matched parameters and equal time, per task: steps, valid and test loss, the task's
    test metrics (mean ± sd over seeds); parameters from the sweep's step-time benchmark (benchmarks/family_step.py)."""
    rows = []
    for name, (task, metrics) in FAMILY_TASKS.items():
        folder = RESULTS / name
        if not (folder / "results.csv").is_file():
            continue
        runs = [r for r in csv.DictReader((folder / "results.csv").open()) if r["status"] == "done"]
        machine = machine_label(json.loads((folder / "results.json").read_text())["machine"])
        step_file = REPO / "benchmarks" / "results" / f"family_step_{name}_cpu.json"
        params = {r["setting"]: r["params"] for r in json.loads(step_file.read_text())["rows"]}  # by run name
        for label in ("encoder-decoder", "prefix LM", "decoder-only LM"):
            rs = [r for r in runs if family_label(r) == label]
            if rs:
                cells = [mean_sd([float(r[k]) for r in rs]) for k in ("valid_loss", "test_loss")]
                scores = "; ".join(f"{header} {mean_sd([float(r[k]) for r in rs])}" for k, header in metrics.items())
                named = f"family-{rs[0]['family']}_prefix_attention-{rs[0]['prefix_attention']}_"  # the name's start
                size = n(next(count for setting, count in params.items() if setting.startswith(named)))
                rows.append([task, label, size, rs[0]["steps"], len(rs), *cells, scores, machine])
    header = ["task", "family", "parameters", "steps (equal time)", "seeds", "valid loss", "test loss", "test scores"]
    return table([*header, "measured"], rows)
