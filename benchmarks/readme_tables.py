"""The tables of figures in README.md and docs/*.md, regenerated from the result files that commands wrote.

    python benchmarks/readme_tables.py           # rewrite the generated tables of README.md and docs/*.md in place
    python benchmarks/readme_tables.py --check   # exit 1 naming each table that differs (tests/test_readme_tables.py)

A generated table, in README.md or any docs/*.md page, is a line
`<!-- generated: python benchmarks/readme_tables.py (NAME) -->` and the table under it (the lines up to the first
that does not start with "|"). Its figures come from:
    benchmarks/results/*.json                    the benchmarks (common.save)
    experiments/ablations/results/*/results.csv  the sweeps (run.py sweep: txjax/sweep_report.py; results.json)
    experiments/results/NAME/eval_*.json         a run's evals (run.py train / run.py eval, copied from its workdir)
and every row says on which machine and day they were measured (txjax/provenance.py). Figures of different CPU
models stay in different rows: these machines change kind between days and timings move by 2x between kinds.
To change a figure, re-run its command; to change a table's shape, edit its function here.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "results"
SWEEPS = REPO / "experiments" / "ablations" / "results"
RUNS = REPO / "experiments" / "results"
MARKER = re.compile(r"<!-- generated: python benchmarks/readme_tables.py \((\w+)\) -->")
ABLATIONS = ["attention_scaling", "positional", "norm_placement", "tied_head", "activation", "num_heads"]
ABLATIONS += ["lr_schedule", "shakespeare_defaults", "bible_budget", "optimizers", "schedules", "model_options"]
SETTING_END = ("seed", "status")  # results.csv: run, the swept fields, seed, status, ...


def n(x, digits: int = 3) -> str:
    """A figure as the pages print it: 3 significant digits, thousands separated, '' when missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def machine_label(machine: dict) -> str:
    """'AMD EPYC 9B45, 2 cores, 2026-12-01' (+ the load when other work shared the cores: timings noisy)."""
    cpu = machine.get("cpu_model") or "CPU model not recorded"
    label = f"{cpu}, {machine.get('cpu_cores', '?')} cores, {machine.get('date', '?')[:10]}"
    load = machine.get("load_average_1min") or 0.0
    return label + (f", load {load:.1f}" if load > 1.5 * machine.get("cpu_cores", 1) else "")


def bench(name: str) -> dict | None:
    path = BENCH / f"{name}_cpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def target_tokens_per_s(row: dict) -> float:
    """A train benchmark row's target tokens/s (files written before issue 16 named it tokens_per_s)."""
    return row["target_tokens_per_s"] if "target_tokens_per_s" in row else row["tokens_per_s"]


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# ---- the tables ----------------------------------------------------------------------------------------------------


def ablations() -> list[str]:
    """Per sweep: valid loss per setting, mean ± sd over seeds, best first; the machine of its runs."""
    rows = []
    for name in ABLATIONS:
        path = SWEEPS / name / "results.csv"
        if not path.is_file():
            rows.append([f"`{name}`", "", "", "no results.csv: not re-run with `run.py sweep`", ""])
            continue
        runs = [r for r in csv.DictReader(path.open()) if r["status"] == "done"]
        fields = list(runs[0])
        fields = fields[1 : min(fields.index(f) for f in SETTING_END if f in fields)]
        groups = defaultdict(list)
        for r in runs:
            groups[r[fields[0]] if len(fields) == 1 else " ".join(f"{f}={r[f]}" for f in fields)].append(r)
        report = SWEEPS / name / "results.json"
        extra = json.loads(report.read_text())["metrics"][1:] if report.is_file() else []
        cells = []
        for setting, rs in sorted(
            groups.items(), key=lambda kv: statistics.mean(float(r["valid_loss"]) for r in kv[1])
        ):
            losses = [float(r["valid_loss"]) for r in rs]
            sd = f" ± {n(statistics.stdev(losses), 2)}" if len(losses) > 1 else ""
            more = "".join(f", {m} {n(statistics.mean(float(r[m]) for r in rs))}" for m in extra if rs[0].get(m))
            cells.append(f"{setting}: {n(statistics.mean(losses), 4)}{sd}{more}")
        cpus = sorted({r.get("cpu_model") or "CPU model not recorded" for r in runs})
        date = json.loads(report.read_text())["machine"]["date"][:10] if report.is_file() else "before 2026-12-01"
        seeds = max(len(rs) for rs in groups.values())
        rows.append([f"`{name}`", runs[0]["steps"], seeds, "; ".join(cells), f"{', '.join(cpus)}, {date}"])
    return table(
        ["sweep", "steps", "seeds", "valid loss by setting, best first (mean ± sd over seeds)", "measured"], rows
    )


MUP_HEADER = ["parametrization", "d_model", "best learning rate", "valid loss there", "measured"]


def mup() -> list[str]:
    """mup_transfer: per parametrization and width, the best peak learning rate (mean valid loss over seeds)."""
    path = SWEEPS / "mup_transfer" / "results.csv"
    if not path.is_file():
        return table(MUP_HEADER, [])
    runs = [r for r in csv.DictReader(path.open()) if r["status"] == "done"]
    losses = defaultdict(list)
    for r in runs:
        losses[r["parametrization"], int(r["d_model"]), float(r["learning_rate"])].append(float(r["valid_loss"]))
    date = json.loads((SWEEPS / "mup_transfer" / "results.json").read_text())["machine"]["date"][:10]
    cpus = ", ".join(sorted({r.get("cpu_model") or "CPU model not recorded" for r in runs}))
    rows = []
    for p, width in sorted({key[:2] for key in losses}, key=lambda k: (k[0] != "standard", k[1])):
        mean = {lr: statistics.mean(v) for (pp, w, lr), v in losses.items() if (pp, w) == (p, width)}
        best = min(mean, key=mean.get)
        rows.append([p, width, f"{best:g}", n(mean[best], 4), f"{cpus}, {date}"])
    return table(MUP_HEADER, rows)


def data() -> list[str]:
    d = bench("data")
    p, rss, loop = d["prepare"], d["peak_rss_mb"], d["loop_ms_per_step"]
    large_mb = p["workers_1"]["tokens"] / 1e6
    ratio = loop["shards"] / loop["memory"]
    rows = [
        [
            f"prepare, {w} worker{'s' * (w > 1)} ({n(large_mb)} M tokens)",
            f"{n(p[f'workers_{w}']['mb_per_s'])} MB/s, {n(p[f'workers_{w}']['tokens_per_s'] / 1e6)} M tokens/s",
            "",
        ]
        for w in (1, 2)  # fmt: skip
    ]
    rows += [
        [f"peak RSS of `run.py train` from shards, {d['corpus_gb']['small']} GB / {d['corpus_gb']['large']} GB corpus",
         f"{n(rss['small']['rss_mb'])} / {n(rss['large']['rss_mb'])} MB ({n(d['rss_gap_mb'])} MB apart)",
         "within 200 MB: " + ("met" if abs(d["rss_gap_mb"]) <= 200 else "missed")],
        [f"peak RSS of the in-memory loader (`data.kind=text`), {d['corpus_gb']['small']} GB corpus",
         f"{n(rss['text_in_memory_small']['rss_mb'])} MB", "(grows with the corpus)"],
        ["loader alone, windows / packed, tokens/s", f"{n(d['loader_tokens_per_s']['windows'])} / "
         f"{n(d['loader_tokens_per_s']['packed'])} ({n(d['loader_over_step'])}x the {n(d['step_tokens_per_s'])} the "
         "step consumes, packed)", ">= 20x: " + ("met" if d["loader_over_step"] >= 20 else "missed")],
        ["shakespeare_char training loop, ms/step, fed from shards / from memory",
         f"{n(loop['shards'])} / {n(loop['memory'])} ({ratio:.3f}x)", "within 5%: " + ("met" if ratio <= 1.05 else
         "missed")],
    ]  # fmt: skip
    return table(["what", "figure", "target", "measured"], [[*r, machine_label(d["machine"])] for r in rows])


def smollm2() -> list[str]:
    d = bench("smollm2_score_decode")
    s, dec = d["score"], d["decode_tokens_per_s"]
    label = machine_label(d["machine"])
    rows = [
        [f"tinyshakespeare valid perplexity, context {s['context']}, {s['txjax']['tokens']:,} tokens",
         n(s["txjax"]["perplexity"], 5), n(s["transformers"]["perplexity"], 5), label],
        ["nats per character / bits per byte", f"{n(s['txjax']['nats_per_char'], 5)} / "
         f"{n(s['txjax']['bits_per_byte'], 5)}", f"{n(s['transformers']['nats_per_char'], 5)} / "
         f"{n(s['transformers']['bits_per_byte'], 5)}", label],
        [f"batch-1 greedy decode, tokens/s, {dec['new_tokens']} new tokens", n(dec["txjax"]), n(dec["transformers"]),
         label],
    ]  # fmt: skip
    for run, what in (("smollm2_ft", "SmolLM2 fine-tuned"), ("shakespeare_char", "shakespeare_char from scratch")):
        path = RUNS / run / "eval_text.json"
        if path.is_file():
            e = json.loads(path.read_text())
            rows.append(
                [f"valid nats/char, {what} (`{run}`)", n(e["nats_per_char"], 4), "", machine_label(e["machine"])]
            )
    return table(["SmolLM2-135M (Q4_1 dequantized, float32)", "txjax", "transformers", "measured"], rows)


def train_speed() -> list[str]:
    rows = []
    for shape in ("shakespeare_char", "baby_gpt", "gpt2_small", "marian_small"):
        d = bench(f"train_{shape}")
        if d is None:
            continue
        ref = [r for r in d["rows"] if r["attention"] == "reference" and r["layers"] == "loop"] or d["rows"]
        by_dtype = {r["dtype"]: r for r in ref}
        default = next(r for r in d["rows"] if r["default"])
        rows.append([shape, n(by_dtype.get("float32", {}).get("ms_per_step")),
                     n(by_dtype.get("bfloat16", {}).get("ms_per_step")), n(target_tokens_per_s(default)),
                     n(default["mfu"], 2), machine_label(d["machine"])])  # fmt: skip
    header = ["shape (`python benchmarks/train.py --shape=S`)", "float32 ms/step", "bfloat16 ms/step"]
    return table(header + ["target tokens/s (default dtype)", "MFU", "measured"], rows)


def decode() -> list[str]:
    rows = []
    for shape in ("shakespeare_char", "gpt2_small"):
        d = bench(f"decode_{shape}_float32")
        if d is None:
            continue
        for i, r in enumerate(d["rows"]):
            recompute = n(r["recompute_tokens_per_s"]) + (" (est.)" if r["recompute"] == "est" else "")
            rows.append([shape if i == 0 else "", r["new_tokens"], n(r["cached_tokens_per_s"]),
                         n(r["cached_cpu_us_per_token"] / 1e3), recompute, f"{n(r['speedup'], 2)}x",
                         machine_label(d["machine"])])  # fmt: skip
    header = ["shape (`python benchmarks/decode.py --shape=S`)", "new tokens", "cached tokens/s"]
    return table(header + ["cached CPU ms/token", "recompute tokens/s", "speed-up", "measured"], rows)


def generation() -> list[str]:
    """Batched greedy generation and a split's beam search, txjax against transformers in one run each."""
    rows = []
    d = bench("batched_generation")
    for r in d["rows"] if d else []:
        bound = f"{n(r['txjax_of_bound'], 2)} / {n(r['transformers_of_bound'], 2)}" if "txjax_of_bound" in r else ""
        rows.append([f"{r['model']}, greedy, {d['new_tokens']} new tokens: tokens/s", r["batch"], r["prompts"],
                     n(r["txjax_tokens_per_s"]), n(r["transformers_tokens_per_s"]), f"{n(r['ratio'], 2)}x", bound,
                     machine_label(d["machine"])])  # fmt: skip
    d = bench("beam_split")
    if d:
        per_side = lambda side: max((r for r in d["rows"] if r["side"] == side), key=lambda r: r["sentences_per_s"])
        ours, theirs = per_side("txjax"), per_side("transformers")
        rows.append([f"marian_small, beam {d['beam_size']}, the {d['sentences']} test sources, {d['new_tokens']} "
                     "new tokens each: sentences/s",
                     f"{ours['batch']} / {theirs['batch']}", "sorted", n(ours["sentences_per_s"]),
                     n(theirs["sentences_per_s"]), f"{n(d['ratio_best'], 2)}x", "",
                     machine_label(d["machine"])])  # fmt: skip
    header = ["workload", "batch (txjax / transformers)", "prompts", "txjax", "transformers", "ratio"]
    return table(header + ["of the float32 bound (txjax / transformers)", "measured"], rows)


def peers() -> list[str]:
    """txjax against transformers, each pair from files of one machine."""
    rows = []
    marian, hf = bench("train_marian_small"), bench("peer_hf_train")
    if marian and hf:
        tx = next(r for r in marian["rows"] if r["default"])
        rows.append(["Marian-size translation training, target tokens/s", n(target_tokens_per_s(tx)),
                     n(hf["marian_target_tokens_per_s"]), "`python benchmarks/train.py --shape=marian_small`, "
                     "`python benchmarks/peer_hf.py --what=train`",
                     f"{machine_label(marian['machine'])} / {machine_label(hf['machine'])}"])  # fmt: skip
    hf = bench("peer_hf_train_decode")
    for shape in ("shakespeare_char", "gpt2_small"):
        d = bench(f"decode_{shape}_float32")
        if d and hf:
            rows.append([f"cached greedy decoding, {shape}, 256 new tokens, tokens/s",
                         n(next(r for r in d["rows"] if r["new_tokens"] == 256)["cached_tokens_per_s"]),
                         n(hf[f"{shape}_tokens_per_s"]), f"`python benchmarks/decode.py --shape={shape}`, "
                         "`python benchmarks/peer_hf.py`", f"{machine_label(d['machine'])} / "
                         f"{machine_label(hf['machine'])}"])  # fmt: skip
    bible, hf = RUNS / "bible_en_es" / "eval_test.json", bench("peer_hf_bleu")
    if bible.is_file() and hf:
        e = json.loads(bible.read_text())
        rows.append(["En-Es test BLEU (chrF), beam 4, after 20 minutes of training", f"{n(e['bleu'])} ({n(e['chrf'])})",
                     f"{n(hf['marian_bleu']['bleu_beam4'])} ({n(hf['marian_bleu']['chrf_beam4'])})",
                     "`python run.py eval --workdir=runs/bible --split=test`, `python benchmarks/peer_hf.py "
                     "--what=bleu`", f"{machine_label(e['machine'])} / {machine_label(hf['machine'])}"])  # fmt: skip
    return table(["task", "txjax", "transformers", "commands", "measured (txjax / transformers)"], rows)


def experiments() -> list[str]:
    """The experiments' final evals, copied from their workdirs into experiments/results/NAME/."""
    rows = []
    for name, command in (
        ("reverse", "python run.py train"),
        ("add_seq2seq", "python run.py train --config=experiments/add_seq2seq.py"),
        ("shakespeare_char", "python run.py train --config=experiments/shakespeare_char.py"),
        ("bible_en_es", "python run.py train --config=experiments/bible_en_es.py"),
    ):
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


TABLES = {
    f.__name__: f
    for f in (
        *(ablations, mup, data, smollm2, train_speed, decode, generation, peers),
        *(experiments, bible_variants, bible_averaging, bible_length_penalty),
    )
}


def pages() -> list[Path]:
    """The markdown files whose generated tables this script keeps: README.md and every docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def render(readme: str, name: str = "README.md") -> str:
    """A page's text with every generated table replaced by what its function makes of today's result files."""
    lines, out, i = readme.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        match = MARKER.fullmatch(lines[i].strip())
        i += 1
        if match:
            if match.group(1) not in TABLES:
                raise SystemExit(f"{name}: unknown generated table {match.group(1)!r}; one of {sorted(TABLES)}")
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            out += TABLES[match.group(1)]()
    return "\n".join(out) + "\n"


def differing(readme: str, name: str = "README.md") -> list[str]:
    """The names of the generated tables whose text in one page differs from the result files."""
    new = render(readme, name)
    spans = lambda text: dict(re.findall(r"<!-- generated: [^(]*\((\w+)\) -->\n((?:\|.*\n)*)", text))
    old, fresh = spans(readme), spans(new)
    return [name for name in fresh if old.get(name) != fresh[name]]


def generated(text: str) -> list[str]:
    """The names of a page's generated tables, in order."""
    return [m.group(1) for line in text.splitlines() if (m := MARKER.fullmatch(line.strip()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's tables differ from the result files")
    args = parser.parse_args()
    bad = []
    for path in pages():
        name, text = str(path.relative_to(REPO)), path.read_text()
        if not generated(text):
            continue
        if args.check:
            bad += [f"{name} ({table})" for table in differing(text, name)]
        else:
            new = render(text, name)
            if new != text:
                path.write_text(new)
                print(f"wrote {name}")
    if args.check:
        if bad:
            sys.exit(f"tables {', '.join(bad)} differ from their result files; run python {__file__}")
        print("the generated tables of README.md and docs/*.md agree with the result files")


if __name__ == "__main__":
    main()
