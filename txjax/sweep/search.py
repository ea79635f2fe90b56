"""A sweep's sampled settings: the `search` section of a sweep file (txjax.sweep.spec), drawn by Ray Tune's and
Optuna's samplers, not by txjax's own.

    search = {"kind": "random" | "optuna", "num_samples": N, "seed": S,
              "space": {field: ("loguniform", lo, hi) | ("uniform", lo, hi) | ("choice", [values]) |
                       ("randint", lo, hi)}}          # randint: lo <= value < hi, as in Tune

random: N points drawn up front by Tune's sampling domains (tune.loguniform ...) from one NumPy generator seeded by
S, so the in-process and the Ray sweep of one file train the same points, and a rerun the same ones. optuna: N points
proposed one after another by Optuna's TPE sampler seeded by S, each told the mean final valid loss of its seeds
(in-process through optuna's ask/tell; on Ray through Tune's OptunaSearch with the same sampler and distributions:
the same points as in-process when trials run one at a time, --max_concurrent=1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from txjax.errors import ConfigError
from txjax.extras import require

SEARCH_KINDS = ("random", "optuna")
ARGUMENTS = {"loguniform": "lo, hi", "uniform": "lo, hi", "randint": "lo, hi", "choice": "[values]"}
_KEYS = {"kind", "num_samples", "seed", "space"}


def check_section(search: dict, path: Path) -> None:
    """ConfigError naming the first thing wrong with a sweep file's search section."""
    if not isinstance(search, dict) or set(search) - _KEYS or search.get("kind") not in SEARCH_KINDS:
        raise ConfigError(
            f"{path}: search must be {{'kind': 'random' | 'optuna', 'num_samples': N, 'seed': S, 'space': "
            f"{{field: (distribution, ...)}}}}; got {search!r}"
        )
    if not isinstance(search.get("num_samples"), int) or search["num_samples"] < 1:
        raise ConfigError(f"{path}: search needs num_samples, a positive integer")
    if not isinstance(search.get("seed", 0), int):
        raise ConfigError(f"{path}: the search's seed must be an integer")
    if not isinstance(search.get("space"), dict) or not search["space"]:
        raise ConfigError(f"{path}: search needs a space, {{field: (distribution, ...)}}")
    for field, dimension in search["space"].items():
        _check_dimension(field, dimension, path)


def _check_dimension(field: str, dimension, path: Path) -> None:
    known = ", ".join(f"({name!r}, {args})" for name, args in ARGUMENTS.items())
    bad = f"{path}: search space {field}: {dimension!r} is not one of {known}"
    if not isinstance(dimension, tuple | list) or not dimension or dimension[0] not in ARGUMENTS:
        raise ConfigError(bad)
    name, *args = dimension
    if name == "choice":
        if len(args) != 1 or not isinstance(args[0], list | tuple) or not args[0]:
            raise ConfigError(bad)
        return
    if len(args) != 2 or not all(isinstance(a, int | float) and not isinstance(a, bool) for a in args):
        raise ConfigError(bad)
    lo, hi = args
    if not lo < hi or (name == "loguniform" and lo <= 0) or (name == "randint" and not isinstance(lo + hi, int)):
        raise ConfigError(f"{bad}: it needs lo < hi (loguniform: 0 < lo; randint: integers)")


def first_point(space: dict) -> dict:
    """One value of every dimension (its lower bound or first choice): checks that the fields exist."""
    return {field: d[1][0] if d[0] == "choice" else d[1] for field, d in space.items()}


def tune_space(space: dict) -> dict:
    """{field: Ray Tune sampling domain}."""
    tune = require("ray.tune", "a sweep's random search")
    domains = {"loguniform": tune.loguniform, "uniform": tune.uniform, "randint": tune.randint, "choice": tune.choice}
    return {field: domains[d[0]](*d[1:]) for field, d in space.items()}


def random_points(search: dict) -> list[dict]:
    """num_samples points, each field drawn by its Tune domain, all from one generator seeded by search["seed"]."""
    rng = np.random.default_rng(search.get("seed", 0))
    domains = tune_space(search["space"])
    return [{f: _plain(d.sample(random_state=rng)) for f, d in domains.items()} for _ in range(search["num_samples"])]


def _plain(value):
    """A NumPy scalar as the Python number a config takes (and a run name shows)."""
    return value.item() if isinstance(value, np.generic) else value


def optuna_sampler(search: dict):
    """Optuna's TPE sampler, seeded by search["seed"]."""
    optuna = require("optuna", "a sweep's optuna search")
    return optuna.samplers.TPESampler(seed=search.get("seed", 0))


def optuna_space(space: dict) -> dict:
    """{field: Optuna distribution}, the same dimensions as tune_space."""
    distributions = require("optuna", "a sweep's optuna search").distributions
    make = {
        "loguniform": lambda lo, hi: distributions.FloatDistribution(lo, hi, log=True),
        "uniform": lambda lo, hi: distributions.FloatDistribution(lo, hi),
        "randint": lambda lo, hi: distributions.IntDistribution(lo, hi - 1),
        "choice": lambda values: distributions.CategoricalDistribution(list(values)),
    }
    return {field: make[d[0]](*d[1:]) for field, d in space.items()}
