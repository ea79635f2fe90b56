"""Tests of sweeps: failures are recorded and the sweep goes on, a re-run skips finished runs and resumes the others,
vmapped runs equal the same runs trained one by one (tiny models, a few steps each)."""

import csv
import json
import socket
import types
from pathlib import Path

import jax
import numpy as np
import pytest

import txjax.sweep.local
from experiments.ablations import baseline
from txjax import config as config_lib
from txjax.experiment import load_workdir
from txjax.ops.metrics_log import MetricsLog, read_metrics
from txjax.sweep.local import run_sweep
from txjax.sweep.report import write_report
from txjax.sweep.spec import SweepRun, deduplicate, expand, load_sweep
from txjax.training.loop import train

REPO = Path(__file__).parents[1]

TINY = {
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.d_model": 16,
    "model.d_ff": 32,
    "data.max_digits": 3,
    "data.eval_size": 8,
    "train.steps": 4,
    "train.batch_size": 4,
    "train.warmup_steps": 2,
    "train.log_every": 2,
    "train.eval_every": 2,
    "train.eval_batches": 1,
    "train.checkpoint_every": 2,
}


def sweep_file(tmp_path, **spec):
    path = tmp_path / "sweep.py"
    spec = {"experiment": "experiments/reverse.py", "fixed": TINY, **spec}
    path.write_text(f'inf = float("inf")\n\n\ndef get_sweep():\n    return {spec!r}\n')
    return load_sweep(path)


def results(workdir):
    """{run name: its result.json}"""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(workdir.glob("*/result.json"))}


def params_of(workdir):
    return jax.device_get(load_workdir(workdir).params)


def test_grid_zip_and_seeds_expand_to_named_runs(tmp_path):
    sweep = sweep_file(
        tmp_path,
        grid={"model.positional": ["rope", "alibi"]},
        zip={"model.activation": ["relu", "swiglu"], "model.d_ff": [32, 21]},
        seeds=[0, 1],
    )
    runs = expand(sweep, [], tmp_path)
    assert len(runs) == 8 and runs[0].name == "positional-rope_activation-relu_d_ff-32_seed-0"
    assert runs[-1].config.model.d_ff == 21 and runs[-1].config.train.seed == 1
    assert runs[0].label == "positional=rope, activation=relu, d_ff=32"
    with pytest.raises(config_lib.ConfigError, match="the sweep varies this field"):
        expand(sweep, ["--config.model.positional=none"], tmp_path)


def test_failed_runs_are_recorded_and_a_rerun_skips_finished_runs(tmp_path, monkeypatch):
    # a bad setting (3 heads do not divide d_model 16) and a non-finite loss (lr = inf) fail; the rest trains
    sweep = sweep_file(tmp_path, grid={"model.num_heads": [2, 3], "train.learning_rate": [1e-3, float("inf")]})
    workdir = tmp_path / "out"
    run_sweep(sweep, workdir, [], vmap=False)
    status = {name: r["status"] for name, r in results(workdir).items()}
    assert status == {
        "num_heads-2_learning_rate-0.001_seed-0": "done",
        "num_heads-2_learning_rate-inf_seed-0": "failed",
        "num_heads-3_learning_rate-0.001_seed-0": "failed",
        "num_heads-3_learning_rate-inf_seed-0": "failed",
    }
    assert "Diverged" in results(workdir)["num_heads-2_learning_rate-inf_seed-0"]["error"]
    assert "divisible" in results(workdir)["num_heads-3_learning_rate-inf_seed-0"]["error"]
    table = (workdir / "results.csv").read_text()
    assert table.count("\n") == 5 and (workdir / "results.md").is_file() and (workdir / "results.png").is_file()

    trained = []

    def record_training(configs, workdirs):
        trained.extend(Path(w).name for w in workdirs)
        return [RuntimeError("trained again")] * len(workdirs)

    monkeypatch.setattr(txjax.sweep.local, "train_runs", record_training)
    before = results(workdir)
    run_sweep(sweep, workdir, [], vmap=False)  # the failed run that trains (lr inf) trains again, the done one not
    assert trained == ["num_heads-2_learning_rate-inf_seed-0"]
    after = results(workdir)
    assert after.pop("num_heads-2_learning_rate-inf_seed-0")["error"] == "RuntimeError: trained again"
    assert {k: v for k, v in before.items() if k != "num_heads-2_learning_rate-inf_seed-0"} == after
    with pytest.raises(config_lib.ConfigError, match="different sweep"):
        run_sweep(sweep, workdir, ["--config.train.steps=6"], vmap=False)


def test_a_search_drawing_a_setting_twice_trains_it_once_and_says_so(tmp_path, capsys):
    pytest.importorskip("ray.tune")
    sweep = sweep_file(
        tmp_path,
        search={"kind": "random", "num_samples": 3, "seed": 0, "space": {"model.positional": ("choice", ["rope"])}},
        seeds=[0, 1],
    )
    runs = expand(sweep, [], tmp_path)
    assert [(r.name, r.draws) for r in runs] == [("positional-rope_seed-0", 3), ("positional-rope_seed-1", 3)]
    assert "drew positional-rope_seed-0 again" in capsys.readouterr().out
    # different values that fmt shows alike are named apart, by their values: the same two names in either order
    a, b = ({"train.learning_rate": lr, "train.seed": 0} for lr in (1e-3, 1e-3 + 1e-12))
    runs = [SweepRun("learning_rate-0.001_seed-0", s, tmp_path / "learning_rate-0.001_seed-0") for s in (a, b)]
    named = deduplicate(runs)
    assert len({r.name for r in named}) == 2 and len({r.workdir for r in named}) == 2
    assert named[1].name.startswith("learning_rate-0.001_seed-0_") and named[1].workdir.name == named[1].name
    named[0].draws, named[0].result = 2, {"status": "done"}
    write_report(tmp_path, named, ["valid_loss"])
    assert "Drawn again by the search, trained once (1): learning_rate-0.001_seed-0 2 times." in (
        (tmp_path / "results.md").read_text()
    )
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [row["draws"] for row in rows] == ["2", ""]


def test_a_sweep_with_a_failed_run_exits_non_zero(tmp_path, capsys):
    from txjax.cli import sweep as sweep_cli

    sweep_file(tmp_path, grid={"model.num_heads": [3]})  # 3 heads do not divide d_model 16: fails before training
    with pytest.raises(SystemExit) as e:
        sweep_cli.main([f"--sweep={tmp_path / 'sweep.py'}", f"--workdir={tmp_path / 'out'}"])
    assert e.value.code == 1
    assert "error: 1 of 1 runs failed" in capsys.readouterr().err


def test_vmapped_runs_resume_after_ctrl_c_and_equal_sequential_runs(tmp_path, monkeypatch):
    sweep = sweep_file(tmp_path, zip={"train.learning_rate": [1e-3, 3e-3], "train.warmup_steps": [2, 0]}, seeds=[0, 1])
    workdir = tmp_path / "out"
    log_train = MetricsLog.train

    def interrupt_at_step_4(self, step, *args):
        if step == 4:
            raise KeyboardInterrupt
        return log_train(self, step, *args)

    monkeypatch.setattr(MetricsLog, "train", interrupt_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, workdir, [])
    assert not list(workdir.glob("*/result.json"))  # nothing counts as finished; step 2 is saved
    monkeypatch.setattr(MetricsLog, "train", log_train)
    runs = run_sweep(sweep, workdir, [])
    assert [r.result["status"] for r in runs] == ["done"] * 4 and runs[0].result["runs_vmapped"] == 4
    run = runs[3]  # lr 3e-3 with no warmup, seed 1: trained alone, it takes the same steps
    alone = tmp_path / "alone"
    train(expand(sweep, [], tmp_path)[3].config, alone)
    for a, b in zip(jax.tree_util.tree_leaves(params_of(run.workdir)), jax.tree_util.tree_leaves(params_of(alone))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    together, one = read_metrics(run.workdir), read_metrics(alone)
    assert [(r["split"], r["step"]) for r in together] == [(r["split"], r["step"]) for r in one]
    for key in ("loss", "learning_rate"):
        np.testing.assert_allclose([r.get(key, 0) for r in together], [r.get(key, 0) for r in one], rtol=1e-5)
    # one loop: a stacked run logs what a single run logs (mfu and train_minutes included)
    assert [sorted(r) for r in together] == [sorted(r) for r in one]
    assert all("mfu" in r for r in together if r["split"] == "train")
    assert all("train_minutes" in r for r in together if r["split"] == "valid")


def test_report_shows_the_final_evals_generation_metrics(tmp_path):
    """A translation sweep's table and summary carry the final eval's BLEU (eval_valid.json), per run and per
    setting; runs without it leave the cell empty."""
    runs = []
    for name, bleu in (("a", 10.0), ("b", 14.0), ("c", None)):
        run = SweepRun(name, {"model.dropout": 0.1 if name == "c" else 0.0, "train.seed": ord(name)}, tmp_path / name)
        run.workdir.mkdir()
        run.result = {"status": "done", "wall_s": 1.0}
        (run.workdir / "eval_valid.json").write_text(json.dumps({"loss": 3.0, **({"bleu": bleu} if bleu else {})}))
        runs.append(run)
    write_report(tmp_path, runs, ["valid_bleu"])
    rows = {row["run"]: row for row in csv.DictReader((tmp_path / "results.csv").open())}
    assert [rows[n]["valid_bleu"] for n in "abc"] == ["10.0", "14.0", ""]
    assert "| dropout=0 | 2/2 | 3.0000 ± 0.0000 | 12.0000 ± 2.8284 |" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("path", sorted((REPO / "experiments" / "ablations").glob("*.py")), ids=lambda p: p.stem)
def test_every_ablation_states_its_baseline_and_expands(path, tmp_path):
    """Each shakespeare_char ablation fixes the baseline it ablates from, so a change of the experiment's defaults
    does not change what it measures; every sweep file loads and expands into valid configs."""
    if path.stem == "baseline":
        return
    sweep = load_sweep(path)
    if sweep["experiment"].endswith("shakespeare_char.py"):
        assert set(baseline.SHAKESPEARE_CHAR) <= set(sweep["fixed"]) and "train.steps" in sweep["fixed"]
    runs = expand(sweep, [], tmp_path)
    assert runs and [run.error for run in runs if run.error] == []


def test_a_ray_address_where_no_cluster_answers_is_one_line():
    """--launcher=ray --address=HOST:PORT where nothing listens: one line within seconds (ray.init would retry for
    minutes); --address=auto without a cluster: Ray's ConnectionError as one line."""
    ray = pytest.importorskip("ray")
    from txjax.sweep.ray_launcher import connect

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(config_lib.ConfigError, match=rf"^--address=127.0.0.1:{port}: no Ray cluster answers there"):
        connect(ray, f"127.0.0.1:{port}")
    assert not ray.is_initialized()

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    line = r"^--address=auto: Could not find any running Ray instance\. Please specify the one to connect to; start"
    with pytest.raises(config_lib.ConfigError, match=line):
        connect(types.SimpleNamespace(init=no_cluster), "auto")
