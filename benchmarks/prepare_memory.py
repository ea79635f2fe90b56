"""The memory of `run.py prepare` on Parquet corpora of two sizes: it should not grow with the corpus.

    python benchmarks/prepare_memory.py [--sizes_gb=0.2,2] [--workers=2] [--dir=/tmp] [--shared=../shared/data]

Writes a synthetic Parquet corpus of each size (of text, uncompressed; nothing is downloaded) into a temporary
folder under --dir: documents of 10-80 lines drawn at random from ../shared/data/tinyshakespeare/input.txt and both
sides of ../shared/data/bible/*.tsv (about 2 KB each, a web page's length), a `text` and an `id` column, row groups
of about 32 MB of text, files of about 256 MB. Then runs `python run.py prepare --input=FOLDER --tokenizer=byte` on
it in a subprocess and polls the resident memory (VmRSS) of that process and of its workers every 50 ms: the peak
of their sum and of the main process. Target: the peak at the largest size within 300 MB of the smallest. The
corpora are deleted after their run. Prints a table and writes benchmarks/results/prepare_memory_cpu.json.
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
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SHARED = common.REPO.parent / "shared" / "data"
ROW_GROUP_BYTES = 32 * 2**20
FILE_BYTES = 256 * 2**20
TARGET_MB = 300


def line_pool(shared: Path) -> np.ndarray:
    lines = [x for x in (shared / "tinyshakespeare" / "input.txt").read_text().splitlines() if x.strip()]
    for tsv in sorted((shared / "bible").glob("*.tsv")):
        lines += [field for line in tsv.read_text().splitlines() for field in line.split("\t") if field.strip()]
    return np.array(lines, dtype=object)


def write_corpus(directory: Path, size_bytes: int, seed: int, shared: Path) -> dict:
    """Parquet files of documents, `size_bytes` of text in all; returns the corpus' sizes."""
    pool, rng = line_pool(shared), np.random.default_rng(seed)
    directory.mkdir(parents=True)
    written, documents, files = 0, 0, 0
    while written < size_bytes:
        schema = pa.schema({"id": pa.int64(), "text": pa.string()})
        with pq.ParquetWriter(directory / f"part-{files:03d}.parquet", schema) as w:
            in_file = 0
            while in_file < FILE_BYTES and written < size_bytes:
                texts, size = [], 0
                while size < ROW_GROUP_BYTES and written + size < size_bytes:
                    text = "\n".join(pool[rng.integers(0, len(pool), rng.integers(10, 81))])
                    texts.append(text)
                    size += len(text.encode())
                ids = np.arange(documents, documents + len(texts))
                w.write_table(pa.table({"id": ids, "text": texts}), row_group_size=len(texts))
                documents, written, in_file = documents + len(texts), written + size, in_file + size
        files += 1
    parquet = sum(p.stat().st_size for p in directory.glob("*.parquet"))
    return {"text_mb": written / 1e6, "parquet_mb": parquet / 1e6, "documents": documents, "files": files}


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/*/stat's parent ids)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            pass
    out, frontier = [pid], [pid]
    while frontier:
        frontier = [c for c, p in parents.items() if p in frontier]
        out += frontier
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_rss(command: list[str]) -> dict:
    """Runs `command`; the peak VmRSS (MB) of its process tree (sum) and of the main process, and its summary."""
    proc = subprocess.Popen(command, cwd=common.REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak_total = peak_main = 0.0
    while proc.poll() is None:
        peak_main = max(peak_main, rss_mb(proc.pid))
        peak_total = max(peak_total, sum(rss_mb(p) for p in tree(proc.pid)))
        time.sleep(0.05)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out[-2000:]}")
    return {
        "peak_rss_mb": peak_total,
        "peak_rss_main_mb": peak_main,
        "summary": json.loads(out.strip().splitlines()[-1]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_gb", default="0.2,2", help="corpus sizes, GB of text, smallest first")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the corpora and shards are written")
    parser.add_argument("--shared", default=str(SHARED), help="the folder of tinyshakespeare/ and bible/")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes_gb.split(",")]
    rows = []
    for i, size in enumerate(sizes):
        root = Path(tempfile.mkdtemp(prefix="prepare_memory_", dir=args.dir))
        try:
            began = time.monotonic()
            corpus = write_corpus(root / "corpus", int(size * 1e9), seed=i, shared=Path(args.shared))
            print(f"wrote {corpus} in {time.monotonic() - began:.0f} s", file=sys.stderr)
            command = [sys.executable, "run.py", "prepare", f"--input={root / 'corpus'}", f"--output={root / 'out'}",
                       "--tokenizer=byte", f"--workers={args.workers}"]  # fmt: skip
            result = peak_rss(command)
            s = result.pop("summary")
            rows.append({"size_gb": size, **corpus, **result, "seconds": s["seconds"], "mb_per_s": s["mb_per_s"],
                         "tokens": s["tokens"], "workers": s["workers"]})  # fmt: skip
            print(common.table(rows[-1:]), file=sys.stderr)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    gap = rows[-1]["peak_rss_mb"] - rows[0]["peak_rss_mb"]
    print(common.table(rows))
    print(f"peak RSS {rows[-1]['size_gb']} GB - {rows[0]['size_gb']} GB: {gap:.1f} MB (target: within {TARGET_MB})")
    command = "python run.py prepare --input=FOLDER --output=DIR --tokenizer=byte --workers=" + str(args.workers)
    path = common.save("prepare_memory", {"prepare_command": command, "runs": rows, "rss_gap_mb": gap,
                                          "target_mb": TARGET_MB})  # fmt: skip
    print(json.dumps({"rss_gap_mb": gap, "result": str(path)}))


if __name__ == "__main__":
    main()
