"""The valid-loss curves of the kv_cache, linear_layers and mtp sweeps (experiments/ablations/*.py), one line per
setting (mean over seeds), named as docs/experiments.md names them: against the minutes trained (each eval's
train_minutes: the wall time of the program that trained the setting's seeds together, evals not counted) and
against the step (mtp's settings train fewer steps the deeper they are: equal compute).

    python experiments/ablations/evals/ablation_curves.py runs/sweeps/kv_cache runs/sweeps/linear_layers \
        runs/sweeps/mtp

Writes curves.png into each sweep's results folder (--out/<sweep name>/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # experiments/ablations/evals/: not a sweep file (test_sweep loads those)
sys.path.insert(0, str(REPO))

from txjax.ops.metrics_log import read_metrics  # noqa: E402

OUT = REPO / "experiments" / "ablations" / "results"


def setting_label(model: dict, swept: set[str]) -> str:
    """What a run of the three sweeps is, from its config's model section and the fields its sweep varies."""
    if "model.mtp_depth" in swept:
        return f"MTP depth {model['mtp_depth']}"
    if "model.layer_types" in swept:
        return f"{model['layer_types']} (Gated DeltaNet 3:1)" if model["layer_types"] else "all softmax"
    if model["attention"] == "mla":
        return f"MLA (latent {model['kv_lora_rank']} + RoPE key {model['qk_rope_head_dim']})"
    if model["num_kv_heads"] is not None:
        return f"GQA ({model['num_heads']} query heads, {model['num_kv_heads']} K/V)"
    return f"MHA ({model['num_heads']} heads of {model['d_head']})"


def curves(sweep_dir: Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{x: {setting: [(x value, valid loss)]}} for x in train_minutes and step, each eval step's mean over seeds."""
    evals = defaultdict(lambda: defaultdict(list))  # setting -> step -> [(train_minutes, loss)] over seeds
    swept = set(json.loads((sweep_dir / "sweep.json").read_text())["sweep"].get("zip", {}))
    for run in sorted(p for p in sweep_dir.iterdir() if (p / "config.json").is_file()):
        label = setting_label(json.loads((run / "config.json").read_text())["model"], swept)
        for record in read_metrics(run):
            if record["split"] == "valid":
                evals[label][record["step"]].append((record["train_minutes"], record["loss"]))
    means = {
        label: [(step, *map(statistics.mean, zip(*seeds))) for step, seeds in sorted(by_step.items())]
        for label, by_step in evals.items()
    }
    return {
        "train_minutes": {label: [(minutes, loss) for _, minutes, loss in points] for label, points in means.items()},
        "step": {label: [(step, loss) for step, _, loss in points] for label, points in means.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="the sweeps' workdirs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for sweep_dir in args.sweeps:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, (x, lines) in zip(axes, curves(sweep_dir).items()):
            for label, xy in lines.items():
                ax.plot(*zip(*xy), marker="o", ms=3, label=label)
            xlabel = "minutes trained (the seeds together)" if x == "train_minutes" else "step"
            ax.set(
                title=f"{sweep_dir.name}: valid loss against {xlabel}", xlabel=xlabel, ylabel="valid loss (nats/char)"
            )
            ax.set_ylim(top=2.6)  # the first evals (~2.9) would flatten the differences that matter
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        folder = args.out / sweep_dir.name
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / "curves.png", dpi=110)
        plt.close(fig)
        print(f"wrote {folder / 'curves.png'}")


if __name__ == "__main__":
    main()
