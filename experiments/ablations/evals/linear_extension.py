"""Loss by position at 4x the training context: the linear_layers sweep's models (experiments/ablations/
linear_layers.py: all-softmax against 'LLLF', three Gated DeltaNet layers to one of full attention, trained at context
64) evaluated on the whole valid split at context 256, the loss per bucket of 32 positions (`run.py eval
--by_position=32 --config.data.seq_len=256 --config.model.max_len=256`, each eval written beside the run's own as
eval_valid_<digest>.json: the sweep's eval_valid.json is left as it was).

    python experiments/ablations/evals/linear_extension.py runs/sweeps/linear_layers

Writes results.csv (one row per run and bucket, with the run's parameters: `run.py inspect`'s count), results.png
(the loss by position, mean over seeds, one line per setting) and results.json (the machine, load and command of the
first eval: txjax.ops.provenance) into --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # rope_extension, the same eval at another context
import rope_extension  # noqa: E402
from rope_extension import REPO, evaluate  # noqa: E402

from txjax import config as config_lib  # noqa: E402
from txjax.ops.summary import summarize  # noqa: E402

TRAINED, CONTEXT = 64, 256


def layers_label(layer_types: str) -> str:
    """A setting's name in the table and the plot."""
    return f"{layer_types} (Gated DeltaNet 3:1)" if layer_types else "all softmax"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the linear_layers sweep's workdir")
    parser.add_argument("--out", type=Path, default=REPO / "experiments/ablations/results/linear_extension")
    parser.add_argument("--bucket", type=int, default=32)
    args = parser.parse_args()
    rows, machines = [], []
    for workdir in sorted(p for p in args.sweep.iterdir() if (p / "eval_valid.json").is_file()):
        config = config_lib.load(workdir)
        params = summarize(config_lib.model_config(config.model.to_dict())).total_params
        m, machine = evaluate(workdir, CONTEXT, [], args.bucket, trained=TRAINED)
        machines.append(machine)
        print(f"{workdir.name}: loss {m['loss']:.4f} at context {CONTEXT}", flush=True)
        for start, loss, tokens in zip(*(m["by_position"][k] for k in ("from", "loss", "tokens"))):
            rows.append({"run": workdir.name, "layers": layers_label(config.model.layer_types), "parameters": params})
            rows[-1] |= {"context": CONTEXT, "overall_loss": m["loss"], "from": start, "loss": loss, "tokens": tokens}
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = f"python experiments/ablations/evals/linear_extension.py {args.sweep}"
    loads = [m["load_average_1min"] for m in machines]
    report = {"machine": {**machines[0], "command": command}, "load_average_1min_range": [min(loads), max(loads)]}
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(args.out / "results.png", rows, args.bucket)


def plot(path: Path, rows: list[dict], bucket: int) -> None:
    curves = defaultdict(lambda: defaultdict(list))  # setting -> bucket start -> losses over seeds
    for r in rows:
        curves[r["layers"]][r["from"]].append(r["loss"])
    title = f"trained at context {TRAINED}, evaluated at {CONTEXT} (mean over seeds)"
    rope_extension.plot(path, curves, bucket, title, trained=TRAINED, dots=True)


if __name__ == "__main__":
    main()
