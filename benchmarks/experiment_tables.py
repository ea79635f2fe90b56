"""The generated tables of the experiments' results (docs/experiments.md): their final evals and bible_en_es's
variants, checkpoint averaging and length penalties, from the files copied into experiments/results/."""

from __future__ import annotations

import json
from pathlib import Path

from table_format import RUNS, bench, machine_label, n, table

COMMANDS = {
    "reverse": "python run.py train",
    "add_seq2seq": "python run.py train --config=experiments/add_seq2seq.py",
    "shakespeare_char": "python run.py train --config=experiments/shakespeare_char.py",
    "bible_en_es": "python run.py train --config=experiments/bible_en_es.py",
    "passkey": "python run.py train --config=experiments/passkey.py --config.train.init_from=C8192",
}  # passkey: the last run of its curriculum (experiments/passkey.py, docs/long_context.md)


def experiments() -> list[str]:
    """The experiments' final evals, copied from their workdirs into experiments/results/NAME/."""
    rows = []
    for name, command in COMMANDS.items():
        for split in ("valid", "test"):
            path = RUNS / name / f"eval_{split}.json"
            if not path.is_file():
                continue
            e = json.loads(path.read_text())
            shown = [f"{k} {e[k]:.3f}" for k in ("exact_match", "token_accuracy") if k in e]
            shown += [f"{k} {n(e[k], 4)}" for k in ("loss", "bleu", "chrf") if k in e]
            minutes = n(e["train_minutes"]) if "train_minutes" in e else ""  # written by run.py train's final eval
            rows.append([name, f"`{command}`", split, e.get("step", ""), ", ".join(shown),
                         minutes, machine_label(e["machine"])])  # fmt: skip
    header = ["experiment", "command", "split", "step", "result (whole split)", "training minutes", "measured"]
    return table(header, rows)


def passkey() -> list[str]:
    """The passkey curriculum (experiments/passkey.py): each run's final evals, the last run's copied into
    experiments/results/passkey/ and the runs before it into experiments/results/passkey/stages/CONTEXT/."""
    folders = sorted((RUNS / "passkey" / "stages").glob("*/"), key=lambda p: int(p.name)) + [RUNS / "passkey"]
    rows = []
    for folder in folders:
        for split in ("valid", "test"):
            path = folder / f"eval_{split}.json"
            if not path.is_file():
                continue
            e, config = json.loads(path.read_text()), flat_config(folder)
            decoded = f"{e['generated_exact_match']:.3f}" if "generated_exact_match" in e else ""
            rows.append([f"{config['data.max_digits']:,}", f"`{e['machine']['command']}`", split, e["step"],
                         f"{e['exact_match']:.3f}", decoded, e["examples"], n(train_minutes(folder)),
                         machine_label(e["machine"])])  # fmt: skip
    header = ["context", "command", "split", "step", "exact match (teacher-forced)", "exact match (greedy decoding)",
              "examples", "training minutes", "measured"]  # fmt: skip
    return table(header, rows)


def flat_config(folder: Path) -> dict:
    """A run's config.json as {"section.field": value}."""
    flat = {}
    for section, fields in json.loads((folder / "config.json").read_text()).items():
        flat.update({f"{section}.{k}": v for k, v in fields.items()} if isinstance(fields, dict) else {section: fields})
    return flat


def bible_variants() -> list[str]:
    """bible_en_es's 20-minute runs: the experiment as committed (experiments/results/bible_en_es/) and each variant
    (experiments/results/bible_en_es/variants/NAME/, copied from its workdir), labelled by the config fields in
    which it differs from the committed run (model.vocab_size follows data.vocab_size: left out)."""
    committed, rows = flat_config(RUNS / "bible_en_es"), []
    for folder in [RUNS / "bible_en_es", *sorted((RUNS / "bible_en_es" / "variants").glob("*/"))]:
        valid, test = (folder / "eval_valid.json", folder / "eval_test.json")
        if not (valid.is_file() and test.is_file()):
            continue
        v, t, config = json.loads(valid.read_text()), json.loads(test.read_text()), flat_config(folder)
        # a field only the committed run records was added after the variant ran (at its default: the old behaviour)
        changed = sorted(k for k in {*config} - {"model.vocab_size"} if config[k] != committed.get(k, config[k]))
        flags = [f"`{k}={config.get(k)}`" for k in changed]
        rows.append([", ".join(flags) or "(the experiment as committed)", v["step"], n(train_minutes(folder)),
                     n(v["loss"], 4), n(v["bleu"], 4), f"{n(t['bleu'], 4)} ({n(t['chrf'], 4)})",
                     machine_label(v["machine"])])  # fmt: skip
    header = ["config fields changed from the committed run", "steps", "training minutes", "valid loss",
              "valid BLEU (greedy)", "test BLEU, beam 4 (chrF)", "measured"]  # fmt: skip
    return table(header, rows)


def train_minutes(folder: Path) -> float | None:
    """The training minutes of a run's last logged evaluation (metrics.jsonl)."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return next((r["train_minutes"] for r in reversed(records) if "train_minutes" in r), None)


def bible_averaging() -> list[str]:
    """The checkpoints100 run's last checkpoints averaged (`run.py eval --average=N`), valid and test split, copied
    into experiments/results/bible_en_es/variants/checkpoints100/average/eval_{valid,test}_N.json."""
    folder, rows = RUNS / "bible_en_es" / "variants" / "checkpoints100" / "average", []
    for valid in sorted(folder.glob("eval_valid_*.json"), key=lambda p: int(p.stem.split("_")[-1])):
        v, test = json.loads(valid.read_text()), folder / valid.name.replace("valid", "test")
        t = json.loads(test.read_text()) if test.is_file() else None
        steps = v.get("averaged_steps", [v["step"]])
        rows.append([len(steps), f"{min(steps)}-{max(steps)}", n(v["loss"], 4), n(v["bleu"], 4), n(v["chrf"], 4),
                     f"{n(t['bleu'], 4)} ({n(t['chrf'], 4)})" if t else "", f"`{v['machine']['command']}`",
                     machine_label(v["machine"])])  # fmt: skip
    header = ["checkpoints averaged", "steps", "valid loss", "valid BLEU, beam 4", "valid chrF", "test BLEU (chrF)",
              "command (valid)", "measured"]  # fmt: skip
    return table(header, rows)


def bible_length_penalty() -> list[str]:
    """The 16-row bible_en_es run's valid split decoded with beam 4 at several length penalties (`run.py eval
    --config.decode.length_penalty=A`, copied into experiments/results/bible_en_es/variants/batch16/length_penalty/)."""
    folder = RUNS / "bible_en_es" / "variants" / "batch16" / "length_penalty"
    evals = [json.loads(p.read_text()) for p in folder.glob("eval_valid_*.json")]
    rows = [[e["decode"]["length_penalty"], e["decode"]["beam_size"], e["step"], n(e["bleu"], 4), n(e["chrf"], 4),
             f"`{e['machine']['command']}`", machine_label(e["machine"])]
            for e in sorted(evals, key=lambda e: e["decode"]["length_penalty"])]  # fmt: skip
    return table(["length penalty", "beam", "step", "valid BLEU", "valid chrF", "command", "measured"], rows)


def _sft() -> dict | None:
    path = RUNS / "smollm2_sft" / "sft.json"
    return json.loads(path.read_text()) if path.is_file() else None


def smollm2_sft() -> list[str]:
    """experiments/workflows/smollm2_sft.py's figures (before and after the LoRA run), and LoRA against full fine-tuning
    from benchmarks/results/lora_cpu.json (benchmarks/lora.py)."""
    rows = []
    if d := _sft():
        label = machine_label(d["machine"])
        valid = [json.loads(line) for line in (RUNS / "smollm2_sft" / "metrics.jsonl").open()]
        valid = [r for r in valid if r.get("split") == "valid"]
        same = [r for r in valid if valid and r["tokens"] == valid[0]["tokens"]]  # the periodic evals' batches
        if same:
            rows.append([f"valid loss, assistant tokens, the same {same[0]['tokens']:,} tokens at step "
                         f"{same[0]['step']} / {same[-1]['step']}", n(same[0]["loss"], 4), n(same[-1]["loss"], 4),
                         label])  # fmt: skip
        if valid and valid[-1] not in same:
            last = valid[-1]
            rows.append([f"valid loss, the whole valid split ({last['tokens']:,} tokens), step {last['step']}", "",
                         n(last["loss"], 4), label])  # fmt: skip
        task = d["lm_eval"]["task"][0].split("=")[1]
        for metric in ("acc,none", "acc_norm,none"):
            before, after = (d["lm_eval"][w]["results"][task].get(metric) for w in ("before", "after"))
            rows.append([f"lm-eval `{task}` {metric.split(',')[0]}, 0-shot, {d['lm_eval']['limit']} questions",
                         n(before, 3), n(after, 3), label])  # fmt: skip
        total = 134515008
        rows.append([f"trainable parameters (rank 16, of {total:,})", "",
                     f"{d['trainable_params']:,} ({100 * d['trainable_params'] / total:.1f}%)", label])  # fmt: skip
        rows.append(["peft adapter folder / the base's transformers folder (bytes)", "",
                     f"{d['adapter_bytes']:,} / {d['base_bytes']:,}", label])  # fmt: skip
        if "peft" in d:
            tokens = sum(r["tokens"] for r in d["peft"]["rows"])
            rows.append([f"largest logit difference, peft on transformers vs txjax merged (float32, {tokens} tokens)",
                         "", f"{d['peft']['max_abs_diff']:.1e}", label])  # fmt: skip
    if b := bench("lora"):
        full, lora = (next(r for r in b["rows"] if r["variant"] == v) for v in ("full", "lora"))
        s = b["settings"]
        what = f"{s['batch_size']} x {s['seq_len']} tokens, {s['dtype']}"
        rows.append([f"peak RSS (MB), full fine-tuning / LoRA, {what}", n(full["peak_rss_mb"]), n(lora["peak_rss_mb"]),
                     machine_label(b["machine"])])  # fmt: skip
        rows.append([f"seconds a step, full fine-tuning / LoRA, {what}", n(full["ms_per_step"] / 1000),
                     n(lora["ms_per_step"] / 1000), machine_label(b["machine"])])  # fmt: skip
    return table(["SmolLM2-135M-Instruct, LoRA SFT", "before / full", "after / LoRA", "measured"], rows)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def smollm2_sft_generations() -> list[str]:
    """The held-out requests' replies (greedy, generate --chat) before and after the LoRA run."""
    d = _sft()
    requests = d["requests"] if d else []
    rows = [[_cell(r["request"]), _cell(r["reference"]), _cell(r["before"]), _cell(r["after"])] for r in requests]
    return table(["request (held out)", "reference", "before", "after"], rows)


def marian_lora() -> list[str]:
    """experiments/workflows/marian_lora.py's runs (experiments/results/marian_lora/lora.json): test BLEU (chrF) of
    the base and of its two fine-tunes in both directions, their trainable parameters, step time and peak RSS."""
    path = RUNS / "marian_lora" / "lora.json"
    d = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    what = {"base": "base: English -> Spanish", "lora": "LoRA r={rank} from the base: Spanish -> English",
            "full": "full fine-tune from the base: Spanish -> English"}  # fmt: skip
    total = d["runs"].get("full", {}).get("trainable_params")
    rows = []
    for name, r in d["runs"].items():
        t, load = r["train"], r["train"].get("load_average_1min")
        score = {pair: f"{e['bleu']:.2f} ({e['chrf']:.2f})" for pair, e in r["test"].items()}
        share = f" ({100 * r['trainable_params'] / total:.1f}%)" if total else ""
        step = n(t["ms_per_step_median"] / 1000) + (f" (load {load:.1f})" if load is not None else "")
        rows.append([what[name].format(**d["settings"]), t["step"], score["es-en"], score["en-es"],
                     f"{r['trainable_params']:,}{share}", step, n(t.get("peak_rss_mb")),
                     machine_label(d["machine"])])  # fmt: skip
    header = ["run", "steps", "test BLEU (chrF), es -> en", "test BLEU (chrF), en -> es",
              "trainable parameters", "seconds a step (median; load at start)", "peak RSS (MB), its training process",
              "measured"]  # fmt: skip
    return table(header, rows)
