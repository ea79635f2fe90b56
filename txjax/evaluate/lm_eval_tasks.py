"""The lm-evaluation-harness tasks of a command (`run.py lm-eval` and the harness's own CLI with txjax registered):
found in the harness or an --include_path folder, each read once before any model runs, so that an unknown task or
an unreadable dataset is one line naming it."""

from __future__ import annotations

from txjax.errors import ConfigError

LOCAL_TASKS = "experiments/lm_eval"  # the shipped local-file tasks (txjax_capitals, txjax_sums, txjax_paragraphs)


def task_manager(names: list[str], include_path: str | None):
    """The harness's TaskManager: only the --include_path folder's tasks when it has all of `names` (indexing the
    harness's thousands of task YAMLs takes seconds), else those and the harness's."""
    from lm_eval.tasks import TaskManager

    if include_path:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    return TaskManager(include_path=include_path)


def load_tasks(task_manager, names: list[str]) -> None:
    """Each task built once (its dataset read) so that an unknown task or unreadable dataset is one line naming it."""
    for name in names:
        if name not in task_manager.all_tasks:
            raise ConfigError(
                f"--tasks: no task {name!r}: `lm_eval ls tasks` lists the harness's; a task of your own is a YAML"
                f" in a folder given as --include_path=DIR (see {LOCAL_TASKS})"
            )
        try:
            task_manager.load([name])
        except Exception as e:  # datasets raises ConnectionError, FileNotFoundError, DatasetNotFoundError, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"task {name!r}: its dataset could not be read ({reason}); offline, point the task at local files:"
                f" a YAML with dataset_path: json and dataset_kwargs.data_files in a folder given as --include_path"
                f" (example: {LOCAL_TASKS}, docs/lm_eval.md)"
            ) from None
