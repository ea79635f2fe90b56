"""The generated tables of the architecture ablations in docs/experiments.md (benchmarks/readme_tables.py): MHA, GQA
and MLA at equal KV-cache bytes (kv_cache), all-softmax against Gated DeltaNet layers (linear_layers, with its eval at
4x the context, linear_extension) and multi-token prediction at equal compute (mtp), from their results folders under
experiments/ablations/results/."""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict

from ablation_tables import RESULTS, mean_sd
from table_format import machine_label, n, table


def sweep_runs(name: str) -> tuple[list[dict], str]:
    """A sweep's finished runs (its results.csv) and the label of the machine its report was written on."""
    folder = RESULTS / name
    runs = [r for r in csv.DictReader((folder / "results.csv").open()) if r["status"] == "done"]
    return runs, machine_label(json.loads((folder / "results.json").read_text())["machine"])


def grouped(runs: list[dict], key) -> dict:
    """{key(run): [runs]} in the sweep's order of settings."""
    groups = defaultdict(list)
    for r in runs:
        groups[key(r)].append(r)
    return groups


def attention_kind(run: dict) -> str:
    """The kv_cache sweep's settings by name: its decode benchmark's file is decode_<name>.json."""
    return "mla" if run["attention"] == "mla" else "gqa" if run["num_kv_heads"] else "mha"  # None: written ""


def kv_cache() -> list[str]:
    """experiments/ablations/kv_cache.py: per attention, the parameters and KV-cache bytes per token (`run.py
    inspect`'s, from the decode benchmark's file), the valid loss over seeds, and batch-1 greedy decoding of 256 new
    tokens (benchmarks/decode.py on the same shapes, random weights, bfloat16)."""
    runs, machine = sweep_runs("kv_cache")
    names = {"mha": "MHA, 2 heads of 32", "gqa": "GQA, 4 query heads, 2 K/V heads of 32"}
    names["mla"] = "MLA, 4 heads, latent 112 + RoPE key 16"
    rows = []
    for kind, rs in grouped(runs, attention_kind).items():
        d = json.loads((RESULTS / "kv_cache" / f"decode_{kind}.json").read_text())
        s = d["summary"]
        rows.append([names[kind], n(s["parameters"]), n(s["kv_bytes_per_token"]), len(rs),
                     mean_sd([float(r["valid_loss"]) for r in rs]), n(s["cached_tokens_per_s"]),
                     n(s["cached_cpu_us_per_token"] / 1e3), machine, machine_label(d["machine"])])  # fmt: skip
    header = ["attention", "parameters", "KV cache bytes / token", "seeds", "valid loss", "decode tokens/s"]
    return table([*header, "decode CPU ms/token", "trained", "decode measured"], rows)


def linear_layers() -> list[str]:
    """experiments/ablations/linear_layers.py and evals/linear_extension.py: per setting, the parameters, the valid
    loss at the trained context 64 and at 256 (whole window and per quarter), mean ± sd over seeds."""
    runs, machine = sweep_runs("linear_layers")
    by_position = list(csv.DictReader((RESULTS / "linear_extension" / "results.csv").open()))
    eval_machine = json.loads((RESULTS / "linear_extension" / "results.json").read_text())["machine"]
    rows = []
    for rs in grouped(runs, lambda r: r["layer_types"]).values():
        mine = [r for r in by_position if r["run"] in {run["run"] for run in rs}]
        overall = {r["run"]: float(r["overall_loss"]) for r in mine}
        quarters = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # quarter -> run -> [loss sum, tokens]
        for r in mine:
            cell = quarters[int(r["from"]) // 64][r["run"]]
            cell[0] += float(r["loss"]) * int(r["tokens"])
            cell[1] += int(r["tokens"])
        cells = [mean_sd([s / t for s, t in quarters[q].values()]) for q in range(4)]
        rows.append([mine[0]["layers"], n(int(mine[0]["parameters"])), len(rs),
                     mean_sd([float(r["valid_loss"]) for r in rs]), n(statistics.mean(float(r["target_tokens_per_s"])
                     for r in rs)), mean_sd(list(overall.values())), *cells, machine,
                     machine_label(eval_machine)])  # fmt: skip
    header = ["layers", "parameters", "seeds", "valid loss, context 64", "target tokens/s", "at 256: all"]
    return table([*header, "0-63", "64-127", "128-191", "192-255", "trained", "evaluated"], rows)


def mtp() -> list[str]:
    """experiments/ablations/mtp.py: per MTP depth, its steps (equal compute), the next-token valid loss over seeds,
    the training rate and the minutes the setting's seeds trained together."""
    runs, machine = sweep_runs("mtp")
    rows = [
        [depth, rs[0]["steps"], len(rs), mean_sd([float(r["valid_loss"]) for r in rs]),
         n(statistics.mean(float(r["target_tokens_per_s"]) for r in rs)), n(float(rs[0]["wall_s"]) / 60), machine]
        for depth, rs in grouped(runs, lambda r: r["mtp_depth"]).items()
    ]  # fmt: skip
    header = ["MTP depth", "steps (equal compute)", "seeds", "next-token valid loss", "target tokens/s", "minutes"]
    return table([*header, "measured"], rows)
