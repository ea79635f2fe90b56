"""The family comparison's curves (experiments/ablations/family_comparison.py and family_comparison_add.py): valid
loss against the share of the equal-time budget, one panel per task, one line per family (mean over seeds).

    python experiments/ablations/evals/family_curves.py runs/sweeps/family_comparison runs/sweeps/family_add

The runs trained equal time as steps (each family the steps its step time fits in the budget), so a run's share of
the budget at step s is s / its steps: the x axis on which the families' curves compare at equal time (the wall
clock of a shared machine would not). Writes curves.png into each sweep's results folder (--out/<sweep name>/).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # experiments/ablations/evals/: not a sweep file (test_sweep loads those)
sys.path.insert(0, str(REPO))

from txjax.ops.metrics_log import read_metrics  # noqa: E402

OUT = REPO / "experiments" / "ablations" / "results"


def family_label(config: dict) -> str:
    """What a run of the comparison is: its family, the prefix LM read causally being the decoder-only LM."""
    if config["family"] == "prefix_lm":
        return "decoder-only LM" if config["model"]["prefix_attention"] == "causal" else "prefix LM"
    return config["family"].replace("_", "-")


def curves(sweep_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """{family: [(share of the budget, valid loss mean over seeds)]} of one sweep's runs."""
    points = defaultdict(lambda: defaultdict(list))
    for run in sorted(p for p in sweep_dir.iterdir() if (p / "config.json").is_file()):
        config = json.loads((run / "config.json").read_text())
        for record in read_metrics(run):
            if record["split"] == "valid":
                points[family_label(config)][record["step"] / config["train"]["steps"]].append(record["loss"])
    return {name: [(x, sum(v) / len(v)) for x, v in sorted(by_x.items())] for name, by_x in points.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="the sweeps' workdirs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.sweeps), figsize=(6 * len(args.sweeps), 4.2), squeeze=False)
    for ax, sweep_dir in zip(axes[0], args.sweeps):
        experiment = json.loads((sweep_dir / "sweep.json").read_text())["sweep"]["experiment"]
        for name, xy in curves(sweep_dir).items():
            ax.plot(*zip(*xy), marker="o", label=name)
        ax.set(title=Path(experiment).stem, xlabel="share of the equal-time budget", ylabel="valid loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    for sweep_dir in args.sweeps:
        folder = args.out / sweep_dir.name
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / "curves.png", dpi=110)
        print(f"wrote {folder / 'curves.png'}")


if __name__ == "__main__":
    main()
