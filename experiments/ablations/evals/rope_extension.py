"""RoPE scaling as context extension without fine-tuning: models trained at context 256 (local_global.py's
all-global runs: the shakespeare_char baseline, RoPE, 500 steps) evaluated on the whole valid split at context 1,024
with rope_scaling none, linear (factor 4: positions divided by 4, Chen et al. 2023) and yarn (factor 4 over the
original 256: Peng et al. 2023, its attention factor 0.1 ln 4 + 1), the loss reported per bucket of 64 positions
(`run.py eval --by_position=64`), and once more at the trained context 256 unscaled as the reference.

    python experiments/ablations/evals/rope_extension.py runs/sweeps/local_global/attention_window-0_*

Each workdir is copied first (the eval at the trained context, a model unchanged, would otherwise overwrite the
eval_valid.json its sweep's report reads; the others write eval_valid_<digest>.json: txjax.cli.eval.model_changes);
writes results.csv (one row per workdir, scaling and bucket), results.md, results.png and results.json (the machine,
load and command of the first eval: txjax.ops.provenance) into --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # experiments/ablations/evals/: not a sweep file (test_sweep loads those)
sys.path.insert(0, str(REPO))

from txjax import config as config_lib  # noqa: E402
from txjax.cli.eval import model_changes  # noqa: E402
from txjax.evaluate.split import changed_name, metrics_file  # noqa: E402

SCALINGS = {  # name -> (context, the eval's model overrides)
    "trained context (256), none": (256, []),
    "none": (1024, []),
    "linear x4": (1024, ["--config.model.rope_scaling=linear", "--config.model.rope_factor=4"]),
    "yarn x4": (
        1024,
        [
            "--config.model.rope_scaling=yarn",
            "--config.model.rope_factor=4",
            "--config.model.rope_original_max_len=256",
        ],
    ),
}


def evaluate(workdir: Path, context: int, overrides: list[str], bucket: int, trained: int = 256) -> tuple[dict, dict]:
    """(the metrics of `run.py eval` at `context` with `overrides`, the machine its eval file records), for a run
    trained at context `trained`."""
    longer = [f"--config.data.seq_len={context}", f"--config.model.max_len={context}"] if context != trained else []
    command = [sys.executable, "run.py", "eval", f"--workdir={workdir}", f"--by_position={bucket}", *longer]
    done = subprocess.run([*command, *overrides], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    saved, changed = config_lib.load(workdir), config_lib.load(workdir)
    for flag in [*longer, *overrides]:
        config_lib.apply_override(changed, flag)
    written = metrics_file(workdir, changed_name("valid", model_changes(saved, changed)))
    return json.loads(done.stdout.strip().splitlines()[-1]), json.loads(written.read_text())["machine"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "experiments/ablations/results/rope_extension")
    parser.add_argument("--copies", type=Path, default=REPO / "runs/rope_extension")
    parser.add_argument("--bucket", type=int, default=64)
    args = parser.parse_args()
    rows, machines = [], []
    for workdir in args.workdirs:
        copy = args.copies / workdir.name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("tb", "eval_*.json", "*.lock"))
        for name, (context, overrides) in SCALINGS.items():
            m, machine = evaluate(copy, context, overrides, args.bucket)
            machines.append(machine)
            print(f"{workdir.name} {name}: loss {m['loss']:.4f}", flush=True)
            for start, loss, tokens in zip(*(m["by_position"][k] for k in ("from", "loss", "tokens"))):
                rows.append({"run": workdir.name, "scaling": name, "context": context, "overall_loss": m["loss"]})
                rows[-1] |= {"from": start, "loss": loss, "tokens": tokens, "step": m["step"]}
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = " ".join(["python", "experiments/ablations/evals/rope_extension.py", *map(str, args.workdirs)])
    loads = [m["load_average_1min"] for m in machines]
    report = {"machine": {**machines[0], "command": command}, "load_average_1min_range": [min(loads), max(loads)]}
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    curves = defaultdict(lambda: defaultdict(list))  # scaling -> bucket start -> losses over runs
    for r in rows:
        curves[r["scaling"]][r["from"]].append(r["loss"])
    write_markdown(args.out / "results.md", curves, rows, args.bucket, command)
    title = f"trained at 256, evaluated at 1,024 (mean of {len(args.workdirs)} runs)"
    plot(args.out / "results.png", curves, args.bucket, title)


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def write_markdown(path: Path, curves, rows, bucket: int, command: str) -> None:
    names = list(SCALINGS)
    overall = {name: sorted({(r["run"], r["overall_loss"]) for r in rows if r["scaling"] == name}) for name in names}
    lines = [
        "# RoPE scaling as context extension",
        "",
        f"Command: `{command}`; the valid split, mean ± sd over the {len({r['run'] for r in rows})} trained runs.",
        "",
        "| positions | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| all | " + " | ".join(mean_sd([loss for _, loss in overall[n]]) for n in names) + " |",
    ]
    for start in sorted(curves["none"]):
        cells = [mean_sd(curves[n][start]) if start in curves[n] else "" for n in names]
        lines.append(f"| {start}-{start + bucket - 1} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def plot(path: Path, curves, bucket: int, title: str, trained: int = 256, dots: bool = False) -> None:
    """Mean loss by position bucket per setting (curves: name -> bucket start -> losses over runs), a dotted line at
    the trained context; `dots`: each run's loss too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, by_start in curves.items():
        starts = sorted(by_start)
        centres = [s + bucket / 2 for s in starts]
        ax.plot(centres, [statistics.mean(by_start[s]) for s in starts], marker="o", ms=3, label=name)
        for s in starts if dots else ():
            ax.plot([s + bucket / 2] * len(by_start[s]), by_start[s], ".", color=ax.lines[-1].get_color(), alpha=0.4)
    ax.axvline(trained, color="grey", ls=":", lw=1)
    ax.set(xlabel=f"position in the window (buckets of {bucket})", ylabel="valid loss (nats/char)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
