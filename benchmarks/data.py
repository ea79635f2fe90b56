"""Data at scale: `run.py prepare` throughput, the memory of training from shards, and the loader's speed.

    python benchmarks/data.py [--size_gb=2] [--small_gb=0.2] [--tokenizer=char] [--steps=300] [--dir=TMP]

Builds two synthetic corpora in a temporary folder (nothing is downloaded): the lines of
../shared/data/tinyshakespeare/input.txt and of both sides of ../shared/data/bible/*.tsv, drawn at random, a blank
line (a document boundary) after about one line in eight, in files of 256 MB: `size_gb` and `small_gb` of text.
Then measures
  - prepare MB/s and tokens/s with 1 and 2 worker processes on the large corpus;
  - the peak resident memory (VmRSS, polled) of `run.py train --config=experiments/shakespeare_shards.py` from the
    shards of each corpus (target: within 200 MB of each other), and, for contrast, of the in-memory text loader
    (`data.kind=text`) on the small corpus (one file);
  - the loader alone (ShardLMDataset.batch at the shakespeare_char shape, windows and packed) in tokens/s against
    what the shakespeare_char train_step consumes (target: >= 20x);
  - ms/step of the training loop (train.py: prefetching, step, logging) fed from the large corpus' shards and from
    tinyshakespeare in memory, interleaved runs, medians (target: within 5%).
Prints a table per part and one JSON line last (also written to benchmarks/results/data_PLATFORM.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import jax
import numpy as np
from train import build_config, lm_batches, stepper

from txjax import config as config_lib
from txjax.data import load_tokenizer
from txjax.data.prepare import prepare
from txjax.data.shards import ShardLMDataset
from txjax.training.loop import train

SHARED = config_lib.REPO.parent / "shared" / "data"
EXPERIMENT = config_lib.REPO / "experiments" / "shakespeare_shards.py"
FILE_BYTES = 256 * 2**20


def write_corpus(directory: Path, size_bytes: int, seed: int) -> list[Path]:
    """Random lines of the shared corpora, a blank line after ~1 in 8, in files of FILE_BYTES, size_bytes in all."""
    lines = [x for x in (SHARED / "tinyshakespeare" / "input.txt").read_text().splitlines() if x.strip()]
    for tsv in sorted((SHARED / "bible").glob("*.tsv")):
        lines += [field for line in tsv.read_text().splitlines() for field in line.split("\t") if field.strip()]
    pool = np.array([""] + lines, dtype=object)  # "" joined between two lines makes the blank line
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    paths, written = [], 0
    while written < size_bytes:
        path = directory / f"part-{len(paths):03d}.txt"
        with path.open("w", encoding="utf-8") as f:
            size = 0
            while size < min(FILE_BYTES, size_bytes - written):
                picks = np.where(rng.random(200_000) < 1 / 8, 0, rng.integers(1, len(pool), 200_000))
                block = "\n".join(pool[picks].tolist()) + "\n"
                size += f.write(block[: min(FILE_BYTES, size_bytes - written) - size])
        written += path.stat().st_size
        paths.append(path)
    return paths


def peak_rss_mb(command: list[str]) -> dict:
    """Runs `command`, polling /proc/PID/status: the peak VmRSS and the RssAnon / RssFile at that moment, in MB."""
    proc = subprocess.Popen(command, cwd=config_lib.REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = {"rss_mb": 0.0}
    while proc.poll() is None:
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if ":" in line
            )
            now = {k: int(fields[v].split()[0]) / 1024 for k, v in (("rss_mb", "VmRSS"), ("anon_mb", "RssAnon"),
                                                                    ("file_mb", "RssFile"))}  # fmt: skip
            peak = max(peak, now, key=lambda m: m["rss_mb"])
        except (FileNotFoundError, KeyError, ProcessLookupError):
            pass
        time.sleep(0.1)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out[-2000:]}")
    return peak | {"steps": json.loads(out.strip().splitlines()[-1])["step"]}


def run_flags(steps: int) -> list[str]:
    """experiments/shakespeare_shards.py for `steps` steps: no periodic eval, one checkpoint at the end."""
    return [f"--config.train.steps={steps}", "--config.train.eval_every=0", f"--config.train.log_every={steps // 6}",
            f"--config.train.checkpoint_every={steps}"]  # fmt: skip


def train_command(workdir: Path, steps: int, *flags: str) -> list[str]:
    return [sys.executable, "run.py", "train", f"--config={EXPERIMENT}", f"--workdir={workdir}", *run_flags(steps),
            *flags]  # fmt: skip


def loader_tokens_per_s(directory: Path, pack: bool, seconds: float = 3.0) -> float:
    config = config_lib.load_config(EXPERIMENT)
    data = ShardLMDataset(directory, load_tokenizer(directory / "tokenizer"), config.data.seq_len, pack=pack)
    B, k, began = config.train.batch_size, 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        tokens = data.batch(0, k, B)["inputs"].size
        k += 1
    return k * tokens / (time.perf_counter() - began)


def step_tokens_per_s(steps: int = 50) -> float:
    """What the shakespeare_char train_step consumes: its tokens per batch / its median seconds per step."""
    config = build_config("shakespeare_char", [])
    batches = lm_batches(config)
    run, batch = stepper(config), jax.device_put(batches[0])  # as benchmarks/train.py: the step alone
    timings = common.time_calls({"step": lambda: run(batch)}, steps, warmup=3, rounds=1)
    return batches[0]["inputs"].size / (timings["step"]["median_ms"] / 1e3)


def loop_ms_per_step(root: Path, shards: Path, steps: int, repeats: int = 2) -> dict:
    """ms/step medians of train.py's loop fed from shards and from tinyshakespeare in memory, runs interleaved."""
    sources = {
        "memory": [
            "--config.data.kind=text",
            f"--config.data.path={SHARED / 'tinyshakespeare' / 'input.txt'}",
            "--config.data.pack=false",
        ],  # fmt: skip
        "shards": [f"--config.data.path={shards}"],
    }
    ms = {name: [] for name in sources}
    for r in range(repeats):
        for name, flags in sources.items():
            config = config_lib.from_command_line(str(EXPERIMENT), [*run_flags(steps), *flags])
            result = train(config, root / f"loop_{name}_{r}")
            ms[name].append(result["ms_per_step_median"])
    return {name: float(np.median(v)) for name, v in ms.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_gb", type=float, default=2.0, help="the large corpus (the issue asks for >= 2)")
    parser.add_argument("--small_gb", type=float, default=0.2, help="the small corpus of the memory comparison")
    parser.add_argument("--tokenizer", default="char", help="prepare's --tokenizer")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--dir", help="where the corpora and shards go (default: a temporary folder, removed)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/data_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    root = Path(args.dir or tempfile.mkdtemp(prefix="txjax_data_"))
    try:
        payload = run(root, args)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    path = common.save("data", payload, args.out)
    print(f"saved {path}")
    print(json.dumps(payload))


def run(root: Path, args) -> dict:
    print(f"CPU: {common.provenance.cpu_model()}")
    sizes = {"small": args.small_gb, "large": args.size_gb}
    corpora = {name: write_corpus(root / f"corpus_{name}", int(gb * 1e9), seed) for seed, (name, gb) in
               enumerate(sizes.items())}  # fmt: skip
    valid_fraction = {n: min(0.1, 2e6 / (gb * 1e9)) for n, gb in sizes.items()}  # ~2 MB: a final eval of ~1 min

    prepared = {}
    for workers in (1, 2):
        out = root / f"shards_large_w{workers}"
        prepared[workers] = prepare([str(p) for p in corpora["large"]], out, args.tokenizer, delimiter="\n\n",
                                    valid_fraction=valid_fraction["large"], workers=workers)  # fmt: skip
        if workers == 1:
            shutil.rmtree(out)
    shards = {"large": root / "shards_large_w2", "small": root / "shards_small"}
    prepare([str(p) for p in corpora["small"]], shards["small"], args.tokenizer, delimiter="\n\n",
            valid_fraction=valid_fraction["small"])  # fmt: skip
    prepare_rows = [{"workers": w, **{k: p[k] for k in ("input_mb", "seconds", "mb_per_s", "tokens_per_s")}}
                    for w, p in prepared.items()]  # fmt: skip
    print(common.table(prepare_rows))

    memory = {name: peak_rss_mb(train_command(root / f"rss_{name}", args.steps, f"--config.data.path={d}"))
              for name, d in shards.items()}  # fmt: skip
    if len(corpora["small"]) == 1:
        memory["text_in_memory_small"] = peak_rss_mb(train_command(
            root / "rss_text", args.steps, "--config.data.kind=text", f"--config.data.path={corpora['small'][0]}",
            "--config.data.pack=false", f"--config.data.val_fraction={valid_fraction['small']}"))  # fmt: skip
    print(common.table([{"run": name, **m} for name, m in memory.items()]))

    loader = {pack: loader_tokens_per_s(shards["large"], pack) for pack in (False, True)}
    step = step_tokens_per_s()
    loop = loop_ms_per_step(root, shards["large"], args.steps)
    speed_rows = [{"what": "loader windows", "tokens_per_s": loader[False], "x_step": loader[False] / step},
                  {"what": "loader packed", "tokens_per_s": loader[True], "x_step": loader[True] / step},
                  {"what": "train_step consumes", "tokens_per_s": step}]  # fmt: skip
    print(common.table(speed_rows))
    print(common.table([{"fed from": name, "ms_per_step": ms} for name, ms in loop.items()]))
    rss_gap = memory["large"]["rss_mb"] - memory["small"]["rss_mb"]
    return {
        "corpus_gb": sizes,
        "tokenizer": args.tokenizer,
        "prepare": {
            f"workers_{w}": {k: p[k] for k in ("mb_per_s", "tokens_per_s", "seconds", "tokens")}
            for w, p in prepared.items()
        },  # fmt: skip
        "peak_rss_mb": memory,
        "rss_gap_mb": rss_gap,
        "loader_tokens_per_s": {"windows": loader[False], "packed": loader[True]},
        "step_tokens_per_s": step,
        "loader_over_step": min(loader.values()) / step,
        "loop_ms_per_step": loop,
        "shards_over_memory_ms": loop["shards"] / loop["memory"],
        "targets_met": {
            "rss_within_200mb": abs(rss_gap) <= 200,
            "loader_20x": min(loader.values()) / step >= 20,
            "step_within_5pct": abs(loop["shards"] / loop["memory"] - 1) <= 0.05,
        },
    }


if __name__ == "__main__":
    main()
