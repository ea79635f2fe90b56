"""The loop's view of what it trains (txjax.training.trainee.Trainee): one run and stacked runs both keep it, member
for member, with the Protocol's parameter names; and the loop calls nothing on them outside it."""

import ast
import inspect
from pathlib import Path

import pytest

from txjax import config as config_lib
from txjax.training import edge, loop
from txjax.training.run import Run
from txjax.training.stack import StackedRuns
from txjax.training.trainee import Trainee

MEMBERS = [name for name in dir(Trainee) if not name.startswith("_") and callable(getattr(Trainee, name))]


@pytest.mark.parametrize("cls", [Run, StackedRuns])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_method_of_the_protocol_is_there_with_its_parameters(cls, name):
    theirs, ours = inspect.signature(getattr(Trainee, name)), inspect.signature(getattr(cls, name))
    assert list(ours.parameters) == list(theirs.parameters), f"{cls.__name__}.{name}{ours} against Trainee{theirs}"


def test_runs_are_trainees_and_the_loop_asks_nothing_else_of_them(tmp_path):
    flags = ["--config.data.max_digits=2", "--config.data.eval_size=4", "--config.model.num_layers=1"]
    config = config_lib.from_command_line(None, flags)
    runs = [Run(edge.prepare_run(config.copy_and_resolve_references(), tmp_path / str(r))[0]) for r in range(2)]
    for trainee in (runs[0], StackedRuns(runs)):
        trainee.compile(*trainee.build())  # sets train_step (jitted, not yet compiled)
        assert isinstance(trainee, Trainee)
    declared = set(dir(Trainee)) | set(Trainee.__annotations__)
    tree = ast.parse(Path(inspect.getsourcefile(loop)).read_text())
    body = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_loop")
    asked = {n.attr for n in ast.walk(body) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "run"}
    assert asked and asked <= declared, f"the loop asks {sorted(asked - declared)} beyond the Trainee Protocol"
