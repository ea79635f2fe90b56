"""The scale table (docs/scaling.md, issue 63.5): `run.py compile` of real model shapes for TPU pods, one cell at a
time, each timed (wall seconds and peak RSS of the compiling process, from /usr/bin/time -v) and recorded with what
the command printed: fits, HBM per chip, collectives, XLA's estimated step time and the MFU it implies.

    python benchmarks/scale_table.py --cells=llama3_8b@v6e-256[,...]   # or --cells=all
    python benchmarks/scale_table.py --search=batch --cells=llama3_8b@v5e-256  # the estimator's trials and answer
    python benchmarks/scale_table.py --step=decode --cells=llama3_8b@v5p-128   # one cached decoding step (DECODE)

Each cell's record goes into benchmarks/results/scale_table_cpu.json (search: scale_search_cpu.json) under its name
(a decoding cell's `MODEL@TOPOLOGY --step=decode`, beside the training cells) with the machine, day and command it
ran with, so cells can be (re)run one at a time; benchmarks/readme_tables.py renders the tables from it
(scale_tables.py). The shapes are the imported families' real dimensions (config.json of
each model on the Hugging Face hub, as txjax/convert/llama.py and moe.py map them); the data is the synthetic
passkey task at the model's context (its digits are tokens of a vocabulary the size of the model's), since a compile
reads only the batch's shape.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this process's own jax: libtpu's warnings about a TPU it has not
from common import REPO, RESULTS, machine  # noqa: E402

LLAMA = ["positional=rope", "norm=rmsnorm", "activation=swiglu", "tie_embeddings=false", "use_bias=false"]
# every model's fields; its own come after these and win
COMMON = ["dtype=bfloat16", "remat=full", "attention_impl=blockwise", "attention_block_q=512", "attention_block_kv=512"]
MODELS = {  # name -> (model fields, context): the families' config.json dimensions
    "gpt2_small": (
        ["vocab_size=50257", "d_model=768", "num_heads=12", "d_ff=3072", "num_layers=12", "use_bias=true"]
        + ["positional=learned", "norm=layernorm", "activation=gelu", "tie_embeddings=true"]
        + ["attention_impl=reference", "scan_layers=false"],  # small enough for XLA's estimate of the whole step
        1024,
    ),
    "llama3_8b": (
        ["vocab_size=128256", "d_model=4096", "num_heads=32", "num_kv_heads=8", "d_ff=14336", "num_layers=32"]
        + ["rope_base=500000", *LLAMA],
        8192,
    ),
    "llama3_70b": (
        ["vocab_size=128256", "d_model=8192", "num_heads=64", "num_kv_heads=8", "d_ff=28672", "num_layers=80"]
        + ["rope_base=500000", *LLAMA],
        8192,
    ),
    "mixtral_8x7b": (
        ["vocab_size=32000", "d_model=4096", "num_heads=32", "num_kv_heads=8", "d_ff=14336", "num_layers=32"]
        + ["rope_base=1000000", "num_experts=8", "experts_per_token=2", *LLAMA],
        4096,
    ),
    "llama3_8b_32k_ring": (  # Llama 3 8B at a 32k context, its sequence split over the mesh's sequence axis
        ["vocab_size=128256", "d_model=4096", "num_heads=32", "num_kv_heads=8", "d_ff=14336", "num_layers=32"]
        + ["rope_base=500000", *LLAMA],
        32768,
    ),
}
MESHES = {  # (model, topology) -> mesh; one row of the batch per data x fsdp x expert group of chips
    ("gpt2_small", "v5e-256"): {"data": 16, "fsdp": 16},
    ("gpt2_small", "v5p-128"): {"data": 8, "fsdp": 8},
    ("gpt2_small", "v6e-256"): {"data": 16, "fsdp": 16},
    ("llama3_8b", "v5e-256"): {"fsdp": 64, "tensor": 4},  # fsdp 256: 16.09 GiB a chip (logits of 1 row)
    ("llama3_8b", "v5p-128"): {"fsdp": 64},
    ("llama3_8b", "v6e-256"): {"fsdp": 256},
    ("llama3_70b", "v5e-256"): {"fsdp": 64, "tensor": 4},
    ("llama3_70b", "v5p-128"): {"fsdp": 64},
    ("llama3_70b", "v6e-256"): {"fsdp": 256},
    ("mixtral_8x7b", "v5e-256"): {"expert": 8, "fsdp": 32},
    ("mixtral_8x7b", "v5p-128"): {"expert": 8, "fsdp": 8},
    ("mixtral_8x7b", "v6e-256"): {"expert": 8, "fsdp": 32},
    ("llama3_8b_32k_ring", "v5e-256"): {"fsdp": 64, "sequence": 4},
    ("llama3_8b_32k_ring", "v5p-128"): {"fsdp": 16, "sequence": 4},
    ("llama3_8b_32k_ring", "v6e-256"): {"fsdp": 64, "sequence": 4},
}
# (model, topology) -> mesh of the decoding cells (--step=decode): the training cell's mesh, so that the step sits
# beside its training cell with the same layout of the weights, and one row per group of chips that splits the rows
# (the KV cache's rows are split over the batch axes only when the rows are a multiple of their product, else every
# chip holds all of them); more rows a chip raise tokens per second until the cache fills the HBM, a search not run
DECODE = {(m, t): MESHES[(m, t)] for m in ("llama3_8b", "llama3_70b") for t in ("v5e-256", "v5p-128", "v6e-256")}
PASSKEY_AROUND = 5  # BOS, '=', the 2 passkey digits, EOS around the context's digits (txjax.data.synthetic)


def command(model: str, topology: str, search: str | None = None, step: str = "train") -> list[str]:
    """The run.py compile command of a cell: the model's shape, its context's passkey data, the cell's mesh and one
    row of the batch per group of chips that splits the rows (decode: one cached step with the context's cache)."""
    fields, context = MODELS[model]
    mesh = (DECODE if step == "decode" else MESHES)[(model, topology)]
    rows = mesh.get("data", 1) * mesh.get("fsdp", 1) * mesh.get("expert", 1)
    digits = context - PASSKEY_AROUND + 1  # the LM's inputs are the sequence less its last token
    data = ["task=passkey", f"min_digits={digits}", f"max_digits={digits}", "eval_size=4"]
    args = ["run.py", "compile", f"--topology={topology}", *(["--search", search] if search else [])]
    args += ["--step=decode"] if step == "decode" else []
    args += [f"--config.data.{d}" for d in data] + [f"--config.model.{f}" for f in [*COMMON, *fields]]
    args += [f"--config.model.max_len={context}", f"--config.train.batch_size={rows}"]
    return args + [f"--config.mesh.{axis}={size}" for axis, size in mesh.items()]


def run_cell(model: str, topology: str, search: str | None, step: str) -> dict:
    """One cell compiled under nice -n 10 and /usr/bin/time -v: its JSON lines, wall seconds, peak RSS."""
    args = command(model, topology, search, step)
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        done = subprocess.run(
            ["nice", "-n", "10", "/usr/bin/time", "-v", "-o", timing.name, sys.executable, *args],
            cwd=REPO,
            env={**os.environ, "TXJAX_COMPILATION_CACHE": "0"},  # each cell compiled, not loaded from an earlier one
            capture_output=True,
            text=True,
        )
        times = timing.read()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", times)[1]
    seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(wall.split(":"))))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", times)[1]) * 1024
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {
        "command": "python " + " ".join(args),
        "exit_status": done.returncode,
        "error": done.stderr.strip().splitlines()[-1] if done.returncode else None,
        "wall_seconds": round(seconds, 1),
        "peak_rss_bytes": rss,
        "trials": lines[:-1],
        "result": lines[-1] if lines else None,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", required=True, help="MODEL@TOPOLOGY,... (MESHES; decode: DECODE) or all")
    parser.add_argument("--search", choices=("batch", "remat"), help="run.py compile --search: the estimator")
    parser.add_argument("--step", choices=("train", "decode"), default="train", help="run.py compile --step")
    args = parser.parse_args()
    every = DECODE if args.step == "decode" else MESHES
    cells = list(every) if args.cells == "all" else [tuple(c.split("@")) for c in args.cells.split(",")]
    path = RESULTS / ("scale_search_cpu.json" if args.search else "scale_table_cpu.json")
    for model, topology in cells:
        record = run_cell(model, topology, args.search, args.step)
        saved = json.loads(path.read_text()) if path.is_file() else {"cells": {}}
        suffix = (f" --search={args.search}" if args.search else "") + (
            " --step=decode" if args.step == "decode" else ""
        )
        saved["cells"][f"{model}@{topology}{suffix}"] = record
        path.write_text(json.dumps(saved, indent=1) + "\n")
        result = record["result"] or {}
        print(model, topology, "fits" if result.get("fits") else "does not fit", record["wall_seconds"], "s",
              f"{record['peak_rss_bytes'] / 1e9:.2f} GB RSS", record["error"] or "", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
