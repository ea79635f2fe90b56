"""LoRA against full fine-tuning on a Marian-shaped translation model, BLEU before and after: nothing pretrained can
be downloaded, so the base is trained here, and the fine-tunes teach it a direction it has never translated.

    python experiments/workflows/marian_lora.py      # 20 + 2 + 2 minutes of training on 2 cores at load 8-12

1. data: ../shared/data/bible's pairs with their columns swapped, runs/data/bible_es_en/{train,valid,test}.es-en.tsv
   (RV1909 Spanish -> WEB English; the same books in each split);
2. base: experiments/bible_en_es.py (English -> Spanish) scaled down and in Marian's shape (MODEL: the 2017
   Transformer as txjax/convert/marian.py imports and exports it: post-LN, biases, sinusoidal positions in halves,
   SiLU, a logits bias, one embedding shared and tied, scaled by sqrt(d_model)), 2 + 2 layers, d_model 128, 4,000
   SentencePiece pieces, `--base_steps` steps;
3. lora: `train.init_from` the base on Spanish -> English, rank-8 adapters (alpha 16) on attention's q/k/v/o (self
   and cross) and the FFN, everything else frozen, `--steps` steps;
4. full: the same steps, batch and schedule, every parameter trained;
5. the test split (278 pairs, held out by book) decoded by each run in both directions, beam 4 at length penalty 0.6
   as bible_en_es's test evals: sacreBLEU and chrF (txjax.evaluate.split.split_metrics, what `run.py eval
   --split=test` computes), each kept as the run's eval_test_<pair>.json.

Writes experiments/results/marian_lora/lora.json (the machine and command; BLEU and chrF of every run and
direction; trainable parameters, median seconds a step and the training process's peak RSS of each fine-tune),
curves.png (the fine-tunes' train and valid loss) and each run's config.json and metrics.jsonl under RUN/. A
finished stage is not redone (the data written, a run trained, an eval recorded for its step): running it again
finishes what an interrupted one left.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from workflow import REPO, last_json, measured  # experiments/workflows/workflow.py, beside this file

sys.path.insert(0, str(REPO))

BIBLE, SWAPPED = Path("../shared/data/bible"), Path("runs/data/bible_es_en")
RUNS = Path("runs/marian_lora")
PAIRS = {"en-es": BIBLE / "{}.en-es.tsv", "es-en": SWAPPED / "{}.es-en.tsv"}
MODEL = [
    *("--config.model.num_layers=2", "--config.model.num_encoder_layers=2", "--config.model.d_model=128"),
    *("--config.model.d_ff=512", "--config.model.positional=sinusoidal_halves", "--config.model.activation=silu"),
    *("--config.model.norm_placement=post", "--config.model.use_bias=true", "--config.model.final_logits_bias=true"),
    "--config.data.vocab_size=4000",
]  # bible_en_es.py's other fields hold: 4 heads, embed_scale, shared and tied embeddings, bfloat16, label smoothing
# a fixed number of steps, not bible_en_es's 20-minute budget: the same run on any machine, the fine-tunes equal
STEPS = ["--config.train.max_minutes=0", "--config.train.eval_every_minutes=0", "--config.train.decay_start=steps"]
STEPS += ["--config.train.eval_generation=false"]  # BLEU: stage 5, beam 4
RUN_FILES = ("config.json", "metrics.jsonl")
PROCESS_FILE = "process.json"  # a training process's peak RSS, beside its run: a rerun that trains nothing keeps it


def swap_columns() -> None:
    """Stage 1: the es-en files, each line of the en-es file with its two fields swapped."""
    for split in ("train", "valid", "test"):
        out = REPO / str(PAIRS["es-en"]).format(split)
        if out.is_file():
            continue
        lines = (REPO / str(PAIRS["en-es"]).format(split)).read_text(encoding="utf-8").splitlines()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join("{1}\t{0}\n".format(*line.split("\t")) for line in lines), encoding="utf-8")


def data_flags(pair: str) -> list[str]:
    files = {"path": "train", "valid_path": "valid", "test_path": "test"}
    return [f"--config.data.{field}={str(PAIRS[pair]).format(split)}" for field, split in files.items()]


def train(name: str, *flags: str) -> dict:
    """Trains (or resumes, or finds finished) runs/marian_lora/NAME: run.py train's result, with the peak RSS of the
    process that trained it and the load it started under (recorded beside the run; none for a run this driver
    found finished before it ever ran)."""
    from txjax.training.run import TRAIN_RESULT_FILE

    workdir, load = REPO / RUNS / name, os.getloadavg()[0]
    finished = (workdir / TRAIN_RESULT_FILE).is_file()
    stdout, peak_rss_mb = measured("train", "--config=experiments/bible_en_es.py", f"--workdir={RUNS / name}", *flags)
    process = workdir / PROCESS_FILE
    if not finished:  # a finished run's rerun trains nothing: its RSS would be no training's
        process.write_text(json.dumps({"peak_rss_mb": peak_rss_mb, "load_average_1min": load}) + "\n")
    return last_json(stdout) | (json.loads(process.read_text()) if process.is_file() else {})


def trainable(name: str) -> int:
    """The parameters the run's optimizer trained: a LoRA run's adapters, any other run's every parameter."""
    import jax

    from txjax.experiment import load_workdir
    from txjax.state import lora

    params = lora.trained(load_workdir(REPO / RUNS / name, merge=False).params)[0]
    return sum(leaf.size for leaf in jax.tree.leaves(params))


def test_bleu(name: str, pair: str) -> dict:
    """The run's metrics on the test split of `pair`, beam 4 (its decode section), as `run.py eval --split=test`
    computes them, recorded as the run's eval_test_<pair>.json (read back when it records the run's last step)."""
    from txjax.evaluate.split import read_recorded, split_metrics, write_metrics
    from txjax.experiment import build_dataset, load_workdir

    workdir = REPO / RUNS / name
    run = load_workdir(workdir)
    if (recorded := read_recorded(workdir, f"test_{pair}")).get("step") == run.step:
        return recorded
    config = run.config.copy_and_resolve_references()
    config.data.test_path = str(PAIRS[pair]).format("test")
    metrics = {"pair": pair, "step": run.step, **split_metrics(run, build_dataset(config, run.tokenizer, "test"))}
    write_metrics(workdir, f"test_{pair}", metrics)
    return read_recorded(workdir, f"test_{pair}")


def plot(out: Path) -> None:
    """out/curves.png: the two fine-tunes' train and valid loss (Spanish -> English) on one pair of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from txjax.ops.metrics_log import read_metrics

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, color in (("lora", "C0"), ("full", "C1")):
        records = read_metrics(REPO / RUNS / name)
        for split, style in (("train", {}), ("valid", {"marker": "o", "markersize": 3, "linestyle": "--"})):
            points = [(r["step"], r["loss"]) for r in records if r["split"] == split]
            ax.plot(*zip(*points), color=color, label=f"{name} {split} loss", **style)
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title="fine-tuning the en->es base on es->en")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(out / "curves.png", bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_steps", type=int, default=3000, help="the base's steps, English -> Spanish")
    parser.add_argument("--steps", type=int, default=600, help="each fine-tune's steps, Spanish -> English")
    parser.add_argument("--rank", type=int, default=8, help="LoRA's rank (alpha: twice it)")
    parser.add_argument("--out", default="experiments/results/marian_lora")
    args = parser.parse_args(argv)
    from txjax.ops import provenance  # after argparse: --help needs no JAX

    swap_columns()
    base = train(
        "base",
        *MODEL,
        *STEPS,
        *data_flags("en-es"),
        "--config.train.log_every=100",
        f"--config.train.steps={args.base_steps}",
    )
    tune = [*MODEL, *STEPS, *data_flags("es-en"), f"--config.train.init_from={RUNS / 'base'}"]
    tune += [f"--config.train.steps={args.steps}", f"--config.train.eval_every={args.steps // 4}"]
    tune += [
        "--config.train.warmup_steps=50",
        "--config.train.log_every=25",
        f"--config.train.checkpoint_every={args.steps}",
    ]
    lora_flags = [f"--config.train.lora_rank={args.rank}", f"--config.train.lora_alpha={2 * args.rank}"]
    runs = {"base": base, "lora": train("lora", *tune, *lora_flags), "full": train("full", *tune)}
    out = REPO / args.out
    result = {
        "machine": provenance.machine(
            shlex.join(["python", "experiments/workflows/marian_lora.py", *(argv or sys.argv[1:])])
        ),
        "settings": vars(args),
        "runs": {},
    }
    for name, trained in runs.items():
        bleu = {pair: test_bleu(name, pair) for pair in PAIRS}
        result["runs"][name] = {"train": trained, "trainable_params": trainable(name), "test": bleu}
        (out / name).mkdir(parents=True, exist_ok=True)
        for file in RUN_FILES:
            shutil.copy(REPO / RUNS / name / file, out / name / file)
    plot(out)
    (out / "lora.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    shown = {name: {pair: round(r["test"][pair]["bleu"], 2) for pair in PAIRS} for name, r in result["runs"].items()}
    print(json.dumps({"written": str(out / "lora.json"), "test_bleu": shown}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
