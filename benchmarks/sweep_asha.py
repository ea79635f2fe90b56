"""ASHA against the full grid on the learning-rate sweep, and a 2-worker Ray sweep against the in-process one.

    python benchmarks/sweep_asha.py [--steps=120] [--eval_every=20] [--workdir=/tmp/sweep_asha]

The sweep: experiments/ablations/mup_transfer.py's learning-rate axis (6 peak learning rates, 5e-4 to 1.6e-2) at
one width and parametrization (standard, d_model 64), one seed, `steps` steps with an eval every `eval_every`.
Four sweeps of it, each in its own folder:
    grid         in-process, the 6 runs vmapped in one program (run.py sweep's default)
    grid_alone   in-process, one run after another (--no-vmap)
    grid_ray     on Ray Tune, the local cluster run_on_ray starts (one CPU per trial), one trial per run, 2 at a time
    asha         on Ray Tune as grid_ray, with ASHAScheduler (grace eval_every steps, reduction factor 3)
Reported: the best learning rate of each (lowest final valid loss among the runs that finished), the optimizer
steps each trained in all (a stopped run counts the step it reached), and each one's wall time (Ray's includes
starting the cluster and a process per trial). Writes results/sweep_asha_cpu.json (--sweeps=asha: measures that
one again and keeps the file's others); ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import common

from experiments.ablations import mup_transfer
from txjax.sweep.local import run_sweep
from txjax.sweep.ray_launcher import run_on_ray
from txjax.sweep.report import run_row

RESULT = common.RESULTS / "sweep_asha_cpu.json"
RATES = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]


def lr_sweep(steps: int, eval_every: int, asha: bool) -> dict:
    """mup_transfer's sweep at d_model 64, standard parametrization only, one seed; evals every `eval_every`."""
    sweep = mup_transfer.sweep([64], RATES, steps=steps, base_width=128, seeds=(0,))
    sweep["zip"] = {field: values[:1] for field, values in sweep["zip"].items()}  # (standard, 64)
    sweep["fixed"] |= {"train.eval_every": eval_every, "train.checkpoint_every": eval_every}
    scheduler = {"kind": "asha", "metric": "valid_loss", "grace_steps": eval_every, "reduction_factor": 3}
    defaults = {"search": None, "scheduler": scheduler if asha else None, "metrics": ["valid_loss"], "probes": []}
    return {**defaults, "lines": None, **sweep}


def summary(name: str, runs, wall_s: float) -> dict:
    rows = [run_row(r) for r in runs]
    done = [row for row in rows if row["status"] == "done"]
    best = min(done, key=lambda row: row["valid_loss"])
    return {
        "sweep": name,
        "best_learning_rate": best["learning_rate"],
        "best_valid_loss": best["valid_loss"],
        "total_steps": sum(row["steps"] for row in rows),
        "stopped": sum(row["status"] == "stopped" for row in rows),
        "wall_s": wall_s,
        "runs": {
            row["run"]: {"status": row["status"], "steps": row["steps"], "valid_loss": row["valid_loss"]}
            for row in rows
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--eval_every", type=int, default=20)
    parser.add_argument("--workdir", default="/tmp/sweep_asha")
    parser.add_argument("--sweeps", default="grid,grid_alone,grid_ray,asha", help="these again, the file's others kept")
    args = parser.parse_args()
    common.warn_if_loaded()
    root = Path(args.workdir)
    kept = json.loads(RESULT.read_text())["sweeps"] if RESULT.is_file() else []
    results = [r for r in kept if r["sweep"] not in args.sweeps.split(",")]
    for name in args.sweeps.split(","):
        shutil.rmtree(root / name, ignore_errors=True)
        sweep = lr_sweep(args.steps, args.eval_every, asha=name == "asha")
        began = time.monotonic()
        if name.startswith("grid") and not name.endswith("ray"):
            runs = run_sweep(sweep, root / name, [], vmap=name == "grid")
        else:
            runs = run_on_ray(sweep, root / name, [], vmap=False, max_concurrent=2)
        results.append(summary(name, runs, time.monotonic() - began))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "runs"}), flush=True)
    results.sort(key=lambda r: ["grid", "grid_alone", "grid_ray", "asha"].index(r["sweep"]))
    print(common.table([{k: v for k, v in r.items() if k != "runs"} for r in results]))
    payload = {"steps": args.steps, "eval_every": args.eval_every, "learning_rates": RATES, "sweeps": results}
    path = common.save("sweep_asha", payload)
    print(json.dumps({"result": str(path), **{r["sweep"]: r["best_learning_rate"] for r in results}}))


if __name__ == "__main__":
    main()
