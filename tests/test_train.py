"""Tests of the training loop, checkpoints, evaluation and configs (tiny models, a few steps each)."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import txjax.training.loop
from txjax import config as config_lib
from txjax import families
from txjax.data import prefetch
from txjax.evaluate.split import evaluate, make_eval_step
from txjax.experiment import build_dataset, build_model, build_tokenizer, fill_model_sizes, load_workdir
from txjax.families.objective import token_sums
from txjax.ops import profiling
from txjax.ops.metrics_log import read_metrics
from txjax.sections.train import TrainConfig
from txjax.state.checkpoint import Checkpointer
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state
from txjax.training.loop import train
from txjax.training.step import make_train_step

REPO = Path(__file__).parents[1]


TINY_TASK = ["--config.data.max_digits=4", "--config.data.eval_size=20"]  # synthetic: 1-4 digits
TINY_MODEL = [  # 1 layer, d_model 32, 6 steps: any data kind
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.train.steps=6",
    "--config.train.batch_size=8",
    "--config.train.warmup_steps=2",
    "--config.train.log_every=2",
    "--config.train.eval_every=0",
    "--config.train.checkpoint_every=2",
]
TINY_FLAGS = [*TINY_TASK, *TINY_MODEL]  # the default experiment (reverse) at toy size


def tiny_config(*flags):
    return config_lib.from_command_line(None, TINY_FLAGS + list(flags))


def params_of(workdir):
    return jax.device_get(load_workdir(workdir).params)


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def run_py(*args, **kwargs):
    return subprocess.run(
        [sys.executable, str(REPO / "run.py"), *args], capture_output=True, text=True, cwd=REPO, **kwargs
    )


# ---------------------------------------------------------------- configs and user errors


def test_unknown_key_names_close_match():
    with pytest.raises(config_lib.ConfigError, match="did you mean num_layers"):
        tiny_config("--config.model.num_layer=3")
    with pytest.raises(config_lib.ConfigError, match="unknown key 'trian'; did you mean train"):
        tiny_config("--config.trian.steps=3")


def test_bad_values_are_one_line_errors():
    for flag, message in [
        ("--config.model.positional=rop", "model.positional='rop' is not one of"),
        ("--config.train.steps=abc", "expected int"),
        ("--config.model.d_model=33", "divisible by model.num_heads"),
        ("--config.train.grad_accum=3", "divisible by grad_accum"),
        ("--config.model.attention_impl=cudnn", "needs model.dtype=bfloat16"),
        ("--config.model.matmul_precision=tf32", "model.matmul_precision='tf32' is not one of highest, high"),
        (
            "--config.model.remat=dots",
            "model.remat='dots' is not one of none, dots_saveable, dots_with_no_batch_dims_saveable, offload, full",
        ),
    ]:
        with pytest.raises(config_lib.ConfigError, match=message) as e:
            tiny_config(flag)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("experiment", sorted(p.name for p in (REPO / "experiments").glob("*.py")))
def test_every_experiment_file_validates(experiment, tmp_path):
    """Each experiment validates as shipped; one that starts from train.init_from (a workdir `run.py import` makes)
    is refused in one line naming that workdir while it is absent, and validates over a source of its family."""
    path = str(REPO / "experiments" / experiment)
    source = config_lib.load_config(path).train.init_from
    flags = []
    if source:
        if not (REPO / source / config_lib.CONFIG_FILE).is_file():
            with pytest.raises(config_lib.ConfigError, match=f"^train.init_from='{source}': no config.json in "):
                config_lib.from_command_line(path, [])
        stub = config_lib.from_command_line(None, [f"--config.family={config_lib.load_config(path).family}"])
        stub.model.update(vocab_size=64, max_len=512)
        (tmp_path / "source").mkdir()
        config_lib.save(stub, tmp_path / "source")
        flags = [f"--config.train.init_from={tmp_path / 'source'}"]
    config = config_lib.from_command_line(path, flags)
    assert config.family in families.FAMILIES and config.train.steps > 0


def test_cli_user_error_is_one_line_without_traceback():
    result = run_py("train", "--config.model.num_layer=3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --config.model.num_layer: unknown key 'num_layer'; did you mean num_layers, scan_layers, "
        "num_encoder_layers?"
    ]


def test_missing_data_file_fails_before_training(tmp_path):
    config = config_lib.from_command_line(
        str(REPO / "experiments/shakespeare_char.py"), [f"--config.data.path={tmp_path}/absent.txt"]
    )
    with pytest.raises(config_lib.ConfigError, match=f"not found: {tmp_path}/absent.txt"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------- data feeding, steps, eval


def test_training_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    config = tiny_config()
    data = build_dataset(config, build_tokenizer(config, tmp_path), "train")
    fed = list(prefetch(data.batch(config.train.seed, k, 8) for k in range(3, 6)))
    for k, batch in zip(range(3, 6), fed):
        again = data.batch(config.train.seed, k, 8)
        assert all(np.array_equal(batch[name], again[name]) for name in batch)
    assert not np.array_equal(fed[0]["inputs"], fed[1]["inputs"])


def _model_and_state(config, tmp_path):
    tokenizer = build_tokenizer(config, tmp_path)
    data = build_dataset(config, tokenizer, "train")
    fill_model_sizes(config, tokenizer, data)
    model = build_model(config)
    tx = make_optimizer(OptimConfig.of(config.train), families.param_roles(model))
    return data, model, tx, jax.jit(lambda: init_state(model, tx, config.train.seed))()


@pytest.mark.gpu
def test_grad_accumulation_equals_the_full_batch(tmp_path):
    config = tiny_config()
    data, model, tx, state = _model_and_state(config, tmp_path)
    batch = data.batch(0, 0, 8)
    params = {}
    for accum in (1, 2):
        config.train.grad_accum = accum
        step = make_train_step(model, tx, TrainConfig.of(config.train))
        params[accum] = step(jax.tree_util.tree_map(np.copy, state), batch)[0].params
    for a, b in zip(jax.tree_util.tree_leaves(params[1]), jax.tree_util.tree_leaves(params[2])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_label_smoothing_matches_optax_smoothed_labels():
    logits_BxLxV = jax.random.normal(jax.random.key(0), (2, 3, 7)) * 3
    targets_BxL = jax.random.randint(jax.random.key(1), (2, 3), 0, 7)
    weights_BxL = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    smoothed = optax.smooth_labels(jax.nn.one_hot(targets_BxL, 7), 0.1)
    expected = (optax.softmax_cross_entropy(logits_BxLxV, smoothed) * weights_BxL).sum()
    np.testing.assert_allclose(
        token_sums(logits_BxLxV, targets_BxL, weights_BxL, 0.1)["objective"], expected, rtol=1e-6
    )


@pytest.mark.gpu
def test_token_sums_match_numpy_cross_entropy_and_argmax():
    logits_BxLxV = np.asarray(jax.random.normal(jax.random.key(0), (4, 5, 11)) * 3)
    targets_BxL = np.array(jax.random.randint(jax.random.key(1), (4, 5), 0, 11))
    targets_BxL[0, :] = logits_BxLxV[0].argmax(-1)  # some hits for sure
    weights_BxL = (np.arange(5)[None, :] < np.array([5, 3, 1, 0])[:, None]).astype(np.float32)
    log_p_BxLxV = logits_BxLxV - np.log(np.exp(logits_BxLxV).sum(-1, keepdims=True))
    ce_BxL = -np.take_along_axis(log_p_BxLxV, targets_BxL[..., None], -1)[..., 0]
    sums = token_sums(logits_BxLxV, targets_BxL, weights_BxL)
    np.testing.assert_allclose(sums["loss"], (weights_BxL * ce_BxL).sum(), rtol=1e-5)
    assert sums["correct"] == (weights_BxL * (logits_BxLxV.argmax(-1) == targets_BxL)).sum() >= 5
    assert sums["weight"] == 9


@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder"])
def test_eval_over_padded_batches_equals_one_unbatched_pass(tmp_path, family):
    """10 examples in batches of 3 (the last one padded with 2 empty rows) and all 10 in one batch: same sums."""
    config = tiny_config(f"--config.family={family}", "--config.data.eval_size=10")
    data, model, _, state = _model_and_state(config, tmp_path)
    eval_step = make_eval_step(model)
    results = {b: evaluate(eval_step, state.params, data.eval_batches(b), exact_match=True) for b in (3, 10)}
    assert eval_step._cache_size() == 2  # one per batch size
    whole = results[10]
    assert whole["examples"] == 10 and whole["tokens"] == sum(
        float(b[k].sum()) for b in data.eval_batches(10) for k in b if k.endswith("weights")
    )
    batched = results[3]
    assert batched["tokens"] == whole["tokens"] and batched["examples"] == 10
    np.testing.assert_allclose(batched["loss"], whole["loss"], rtol=1e-6)
    np.testing.assert_allclose(batched["token_accuracy"], whole["token_accuracy"], rtol=1e-6)


# ---------------------------------------------------------------- the loop: compile once, resume, stop


def test_train_compiles_once_writes_the_workdir_and_guards_it(tmp_path):
    config = tiny_config("--config.train.eval_every=2", "--config.train.eval_batches=1")
    result = train(config, tmp_path)
    assert result["step"] == 6 and result["train_step_compiles"] == 1 and result["eval_step_compiles"] == 1
    for name in ("config.json", "tokenizer/tokenizer.json", "metrics.jsonl", "curves.png", "eval_valid.json"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tb").iterdir())
    assert Checkpointer(tmp_path / "checkpoints", 3).manager.all_steps() == [2, 4, 6]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6]
    assert json.loads((tmp_path / "eval_valid.json").read_text())["examples"] == 20
    saved = (tmp_path / "config.json").read_text()
    with pytest.raises(config_lib.ConfigError, match=r"checkpoints of another run \(model.d_model 32 -> 64\)"):
        train(tiny_config("--config.model.d_model=64"), tmp_path)
    # another batch stream would not continue the run either; a longer schedule does
    with pytest.raises(config_lib.ConfigError, match=r"another run \(.*data.max_digits 4 -> 5; train.seed 0 -> 3\)"):
        train(tiny_config("--config.data.max_digits=5", "--config.train.seed=3"), tmp_path)
    with pytest.raises(config_lib.ConfigError, match=r"another run \(train.optimizer 'adamw' -> 'lion'\)"):
        train(tiny_config("--config.train.optimizer=lion"), tmp_path)  # its state would not restore
    assert (tmp_path / "config.json").read_text() == saved
    assert train(tiny_config("--config.train.steps=8"), tmp_path)["step"] == 8


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    """A run's scalars reach its TensorBoard event file, and the writer's import leaves PyTorch unimported (where it
    is installed, tensorboardX would import it: seconds of every run's start-up) yet importable afterwards."""
    script = (
        "import importlib.util, sys\n"
        "from txjax.ops.trackers import _summary_writer_class\n"
        "writer = _summary_writer_class()(sys.argv[1])\n"
        "writer.add_scalar('train/loss', 1.5, 3)\n"
        "writer.close()\n"
        "assert 'torch' not in sys.modules\n"
        "if importlib.util.find_spec('torch'):\n"
        "    import torch\n"
        "    assert torch.ones(2).sum().item() == 2.0\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    (events,) = tmp_path.glob("events.out.tfevents.*")
    assert b"train/loss" in events.read_bytes()


def test_resuming_without_a_config_says_the_saved_one_is_used(tmp_path, capsys):
    import run

    flags = [f"--workdir={tmp_path}", "--config.train.steps=2", "--config.data.eval_size=8"]
    flags += ["--config.model.num_layers=1", "--config.model.d_model=16", "--config.model.d_ff=32"]
    assert run.main(["train", "--config=" + str(REPO / "experiments" / "reverse.py"), *flags]) == 0
    assert "resuming with" not in capsys.readouterr().err
    assert run.main(["train", *flags]) == 0  # the saved config.json, steps already done: evaluates again
    err = capsys.readouterr().err
    assert f"resuming with {tmp_path / 'config.json'}; edits to the experiment file are not applied" in err


def test_train_records_hold_mfu_unless_measuring_the_peak_fails(tmp_path, monkeypatch, capsys):
    """mfu = model FLOPs per step / seconds per step / measured peak: in (0, 1) for every logged interval; when
    measuring the peak fails, training goes on and logs no mfu."""
    train(tiny_config(), tmp_path / "measured")
    mfu = [r.get("mfu") for r in read_metrics(tmp_path / "measured") if r["split"] == "train"]
    assert len(mfu) == 3 and all(0 < m < 1 for m in mfu), mfu

    def broken_peak():
        raise RuntimeError("no matmul today")

    monkeypatch.setattr(txjax.training.run, "peak_gflops", broken_peak)
    assert train(tiny_config(), tmp_path / "failed")["step"] == 6
    assert not any("mfu" in r for r in read_metrics(tmp_path / "failed"))
    assert "mfu not logged: measuring the matmul peak failed (RuntimeError: no matmul today)" in capsys.readouterr().err


@pytest.mark.gpu
def test_resume_after_a_crash_is_bit_exact(tmp_path, monkeypatch):
    """Crash while fetching batch 3 (after the checkpoint at step 2), rerun: same parameters as no crash."""
    flags = ["--config.model.dropout=0.1", "--config.train.grad_accum=2"]
    train(tiny_config(*flags), tmp_path / "straight")

    class Crash(Exception):
        pass

    def crashing_dataset(*args):
        data = build_dataset(*args)
        batch = data.batch
        data.batch = lambda seed, k, *args: (_ for _ in ()).throw(Crash()) if k == 3 else batch(seed, k, *args)
        return data

    monkeypatch.setattr(txjax.training.edge, "build_dataset", crashing_dataset)
    with pytest.raises(Crash):
        train(tiny_config(*flags), tmp_path / "crashed")
    monkeypatch.undo()
    assert Checkpointer(tmp_path / "crashed" / "checkpoints", 3).latest_step() == 2
    train(tiny_config(*flags), tmp_path / "crashed")
    assert_trees_equal(params_of(tmp_path / "straight"), params_of(tmp_path / "crashed"))
    steps = [json.loads(line)["step"] for line in (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)


def test_evals_by_training_time_decode_and_do_not_count_against_the_budget(tmp_path, monkeypatch):
    """A fake clock: 1 s per reading, 1000 s per evaluation. With a 30 s budget and an eval every 3 s of training,
    the run must still take all its steps (were the evals counted, the first would end it), and each eval must
    carry the generated exact match and the training minutes so far."""
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    def slow_evaluate(*args, **kwargs):
        now[0] += 1000.0
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(txjax.training.loop, "monotonic", clock)
    monkeypatch.setattr(txjax.training.loop, "evaluate", slow_evaluate)
    config = tiny_config(
        "--config.train.max_minutes=0.5",
        "--config.train.eval_every_minutes=0.05",
        "--config.train.eval_generation=true",
    )
    result = train(config, tmp_path)
    valid = [r for r in read_metrics(tmp_path) if r["split"] == "valid"]
    assert result["step"] == 6 and result["train_minutes"] < 0.5 < result["wall_minutes"]
    assert len(valid) >= 3 and all("generated_exact_match" in r and r["train_minutes"] < 0.5 for r in valid)
    assert [r["train_minutes"] for r in valid] == sorted(r["train_minutes"] for r in valid)


def test_a_translation_run_logs_greedy_bleu_and_chrf_at_its_evals(tmp_path, pairs_tsv):
    """eval_generation on a translation task: each eval decodes the valid split greedily and logs BLEU and chrF,
    numbers in metrics.jsonl and TensorBoard (whose scalars take nothing else), and the run ends."""
    data = [f"--config.data.{k}={pairs_tsv}" for k in ("path", "valid_path")]
    flags = ["--config.family=encoder_decoder", "--config.data.kind=parallel", "--config.data.tokenizer=char", *data]
    generation = ["--config.train.eval_every=3", "--config.train.eval_generation=true"]
    config = config_lib.from_command_line(None, [*TINY_MODEL, *flags, *generation])  # no synthetic TINY_TASK
    result = train(config, tmp_path / "run")
    valid = [r for r in read_metrics(tmp_path / "run") if r["split"] == "valid"]
    assert result["step"] == 6 and [r["step"] for r in valid] == [3, 6]
    assert all(isinstance(r["bleu"], float) and 0 <= r["chrf"] <= 100 for r in valid)


def test_time_budget_stops_with_a_checkpoint_and_a_final_eval(tmp_path):
    result = train(tiny_config("--config.train.max_minutes=1e-9"), tmp_path)
    assert result["step"] == 1 and "valid_loss" in result
    assert Checkpointer(tmp_path / "checkpoints", 3).latest_step() == 1


def test_profile_steps_write_a_trace_of_those_steps_and_print_its_top_ops(tmp_path, capsys):
    train(tiny_config("--config.train.profile_steps=2:4"), tmp_path)
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and list(traces[0].parent.glob("*.trace.json.gz"))
    ops = profiling.top_ops(tmp_path / "profile", n=1000)
    assert ops and abs(sum(r["share"] for r in ops) - 1.0) < 1e-6
    step_ops = [r for r in ops if r["module"] == ops[0]["module"]]  # the costliest program: the training step
    assert all(r["calls"] % 2 == 0 for r in step_ops)  # steps 3 and 4: each of its ops twice (or 2k times in loops)
    assert profiling.format_ops(ops[:10]) in capsys.readouterr().out
    with pytest.raises(config_lib.ConfigError, match="profile_steps='4:2': expected A:B with 0 <= A < B"):
        tiny_config("--config.train.profile_steps=4:2")


def test_a_config_saved_with_retired_decoding_keys_still_loads():  # fused_projections, later decoding_layout
    saved = REPO / "experiments" / "results" / "bible_en_es"
    assert "fused_projections" in json.loads((saved / config_lib.CONFIG_FILE).read_text())["model"]
    model = config_lib.load(saved).model
    assert "fused_projections" not in model and "decoding_layout" not in model
    config_lib.model_config(model.to_dict())
