"""The generated tables of README.md and docs/*.md are what the committed result files say
(benchmarks/readme_tables.py)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

spec = importlib.util.spec_from_file_location("readme_tables", REPO / "benchmarks" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_tables)
PAGES = {str(path.relative_to(REPO)): path.read_text() for path in readme_tables.pages()}


def test_every_generated_table_agrees_with_its_result_files():
    names = [table for text in PAGES.values() for table in readme_tables.generated(text)]
    assert len(names) >= 6
    assert sorted(names) == sorted(readme_tables.TABLES)  # every table on one page, once
    assert {name: readme_tables.differing(text, name) for name, text in PAGES.items()} == dict.fromkeys(PAGES, [])


def test_a_figure_edited_by_hand_is_named():
    """One digit of the data table changed in its page (not in its file) makes that table, and only it, differ."""
    marker = "<!-- generated: python benchmarks/readme_tables.py (data) -->\n"
    page = next(text for text in PAGES.values() if marker in text)
    digit = page.index(" MB/s", page.index(marker)) - 1  # the last digit of prepare's first MB/s
    assert page[digit].isdigit()
    edited = page[:digit] + str((int(page[digit]) + 1) % 10) + page[digit + 1 :]
    assert readme_tables.differing(edited) == ["data"]


def test_machines_are_labelled_and_load_is_said():
    label = readme_tables.machine_label
    idle = {"cpu_model": "AMD EPYC 9B45", "cpu_cores": 2, "date": "2026-12-01 10:00", "load_average_1min": 1.0}
    assert label(idle) == "AMD EPYC 9B45, 2 cores, 2026-12-01"
    assert label({**idle, "load_average_1min": 6.0}).endswith(", load 6.0")
    assert label({"cpu_cores": 2, "date": "2026-11-30 17:00"}).startswith("CPU model not recorded")
