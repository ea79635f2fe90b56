"""Peak memory of `run.py eval --text` against the size of the text: flat, since the file is read, tokenized and
scored piece by piece (txjax.evaluate.score_text).

    python benchmarks/score_text_memory.py [--sizes_mb=2,20,200] [--partial_mb=2048 --partial_s=600]
                                           [--context=64] [--batch_size=256]

A tiny character-level LM (1 layer, d_model 16, the shakespeare_char experiment's other settings) is trained for one
step on a small generated text in a temporary workdir; then, for each size, a text of that many MB (random lines of
words, a fixed seed) is scored by `run.py eval --workdir=W --text=FILE` in a fresh process, whose peak resident
memory (ru_maxrss from wait4, Python and jax included) and wall time are reported with the number of tokens it
scored. Every half second the child's resident memory (VmRSS) and its offset in the text file (/proc/PID/fdinfo) are
sampled: `trace` lists [MB read, GB resident] along the way. With --partial_mb, a text of that size is scored for
--partial_s seconds and stopped by SIGTERM: its row gives how far it read and the peak so far (VmHWM), for a text
too long to score whole on a CPU. Writes benchmarks/results/score_text_memory_PLATFORM.json after each size. On a
CPU at about 200k tokens/s, 200 MB takes about 17 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    """`size` bytes of lines of 12 random words: lines drawn at random from 65,536 random lines (fast for GBs)."""
    rng = np.random.default_rng(seed)
    lines = [(" ".join(rng.choice(WORDS, size=12)) + "\n").encode() for _ in range(1 << 16)]
    with path.open("wb") as f:
        written = 0
        while written < size:
            block = b"".join([lines[i] for i in rng.integers(len(lines), size=1 << 16).tolist()])
            written += f.write(block[: size - written])


def sample(pid: int, text: Path) -> tuple[float, float, float] | None:
    """(MB of `text` read, GB resident now, GB resident at most) of process `pid`; None once it has gone."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        position = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            if os.readlink(fd) == str(text):
                position = int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    kib = lambda key: int(status[key].split()[0]) if key in status else 0
    return position / MB, kib("VmRSS") / 2**20, kib("VmHWM") / 2**20


def score(command: list[str], text: Path, stop_after: float = 0) -> tuple[dict, list, float, float, bool]:
    """Runs `command`, sampling it; (its last JSON line or {}, trace, peak GB, seconds, stopped by SIGTERM)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=common.REPO)
    os.set_blocking(child.stdout.fileno(), False)
    out, trace, peak, stopped = b"", [], 0.0, False
    while not (ended := os.wait4(child.pid, os.WNOHANG))[0]:
        out += child.stdout.read() or b""
        if point := sample(child.pid, text):
            trace.append([round(point[0], 1), round(point[1], 4)])
            peak = max(peak, point[2])
        if stop_after and time.perf_counter() - start > stop_after and not stopped:
            child.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(0.5)
    child.returncode = os.waitstatus_to_exitcode(ended[1])
    seconds = time.perf_counter() - start
    out += child.stdout.read() or b""
    if child.returncode and not stopped:
        sys.exit(f"{' '.join(command)} failed (status {child.returncode})")
    peak = max(peak, ended[2].ru_maxrss / 2**20)  # Linux: KiB
    lines = out.decode().strip().splitlines()
    metrics = json.loads(lines[-1]) if lines and not stopped else {}
    return metrics, thin(trace), peak, seconds, stopped


def thin(trace: list, points: int = 40) -> list:
    """About `points` of the trace's samples, evenly spaced, the last one kept."""
    step = max(1, len(trace) // points)
    return trace[::step] + ([trace[-1]] if trace and (len(trace) - 1) % step else [])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_mb", default="2,20", help="comma-separated text sizes in MB")
    parser.add_argument("--partial_mb", type=float, default=0, help="then score a text of this size for a while")
    parser.add_argument("--partial_s", type=float, default=600, help="seconds the --partial_mb text is scored for")
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
        sizes = [(float(mb), 0.0) for mb in args.sizes_mb.split(",") if mb]
        sizes += [(args.partial_mb, args.partial_s)] if args.partial_mb else []
        for size_mb, stop_after in sizes:
            text = tmp / "text.txt"
            write_text(text, int(size_mb * MB))
            command = [sys.executable, "run.py", "eval", f"--workdir={workdir}", f"--text={text}"]
            metrics, trace, peak, seconds, stopped = score(command, text, stop_after)
            row = {"text_mb": size_mb, "read_mb": max([size_mb * (not stopped)] + [mb for mb, _ in trace])}
            row |= {"tokens": metrics.get("tokens"), "peak_rss_gb": peak, "seconds": seconds, "stopped": stopped}
            row |= {"tokens_per_s": metrics["tokens"] / seconds if metrics else None, "loss": metrics.get("loss")}
            rows.append({**row, "trace": trace})
            text.unlink()
            payload = {"context": args.context, "batch_size": args.batch_size, "rows": rows}
            path = common.save("score_text_memory", payload, args.out)  # after each size: a long run keeps its rows
            print(common.table([row]), flush=True)
    print(common.table([{k: v for k, v in row.items() if k != "trace"} for row in rows]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
