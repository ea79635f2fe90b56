"""A sweep's report, built from its run folders alone: results.csv, results.md, results.png and results.json (the
per-setting summary with the machine, date, command and commit: txjax.ops.provenance).

Per run: its settings, status (done | failed | stopped | unfinished | pending), steps (a stopped run's: the step
the scheduler stopped it at), final train loss (last logged interval), final valid metrics (eval_valid.json: the
whole valid split; a stopped run's: its last eval's), the probes' metrics, wall time of the
program that trained it, its training target_tokens_per_s (median over the logged intervals after the first, which
includes compilation; runs trained together share the program's time, so each one's rate is its share) and how many runs
that program trained. Per setting: mean and sample standard deviation over the seeds that finished. With a sweep's
`lines` spec also a line plot of a metric against one swept field per value of another (results_lines.png) and
the best value of that field per line in results.md. A setting a search drew more than once is one run, with a
`draws` column and a line in results.md saying so.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from txjax.ops import provenance, storage
from txjax.ops.metrics_log import read_metrics

RESULTS_CSV, RESULTS_MD, RESULTS_PNG, RESULTS_JSON = "results.csv", "results.md", "results.png", "results.json"
RESULTS_LINES_PNG = "results_lines.png"  # with a sweep's `lines` spec
REPORT_FILES = (RESULTS_CSV, RESULTS_MD, RESULTS_PNG, RESULTS_JSON, RESULTS_LINES_PNG)
GENERATION_METRICS = ("bleu", "chrf", "generated_exact_match")  # in eval_valid.json when train.eval_generation


def run_row(run) -> dict:
    """One run's line of the table (see the module docstring)."""
    result, records = run.result, read_metrics(run.workdir)
    status = result.get("status") or ("unfinished" if records else "pending")
    train = [r for r in records if r["split"] == "train"]
    valid_file = run.workdir / "eval_valid.json"
    valid = json.loads(valid_file.read_text()) if valid_file.is_file() and status == "done" else {}
    if status == "stopped":  # early, by a scheduler: its last eval
        valid = next((r for r in reversed(records) if r["split"] == "valid"), {}) | {"step": result["step"]}
    speeds = [r.get("target_tokens_per_s", math.nan) for r in train[1:]]
    probes = {k: v for k, v in result.items() if k not in ("status", "error", "wall_s", "runs_vmapped", "step")}
    return {
        "run": run.name,
        **{k.rpartition(".")[2]: v for k, v in run.settings.items()},
        "status": status,
        "steps": valid.get("step", train[-1]["step"] if train else 0),
        "train_loss": train[-1]["loss"] if train else math.nan,
        "valid_loss": valid.get("loss", math.nan),
        "valid_accuracy": valid.get("token_accuracy", math.nan),
        **{f"valid_{k}": valid[k] for k in GENERATION_METRICS if k in valid},
        **probes,
        "wall_s": result.get("wall_s", math.nan),
        "target_tokens_per_s": float(np.median(speeds)) if speeds else math.nan,
        "runs_vmapped": result.get("runs_vmapped", 0),
        "error": result.get("error", ""),
        "cpu_model": valid.get("machine", {}).get("cpu_model", ""),  # the machine of the final eval
        **({"draws": run.draws} if getattr(run, "draws", 1) > 1 else {}),  # a search drew the setting again
    }


def final_metric(runs, metric: str) -> float:
    """The mean of `metric` (a column of run_row) over the runs that are done; NaN when none is."""
    values = [row[metric] for row in map(run_row, runs) if row["status"] == "done"]
    return float(np.mean(values)) if values else math.nan


def per_setting(runs, rows: list[dict], metrics: list[str]) -> list[dict]:
    """Per setting (runs with equal labels, i.e. equal but for the seed): n done, mean and sd of each metric."""
    by_label: dict[str, list[dict]] = {}
    for run, row in zip(runs, rows):
        by_label.setdefault(run.label, []).append(row)
    summary = []
    for label, group in by_label.items():
        done = [r for r in group if r["status"] == "done"]
        entry = {"setting": label, "n": len(done), "runs": len(group)}
        for m in metrics:
            values = np.array([r.get(m, math.nan) for r in done], float)
            values = values[np.isfinite(values)]
            entry[m] = float(values.mean()) if len(values) else math.nan
            entry[f"{m}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        summary.append(entry)
    return summary


def write_report(workdir: Path, runs, metrics: list[str], command: str = "", spec: dict | None = None) -> None:
    """Writes results.csv, results.md, results.png and results.json into the sweep folder (and results_lines.png for
    a sweep's `lines` spec), each whole or not at all (txjax.ops.storage.replace_file); a full or read-only disk is
    a StorageError naming the file (the runs' own folders are untouched: the same command writes the report again)."""
    advice = "free space or make it writable, then run the same command again (finished runs are kept)"
    with storage.writing("the sweep's report", advice):
        _write_report(workdir, runs, metrics, command, spec)


def _write_report(workdir: Path, runs, metrics: list[str], command: str, spec: dict | None) -> None:
    rows = [run_row(r) for r in runs]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    storage.replace_file(workdir / RESULTS_CSV, table.getvalue())
    shown = list(dict.fromkeys(["valid_loss", *metrics]))
    summary = per_setting(runs, rows, shown)
    machine = provenance.machine(command)
    report = {"machine": machine, "metrics": shown, "per_setting": [_no_nan(entry) for entry in summary]}
    storage.replace_file(workdir / RESULTS_JSON, json.dumps(report, indent=1) + "\n")
    found = lines_of(runs, rows, spec, metrics[0]) if spec else {}  # the lines spec's points, once for table and plot
    lines = [
        f"# Sweep {workdir.name}",
        "",
        f"Command: `{command}`" if command else "",
        "",
        f"Report written {machine['date']} on {machine['cpu_model']} ({machine['cpu_cores']} cores), commit "
        f"{machine['commit']}; runs by CPU: {_machines(rows)}.",
        "",
        "## Per setting: mean ± sd over seeds",
        "",
        _md_table(
            ["setting", "n", *shown],
            [[s["setting"], f"{s['n']}/{s['runs']}", *(_pm(s[m], s[f"{m}_sd"]) for m in shown)] for s in summary],
        ),
        "",
        *(_best_table(found, spec, metrics[0]) if spec else []),
        *_stopped(rows),
        *_repeats(rows),
        "## Runs",
        "",
        _md_table(columns, [[_cell(row.get(c, "")) for c in columns] for row in rows]),
        "",
    ]
    storage.replace_file(workdir / RESULTS_MD, "\n".join(lines))
    plot(workdir, runs, rows, summary, metrics)
    if spec:
        plot_lines(workdir, found, spec, metrics[0])


def _stopped(rows: list[dict]) -> list[str]:
    """results.md's line on the runs a scheduler stopped early (none: no line)."""
    stopped = [f"{row['run']} at step {row['steps']}" for row in rows if row["status"] == "stopped"]
    return [f"Stopped early by the scheduler ({len(stopped)}): {'; '.join(stopped)}.", ""] if stopped else []


def _repeats(rows: list[dict]) -> list[str]:
    """results.md's line on the settings a search drew more than once (none: no line)."""
    drawn = [f"{row['run']} {row['draws']} times" for row in rows if row.get("draws", 1) > 1]
    return [f"Drawn again by the search, trained once ({len(drawn)}): {'; '.join(drawn)}.", ""] if drawn else []


def _machines(rows: list[dict]) -> str:
    counts = collections.Counter(row["cpu_model"] or "not recorded" for row in rows if row["status"] == "done")
    return ", ".join(f"{n} on {cpu}" for cpu, n in counts.items()) or "none done"


def _no_nan(entry: dict) -> dict:
    """NaN (no value, or one seed's sd) as null: results.json stays standard JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in entry.items()}


def _md_table(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in body])


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _pm(mean: float, sd: float) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.4f}" + ("" if math.isnan(sd) else f" ± {sd:.4f}")


def _zero(sd: float) -> float:
    return 0.0 if math.isnan(sd) else sd


def plot(workdir: Path, runs, rows: list[dict], summary: list[dict], metrics: list[str]) -> Path:
    """Left: the valid loss of every run against step, then against the minutes it had trained (each eval's
    train_minutes: the wall time of the program that trained it, shared by the runs vmapped together, evals and saves
    not counted), one colour per setting; then one bar chart per metric: mean per setting, error bar = sd over
    seeds, dots = the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [s["setting"] for s in summary]
    colours = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, 2 + len(metrics), figsize=(10 + 4 * len(metrics), 4.5), dpi=110, squeeze=False)
    for curves, key, xlabel in ((axes[0, 0], "step", "step"), (axes[0, 1], "train_minutes", "minutes trained")):
        labelled = set()
        for run in runs:
            points = [(r[key], r["loss"]) for r in read_metrics(run.workdir) if r["split"] == "valid" and key in r]
            if points:  # a setting's first curve carries its label
                label = None if run.label in labelled else run.label
                labelled.add(run.label)
                curves.plot(*zip(*points), color=colours[run.label], alpha=0.8, marker="o", markersize=2, label=label)
        curves.set(xlabel=xlabel, ylabel="valid loss (nats/token)", title=f"eval curves against {xlabel}")
        curves.grid(alpha=0.3)
        if labelled:  # runs without evals draw no curves
            curves.legend(fontsize=7)
    x = np.arange(len(labels))
    for ax, metric in zip(axes[0, 2:], metrics):
        ax.bar(
            x,
            [s[metric] for s in summary],
            yerr=[_zero(s[f"{metric}_sd"]) for s in summary],
            color=[colours[label] for label in labels],
            alpha=0.6,
            capsize=4,
        )
        for i, label in enumerate(labels):
            seeds = [
                row.get(metric, math.nan)
                for run, row in zip(runs, rows)
                if run.label == label and row["status"] == "done"
            ]
            ax.plot([i] * len(seeds), seeds, "k.", markersize=4)
        ends = [s[metric] + sign * _zero(s[f"{metric}_sd"]) for s in summary for sign in (-1, 1)]
        ends = [v for v in ends if np.isfinite(v)]
        if ends:  # the bars' range, not from 0: the differences between settings are what the chart is for
            pad = 0.2 * (max(ends) - min(ends)) or 0.05 * abs(max(ends)) or 1.0
            ax.set_ylim(min(ends) - pad, max(ends) + pad)
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.set(title=metric)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = workdir / RESULTS_PNG
    save_figure(fig, path)
    return path


def save_figure(fig, path: Path) -> None:
    """The figure as PNG at `path`, whole or not at all; closed."""
    import matplotlib.pyplot as plt

    image = io.BytesIO()
    fig.savefig(image, format="png")
    plt.close(fig)
    storage.replace_file(path, image.getvalue())


def lines_of(runs, rows: list[dict], spec: dict, metric: str) -> dict:
    """{panel value: {series value: {x: [the metric of each finished seed]}}} (panel None without spec["panels"])."""
    out: dict = {}
    for run, row in zip(runs, rows):
        value = row.get(metric, math.nan)
        if row["status"] == "done" and np.isfinite(value):
            panel = out.setdefault(run.settings.get(spec.get("panels")), {})
            panel.setdefault(run.settings[spec["series"]], {}).setdefault(run.settings[spec["x"]], []).append(value)
    return out


def _best_table(found: dict, spec: dict, metric: str) -> list[str]:
    """results.md's section: per line of `found` (lines_of), the x whose mean metric is lowest, and that mean."""
    body = [
        [panel, series, fmt(best), _pm(float(np.mean(points[best])), math.nan)]
        for panel, lines in found.items()
        for series, points in lines.items()
        for best in [min(points, key=lambda x: np.mean(points[x]))]
    ]
    names = [short(spec.get("panels") or "-"), short(spec["series"]), f"best {short(spec['x'])}", metric]
    return [f"## Best {short(spec['x'])} per {short(spec['series'])}", "", _md_table(names, body), ""]


def plot_lines(workdir: Path, found: dict, spec: dict, metric: str) -> Path:
    """One panel per spec["panels"] value: the metric's mean over seeds against spec["x"] (log scale), one line per
    spec["series"] value, the seeds as dots, a star at each line's minimum (does the best x move along the series?).
    The y range stops at 1.5x the lowest mean, so that diverging settings do not flatten the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(found), 1)
    fig, axes = plt.subplots(1, n, figsize=(1 + 5 * n, 4.5), dpi=110, squeeze=False, sharey=True)
    lowest = min((np.mean(v) for lines in found.values() for pts in lines.values() for v in pts.values()), default=1)
    for ax, (panel, lines) in zip(axes[0], found.items()):
        for i, (series, points) in enumerate(lines.items()):
            colour = plt.cm.viridis(i / max(len(lines) - 1, 1))
            xs = sorted(points)
            means = [float(np.mean(points[x])) for x in xs]
            ax.plot(xs, means, "-o", color=colour, markersize=3, label=f"{short(spec['series'])}={fmt(series)}")
            for x in xs:
                ax.plot([x] * len(points[x]), points[x], ".", color=colour, alpha=0.4)
            ax.plot(xs[int(np.argmin(means))], min(means), "*", color=colour, markersize=12)
        ax.set_xscale("log")
        ax.set_ylim(top=1.5 * lowest if lowest > 0 else None)
        title = f"{short(spec['panels'])}={fmt(panel)}" if spec.get("panels") else ""
        ax.set(xlabel=short(spec["x"]), ylabel=metric, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = workdir / RESULTS_LINES_PNG
    save_figure(fig, path)
    return path


def short(field_name: str) -> str:
    return field_name.rpartition(".")[2]


def fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
