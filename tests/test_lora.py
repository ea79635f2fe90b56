"""LoRA (txjax.state.lora): adapters beside the weights of a small random Llama imported from transformers, the base
frozen. At init the model is the base bit for bit; training changes the adapters alone and the optimizer holds
their moments alone; what evaluation and generation read is W + s A B, written here in NumPy; a resumed run equals
the uninterrupted one; bad settings are one line each."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_hf import save_tiny_decoder  # noqa: E402

import run  # noqa: E402
from txjax import config as config_lib  # noqa: E402
from txjax import families  # noqa: E402
from txjax.experiment import CHECKPOINT_DIR, load_workdir  # noqa: E402
from txjax.state import lora  # noqa: E402
from txjax.state.checkpoint import Checkpointer  # noqa: E402
from txjax.state.optim import OptimConfig  # noqa: E402
from txjax.state.train_state import init_state, optimizer  # noqa: E402

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 30
RANK, ALPHA = 4, 8.0


def train_flags(folder: Path, source: Path, *more: str) -> list[str]:
    return [
        f"--config.train.init_from={source}",
        "--config.data.kind=text",
        f"--config.data.path={folder / 'text.txt'}",
        "--config.data.seq_len=16",
        "--config.train.steps=4",
        "--config.train.batch_size=2",
        "--config.train.learning_rate=1e-2",
        "--config.train.warmup_steps=0",
        "--config.train.eval_batches=1",
        "--config.train.checkpoint_every=2",
        f"--config.train.lora_rank={RANK}",
        f"--config.train.lora_alpha={ALPHA}",
        *more,
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(folder with the transformers model and text, the imported workdir, a LoRA run of 4 steps from it)."""
    root = tmp_path_factory.mktemp("lora")
    save_tiny_decoder(root / "hf", TEXT, vocab_size=280, max_positions=32)
    (root / "text.txt").write_text(TEXT)
    flags = [f"--config.data.path={root / 'text.txt'}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'base'}", *flags]) == 0
    assert run.main(["train", f"--workdir={root / 'tuned'}", *train_flags(root, root / "base")]) == 0
    return root, root / "base", root / "tuned"


def saved_state(workdir: Path, step: int):
    """The whole TrainState a LoRA run saved at `step` (adapters, base and optimizer state)."""
    config = config_lib.load(workdir)
    model, settings = families.build(config.family, config_lib.model_config(config.model.to_dict())), config.train
    lora_config = lora.LoraConfig.of(settings)
    tx = optimizer(model, OptimConfig.of(settings), lora_config)
    abstract = jax.eval_shape(lambda: init_state(model, tx, settings.seed, lora_config=lora_config))
    ckpt = Checkpointer(workdir / CHECKPOINT_DIR, 3)
    try:
        return ckpt.restore(abstract, step)
    finally:
        ckpt.close()


def numpy_merged(adapted: lora.Adapted) -> dict:
    """W + (alpha / r) A B for each adapted weight, reshaped as W, in NumPy (float64)."""
    flat = {k: np.asarray(v, np.float64) for k, v in _flat(adapted.base).items()}
    adapters = _flat(adapted.lora)
    for path in {p[:-1] for p in adapters}:
        a, b = (np.asarray(adapters[(*path, x)], np.float64) for x in "ab")
        flat[path] = flat[path] + (ALPHA / RANK * np.einsum("...ir,...ro->...io", a, b)).reshape(flat[path].shape)
    return flat


def _flat(tree) -> dict:
    return {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_at_init_the_adapted_model_is_the_base_bit_for_bit(runs):
    _, base, _ = runs
    source = load_workdir(base)
    config = lora.LoraConfig(lora_rank=RANK, lora_alpha=ALPHA)
    adapted = lora.adapted(source.params, families.param_roles(source.model), config, jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, lora.model_params(adapted), source.params)
    adapters = _flat(adapted.lora)
    assert {p[-2] for p in adapters} == {"query", "key", "value", "out", "kernel"}  # the FFN's: wi/kernel, ...
    assert all(not np.asarray(v).any() for p, v in adapters.items() if p[-1] == "b")
    a = np.concatenate([np.ravel(v) for p, v in adapters.items() if p[-1] == "a"])
    assert abs(a.std() * RANK - 1) < 0.1  # peft's gaussian init: N(0, 1/r^2)


def test_training_changes_the_adapters_alone_and_evaluation_reads_the_merged_weights(runs):
    _, base, tuned = runs
    state = saved_state(tuned, 4)
    jax.tree.map(np.testing.assert_array_equal, state.params.base, load_workdir(base).params)  # frozen bit for bit
    assert all(np.abs(np.asarray(v)).max() > 0 for p, v in _flat(state.params.lora).items() if p[-1] == "b")
    merged = _flat(load_workdir(tuned).params)  # what eval, generate and export read
    want = numpy_merged(state.params)
    assert set(merged) == set(want)
    for path, value in want.items():
        np.testing.assert_allclose(merged[path], value, rtol=1e-5, atol=1e-6)
    assert any(not np.array_equal(merged[p], _flat(state.params.base)[p]) for p in want)


def test_the_optimizer_state_holds_the_adapters_moments_alone(runs):
    """AdamW's two moments of each adapter and scalars: no array of the base's size."""
    _, _, tuned = runs
    state = saved_state(tuned, 4)
    adapters = sum(x.size for x in jax.tree.leaves(state.params.lora))
    base = sum(x.size for x in jax.tree.leaves(state.params.base))
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert sum(x.size for x in moments) == 2 * adapters and adapters < base / 4


def test_a_resumed_lora_run_equals_the_uninterrupted_one(runs, tmp_path):
    folder, base, tuned = runs
    resumed = tmp_path / "resumed"
    shutil.copytree(tuned, resumed)
    shutil.rmtree(resumed / CHECKPOINT_DIR / "4")
    (resumed / "train_result.json").unlink()
    assert run.main(["train", f"--workdir={resumed}", *train_flags(folder, base)]) == 0
    jax.tree.map(np.testing.assert_array_equal, saved_state(resumed, 4), saved_state(tuned, 4))


@pytest.mark.parametrize(
    "flags, words",
    [
        (
            ["--config.train.lora_targets=query,qeury"],
            "config.train.lora_targets=['query', 'qeury']: unknown 'qeury'; LoRA adapts the weight matrices",
        ),
        (["--config.train.lora_targets=router"], "names no weight matrix of this model; its matrices: key, out,"),
        (["--config.train.lora_rank=20"], "config.train.lora_rank=20 is above the dimension of decoder/layers/self_"),
        (["--config.train.lora_rank=0"], "config.train.lora_alpha=8.0 is not read by train.lora_rank=0 (LoRA is off"),
    ],
    ids=["unknown_target", "no_such_weight", "rank_above_dimension", "alpha_without_lora"],
)
def test_bad_lora_settings_are_one_line_and_write_nothing(runs, tmp_path, capsys, flags, words):
    folder, base, _ = runs
    target = tmp_path / "run"
    assert run.main(["train", f"--workdir={target}", *train_flags(folder, base), *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not target.exists()


def test_the_lora_settings_are_in_the_saved_config(runs):
    saved = json.loads((runs[2] / config_lib.CONFIG_FILE).read_text())["train"]
    assert (saved["lora_rank"], saved["lora_alpha"], saved["lora_scaling"]) == (RANK, ALPHA, "lora")


def test_the_peft_export_loads_onto_the_base_with_the_runs_logits_and_merged_equals_it(runs, tmp_path, capsys):
    """peft.PeftModel.from_pretrained(the imported transformers model, the exported folder) gives the logits txjax
    computes from the run (float32, within 1e-4), and --merged's folder, loaded by transformers alone, the same."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    folder, base, tuned = runs
    assert run.main(["export", f"--workdir={tuned}", f"--to={tmp_path / 'adapter'}"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (RANK, ALPHA, str(base))
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf").eval()
    tokens = np.arange(3, 35).reshape(2, 16) * 7 % 280
    with torch.no_grad():
        base_logits = hf(torch.as_tensor(tokens)).logits.numpy()
        adapted = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()  # adapts hf in place
        want = adapted(torch.as_tensor(tokens)).logits.numpy()
    result = load_workdir(tuned)
    got = np.asarray(result.model.apply({"params": result.params}, tokens))
    assert np.abs(want).max() > 3.0
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(base_logits - want).max() > 1e-3  # the adapters change the model: the base's are not the run's
    assert run.main(["export", f"--workdir={tuned}", f"--to={tmp_path / 'merged'}", "--merged"]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.as_tensor(tokens)).logits.numpy(), want, atol=1e-4, rtol=0)


def test_merged_on_a_run_without_lora_is_one_line(runs, tmp_path, capsys):
    assert run.main(["export", f"--workdir={runs[1]}", f"--to={tmp_path / 'out'}", "--merged"]) == 2
    err = capsys.readouterr().err
    assert "has no LoRA adapters to merge (train.lora_rank=0); drop --merged" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["encoder_decoder"])  # prefix_lm passes too: a decoder stack, kept out for time
def test_the_other_families_train_their_adapters_alone(family, pairs_tsv, tmp_path):
    """A tiny model trained from scratch with LoRA (cross-attention's weights adapted too): its base is the same bit
    for bit after steps 1 and 2, and the one drawn at step 0 (by another program: within float rounding), and every B
    moved from 0."""
    from txjax.training.loop import train

    data = [f"--config.data.{k}={pairs_tsv}" for k in ("path", "valid_path", "test_path")]
    model = ["--config.model.num_layers=1", "--config.model.num_heads=2", "--config.model.d_model=16"]
    steps = ["--config.train.steps=2", "--config.train.batch_size=2", "--config.train.eval_batches=1"]
    steps += ["--config.train.checkpoint_every=1"]
    lora_flags = [f"--config.train.lora_rank={RANK}", f"--config.train.lora_alpha={ALPHA}"]
    flags = [f"--config.family={family}", "--config.data.kind=parallel", "--config.data.tokenizer=char", *data]
    config = config_lib.from_command_line(None, [*flags, *model, "--config.model.d_ff=32", *steps, *lora_flags])
    assert train(config, tmp_path / "run")["step"] == 2
    state, saved = saved_state(tmp_path / "run", 2), config_lib.load(tmp_path / "run")
    built = families.build(family, config_lib.model_config(saved.model.to_dict()))
    lora_config = lora.LoraConfig.of(saved.train)
    tx = optimizer(built, OptimConfig.of(saved.train), lora_config)
    start = jax.jit(lambda: init_state(built, tx, 0, lora_config=lora_config))()  # op by op: each op compiled alone
    jax.tree.map(np.testing.assert_array_equal, state.params.base, saved_state(tmp_path / "run", 1).params.base)
    close = lambda got, drawn: np.testing.assert_allclose(got, drawn, rtol=0, atol=1e-6)  # another program drew it
    jax.tree.map(close, state.params.base, start.params.base)
    adapted = {p[:-1] for p, v in _flat(state.params.lora).items() if p[-1] == "b" and np.abs(v).max() > 0}
    assert adapted == {p[:-1] for p in _flat(start.params.lora) if p[-1] == "b"}
    assert any("cross_attention" in p for p in adapted) == (family == "encoder_decoder")


def test_a_weight_the_format_fuses_is_refused_in_one_line_naming_merged(tmp_path):
    """GPT-2's c_attn holds W^Q, W^K and W^V in one tensor: no peft pair of one of them; refused, nothing written."""
    import dataclasses

    from txjax.convert import gpt2
    from txjax.convert.peft_adapter import write_adapter
    from txjax.model.models import DecoderLM

    cfg = dataclasses.replace(gpt2.GPT2_SMALL, vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=8)
    model = DecoderLM(cfg)
    params = families.init_params(model, jax.random.key(0))
    config = lora.LoraConfig(lora_rank=2, lora_targets=("query",))
    adapted = lora.adapted(params, families.param_roles(model), config, jax.random.key(1))
    fields = {"lora_rank": 2, "lora_alpha": 16.0, "lora_scaling": "lora"}
    with pytest.raises(ValueError) as refused:
        write_adapter(tmp_path, jax.device_get(adapted), cfg, gpt2.params_to_hf, fields, "decoder_lm", "gpt2")
    assert str(refused.value).startswith("the LoRA weight decoder/layers/self_attention/query cannot be a peft adapter")
    assert "--merged" in str(refused.value) and "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_peft_adapter_imported_onto_the_base_is_the_run_again(runs, tmp_path, capsys):
    """run.py import --from=ADAPTER --base=WORKDIR: the exported adapter read back onto the imported base gives the
    run's merged weights, and exported again the same tensors; trained biases (bias="all") are one line, nothing
    written."""
    from safetensors.numpy import load_file

    _, base, tuned = runs
    adapter, again = tmp_path / "adapter", tmp_path / "again"
    assert run.main(["export", f"--workdir={tuned}", f"--to={adapter}"]) == 0
    assert run.main(["import", f"--from={adapter}", f"--base={base}", f"--workdir={again}"]) == 0
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    jax.tree.map(close, load_workdir(again).params, load_workdir(tuned).params)
    assert run.main(["export", f"--workdir={again}", f"--to={tmp_path / 'twice'}"]) == 0
    first, twice = (
        load_file(adapter / "adapter_model.safetensors"),
        load_file(tmp_path / "twice" / "adapter_model.safetensors"),
    )
    assert first.keys() == twice.keys() and all(np.array_equal(first[k], twice[k]) for k in first)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"bias": "all"}))
    capsys.readouterr()
    assert run.main(["import", f"--from={adapter}", f"--base={base}", f"--workdir={tmp_path / 'biases'}"]) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json: bias='all' is not plain LoRA, which txjax reads" in err and err.count("\n") == 1
    assert not (tmp_path / "biases").exists()


def test_lora_runs_differing_in_the_learning_rate_train_stacked(runs, tmp_path):
    """Two LoRA runs of two learning rates: one vmapped program, each run's base the source's bit for bit, their
    adapters apart."""
    from txjax.training.stack import train_runs

    folder, base, _ = runs
    flags = lambda lr: [*train_flags(folder, base, f"--config.train.learning_rate={lr}"), "--config.train.steps=2"]
    configs = [config_lib.from_command_line(None, flags(lr)) for lr in (1e-2, 1e-3)]
    results = train_runs(configs, [tmp_path / "fast", tmp_path / "slow"])
    assert [r["runs_vmapped"] for r in results] == [2, 2]
    fast, slow = (saved_state(tmp_path / name, 2).params for name in ("fast", "slow"))
    for params in (fast, slow):
        jax.tree.map(np.testing.assert_array_equal, params.base, load_workdir(base).params)
    assert not np.array_equal(
        *(np.asarray(p.lora["decoder"]["layers"]["self_attention"]["query"]["b"]) for p in (fast, slow))
    )
