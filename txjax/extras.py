"""Optional dependencies (pyproject.toml's extras), top-level as any wing may need one: `require(module, what)` imports
one, or fails with one line that names the package, what needs it and the install command, e.g.

    error: reading a .gguf file needs the 'gguf' package (the interop extra): pip install -e '.[interop]'

MissingExtra is a ModuleNotFoundError (code that catches ImportError still does); run.py prints it as that one line,
without a traceback, and exits with status 2, like a config error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {  # module -> the extra of pyproject.toml that installs it
    "torch": "interop",
    "transformers": "interop",
    "tokenizers": "interop",
    "gguf": "interop",
    "accelerate": "interop",
    "jinja2": "interop",
    "peft": "interop",  # what loads the LoRA adapters export writes (the tests' reference)
    "lm_eval": "lmeval",
    "ray": "sweep",
    "optuna": "sweep",
    "pyarrow": "data",
    "zstandard": "data",
    "wandb": "track",
    "mlflow": "track",
    "libtpu": "tpu",
}


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed: one line naming it and the extra that installs it."""


def require(module: str, what: str) -> ModuleType:
    """`import module` (a dotted name imports the submodule too), or MissingExtra: "{what} needs the '{package}'
    package (the {extra} extra): pip install -e '.[{extra}]'"."""
    package = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.partition(".")[0] != package:
            raise  # the package is there but broken (one of its own imports failed): its traceback says why
        extra = EXTRAS[package]
        raise MissingExtra(
            f"{what} needs the {package!r} package (the {extra} extra): pip install -e '.[{extra}]'", name=package
        ) from None
