"""Conventions users bring from other tools: temperature 0 is greedy (vLLM, llama.cpp, `transformers serve`)."""

import pytest
from test_decode import EOS, LM_PROMPTS, lm, lm_greedy

import run
from txjax import decode

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
    from txjax import config as config_lib

    section = config_lib.base_config().decode
    section.update(method="sample", temperature=0.0, top_k=40)  # what --config.decode.temperature=0 writes
    assert decode.strategy_from_config(section, 7) == {"method": "greedy", "max_new_tokens": 64, "eos_id": 7}
    # --temperature=0 alone picks a method the way --temperature=0.8 alone picks sampling: here, greedy
    assert decode.strategy_from_config(config_lib.base_config().decode, 7, temperature=0)["method"] == "greedy"


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
