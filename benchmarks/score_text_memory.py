"""Peak memory of `run.py eval --text` against the size of the text: flat, since the file is read, tokenized and
scored piece by piece (txjax.evaluate.score_text).

    python benchmarks/score_text_memory.py [--sizes_mb=2,20] [--context=64] [--batch_size=256]

A tiny character-level LM (1 layer, d_model 16, the shakespeare_char experiment's other settings) is trained for one
step on a small generated text in a temporary workdir; then, for each size, a text of that many MB (lines of words
drawn from that text's alphabet, a fixed seed) is scored by `run.py eval --workdir=W --text=FILE` in a fresh process,
whose peak resident memory (ru_maxrss from wait4, Python and jax included) and wall time are reported with the
number of tokens it scored. Writes benchmarks/results/score_text_memory_PLATFORM.json after each size. On a CPU at
about 200k tokens/s, --sizes_mb=2,20,200 adds about 20 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np

MB = 2**20
WORDS = "the quick brown fox jumps over a lazy dog and then runs back home again to sleep until morning".split()


def write_text(path: Path, size: int, seed: int = 0) -> None:
    """About `size` bytes of lines of random words (written 1 MB at a time)."""
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="utf-8") as f:
        written = 0
        while written < size:
            block = "\n".join(" ".join(rng.choice(WORDS, size=12)) for _ in range(min(20_000, 1 + size // 60))) + "\n"
            written += f.write(block[: size - written])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_mb", default="2,20", help="comma-separated text sizes in MB")
    parser.add_argument("--context", type=int, default=64, help="the model's max_len: tokens per window")
    parser.add_argument("--batch_size", type=int, default=256, help="the training batch: windows per eval step")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/score_text_memory_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_text(tmp / "train.txt", MB, seed=1)
        workdir = tmp / "workdir"
        train = [
            sys.executable,
            "run.py",
            "train",
            "--config=experiments/shakespeare_char.py",
            f"--workdir={workdir}",
            f"--config.data.path={tmp / 'train.txt'}",
            f"--config.data.seq_len={args.context}",
            f"--config.model.max_len={args.context}",
            f"--config.train.batch_size={args.batch_size}",
            "--config.model.num_layers=1",
            "--config.model.d_model=16",
            "--config.model.num_heads=2",
            "--config.model.d_ff=64",
            "--config.model.dtype=float32",
            "--config.train.steps=1",
            "--config.train.eval_every=0",
        ]
        subprocess.run(train, check=True, cwd=common.REPO, capture_output=True)
        for size_mb in map(float, args.sizes_mb.split(",")):
            text = tmp / "text.txt"
            write_text(text, int(size_mb * MB))
            command = [sys.executable, "run.py", "eval", f"--workdir={workdir}", f"--text={text}"]
            start = time.perf_counter()
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=common.REPO)
            out = child.stdout.read()
            _, status, usage = os.wait4(child.pid, 0)
            seconds = time.perf_counter() - start
            if status:
                sys.exit(f"{' '.join(command)} failed (status {status})")
            metrics = json.loads(out.decode().strip().splitlines()[-1])
            rows.append(
                {
                    "text_mb": size_mb,
                    "tokens": metrics["tokens"],
                    "peak_rss_gb": usage.ru_maxrss * 1024 / 2**30,  # Linux: KiB
                    "seconds": seconds,
                    "tokens_per_s": metrics["tokens"] / seconds,
                    "loss": metrics["loss"],
                }
            )
            text.unlink()
            payload = {"context": args.context, "batch_size": args.batch_size, "rows": rows}
            path = common.save("score_text_memory", payload, args.out)  # after each size: a long run keeps its rows
            print(common.table(rows[-1:]), flush=True)
    print(common.table(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
