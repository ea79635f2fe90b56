"""No public name defined at the top of two txjax modules for different things (a reader who finds `check` or
`KINDS` must not have to ask which one). The exceptions are one role kept by several modules on purpose, each
listed here with the role."""

import ast
from collections import defaultdict
from pathlib import Path

TXJAX = Path(__file__).resolve().parents[1] / "txjax"

ROLES = {
    "main": "a command's entry point (txjax/cli/*, and the harness's own CLI in evaluate/lm_eval_model.py)",
    "attention": "the attention backends of one contract (model/blockwise.py, model/ring_attention.py)",
    # each converter in txjax/convert/ is one format's module of the same functions and tables
    **dict.fromkeys(
        ("config_from_hf", "config_to_hf", "params_from_hf", "params_to_hf", "config_from_gguf", "MODEL_TYPES",
         "ARCHITECTURES", "FAMILY", "HF_ACTIVATIONS"),
        "a converter's function or table (txjax/convert/)",
    ),
}  # fmt: skip


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return {name for name in names if not name.startswith("_")}


def test_no_public_name_is_defined_in_two_modules_outside_the_listed_roles():
    where = defaultdict(list)
    for path in sorted(TXJAX.rglob("*.py")):
        for name in top_level_names(path):
            where[name].append(str(path.relative_to(TXJAX)))
    twice = {name: files for name, files in where.items() if len(files) > 1 and name not in ROLES}
    assert twice == {}
