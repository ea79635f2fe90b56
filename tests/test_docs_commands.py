"""benchmarks/docs_commands.py, which runs the shell commands of README.md and docs/*.md as written: every command
is found (continued lines, a quoted string over two lines, a template's [--flags] line, a for loop), each one runs
or is skipped with its reason, a documented `# error:` line is what its command must print, and the commands a new
user copies first all run."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(REPO / "benchmarks"))  # docs_commands imports benchmarks/common.py
spec = importlib.util.spec_from_file_location("docs_commands", REPO / "benchmarks" / "docs_commands.py")
docs_commands = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_commands)


def planned() -> dict[tuple[str, int], tuple[str, str | None, list[str], str]]:
    """{(page, line): (command as written, what runs or None, notes, documented error)} over every page, in order."""
    made, out = set(), {}
    for page in docs_commands.pages():
        for line, command, error in docs_commands.commands(page):
            ran, notes = docs_commands.plan(command, made)
            out[(str(page.relative_to(REPO)), line)] = (command, ran, notes, error)
    return out


def test_every_docs_command_runs_or_is_skipped_with_its_reason():
    plans = planned()
    assert len(plans) >= 50
    for (page, line), (command, ran, notes, _) in plans.items():
        assert ran is not None or (len(notes) == 1 and notes[0].startswith("SKIPPED: ")), (page, line, command)
        assert not command.lstrip().startswith("["), (page, line)  # a template's flags belong to their command
    running = [ran for _, ran, _, _ in plans.values() if ran]
    first = [
        "python run.py train",  # README's first line, after its install
        "python run.py train --config=experiments/shakespeare_char.py --workdir=runs/sc ",
        "python run.py eval --workdir=runs/sc --split=valid",
        'python run.py generate --workdir=runs/sc --prompt="ROMEO:" --max_new_tokens=400',
        "python run.py import --from=$GGUF --workdir=runs/smollm2",
        "python run.py export --workdir=runs/smollm2 --to=runs/smollm2_hf",
        "python run.py sweep --sweep=experiments/ablations/attention_scaling.py --workdir=runs/sweeps/",
        "python run.py lm-eval --workdir=runs/smollm2 --include_path=experiments/lm_eval",
        'python run.py generate --workdir=runs/bible --prompt="In the beginning',
    ]
    for command in first:
        assert any(command in ran for ran in running), command
    bible = next(ran for ran in running if "generate --workdir=runs/bible" in ran)
    assert bible.startswith("python run.py train --config=experiments/bible_en_es.py --workdir=runs/bible ")
    steps = [ran for ran in running if "run.py train --" in ran or "run.py sweep --" in ran]
    assert len(steps) >= 10 and all(docs_commands.STEPS.partition(" ")[2] in ran for ran in steps)  # shortened


def test_a_quoted_string_over_two_lines_is_one_command_and_documented_errors_are_expected():
    plans = planned()
    (parquet,) = [c for c, _, _, _ in plans.values() if c.startswith('python -c "import pyarrow')]
    assert "\npq.write_table(" in parquet and parquet.endswith('row_group_size=1000)"')
    errors = {c: e for c, _, _, e in plans.values() if e}
    assert errors["python run.py train --config.model.num_layer=6"].startswith(
        "error: --config.model.num_layer: unknown key 'num_layer'"
    )
    (loop,) = [c for c, _, _, _ in plans.values() if c.startswith("for i in 0 1; do")]  # docs/scaling.md's
    assert "--process_id=$i &" in loop and loop.endswith("done; wait")
    assert not docs_commands.open_quote('python -c "print(1)"') and docs_commands.open_quote('python -c "print(')
