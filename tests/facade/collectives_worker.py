"""Run every collective on every case of a spec file, with accelerando or the reference; write what each returned.

Started by ``test_collectives_shapes_vs_reference.py``, in one process (plain interpreter) or two
(``accelerando launch --num_processes 2``), with ``--lib accelerate --lib accelerando``: the
installed reference (no stand-in) runs every case, then accelerando does, in the same processes
(each with its own process state; both join the process group the launch set up). Each rank writes
``rank<N>-<lib>.json``: for every (place, operation, case) the encoded result, or the name of the
exception it raised. The test compares the two libraries' files entry for entry.

A case is a JSON description of the data one rank passes (``build``): tensors whose values depend on
the rank (so a gather shows whose rows came back), Python scalars, strings, None, and lists, tuples
and dicts of them. A tensor's size may grow with the rank (``[base, step]``) for padding.

Places: ``outside`` (no dataloader), and the first and the last batch of two prepared dataloaders
whose length the total batch size does not divide (the last batch is the uneven one, where
``gather_for_metrics`` drops the duplicated samples).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool, "float64": torch.float64}

#: (dataset length, batch size per process, iterable?) of the dataloaders: 1 process leaves 1, 3 and 1
#: rows in the last batch, 2 processes leave 1 of 4, 7 of 8 and 1 of 4.
LOADERS = ((5, 2, False), (7, 4, False), (5, 2, True))


class Stream(torch.utils.data.IterableDataset):
    """``range(length)`` as iterable data (no ``len``)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Any:
        return iter(range(self.length))


def build(spec: Any, rank: int) -> Any:
    """The data rank ``rank`` passes for ``spec`` (see the module docstring)."""
    kind = spec["kind"]
    if kind == "tensor":
        shape = [d if isinstance(d, int) else d[0] + d[1] * rank for d in spec["shape"]]
        count = 1
        for d in shape:
            count *= d
        values = torch.arange(count, dtype=torch.float64) + 100 * rank + spec.get("offset", 0)
        if spec["dtype"] == "bool":
            values = values.remainder(2)
        return values.reshape(shape).to(DTYPES[spec["dtype"]])
    if kind == "list":
        return [build(s, rank) for s in spec["items"]]
    if kind == "tuple":
        return tuple(build(s, rank) for s in spec["items"])
    if kind == "dict":
        return {key: build(s, rank) for key, s in spec["items"]}
    if kind == "int":
        return spec["v"] + rank
    if kind == "float":
        return spec["v"] + 0.5 * rank
    if kind == "str":
        return f"{spec['v']}-{rank}"
    if kind == "none":
        return None
    raise ValueError(f"unknown case kind {kind!r}")


def is_ragged(spec: Any) -> bool:
    """Whether the data of ``spec`` differs in shape from one process to another."""
    if spec["kind"] == "tensor":
        return any(not isinstance(d, int) and d[1] != 0 for d in spec["shape"])
    if spec["kind"] in ("list", "tuple"):
        return any(is_ragged(s) for s in spec["items"])
    if spec["kind"] == "dict":
        return any(is_ragged(s) for _, s in spec["items"])
    return False


def is_empty(data: Any) -> bool:
    """Whether ``data`` is an empty container."""
    return isinstance(data, (list, tuple, dict)) and not data


def encode(value: Any, depth: int = 0) -> Any:
    """A JSON form of ``value`` that keeps types (tensor dtype and shape, list vs tuple, dict order)."""
    if depth > 8:
        return {"deep": type(value).__name__}
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype), "shape": list(value.shape), "v": value.tolist()}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [encode(v, depth + 1) for v in value]}
    if isinstance(value, Mapping):
        return {type(value).__name__: [[str(k), encode(v, depth + 1)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {type(value).__name__: value}
    return {"other": type(value).__name__}


def outcome(call: Callable[[], Any], data: Any) -> Any:
    """``call()``'s encoded result, whether it is ``data`` itself, and whether ``data`` was changed."""
    before = encode(data)
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the exception's type is the observation
        return {"raises": type(error).__name__}
    return {"result": encode(result), "same_object": result is data, "input_changed": encode(data) != before}


def operations(lib: Any, accelerator: Any, world: int) -> dict[str, Callable[[Any], Any]]:
    """The calls to observe, by name: the Accelerator's methods and the utils functions."""
    utils = lib.utils
    last = world - 1
    return {
        "gather": accelerator.gather,
        "gather_for_metrics": accelerator.gather_for_metrics,
        "gather_for_metrics_object": lambda d: accelerator.gather_for_metrics(d, use_gather_object=True),
        "reduce_sum": lambda d: accelerator.reduce(d),
        "reduce_mean": lambda d: accelerator.reduce(d, reduction="mean"),
        "reduce_scaled": lambda d: accelerator.reduce(d, reduction="sum", scale=2.0),
        "utils_reduce": utils.reduce,
        "pad_dim0": accelerator.pad_across_processes,
        "pad_dim1_first": lambda d: accelerator.pad_across_processes(d, dim=1, pad_index=-1, pad_first=True),
        "pad_dim_last": lambda d: accelerator.pad_across_processes(d, dim=-1),
        "utils_gather": utils.gather,
        "utils_gather_object": utils.gather_object,
        "utils_broadcast": lambda d: utils.broadcast(d, from_process=last),
        "utils_broadcast_object_list": lambda d: utils.broadcast_object_list(d, from_process=last),
    }


#: What data of different shapes on different processes may meet: the reference's gather, reduce and
#: broadcast abort the process (gloo's size check) or hang on it, so only these see ragged cases.
RAGGED_OK = ("pad_dim0", "pad_dim1_first", "pad_dim_last", "utils_gather_object", "gather_for_metrics_object")
#: torch's broadcast_object_list waits forever on an empty list (or dict), and the reference passes it on (ours
#: returns at once: tests/utils/test_utils_distributed.py).
HANGS_ON_EMPTY = ("utils_broadcast_object_list",)
TRACE = bool(os.environ.get("COLLECTIVES_TRACE"))
FOR_METRICS = ("gather_for_metrics", "gather_for_metrics_object")


def run_cases(lib: Any, cases: list[Any], rank: int, world: int) -> dict[str, Any]:
    """Every operation on every case outside a dataloader; ``gather_for_metrics`` also inside them."""
    accelerator = lib.Accelerator(cpu=True)
    ops = operations(lib, accelerator, world)
    seen: dict[str, Any] = {}

    def observe(place: str, names: tuple[str, ...]) -> None:
        for index, spec in enumerate(cases):
            for name in names:
                data = build(spec, rank)
                if (is_ragged(spec) and name not in RAGGED_OK) or (name in HANGS_ON_EMPTY and is_empty(data)):
                    continue
                if TRACE:
                    print(f"[rank{rank}] {place} {name} {index}", file=sys.stderr, flush=True)
                seen[f"{place}|{name}|{index}"] = outcome(functools.partial(ops[name], data), data)

    observe("outside", tuple(ops))
    for length, batch, iterable in LOADERS:
        dataset = Stream(length) if iterable else list(range(length))
        loader = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=batch))
        for step, rows in enumerate(loader):
            # Observed while the batch is current: ``end_of_dataloader`` marks the last (uneven) one.
            last = accelerator.gradient_state.end_of_dataloader
            if step == 0 or last:
                place = f"{'stream' if iterable else 'loader'}{length}x{batch}/{'last' if last else 'first'}"
                seen[f"{place}|rows"] = encode(accelerator.gather_for_metrics(rows))
                observe(place, FOR_METRICS)
    return seen


def main() -> None:
    """Parse the arguments, run the cases with each library asked for, write this rank's files."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", choices=["accelerando", "accelerate"], action="append", required=True)
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cases = json.loads(args.cases.read_text())
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    args.out.mkdir(parents=True, exist_ok=True)
    environ = dict(os.environ)
    for name in args.lib:
        # Each library runs on the environment the process started with (nothing the one before set).
        os.environ.clear()
        os.environ.update(environ)
        lib = importlib.import_module(name)
        assert lib.__file__ and os.sep + name + os.sep in lib.__file__, lib.__file__  # no stand-in
        importlib.import_module(f"{name}.utils")  # `lib.utils` as an attribute
        seen = run_cases(lib, cases, rank, world)
        (args.out / f"rank{rank}-{name}.json").write_text(json.dumps(seen, indent=0, sort_keys=True))


if __name__ == "__main__":
    main()
