"""Tests of generation's inputs and its command: bad input, the sliding window, `run.py generate`, the flags."""

import json

import jax.numpy as jnp
import pytest
from test_decode import LM_PROMPTS, lm, random_params, tiny

from txjax import decode
from txjax.families import family_of
from txjax.model.models import EncoderDecoder

# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "prompts, max_new, match",
    [
        ([[]], 4, "prompt 0 is empty"),
        ([], 4, "no prompts"),
        ([[3] * 25], 1, "more than the model's context max_len=24"),
        ([[3] * 10], 16, r"lower max_new_tokens to <= 15"),
        ([[3, 99]], 4, "outside the vocab"),
        ([[3]], 0, "max_new_tokens=0 must be >= 1"),
    ],
)
def test_bad_input_is_a_one_line_value_error(prompts, max_new, match):
    model, params = lm("rope")
    with pytest.raises(ValueError, match=match) as info:
        decode.generate(model, params, prompts, max_new_tokens=max_new)
    assert "\n" not in str(info.value)


def test_unencodable_prompt_is_a_value_error():
    from txjax.data import CharTokenizer

    with pytest.raises(ValueError, match="not in the char tokenizer"):
        family_of(lm("rope")[0]).read_text(CharTokenizer("abc"), "abz")


# ---------------------------------------------------------------- beyond the context, from a workdir


def test_generate_windowed_is_generate_while_it_fits_then_slides():
    model, params = lm("rope")  # max_len 24
    prompt = list(LM_PROMPTS[1])  # 6 tokens: the first chunk generates 24 - 6 + 1 = 19, then chunks of 24 - 12 + 1
    (long,) = decode.generate_windowed(model, params, prompt, max_new_tokens=19 + 13, keep=12)
    assert len(long) == 32 and long[:19] == decode.generate(model, params, [prompt], max_new_tokens=19).ids[0]
    restart = (prompt + long[:19])[-12:]  # the second chunk continues from the last 12 tokens alone
    assert long[19:] == decode.generate(model, params, [restart], max_new_tokens=13).ids[0]


def test_run_py_generate_and_translation_bleu(tmp_path, pairs_tsv, monkeypatch, capsys):
    """`run.py generate` and the BLEU/chrF of evaluation on an (untrained) encoder-decoder run; `run.py eval`
    decodes with the run's decode section, or with the fields its --config.decode.* flags change."""
    import run
    import txjax.cli.eval
    import txjax.cli.generate
    from txjax import config as config_lib
    from txjax import experiment
    from txjax.data import CharTokenizer, ParallelDataset
    from txjax.evaluate import split as evaluate

    tokenizer = CharTokenizer.from_text(pairs_tsv.read_text().replace("\t", "").replace("\n", ""), specials=True)
    config = config_lib.base_config()
    config.unlock()
    config.update(family="encoder_decoder")
    config.data.update(kind="parallel", path=str(pairs_tsv), valid_path=str(pairs_tsv))
    config.decode.update(method="beam", max_new_tokens=8, beam_size=2)
    model = EncoderDecoder(tiny(vocab_size=tokenizer.vocab_size))
    params = random_params(model, jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32))
    fake_run = experiment.TrainedRun(config, model, tokenizer, params, step=0)
    for command in (txjax.cli.generate, txjax.cli.eval):
        monkeypatch.setattr(command, "load_workdir", lambda workdir, mesh=None, average=1: fake_run)

    assert run.main(["generate", "--workdir=unused", "--prompt=the cat"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one translation (beam search; maybe empty, untrained)
    assert run.main(["generate", "--workdir=unused", "--prompt=the cat!"]) == 2  # '!' is not in the vocab
    assert capsys.readouterr().err.count("\n") == 1

    dataset = ParallelDataset(pairs_tsv, tokenizer, max_src_len=12, max_tgt_len=12)
    generation = (model, params, tokenizer, dataset, config.decode)
    metrics = evaluate.generation_metrics(*generation, batch_size=4)
    assert capsys.readouterr().out.startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert 0 <= metrics["bleu"] <= 100 and 0 <= metrics["chrf"] <= 100 and metrics["bleu_signature"]
    greedy = evaluate.generation_metrics(
        model, params, tokenizer, dataset, config.decode, batch_size=4, method="greedy"
    )
    assert metrics["decode"] == {"method": "beam", "beam_size": 2, "length_penalty": 0.6, "max_new_tokens": 8}
    assert greedy["decode"] == {"method": "greedy", "max_new_tokens": 8}

    (tmp_path / "run").mkdir()
    config_lib.save(config, tmp_path / "run")
    # exact by construction: run.py eval's decode_all batches hold the 4 pairs as the batch_size=4 calls above did
    for flags, expected in [([], metrics), (["--config.decode.method=greedy"], greedy)]:
        assert run.main(["eval", f"--workdir={tmp_path / 'run'}", *flags]) == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert {k: printed[k] for k in ("decode", "bleu", "chrf")} == {
            k: expected[k] for k in ("decode", "bleu", "chrf")
        }
    assert run.main(["eval", f"--workdir={tmp_path / 'run'}", "--config.decode.method=bean"]) == 2
    assert "config.decode.method='bean' is not one of" in capsys.readouterr().err
    flags = ["--text=unused.txt", "--config.decode.beam_size=8"]  # an encoder-decoder scores no text alone
    assert run.main(["eval", f"--workdir={tmp_path / 'run'}", *flags]) == 2  # (a decoder's --text: test_passkey)
    assert "is of family encoder_decoder: --text scores decoder-only LMs" in capsys.readouterr().err
    assert run.main(["eval", f"--workdir={tmp_path / 'run'}", "--split=valid", "--config.decode.beam_size=0"]) == 2
    assert "beam_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's one line: eval changes the mesh and the decoding only
        run.main(["eval", f"--workdir={tmp_path / 'run'}", "--config.train.steps=3"])
    assert "--config.decode.*=VALUE overrides" in capsys.readouterr().err


# ---------------------------------------------------------------- one meaning for the decode section, flags and API

BEAM = {"beam_size": 4, "length_penalty": 0.6}
SAMPLE = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_samples": 1}


@pytest.mark.parametrize(
    "flags,expected",
    [
        ({}, {"method": "greedy"}),  # the config's method
        ({"beam_size": 1}, {"method": "beam", **BEAM, "beam_size": 1}),  # a beam option alone means beam search
        ({"temperature": 0.8}, {"method": "sample", **SAMPLE, "temperature": 0.8}),  # a sampling option: sampling
        ({"method": "sample"}, {"method": "sample", **SAMPLE}),
        ({"method": "beam", "length_penalty": 0.0}, {"method": "beam", **BEAM, "length_penalty": 0.0}),
        ({"method": "greedy", "max_new_tokens": 5}, {"method": "greedy", "max_new_tokens": 5}),
    ],
)
def test_the_config_the_flags_and_the_api_agree_on_the_method(flags, expected):
    from txjax import config as config_lib

    strategy = decode.strategy_from_config(config_lib.base_config().decode, 7, **flags)
    assert strategy == {"max_new_tokens": 64, "eos_id": 7, **expected}
    assert decode.Strategy(**strategy).method == expected["method"]  # the API takes exactly what they give


def test_the_api_and_run_py_take_one_set_of_defaults(monkeypatch):
    """An option left out of `decode.generate` (the Python API's Strategy) and the config's decode section that
    run.py decodes with resolve to the same values: both come from strategy.OPTION_DEFAULTS, so moving a default
    there moves both (a second definition of one, in the config or the API, fails here)."""
    from txjax import config as config_lib
    from txjax.decode import strategy as strategy_lib

    def resolved():  # {method: (the API's options, run.py's options)}
        config = config_lib.base_config().decode
        return {
            method: tuple(
                [s.option(name) for name in options]
                for s in (
                    decode.Strategy(max_new_tokens=64, method=method, eos_id=7),
                    decode.Strategy(**decode.strategy_from_config(config, 7, method=method)),
                )
            )
            for method, options in strategy_lib.METHOD_OPTIONS.items()
        }

    for api, run_py in resolved().values():
        assert api == run_py
    moved = {k: v + 1 if isinstance(v, int) else v / 2 for k, v in strategy_lib.OPTION_DEFAULTS.items()}
    for name, value in moved.items():
        monkeypatch.setitem(strategy_lib.OPTION_DEFAULTS, name, value)
    for method, (api, run_py) in resolved().items():
        want = [moved[name] for name in strategy_lib.METHOD_OPTIONS[method]]
        assert api == run_py == want, method


def test_an_option_of_another_method_is_an_error_not_ignored():
    from txjax import config as config_lib

    config = config_lib.base_config().decode
    with pytest.raises(ValueError, match="temperature applies to method='sample', not method='greedy'"):
        decode.Strategy(**decode.strategy_from_config(config, 7, method="greedy", temperature=0.8))
    with pytest.raises(ValueError, match="options of several methods"):
        decode.strategy_from_config(config, 7, beam_size=2, temperature=0.8)
    with pytest.raises(ValueError, match="temperature applies to method='sample'"):
        decode.generate(*lm("rope"), LM_PROMPTS, max_new_tokens=4, temperature=0.8)  # the API does not go greedy


def test_generate_from_a_workdir_with_beam_size_one_is_greedy_not_sampling():
    """`run.py generate --beam_size=1` is beam search with one beam (greedy), whatever the config's temperature."""
    from txjax import config as config_lib
    from txjax.data import CharTokenizer
    from txjax.experiment import TrainedRun

    model, params = lm("rope")
    config = config_lib.base_config()
    config.decode.update(max_new_tokens=6, temperature=1.0)
    run = TrainedRun(config, model, CharTokenizer("0123456789", specials=True), params, 0)
    greedy, beam1 = (decode.generate_from_workdir(run, "3141", **flags) for flags in ({}, {"beam_size": 1}))
    sampled = {decode.generate_from_workdir(run, "3141", method="sample", seed=s)[0] for s in range(4)}
    assert beam1 == greedy and len(sampled) > 1


def digits_run(max_new_tokens: int = 4):
    """A TrainedRun of the tiny LM (max_len 24) with a character tokenizer of the digits (BOS first: synthetic)."""
    from txjax import config as config_lib
    from txjax.data import CharTokenizer
    from txjax.experiment import TrainedRun

    config = config_lib.base_config()
    config.decode.update(max_new_tokens=max_new_tokens, method="greedy")
    model, params = lm("rope")
    return TrainedRun(config, model, CharTokenizer("0123456789", specials=True), params, step=0)


def test_a_prompt_longer_than_the_context_is_cut_with_a_note(capsys):
    """30 digits after BOS (31 tokens) against max_len 24: its last 24 tokens are generated from, and a note says so;
    beam search refuses it in one line."""
    run, prompt = digits_run(), "314159265358979323846264338327"
    (text,) = decode.generate_from_workdir(run, prompt)
    note = "note: the prompt has 31 tokens, more than the model's context (max_len=24): its last 24 are kept, the"
    assert f"{note} first 7 dropped" in capsys.readouterr().err
    ids = run.tokenizer.encode(prompt)[-24:]
    (expected,) = decode.generate_windowed(run.model, run.params, ids, max_new_tokens=4, eos_id=run.tokenizer.eos_id)
    assert text == prompt + run.tokenizer.decode(expected)
    decode.generate_from_workdir(run, prompt[:20])
    assert "note" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="prompt 0 has 31 tokens, more than the model's context max_len=24: shorten"):
        decode.generate_from_workdir(run, prompt, method="beam")


def test_a_long_prompt_is_prefilled_in_chunks(monkeypatch):
    """A prompt over 2 * PREFILL_CHUNK tokens goes through the chunked prefill (decode.prefill_chunk 0) and gives the
    one-call prefill's tokens."""
    import txjax.decode.workdir

    run, prompt = digits_run(max_new_tokens=3), "2718281828459045"
    one_call = decode.generate_from_workdir(run, prompt)
    monkeypatch.setattr(txjax.decode.workdir, "PREFILL_CHUNK", 4)
    assert txjax.decode.workdir.workdir_prompt(run, prompt)[2]["prefill_chunk"] == 4
    assert decode.generate_from_workdir(run, prompt) == one_call
    assert "prefill_chunk" not in txjax.decode.workdir.workdir_prompt(run, prompt[:6])[2]
