"""Runs the shell commands of README.md and docs/*.md as written, in order, and records what each did: the docs'
commands checked by running them (issue 55).

    python benchmarks/docs_commands.py [--pages=README.md,docs/decoding.md] [--timeout=900]

Every line of a ```bash block (continuation lines joined) is a command. They run one after another in a scratch
folder laid out as the docs assume (run.py, experiments/, benchmarks/ of this checkout; ../shared/data/ beside it;
runs/ fresh), each in its own bash with the variables earlier lines set (GGUF=...). A command followed by a
`# error: TEXT` line must exit 2 and print that line; every other must exit 0. Recorded per command: page, line,
the command as written, what ran instead (with the reason), exit status, seconds, the last lines of its output on a
failure. Written to benchmarks/results/docs_commands_PLATFORM.json after each command.

What runs is the command as written, except (each change printed and recorded with its reason):
  SHORTER   a command that trains for minutes to hours gets --config.train.steps (and an eval of a whole text
            --max_tokens): the command's path is what is checked, not its training;
  SETUP     a workdir that a command reads and no earlier command of the docs writes is trained first, briefly;
  SKIPPED   what cannot run here: the network (pip, the Hugging Face hub), a GPU, a corpus or cluster of the
            reader's own ([...] placeholders), the test suite itself (.ci/run runs it), the benchmarks (each is
            minutes to hours: their figures' result files are the record), an import into a workdir an earlier
            page's command imported (README's and docs/pretrained.md's SmolLM2: a second import there is refused).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = common.REPO
STEPS = "--config.train.steps=4 --config.train.eval_every=2 --config.train.eval_batches=1"

# (pattern in the command, reason): the first that matches skips the command
SKIP = [
    (r"^python3 -m venv|^pip install", "installs packages from PyPI (the network); .ci/run does it in a fresh clone"),
    (r"pytest", "the test suite itself: .ci/run runs it (about 10 minutes on 2 cores)"),
    (r"gpu(_wheels)?\.sh|--target /tmp/site", "needs a CUDA machine (docs/gpu.md)"),
    (r"^python benchmarks/", "a benchmark: minutes to hours; its result file records the command and figures"),
    (r"lm-eval .*--tasks=hellaswag", "the tasks' data sets come from the Hugging Face hub (the network); "
     "tests/test_lm_eval.py runs run.py lm-eval on a local task"),
    (r"--launcher=ray .*(/shared/|\[--address)", "a Ray cluster and shared folder of the reader's own"),
    (r"^srun |^gcloud ", "a Slurm cluster or a Cloud TPU slice of the reader's own"),
    (r"run\.py compile ", "needs libtpu (the tpu extra); tests/test_compile.py runs it"),
    (r"^for .*--process_id=", "jax.distributed processes training for minutes; tests/test_multiprocess.py runs them"),
    (r"(corpus|fineweb|pile|my_dataset)/|corpus/\*|runs/data/corpus", "a corpus of the reader's own"),
    (r"family_comparison", "the family comparison: its settings' train.steps are the equal-time budget (no "
     "shorter --config.train.steps), about an hour; experiments/ablations/results/family_comparison*/ are the record"),
    (r"path/to/|runs/qwen_moe", "a checkpoint folder of the reader's own (path/to/...) and the workdir imported "
     "from it"),
]  # fmt: skip
# (pattern, what is appended, reason): every match applies
SHORTER = [
    (r"run\.py (train|sweep)\b", STEPS, "trains for minutes to hours"),
    (r"run\.py eval .*--text=", "--max_tokens=2048", "scores a whole text with a 135M model: minutes on a CPU"),
    (r"run\.py lm-eval ", "--limit=4", "every example of its tasks with a 135M model: minutes on a CPU"),
]
# a workdir read by the docs but written by no command of theirs: (workdir, the short command that writes it)
SETUP = {
    "runs/bible": f"python run.py train --config=experiments/bible_en_es.py --workdir=runs/bible {STEPS}",
}


def pages(names: str | None = None) -> list[Path]:
    """The pages named (comma-separated, relative to the repository), or README.md and docs/*.md."""
    return (
        [REPO / p for p in names.split(",")] if names else [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    )


def commands(page: Path) -> list[tuple[int, str, str]]:
    """(line number, command, the `# error:` line documented after it or '') of each ```bash block line."""
    found, lines, i, inside = [], page.read_text().splitlines(), 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            inside = not inside and line.strip() in ("```bash", "```sh")
        elif inside and line.strip() and not line.lstrip().startswith("#"):
            start, command = i, line.strip()
            while i + 1 < len(lines) and (
                command.endswith("\\")
                or lines[i + 1].lstrip().startswith("[")
                or open_quote(command)
                or (command.startswith("for ") and not re.search(r"\bdone\b", command))  # a loop, to its `done`
            ):
                i += 1  # a continued line, a template's [--optional flags] line, a quoted string's next line
                command = (
                    command[:-1].rstrip() + " " + lines[i].strip()
                    if command.endswith("\\")
                    else (command + ("\n" if open_quote(command) else " ") + lines[i].strip())
                )
            after = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found.append((start + 1, command, after[2:] if after.startswith("# error:") else ""))
        i += 1
    return found


def open_quote(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # No closing quotation
        return True
    return False


def plan(command: str, made: set[str]) -> tuple[str | None, list[str]]:
    """(what to run, or None: skipped; the changes with their reasons)."""
    bare, notes = re.sub(r"\s+#.*$", "", command), []  # without its trailing comment
    if bare.startswith("python3 -m venv"):  # README's first line: the install is .ci/run's, the command after it runs
        bare, notes = bare.rpartition("&& ")[2], ["SKIPPED its venv and pip install (the network): .ci/run does them"]
    for pattern, reason in SKIP:
        if re.search(pattern, bare):
            return None, [f"SKIPPED: {reason}"]
    imported = re.search(r"run\.py import .*--workdir=(\S+)", bare)
    if imported and imported[1] in made:
        return None, [f"SKIPPED: an earlier command imported {imported[1]}; a second import into it is refused"]
    for pattern, extra, reason in SHORTER:
        if re.search(pattern, bare):
            resumed = "run.py train" in bare and set(re.findall(r"--workdir=(\S+)", bare)) & made
            extra = extra.replace("steps=4", "steps=8") if resumed and "--config.train.steps" in command else extra
            bare, notes = f"{bare} {extra}", [*notes, f"SHORTER ({reason}): + {extra}"]
    for workdir in re.findall(r"--workdir=(\S+)", bare):
        if workdir in SETUP and workdir not in made and "run.py train" not in bare:
            notes.append(f"SETUP (no command of the docs writes {workdir}): {SETUP[workdir]}")
            bare = f"{SETUP[workdir]} > /dev/null && {bare}"
            made.add(workdir)
    made.update(re.findall(r"--workdir=(\S+)", bare) if "run.py train" in bare or "import" in bare else [])
    return bare, notes


def scratch(tmp: Path) -> Path:
    """A folder laid out as the docs assume: the checkout's run.py, experiments/, benchmarks/, txjax/ and
    ../shared/data/."""
    root = tmp / "repo"
    root.mkdir()
    for name in ("run.py", "experiments", "benchmarks", "txjax"):
        (root / name).symlink_to(REPO / name)
    shared = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if (p / "data").is_dir()), None)
    if shared:
        (tmp / "shared").symlink_to(shared)
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", help="comma-separated pages (default: README.md and docs/*.md)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one command may take")
    parser.add_argument("--list", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/docs_commands_PLATFORM.json)")
    args = parser.parse_args()
    rows, made, variables = [], set(), {}
    with tempfile.TemporaryDirectory() as tmp:
        root = scratch(Path(tmp))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        for page in pages(args.pages):
            for line, command, error in commands(page):
                ran, notes = plan(command, made)
                row = {"page": str(page.relative_to(REPO)), "line": line, "command": command, "ran": ran}
                row |= {"notes": notes, "expected": f"exit 2, {error}" if error else "exit 0"}
                if ran is not None and not args.list:
                    row |= run(ran, root, {**env, **variables}, args.timeout, variables, error)
                rows.append(row)
                status = "skipped" if ran is None else row.get("status", "")
                print(f"{status:>8} {row.get('seconds', 0):6.0f} s  {row['page']}:{line}  {command[:90]}", flush=True)
                for note in notes:
                    print(f"{'':18}{note}", flush=True)
                if row.get("status") not in (None, "ok"):
                    print(row["output_tail"], flush=True)
                if args.list:
                    print(f"{'':18}runs: {ran}")
                    continue
                path = common.save("docs_commands", {"timeout_s": args.timeout, "rows": rows}, args.out)
    if args.list:
        return
    counts = {s: sum(r.get("status", "skipped") == s for r in rows) for s in ("ok", "failed", "timeout", "skipped")}
    print(f"{len(rows)} commands: {counts}; wrote {path}")
    sys.exit(1 if counts["failed"] or counts["timeout"] else 0)


def run(command: str, root: Path, env: dict, timeout: float, variables: dict, error: str) -> dict:
    """Runs `command` in bash in `root`; an assignment NAME=... sets `variables[NAME]` for the commands after it."""
    assignment = re.fullmatch(r"([A-Za-z_]\w*)=(\$\(.*\)|\S*)", command)  # not NAME=VALUE command (its env)
    script = f'{command}; printf %s "${assignment[1]}"' if assignment else command
    start = time.perf_counter()
    try:
        done = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": time.perf_counter() - start, "output_tail": ""}
    seconds = time.perf_counter() - start
    if assignment and done.returncode == 0:
        variables[assignment[1]] = done.stdout
    output = done.stdout + done.stderr
    ok = (done.returncode == 2 and error in done.stderr) if error else done.returncode == 0
    tail = "\n".join(output.strip().splitlines()[-8:])
    return {"status": "ok" if ok else "failed", "exit": done.returncode, "seconds": seconds,
            "output_tail": "" if ok else tail, "command_line": shlex.join(["bash", "-c", script])}  # fmt: skip


if __name__ == "__main__":
    main()
