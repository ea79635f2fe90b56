"""What a compiled program holds, read from XLA: its memory per device (memory_analysis), its FLOPs and XLA's
estimate of its time (cost_analysis), and its collectives, counted in the optimized HLO text.

Collectives are counted as they execute: one inside a while loop (scanned layers, grad_accum's micro-batches) counts
its trip count times (the known_trip_count XLA records, or the bound its condition compares the counter with; a
loop with neither counts once), and bytes
are the collective's output (an all-gather's gathered array, a reduce-scatter's shard; a TPU writes a reduce-scatter
as an all-reduce-scatter computation, an all-reduce of which each device keeps its part). A collective between the
slices of a multi-slice topology is a send to the multi-slice runtime (and a recv), its kind in its attributes: counted
also under `across_slices`, its bytes those each device sends. A program whose step is a loop's body (decoding: one
token a trip, until a bound the condition reads from the cache's length) counts the entry's loops one trip.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np

COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "bf16": 2, "c64": 8, "c128": 16}  # the others: their bit width / 8 (s4 half a byte)

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_COLLECTIVE = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVE_KINDS) + r")(-done)?\(")
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r"known_trip_count[^0-9]*(\d+)")
_CONDITION = re.compile(r"condition=%?([\w.\-]+)")
_INT_CONSTANT = re.compile(r"= s32\[\]\S* constant\((\d+)\)")
# a collective between slices: a send to the multi-slice runtime over the data-center network (and its recv)
_ACROSS_SLICES = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_ARRAY = re.compile(r"\b(pred|bf16|c64|c128|[suf]\d+|f8\w*)\[([\d,]*)\]")


def memory_per_device(compiled) -> dict:
    """Bytes one device holds while the program runs: arguments, outputs (less those aliasing donated arguments),
    temporaries and code, and their total."""
    m = compiled.memory_analysis()
    figures = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes - m.alias_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "code": int(m.generated_code_size_in_bytes),
    }
    return figures | {"total": sum(figures.values())}


def cost(compiled) -> dict:
    """XLA's cost analysis of one device's program: flops, bytes accessed and optimal_seconds (its estimate of the
    step's time; a TPU compiler's, absent on CPU)."""
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis  # jax < 0.4.30 gave one dict per program
    return {k: float(analysis[k]) for k in ("flops", "bytes accessed", "optimal_seconds") if k in analysis}


def array_bytes(shape: str) -> int:
    """Bytes of an HLO shape (an array or a tuple of them): f32[128,256]{1,0} -> 131072."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        size = DTYPE_BYTES.get(dtype) or int(re.sub(r"\D", "", dtype)[:2] or 8) / 8
        total += size * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def replica_groups(instruction: str, devices: int) -> list[list[int]]:
    """The device groups of a collective: replica_groups={{0,1},{2,3}}, the iota form [G,S]<=[dims]T(perm), or a
    collective-permute's source_target_pairs; all `devices` in one group when none is given."""
    if found := re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", instruction):
        shape, dims = [int(n) for n in found[1].split(",")], [int(n) for n in found[2].split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if found[3]:
            ids = ids.transpose([int(n) for n in found[3].split(",")])
        return ids.reshape(shape[0], -1).tolist()
    if found := re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,{} ]*\})\}", instruction):
        return [[int(n) for n in g.split(",") if n.strip()] for g in re.findall(r"\{([\d, ]*)\}", found[1])]
    return [list(range(devices))]


def collectives(hlo_text: str, devices: int, entry_loops_once: bool = False) -> dict:
    """{kind: {"count", "bytes"}} of the collectives one execution of the optimized HLO module of a program over
    `devices` runs (module docstring); those between slices also under "across_slices" (when there are any).
    entry_loops_once: a while loop of the entry computation counts one trip (a program whose step is its body)."""
    computations, order = _computations(hlo_text)
    times = _executions(computations, order, entry_loops_once)
    counted = {"all": defaultdict(lambda: [0, 0]), "across_slices": defaultdict(lambda: [0, 0])}
    for name in order:
        for line in computations[name]:
            if found := _COLLECTIVE.search(line):
                kind, size, scopes = found[2], array_bytes(found[1]), ["all"]  # an async pair: its -done, its output
                if name.startswith("all-reduce-scatter"):  # a TPU's reduce-scatter: an all-reduce kept in part
                    kind, size = "reduce-scatter", size // len(replica_groups(line, devices)[0])
            elif " send(" in line and (found := _ACROSS_SLICES.search(line)):
                shape = line.split("=", 1)[1].split(" send(")[0]
                kind, size = found[1].lower().replace("_", "-"), array_bytes(_ARRAY.search(shape)[0])
                scopes = ["all", "across_slices"]
            else:
                continue
            for scope in scopes:
                counted[scope][kind][0] += times[name]
                counted[scope][kind][1] += times[name] * size
    result = {scope: {k: {"count": c, "bytes": b} for k, (c, b) in sorted(v.items())} for scope, v in counted.items()}
    return result["all"] | ({"across_slices": result["across_slices"]} if result["across_slices"] else {})


def has_loops(hlo_text: str) -> bool:
    """Whether a computation of the module runs more than once a step (a while loop's body, trip count over 1)."""
    computations, order = _computations(hlo_text)
    return max(_executions(computations, order).values()) > 1


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], list[str]]:
    """{computation: its instruction lines} and the computations in the text's order (callees before callers)."""
    computations, order, current = {}, [], None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t", "}")) and (found := _COMPUTATION.match(line)):
            current = found[1] if not line.startswith("ENTRY") else "ENTRY"
            computations[current], order = [], [*order, current]
        elif current is not None and line.startswith((" ", "\t")):
            computations[current].append(line)
    return computations, order


def _executions(computations: dict[str, list[str]], order: list[str], entry_loops_once: bool = False) -> dict[str, int]:
    """How often each computation runs per execution of the entry: its callers' counts, times a while loop's known
    trip count (one for the entry's loops with `entry_loops_once`). Callers come after their callees in the text, so
    one pass in reverse order sees every caller first."""
    times = defaultdict(int, {"ENTRY": 1})
    for name in reversed(order):
        for line in computations[name]:
            called = _CALLED.findall(line)
            if found := _BRANCHES.search(line):
                called += [c.strip().lstrip("%") for c in found[1].split(",")]
            looped = " while(" in line and not (entry_loops_once and name == "ENTRY")
            trips = _trip_count(line, computations) if looped else 1
            for callee in called:
                times[callee] += times[name] * trips
    return times


def _trip_count(line: str, computations: dict[str, list[str]]) -> int:
    """A while loop's trip count: XLA's known_trip_count where it records one, else the bound its condition compares
    the counter with (a scan's `i < N`: its one integer constant); 1 when neither says."""
    if found := _TRIP_COUNT.search(line):
        return int(found[1])
    condition = computations.get(_CONDITION.search(line)[1], [])
    bounds = [int(found[1]) for c in condition if (found := _INT_CONSTANT.search(c))]
    return bounds[0] if len(bounds) == 1 else 1
