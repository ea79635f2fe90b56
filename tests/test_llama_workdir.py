"""run.py import / eval --text / generate --chat / export / train.init_from on a small random Llama folder,
checked against transformers on the same folder (skipped without the `interop` extra)."""

import json
import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tiny_hf import save_tiny_decoder  # noqa: E402

import run  # noqa: E402
from txjax.convert.llama import load_llama  # noqa: E402
from txjax.decode.workdir import workdir_prompt  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 30
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random Llama saved by transformers with a byte-level BPE fast tokenizer (BOS added by its post-processor,
    as Llama's), a chat template, and a text file."""
    root = tmp_path_factory.mktemp("llama")
    save_tiny_decoder(root / "hf", TEXT, vocab_size=280, max_positions=32, chat_template=TEMPLATE)
    (root / "text.txt").write_text(TEXT)
    return root


@pytest.fixture(scope="module")
def workdir(folder, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("runs") / "llama"
    flags = [f"--config.data.path={folder / 'text.txt'}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={folder / 'hf'}", f"--workdir={workdir}", *flags]) == 0
    return workdir


def test_import_keeps_params_and_tokenizer(folder, workdir):
    loaded = load_workdir(workdir)
    cfg, params = load_llama(folder / "hf")
    assert loaded.step == 0 and loaded.model.cfg == cfg and loaded.tokenizer.kind == "hf"
    jax.tree.map(np.testing.assert_array_equal, loaded.params, params)
    ref = transformers.AutoTokenizer.from_pretrained(folder / "hf")
    text = "Speak, citizen: hear me."
    assert workdir_prompt(loaded, text)[0] == ref(text).input_ids  # generate's prompt: BOS first, as HF
    messages = [{"role": "user", "content": "Speak."}]
    assert loaded.tokenizer.render_chat(messages) == ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    # generate --chat's prompt: the template's own BOS once, as apply_chat_template tokenizes the rendered text
    chat_ids = ref.apply_chat_template(messages, add_generation_prompt=True, return_dict=True).input_ids
    assert workdir_prompt(loaded, "Speak.", chat=True)[0] == chat_ids and chat_ids.count(ref.bos_token_id) == 1


def test_eval_text_equals_transformers_on_the_same_windows(folder, workdir, capsys):
    """Windows of the 32-token context, each token predicted once: the mean CE transformers gives is our loss."""
    assert run.main(["eval", f"--workdir={workdir}", f"--text={folder / 'text.txt'}", "--max_tokens=100"]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[-1])
    ids = transformers.AutoTokenizer.from_pretrained(folder / "hf")(TEXT).input_ids[:101]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf").eval()
    nll = []
    for start in range(0, 100, 32):
        window = torch.tensor([ids[start : start + 33]])
        with torch.no_grad():
            logp = torch.log_softmax(model(window[:, :-1]).logits, -1)
        nll += (-logp[0].gather(-1, window[0, 1:, None])[:, 0]).tolist()
    assert metrics["tokens"] == len(nll) == 100
    np.testing.assert_allclose(metrics["loss"], np.mean(nll), rtol=1e-5)
    scored = load_workdir(workdir).tokenizer.decode(ids[1:])
    np.testing.assert_allclose(metrics["nats_per_char"], np.sum(nll) / len(scored), rtol=1e-5)
    np.testing.assert_allclose(metrics["bits_per_byte"], np.sum(nll) / np.log(2) / len(scored.encode()), rtol=1e-5)


def test_chat_generation_stops_at_eos(workdir, capsys):
    flags = ["--chat", "--prompt=Speak.", "--max_new_tokens=20", "--method=greedy"]
    assert run.main(["generate", f"--workdir={workdir}", *flags]) == 0
    assert "[assistant]" not in capsys.readouterr().out  # the reply alone, not the rendered conversation


def _damaged(folder, tmp_path, name: str, change) -> tuple:
    """A copy of the Hugging Face folder whose file `name` is change(its text)."""
    copy = tmp_path / "damaged"
    shutil.copytree(folder / "hf", copy)
    (copy / name).write_text(change((copy / name).read_text()))
    return copy, copy / name


@pytest.mark.parametrize(
    "name, change, words",
    [
        ("tokenizer.json", lambda text: text[: len(text) // 2], "not valid JSON ("),
        ("tokenizer.json", lambda text: text.replace('"BPE"', '"Nonesuch"'), "not a tokenizer the tokenizers library"),
        ("tokenizer_config.json", lambda text: text[:-3], "not valid JSON ("),
        ("chat_template.jinja", lambda text: text.replace("{% endif %}", ""), "the chat template does not compile"),
    ],
    ids=["tokenizer_cut_short", "tokenizer_malformed", "tokenizer_config_cut_short", "chat_template"],
)
def test_a_damaged_tokenizer_file_is_one_line_at_import_naming_it(folder, tmp_path, capsys, name, change, words):
    """Once the tokenizers library's raw exception, or a template that imported fine and then failed at --chat with
    jinja2's traceback: one line naming the file, and nothing written."""
    damaged, path = _damaged(folder, tmp_path, name, change)
    target = tmp_path / "run"
    flags = [f"--from={damaged}", f"--workdir={target}", f"--config.data.path={folder / 'text.txt'}"]
    assert run.main(["import", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and words in err and err.count("\n") == 1, err
    assert "Traceback" not in err and not target.exists()


def test_generate_chat_with_a_broken_template_in_the_workdir_is_one_line(workdir, tmp_path, capsys):
    """A workdir imported before templates were checked (its tokenizer/tokenizer.json edited here): one line."""
    copy = tmp_path / "llama"
    shutil.copytree(workdir, copy)
    saved = json.loads((copy / "tokenizer" / "tokenizer.json").read_text())
    (copy / "tokenizer" / "tokenizer.json").write_text(json.dumps(saved | {"chat_template": "{% for m in messages %}"}))
    assert run.main(["generate", f"--workdir={copy}", "--chat", "--prompt=Speak.", "--max_new_tokens=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the workdir's tokenizer/tokenizer.json: the chat template does not compile (line 1")
    assert "drop --chat" in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_export_loads_in_transformers_with_equal_logits(folder, workdir, tmp_path, capsys):
    out = tmp_path / "exported"
    assert run.main(["export", f"--workdir={workdir}", f"--to={out}"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(json.loads(capsys.readouterr().out)["files"])
    ref, again = (transformers.AutoModelForCausalLM.from_pretrained(p).eval() for p in (folder / "hf", out))
    tokens = torch.tensor([transformers.AutoTokenizer.from_pretrained(out)(TEXT[:80]).input_ids])
    with torch.no_grad():
        np.testing.assert_allclose(again(tokens).logits.numpy(), ref(tokens).logits.numpy(), atol=1e-5, rtol=0)
    assert run.main(["export", f"--workdir={workdir}", f"--to={out}"]) == 2  # never over a folder with files


def test_init_from_starts_from_the_imported_parameters(folder, workdir, tmp_path):
    """Learning rate 0: AdamW changes nothing, so the run ends with exactly the source's parameters; the model and
    tokenizer come from the source whatever the experiment file's model section says."""
    tuned = tmp_path / "tuned"
    flags = [
        f"--config.train.init_from={workdir}",
        "--config.data.kind=text",
        f"--config.data.path={folder / 'text.txt'}",
        "--config.data.seq_len=16",
        "--config.train.steps=2",
        "--config.train.batch_size=2",
        "--config.train.learning_rate=0",
        "--config.train.eval_batches=1",
    ]
    assert run.main(["train", f"--workdir={tuned}", *flags]) == 0
    source, result = load_workdir(workdir), load_workdir(tuned)
    assert result.step == 2 and result.model.cfg == source.model.cfg and result.tokenizer.kind == "hf"
    # exact by construction: at learning rate 0 every update is an exact 0
    jax.tree.map(np.testing.assert_array_equal, result.params, source.params)


def test_import_onto_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(folder, tmp_path, capsys):
    """The checkpoint or the config cannot be written: one line naming the workdir, nothing left beside it."""
    from test_storage_faults import mounted, one_error

    for name, options in [("full", "size=64k"), ("read_only", "ro,size=1m")]:
        with mounted(tmp_path / name, options) as is_tmpfs:
            if not is_tmpfs:
                pytest.skip("mounting a tmpfs is not allowed here")
            target = tmp_path / name / "run"
            flags = [f"--from={folder / 'hf'}", f"--workdir={target}", f"--config.data.path={folder / 'text.txt'}"]
            assert run.main(["import", *flags]) == 2
            line = one_error(capsys)
            reason = "Read-only file system" if name == "read_only" else "No space left on device"
            assert str(target) in line and reason in line
            assert list((tmp_path / name).iterdir()) == []


@pytest.mark.parametrize(
    "damage, named",
    [
        ("nan", "tensor model.layers.1.mlp.up_proj.weight holds 2 NaN or infinite values"),
        ("int8", "tensor model.layers.1.mlp.up_proj.weight is stored as I8"),
    ],
)
def test_a_weight_holding_nan_or_stored_as_integers_is_one_line_and_writes_nothing(
    folder, tmp_path, capsys, damage, named
):
    """One weight with a NaN and an infinity (a damaged file: it imported, then scored NaN) or rounded to int8 (a
    quantized tensor, which a cast would silently make another model): one line naming the tensor, no workdir."""
    from safetensors.numpy import load_file, save_file
    from test_storage_faults import one_error

    hf = tmp_path / "hf"
    shutil.copytree(folder / "hf", hf)
    tensors = load_file(hf / "model.safetensors")
    weight = tensors["model.layers.1.mlp.up_proj.weight"].copy()
    if damage == "nan":
        weight.flat[[3, 7]] = [np.nan, np.inf]
    else:
        weight = np.round(weight * 100).astype(np.int8)
    save_file(tensors | {"model.layers.1.mlp.up_proj.weight": weight}, hf / "model.safetensors")
    flags = [f"--from={hf}", f"--workdir={tmp_path / 'wd'}", f"--config.data.path={folder / 'text.txt'}"]
    assert run.main(["import", *flags]) == 2
    assert named in one_error(capsys)
    assert not (tmp_path / "wd").exists()
