"""benchmarks/gpu.sh --dry-run: every stage of the GPU script runs on small shapes here, writes its result file, and
the summary reads them, so that the script works when a GPU session finally runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers", reason="the decode stage compares with transformers (pip install -e '.[interop]')")


def test_dry_run_runs_every_stage_and_summarizes(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--dry-run", f"--out={out}", "--budget=400"],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stages = {line.split("\t")[0]: line.split("\t")[1] for line in (out / "stages.tsv").read_text().splitlines()}
    assert set(stages) == {"peak", "train", "train_loop", "decode", "moe", "cache", "flags_0", "small", "tests"}
    failed = {name: (out / "logs" / f"{name}.log").read_text()[-1500:] for name, rc in stages.items() if rc != "0"}
    assert not failed, failed
    summary = json.loads((out / "summary.json").read_text())
    assert {"float32", "bfloat16"} <= set(summary["peak_tflops"])
    trained = {(r["file"], r["attention"]) for r in summary["train"]}
    assert ("train_scan", "auto (reference)") in trained and ("train_scan", "reference (reference)") in trained
    flags = {r["file"]: r["xla_flags"] for r in summary["train"]}
    assert flags["train_flags_0"] == "--xla_backend_optimization_level=1"
    assert [r["batch"] for r in summary["decode"]] == [1, 2] and all(r["ratio"] > 0 for r in summary["decode"])
    moe = {r["variant"]: r["overhead"] for r in summary["moe"]}
    assert set(moe) == {"dense", "moe_dropless", "moe_capacity_1.25"} and moe["dense"] == 1.0
    assert json.loads(done.stdout.strip().splitlines()[-1])["stages"] == stages
    # and the docs' generated GPU table reads such a folder (benchmarks/results/gpu/ once a GPU ran the script)
    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "benchmarks" / "readme_tables.py")
    readme_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme_tables)
    readme_tables.BENCH = tmp_path
    rows = readme_tables.gpu()[2:]
    assert any(r.startswith("| train shakespeare_char, batch") for r in rows)
    assert any(r.startswith("| greedy gpt2_tiny, batch 2 |") and "transformers eager" in r for r in rows)


def test_unknown_argument_is_one_line():
    done = subprocess.run(["bash", "benchmarks/gpu.sh", "--gpu"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown argument --gpu" in done.stderr
