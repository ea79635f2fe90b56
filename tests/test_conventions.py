"""Conventions users bring from other tools: temperature 0 is greedy (vLLM, llama.cpp, `transformers serve`); a
missing optional package is one line naming the extra that installs it."""

import sys
from pathlib import Path

import pytest
from test_decode import EOS, LM_PROMPTS, lm, lm_greedy

import run
from txjax import config as config_lib
from txjax import decode
from txjax.convert.gguf import GGUFFile, tokenizer_from_gguf
from txjax.convert.hf_folder import read_tokenizer
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.data.tokenizers import ByteLevelBPETokenizer
from txjax.extras import MissingExtra

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- temperature 0 is greedy


@pytest.mark.parametrize(
    "options",
    [
        {"method": "sample", "temperature": 0},
        {"method": "sample", "temperature": 0.0, "top_k": 3, "top_p": 0.5},  # greedy ignores top_k and top_p
        {"temperature": 0},  # the default method (greedy) takes it too
    ],
)
def test_temperature_zero_generates_what_greedy_does(options):
    model, params = lm("rope")
    out = decode.generate(model, params, LM_PROMPTS, max_new_tokens=10, eos_id=EOS, seed=5, **options)
    assert out.ids == lm_greedy().ids
    # the same Strategy as method greedy, so the same compiled program (no division by zero in it)
    assert decode.Strategy(max_new_tokens=10, eos_id=EOS, **options) == decode.Strategy(max_new_tokens=10, eos_id=EOS)


def test_temperature_zero_errors():
    with pytest.raises(ValueError, match=r"^temperature=0 is greedy, one text per prompt: num_samples=3 must be 1"):
        decode.Strategy(max_new_tokens=4, method="sample", temperature=0, num_samples=3)
    with pytest.raises(ValueError, match=r"^temperature=-0.5 must be >= 0 \(0 = greedy\)$"):
        decode.Strategy(max_new_tokens=4, method="sample", temperature=-0.5)
    with pytest.raises(ValueError, match="temperature applies to method='sample', not method='beam'"):
        decode.Strategy(max_new_tokens=4, method="beam", temperature=0)


def test_a_decode_section_with_temperature_zero_is_greedy():

    section = config_lib.base_config().decode
    section.update(method="sample", temperature=0.0, top_k=40)  # what --config.decode.temperature=0 writes
    assert decode.strategy_from_config(section, 7) == {"method": "greedy", "max_new_tokens": 64, "eos_id": 7}
    # --temperature=0 alone picks a method the way --temperature=0.8 alone picks sampling: here, greedy
    assert decode.strategy_from_config(config_lib.base_config().decode, 7, temperature=0)["method"] == "greedy"


def test_every_decoding_option_has_a_config_default_and_a_generate_flag_of_its_type():
    # one list (decode.strategy.METHOD_OPTIONS): a new option without a default or a flag fails here
    from txjax.cli.generate import OPTIONS

    defaults = config_lib.base_config().decode
    for method, options in decode.strategy.METHOD_OPTIONS.items():
        for name in options:
            assert name in OPTIONS and name in defaults, (method, name)
            assert (
                decode.Strategy(max_new_tokens=1, method=method, **{name: defaults[name]}).option(name)
                == defaults[name]
            )


def test_a_saved_tokenizer_of_every_kind_is_loadable_and_an_unknown_kind_is_one_line(tmp_path):
    from txjax.data import tokenizers

    assert set(tokenizers.TOKENIZER_KINDS) <= set(config_lib.TOKENIZERS)
    classes = [c for c in vars(tokenizers).values() if isinstance(c, type) and issubclass(c, tokenizers.Tokenizer)]
    assert {c.kind for c in classes if c is not tokenizers.Tokenizer} == set(tokenizers.TOKENIZER_KINDS)
    (tmp_path / "tokenizer.json").write_text('{"kind": "wordpiece"}')
    with pytest.raises(ValueError, match="unknown tokenizer kind 'wordpiece' .expected one of byte, char"):
        tokenizers.load_tokenizer(tmp_path)


def test_run_py_generate_temperature_zero_prints_the_greedy_text(monkeypatch, capsys):
    import txjax.cli.generate
    from txjax import config as config_lib
    from txjax.data import CharTokenizer
    from txjax.experiment import TrainedRun

    model, params = lm("rope")
    config = config_lib.base_config()
    config.decode.update(max_new_tokens=6, top_k=5, num_samples=1)
    fake_run = TrainedRun(config, model, CharTokenizer("0123456789", specials=True), params, 0)
    monkeypatch.setattr(txjax.cli.generate, "load_workdir", lambda workdir, average=1: fake_run)

    printed = {}
    for flags in (["--method=greedy"], ["--temperature=0"], ["--temperature=0", "--seed=9"], ["--temperature=1.5"]):
        assert run.main(["generate", "--workdir=unused", "--prompt=3141", *flags]) == 0
        printed[" ".join(flags)] = capsys.readouterr().out
    assert printed["--temperature=0"] == printed["--temperature=0 --seed=9"] == printed["--method=greedy"]
    assert printed["--temperature=1.5"] != printed["--method=greedy"]  # a temperature > 0 still samples

    assert run.main(["generate", "--workdir=unused", "--prompt=3141", "--temperature=-1"]) == 2
    assert capsys.readouterr().err == "error: temperature=-1.0 must be >= 0 (0 = greedy)\n"


def test_the_docs_translation_command_runs_as_written_on_a_workdir_asking_more_than_its_context(monkeypatch, capsys):
    """docs/decoding.md's bible command, on an encoder-decoder whose saved decode section asks for more tokens than
    its context holds (bible workdirs trained with max_new_tokens 160 > max_len 128): a note, then the text."""
    import shlex

    from test_decode import seq2seq

    import txjax.cli.generate
    from txjax import config as config_lib
    from txjax.data import CharTokenizer
    from txjax.experiment import TrainedRun

    docs = (REPO / "docs" / "decoding.md").read_text().splitlines()
    command = shlex.split(next(line for line in docs if line.startswith("python run.py generate --workdir=runs/bible")))
    prompt = command[-1].removeprefix("--prompt=")
    tokenizer = CharTokenizer(prompt, specials=True)
    model, params = seq2seq(vocab_size=tokenizer.vocab_size, max_len=64)
    config = config_lib.load_config(REPO / "experiments" / "bible_en_es.py")
    config.decode.max_new_tokens = 160  # as bible workdirs trained before the experiment said 128
    fake_run = TrainedRun(config, model, tokenizer, params, 0)
    monkeypatch.setattr(txjax.cli.generate, "load_workdir", lambda workdir, average=1: fake_run)
    assert run.main(command[2:]) == 0
    out = capsys.readouterr()
    assert out.err == "note: max_new_tokens=160 is more than the output's context (max_len=64): at most 64 tokens\n"
    assert out.out.endswith("\n")  # the translation's line (a random model's may be empty: it may emit EOS first)


# ---------------------------------------------------------------- a missing optional package is one line

INSTALL = "(the interop extra): pip install -e '.[interop]'"


def test_every_optional_module_names_an_extra_of_pyproject():
    """txjax.extras.EXTRAS (module -> extra) is pyproject.toml's optional-dependencies, test tools aside."""
    import re
    from pathlib import Path

    from txjax.extras import EXTRAS

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = {
        (re.split(r"[<>=~!\[; ]", spec)[0].replace("-", "_"), extra)  # lm-eval installs lm_eval
        for extra, specs in pyproject["project"]["optional-dependencies"].items()
        for spec in specs
        if extra != "test"
    }
    assert set(EXTRAS.items()) == declared


def blocked(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError, as if not installed


@pytest.mark.parametrize(
    "module, call, what",
    [
        ("gguf", lambda tmp: GGUFFile(tmp / "model.gguf"), "reading a .gguf file"),
        ("tokenizers", lambda tmp: tokenizer_from_gguf(None), "a .gguf file's tokenizer"),
        ("tokenizers", lambda tmp: read_tokenizer(tmp, {}), "a pretrained model's tokenizer.json"),
        ("tokenizers", lambda tmp: HFTokenizer.load(tmp, {}), "a pretrained model's tokenizer (kind 'hf')"),
        (
            "tokenizers",
            lambda tmp: ByteLevelBPETokenizer({"a": 0}, []),
            "the byte_bpe tokenizer (GPT-2's byte-level BPE)",
        ),
        ("jinja2", lambda tmp: render_chat_without_jinja2(), "a chat template (--chat)"),
    ],
)
def test_a_missing_optional_package_names_its_extra(monkeypatch, tmp_path, module, call, what):
    blocked(monkeypatch, module)
    with pytest.raises(MissingExtra) as e:
        call(tmp_path)
    assert str(e.value) == f"{what} needs the {module!r} package {INSTALL}"
    assert isinstance(e.value, ImportError) and e.value.name == module  # `except ImportError` still catches it


def render_chat_without_jinja2():
    tokenizer = HFTokenizer.__new__(HFTokenizer)  # no pipeline needed: the template is rendered before encoding
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    return tokenizer.render_chat([{"role": "user", "content": "hi"}])


def tiny_gguf(path, chat_template: str | None = None):
    """A .gguf file with a Llama config and a 4-token vocab (and `chat_template`), no tensors: enough to reach its
    tokenizer."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [("context_length", 32), ("embedding_length", 8), ("feed_forward_length", 16)]:
        getattr(w, f"add_{add}")(value)
    w.add_block_count(1)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c", "d"])
    w.add_token_merges([])
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("module", ["gguf", "tokenizers"])
def test_run_py_import_of_a_gguf_file_without_its_package_is_one_line(monkeypatch, tmp_path, capsys, module):
    """The issue's report: `run.py import` of a GGUF file without `tokenizers` was a ModuleNotFoundError traceback."""
    source = tiny_gguf(tmp_path / "model.gguf")
    blocked(monkeypatch, module)
    assert run.main(["import", f"--from={source}", f"--workdir={tmp_path / 'run'}"]) == 2
    what = {"gguf": "reading a .gguf file", "tokenizers": "a .gguf file's tokenizer"}[module]
    assert capsys.readouterr().err == f"error: {what} needs the {module!r} package {INSTALL}\n"
    assert not (tmp_path / "run").exists()


def test_run_py_lm_eval_without_the_harness_is_one_line(monkeypatch, tmp_path, capsys):
    blocked(monkeypatch, "lm_eval")
    assert run.main(["lm-eval", f"--workdir={tmp_path}", "--tasks=hellaswag"]) == 2
    install = "(the lmeval extra): pip install -e '.[lmeval]'"
    assert capsys.readouterr().err == f"error: run.py lm-eval needs the 'lm_eval' package {install}\n"
