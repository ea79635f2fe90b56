"""The tables of figures in README.md and docs/*.md, regenerated from the result files that commands wrote.

    python benchmarks/readme_tables.py           # rewrite the generated tables of README.md and docs/*.md in place
    python benchmarks/readme_tables.py --check   # exit 1 naming each table that differs (tests/test_readme_tables.py)

A generated table, in README.md or any docs/*.md page, is a line
`<!-- generated: python benchmarks/readme_tables.py (NAME) -->` and the table under it (the lines up to the first
that does not start with "|"). Its figures come from:
    benchmarks/results/*.json                    the benchmarks (common.save; scale_table.py's cells)
    experiments/ablations/results/*/results.csv  the sweeps (run.py sweep: txjax/sweep/report.py; results.json)
    experiments/results/NAME/eval_*.json         a run's evals (run.py train / run.py eval, copied from its workdir)
and every row says on which machine and day they were measured (txjax/ops/provenance.py). Figures of different CPU
models stay in different rows: these machines change kind between days and timings move by 2x between kinds.
To change a figure, re-run its command; to change a table's shape, edit its function here (the experiments' in
experiment_tables.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when a test loads this file
import gpu_summary  # noqa: E402
from ablation_tables import family_comparison, local_global, local_global_step, rope_extension  # noqa: E402
from architecture_tables import kv_cache, linear_layers, mtp  # noqa: E402
from attention_tables import attention_time, local_attention  # noqa: E402
from convert_tables import families  # noqa: E402
from data_tables import data, prepare_memory  # noqa: E402
from experiment_tables import (  # noqa: E402
    bible_averaging,
    bible_length_penalty,
    bible_variants,
    experiments,
    marian_lora,
    passkey,
    smollm2_sft,
    smollm2_sft_generations,
)
from scale_tables import scale, scale_decode, scale_search  # noqa: E402
from table_format import BENCH, REPO, RUNS, bench, machine_label, n, table, target_tokens_per_s  # noqa: E402

SWEEPS = REPO / "experiments" / "ablations" / "results"
MARKER = re.compile(r"<!-- generated: python benchmarks/readme_tables.py \((\w+)\) -->")
ABLATIONS = ["attention_scaling", "positional", "norm_placement", "tied_head", "activation", "num_heads"]
ABLATIONS += ["lr_schedule", "shakespeare_defaults", "bible_budget", "optimizers", "schedules", "model_options"]
ABLATIONS += ["local_global", "moe"]
SETTING_END = ("seed", "status")  # results.csv: run, the swept fields, seed, status, ...


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


def asha() -> list[str]:
    """benchmarks/sweep_asha.py: per sweep of the learning-rate grid, the best rate found, steps and wall time."""
    d = bench("sweep_asha")
    header = ["sweep", "best learning rate", "its valid loss", "steps trained", "runs stopped", "wall time", "measured"]
    if d is None:
        return table(header, [])
    rows = [
        [s["sweep"], f"{s['best_learning_rate']:g}", n(s["best_valid_loss"], 4), s["total_steps"], s["stopped"],
         f"{s['wall_s']:.0f} s", machine_label(d["machine"])]
        for s in d["sweeps"]
    ]  # fmt: skip
    return table(header, rows)


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


def lm_eval() -> list[str]:
    """txjax as an lm-evaluation-harness model against the harness's hf model on the same GGUF and requests
    (benchmarks/lm_eval_hf.py, and with --num_fewshot=5: lm_eval_5shot_cpu.json)."""
    rows = []
    for name in ("lm_eval", "lm_eval_5shot"):
        d = bench(name)
        if d is None:
            continue
        acc = "; ".join(
            f"{task} {metric.split(',')[0]} {n(pair[0])} / {n(pair[1])}"
            for task, metrics in d["metrics_txjax_hf"].items()
            for metric, pair in metrics.items()
            if metric.startswith(("acc,", "exact_match,", "word_perplexity,"))
        )
        ours, theirs = d["speed"]["txjax"], d["speed"]["hf"]
        rolling = d.get("rolling_max_abs_delta_nats")
        rows.append([f"{', '.join(d['tasks'])}, {d['num_fewshot']}-shot", d["loglikelihood_requests"],
                     f"{d['max_abs_delta_nats']:.1e}", f"{rolling:.1e}" if rolling else "",
                     d["greedy_flags_differing"], d.get("generated_texts_differing", ""), acc,
                     f"{n(ours['tokens_per_s'])} / {n(theirs['tokens_per_s'])}",
                     f"{n(d['speed']['ratio_tokens_per_s'], 3)}x", machine_label(d["machine"])])  # fmt: skip
    header = ["tasks", "loglikelihood requests", "max abs Δ (nats)", "rolling: max abs Δ (nats, per text)"]
    header += ["is-greedy differing", "generated texts differing", "metrics txjax / hf"]
    return table(header + ["tokens/s txjax / hf", "ratio", "measured"], rows)


def gpu() -> list[str]:
    """The last `bash benchmarks/gpu.sh` run on a CUDA machine (benchmarks/results/gpu/, read by gpu_summary.py)."""
    folder = BENCH / "gpu"
    header = ["workload", "txjax", "against", "first step (compile) s", "XLA_FLAGS", "measured"]
    if not (folder / "stages.tsv").is_file():
        return table(header, [["no GPU run yet: `bash benchmarks/gpu.sh` on a CUDA machine", "", "", "", "", ""]])
    s = gpu_summary.summary(folder)
    m = s.get("machine", {})
    label = f"{m.get('device_kind')}, {m.get('driver', '')}, jax {m.get('jax')}, {m.get('date', '?')[:10]}"
    rows = [[f"train {r['shape']}, batch {r['batch']}, {r['dtype']}, attention {r['attention']}, {r['layers']}"
             f" ({r['file']})", f"{n(r['ms_per_step'])} ms/step, {n(r['tokens_per_s'])} tokens/s",
             f"MFU {n(r['mfu'], 2)}", n(r["first_step_s"]), f"`{r['xla_flags']}`" if r["xla_flags"] else "",
             label] for r in s["train"]]  # fmt: skip
    for r in s["decode"]:
        peers = [f"eager {n(r['transformers_tokens_per_s'])} ({n(r['ratio'], 2)}x)"]
        if "transformers_static_tokens_per_s" in r:
            peers.append(f"static cache {n(r['transformers_static_tokens_per_s'])} ({n(r['ratio_static'], 2)}x)")
        rows.append([f"greedy {r['model']}, batch {r['batch']}", f"{n(r['txjax_tokens_per_s'])} tokens/s",
                     "transformers " + ", ".join(peers), "", "", label])  # fmt: skip
    return table(header, rows)


def long_context() -> list[str]:
    """Peak memory and tokens/s of a batch-1 train step per context: blockwise attention (measured, or XLA's figure
    where marked) against the reference attention (memory_cpu.json) and XLA's figure per device on mesh.sequence=4."""
    ref = {(r["context"], r["remat"]): r for r in (bench("memory") or {"rows": []})["rows"]}
    ring = bench("memory_shakespeare_char_blockwise_sequence") or {"rows": []}
    split = {("shakespeare_char", r["context"], r["remat"], r["sequence"]): r["xla_estimate_gb"] for r in ring["rows"]}
    rows = []
    for shape in ("shakespeare_char", "gpt2_small"):
        d = bench(f"memory_{shape}_blockwise")
        if d is None:
            continue
        slopes = d.get("gb_per_1k_tokens", {})
        for r in d["rows"]:
            gb = f"{n(r['peak_gb'])} GB" if r.get("peak_gb") is not None else f"{n(r['xla_estimate_gb'])} GB (XLA)"
            theirs = ref.get((r["context"], r["remat"]), {}) if shape == "shakespeare_char" else {}
            reference = theirs.get("peak_gb") or theirs.get("xla_estimate_gb")
            ref_gb = "" if reference is None else f"{n(reference)} GB" + " (XLA)" * (theirs.get("peak_gb") is None)
            slope = slopes.get(str(r["remat"]), {}).get("gb_per_1k")
            one, four = (split.get((shape, r["context"], r["remat"], k)) for k in (1, 4))
            ring_gb = f"{n(one)} / {n(four)} GB" if one and four else ""
            rows.append([shape, f"{r['context']:,}", "on" if r["remat"] else "off", gb, ref_gb, ring_gb,
                         n(r.get("tokens_per_s")), n(slope, 2), machine_label(d["machine"])])  # fmt: skip
    header = ["shape", "context", "remat", "peak, blockwise", "peak, reference", "XLA: 1 / 4 devices (sequence)"]
    header += ["tokens/s", "GB per 1k tokens"]
    return table(header + ["measured"], rows)


def score_text_memory() -> list[str]:
    d = bench("score_text_memory")
    rows = [[f"{n(r['text_mb'])} MB" + (f" (stopped after {n(r['seconds'])} s)" if r.get("stopped") else ""),
             f"{n(r.get('read_mb', r['text_mb']))} MB", n(r["tokens"]) if r["tokens"] else "", n(r["peak_rss_gb"]),
             _resident(r.get("trace", [])), n(r["seconds"]), machine_label(d["machine"])]
            for r in d["rows"]]  # fmt: skip
    head = ["text", "read", "tokens scored", "peak RSS (GB)", "resident after 5 MB (GB)", "seconds", "measured"]
    return table(head, rows)


def _resident(trace: list) -> str:
    """The least and most resident memory sampled once 5 MB of the text were read (a row's trace)."""
    along = [gb for mb, gb in trace if mb >= 5]
    return f"{min(along):.2f}-{max(along):.2f}" if along else ""


TABLES = {
    f.__name__: f
    for f in (
        *(ablations, mup, asha, data, smollm2, train_speed, decode, generation, peers, gpu, lm_eval, long_context),
        *(prepare_memory, score_text_memory, attention_time, local_attention, families),
        *(passkey, local_global, local_global_step, rope_extension, family_comparison, kv_cache, linear_layers, mtp),
        *(experiments, bible_variants, bible_averaging, bible_length_penalty, smollm2_sft, smollm2_sft_generations),
        *(marian_lora, scale, scale_decode, scale_search),
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
