"""txjax as an lm-evaluation-harness model against the harness's own `hf` model (transformers) on a small random
Llama and the shipped local tasks (experiments/lm_eval): every request's log-likelihood and is-greedy flag, the
generated texts, the accuracies (and the log-likelihoods of Llama 3, windowed Mistral, Qwen3, SmolLM3, GPT-OSS,
DeepSeek-V3 and Llama 4 models);
perplexity windows against `run.py eval --text`'s; the CLI's one-line errors. Skipped without the lmeval and
interop extras."""

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from tiny_hf import save_tiny_decoder  # noqa: E402

import run  # noqa: E402
from txjax import families  # noqa: E402
from txjax.config import ConfigError  # noqa: E402
from txjax.evaluate import lm_eval_model  # noqa: E402
from txjax.evaluate.lm_eval_model import TxjaxLM, bucket_length, pack, token_windows  # noqa: E402
from txjax.evaluate.lm_eval_tasks import load_tasks  # noqa: E402
from txjax.evaluate.score_text import score_tokens  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.config import ModelConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "experiments" / "lm_eval"
TEXT = "".join(open(TASKS / name).read() for name in ("capitals.jsonl", "sums.jsonl", "paragraphs.jsonl")) * 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random Llama with a byte-level BPE tokenizer that adds BOS (as Llama's), 96 positions."""
    root = tmp_path_factory.mktemp("llama") / "hf"
    save_tiny_decoder(root, TEXT, vocab_size=400, max_positions=96)
    return root


@pytest.fixture(scope="module")
def workdir(folder, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("runs") / "llama"
    text = folder.parent / "text.txt"
    text.write_text(TEXT)
    flags = [f"--config.data.path={text}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={folder}", f"--workdir={workdir}", *flags]) == 0
    return workdir


@pytest.fixture(scope="module")
def models(folder, workdir):
    hf = HFLM(
        pretrained=transformers.AutoModelForCausalLM.from_pretrained(folder).eval(),
        tokenizer=transformers.AutoTokenizer.from_pretrained(folder),
        batch_size=8,
        device="cpu",
    )
    return TxjaxLM(run=load_workdir(workdir), batch_size=8), hf


def evaluate(lm, tasks):
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)  # the shipped tasks only: fast
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0)


@pytest.fixture(scope="module")
def results(monkeypatch_module, models):
    """The shipped multiple-choice and generation tasks through the harness with txjax and with hf."""
    return [evaluate(lm, ["txjax_capitals", "txjax_sums"]) for lm in models]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)  # the YAMLs' data_files are relative to the repo root
        yield mp


def test_bucket_lengths_packing_and_text_windows():
    assert [bucket_length(n, 96) for n in (1, 16, 17, 40, 64, 65, 96)] == [16, 16, 32, 64, 64, 96, 96]
    lengths = [5, 300, 200, 90, 90, 90, 1, 600, 60]
    rows = pack(lengths, 1024)
    assert sorted(i for _, members in rows for i, _ in members) == list(range(len(lengths)))
    for length, members in rows:  # each request inside its row, none overlapping
        spans = sorted((offset, offset + lengths[i]) for i, offset in members)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] <= length
    assert [length for length, _ in rows] == [1024, 256, 256, 256]  # (600 300), (200), (90 90), (90 60 5 1)
    ids = list(range(10))
    windows = token_windows(ids, 4)
    assert [len(c) for c, _ in windows] == [1, 1, 1] and sum(map(len, (w for _, w in windows))) == 9
    assert [c + w for c, w in windows] == [ids[0:5], ids[4:9], ids[8:10]]


def test_every_request_equals_the_hf_model(results, models):
    """Multiple choice and generation on the shipped tasks: per-request (log-likelihood, is_greedy) within 1e-4
    nats, equal flags, texts and accuracies; few programs for many request lengths."""
    ours, hf = results
    lengths, worst = set(), 0.0
    for task in ("txjax_capitals", "txjax_sums"):
        for a, b in zip(ours["samples"][task], hf["samples"][task], strict=True):
            assert a["doc"] == b["doc"]
            for (ra,), (rb,) in zip(a["resps"], b["resps"], strict=True):
                if task == "txjax_sums":
                    assert ra == rb
                else:
                    assert ra[1] == rb[1]
                    worst = max(worst, abs(ra[0] - rb[0]))
            lengths.add(len(a["arguments"][0][0]))
        assert ours["results"][task] == hf["results"][task]
    assert 0 < worst < 1e-4
    assert models[0].speed()["programs"] <= 3 < len(lengths)


def test_rolling_uses_the_windows_of_eval_text(models):
    """Perplexity: the summed log-likelihood of a text over several windows is minus eval --text's summed CE."""
    lm = models[0]
    text = open(TASKS / "paragraphs.jsonl").read()
    ids = lm.tokenizer.prefix() + lm.tokenizer.encode(text)
    assert len(ids) > 2 * lm.max_length
    (total,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    metrics = score_tokens(lm.model, lm.params, ids, context=lm.max_length, batch_size=4)
    np.testing.assert_allclose(-total, metrics["loss"] * metrics["tokens"], rtol=1e-5)
    assert metrics["tokens"] == len(ids) - 1


@pytest.mark.parametrize(
    "kind", ["llama3", "mistral_window", "qwen3", "smollm3", "gpt_oss", "deepseek_v3_moe", "llama4_text"]
)
def test_newer_families_score_requests_as_the_hf_model(kind, tmp_path):
    """Llama 3 (rope scaling llama3), Mistral (a window of 8 tokens, shorter than the requests), Qwen3 (q/k
    norms), SmolLM3 (a NoPE layer), GPT-OSS (sinks, a 4-token window, biased experts), DeepSeek-V3 (MLA, YaRN, a dense
    then an MoE layer) and Llama 4 (NoPE and chunked RoPE layers, dense and MoE layers alternating), each a random model
    imported with `run.py import`: the capitals task's multiple-choice requests get the harness's `hf` model's
    log-likelihoods within 1e-4 nats and its is-greedy flags."""
    save_tiny_decoder(tmp_path / "hf", TEXT, vocab_size=400, max_positions=96, kind=kind)
    (tmp_path / "text.txt").write_text(TEXT)
    flags = [f"--config.data.path={tmp_path / 'text.txt'}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={tmp_path / 'hf'}", f"--workdir={tmp_path / 'wd'}", *flags]) == 0
    hf = HFLM(
        pretrained=transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval(),
        tokenizer=transformers.AutoTokenizer.from_pretrained(tmp_path / "hf"),
        batch_size=8,
        device="cpu",
    )
    ours = TxjaxLM(run=load_workdir(tmp_path / "wd"), batch_size=8)
    docs = [json.loads(line) for line in open(TASKS / "capitals.jsonl")][:4]
    requests = [
        Instance("loglikelihood", doc, (f"Question: {doc['question']}\nAnswer:", f" {choice}"), i)
        for doc in docs
        for i, choice in enumerate(doc["choices"])
    ]
    assert max(len(ours.tokenizer.encode(r.args[0] + r.args[1])) for r in requests) > 8  # past Mistral's window
    got, want = ours.loglikelihood(requests), hf.loglikelihood(requests)
    assert [g for _, g in got] == [g for _, g in want]
    np.testing.assert_allclose([ll for ll, _ in got], [ll for ll, _ in want], atol=1e-4, rtol=0)


def test_cli_prints_the_table_and_one_json_line(monkeypatch, workdir, results, tmp_path, capsys):
    monkeypatch.chdir(REPO)
    output = tmp_path / "results.json"
    flags = ["--tasks=txjax_capitals,txjax_paragraphs", f"--include_path={TASKS}", f"--output={output}"]
    assert run.main(["lm-eval", f"--workdir={workdir}", *flags]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("|") and "txjax_capitals" in line for line in lines)
    summary = json.loads(lines[-1])
    expected = results[1]["results"]["txjax_capitals"]  # the hf model's
    assert summary["results"]["txjax_capitals"]["acc,none"] == expected["acc,none"]
    assert math.isfinite(summary["results"]["txjax_paragraphs"]["word_perplexity,none"])
    assert summary["txjax"]["tokens_per_second"] > 0 and "--model txjax" in summary["harness"]
    assert json.loads(output.read_text())["results"].keys() == summary["results"].keys()
    # an --output that cannot be written (its folder is a file): the results printed, then one error line naming it
    unwritable = tmp_path / "results.json" / "again.json"
    assert run.main(["lm-eval", f"--workdir={workdir}", *flags[:2], f"--output={unwritable}", "--limit=2"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["results"].keys() == summary["results"].keys()
    assert err.strip().splitlines()[-1].startswith(f"error: cannot write --output={unwritable} ({unwritable}: Not a")


def test_cli_errors_are_one_line(monkeypatch, workdir, tmp_path, capsys):
    monkeypatch.chdir(REPO)
    (tmp_path / "missing.yaml").write_text(
        (TASKS / "txjax_capitals.yaml").read_text().replace("txjax_capitals", "gone").replace("capitals", "gone")
    )
    with pytest.raises(ConfigError, match="no task 'no_such_task'.*--include_path=DIR"):
        load_tasks(TaskManager(include_path=str(TASKS), include_defaults=False), ["no_such_task"])
    for flags, words in [
        ([f"--include_path={tmp_path}", "--tasks=gone"], "task 'gone': its dataset could not be read"),
        (["--include_path=nowhere", "--tasks=gone"], "--include_path=nowhere is not a folder"),
    ]:
        assert run.main(["lm-eval", f"--workdir={workdir}", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and words in err[-1], err
    # the harness's own CLI (python -m txjax.evaluate.lm_eval_model) on a task whose dataset it cannot read (a hub
    # task offline): the same line
    harness = ["--model", "txjax", "--model_args", f"workdir={workdir}", "--include_path", str(tmp_path)]
    assert lm_eval_model.main([*harness, "--tasks", "gone"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: task 'gone': its dataset could not be read"), err


@pytest.mark.parametrize("family", ["encoder_decoder", "prefix_lm"])
def test_refuses_a_model_whose_output_is_a_new_text(family):
    """lm-eval scores a text continuing another: a family that writes a new text from a source is refused in one
    line, before anything is read or compiled (Family.check_scores_text)."""
    run = types.SimpleNamespace(model=families.build(family, ModelConfig(vocab_size=8, max_len=8)))
    with pytest.raises(ConfigError, match=f"^the run is of family {family}: lm-eval scores decoder-only LMs$"):
        TxjaxLM(run=run)
