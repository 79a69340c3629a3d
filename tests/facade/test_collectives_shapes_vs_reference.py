"""gather_for_metrics, gather, reduce, pad_across_processes, broadcast (and the object collectives)
side by side with the installed reference, on every shape of data, in one process and in two.

``collectives_worker.py`` runs every operation on every case, outside a dataloader and on the first
and the last (uneven) batch of prepared dataloaders, with the real ``accelerate`` (no stand-in) and
then with accelerando, in fresh processes (two gloo processes through ``accelerando launch``, which
the reference joins as a 2-process job). Every observation must be equal: the
result's types, dtypes, shapes and values, whether the input itself came back, whether the input
was changed, or the same exception type. The cases are a fixed list of the shapes clients pass
(trl's 0-d token count, Python numbers, strings, None, nested lists/tuples/dicts, mixed containers,
empty ones, tensors whose size differs per process) plus cases drawn by hypothesis.

Where the reference raises and accelerando returns a result, the observation must be one of
``ACCEPTED_WHERE_REFERENCE_RAISES`` (an object that cannot be iterated given to an object gather,
an integer mean across processes): accelerando accepts more there, never less. One difference is
kept on purpose: padding a bool tensor keeps it bool (the reference turns it into int64 on the
processes that pad, so the processes' dtypes differ and a later gather fails).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from accelerando import Accelerator
from suite_support import run_distributed_preloaded

pytest.importorskip("accelerate")

WORKER = Path(__file__).with_name("collectives_worker.py")


def _tensor(shape: list[Any], dtype: str = "float32") -> dict[str, Any]:
    return {"kind": "tensor", "shape": shape, "dtype": dtype}


def _seq(kind: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "items": list(items)}


#: The shapes clients pass, named.
FIXED_CASES: list[dict[str, Any]] = [
    _tensor([], "int64"),  # trl: gather_for_metrics(outputs.num_valid_tokens).sum()
    _tensor([]),  # a mean loss
    _tensor([4]),
    _tensor([2, 3], "int64"),
    _tensor([2, 2], "bool"),
    _tensor([[2, 1], 3]),  # one more row on each later process: padding's case
    _tensor([3, [1, 1]], "int64"),
    {"kind": "int", "v": 3},
    {"kind": "float", "v": 1.5},
    {"kind": "str", "v": "a"},
    {"kind": "none"},
    _seq("list", _tensor([]), _tensor([3], "int64")),
    _seq("tuple", _tensor([2]), _tensor([2, 2])),
    {"kind": "dict", "items": [["a", _tensor([2])], ["b", _seq("tuple", _tensor([2, 2], "bool"))]]},
    {"kind": "dict", "items": [["logits", _tensor([[1, 1], 2])], ["labels", _tensor([[1, 1]], "int64")]]},
    _seq("list", {"kind": "str", "v": "x"}, {"kind": "int", "v": 1}),
    _seq("list"),
    {"kind": "dict", "items": []},
    {"kind": "dict", "items": [["n", {"kind": "int", "v": 1}], ["t", _tensor([2])]]},
]

#: (operation, exception the reference raises) where accelerando returns a result instead, and why.
ACCEPTED_WHERE_REFERENCE_RAISES = {
    ("utils_gather_object", "TypeError"): "an object that cannot be iterated contributes itself",
    ("gather_for_metrics", "TypeError"): "non-tensor data goes through gather_object (same reason)",
    ("gather_for_metrics_object", "TypeError"): "gather_object of an object that cannot be iterated",
    (
        "reduce_mean",
        "RuntimeError",
    ): "an integer mean becomes floating point (the reference divides in place)",
    ("utils_reduce", "RuntimeError"): "utils.reduce's default is the mean: same reason",
}


@st.composite
def _tensor_specs(draw: st.DrawFn) -> dict[str, Any]:
    shape: list[Any] = draw(st.lists(st.integers(1, 3), max_size=3))
    if shape and draw(st.booleans()):
        shape[0] = [shape[0], 1]  # the size grows with the process
    return _tensor(shape, draw(st.sampled_from(["float32", "int64", "bool", "float64"])))


_LEAVES = st.one_of(
    _tensor_specs(),
    st.builds(lambda v: {"kind": "int", "v": v}, st.integers(-5, 5)),
    st.builds(lambda v: {"kind": "float", "v": v}, st.sampled_from([0.25, -1.5])),
    st.builds(lambda v: {"kind": "str", "v": v}, st.sampled_from(["s", "tok"])),
    st.just({"kind": "none"}),
)
_SPECS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda items: _seq("list", *items), st.lists(inner, max_size=3)),
        st.builds(lambda items: _seq("tuple", *items), st.lists(inner, max_size=3)),
        st.builds(
            lambda items: {"kind": "dict", "items": [[k, v] for k, v in items.items()]},
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        ),
    ),
    max_leaves=5,
)


def drawn_cases(count: int) -> list[dict[str, Any]]:
    """``count`` cases drawn by hypothesis, the same ones on every run (derandomized), without repeats."""
    drawn: dict[str, dict[str, Any]] = {}

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(_SPECS)
    def collect(spec: dict[str, Any]) -> None:
        drawn.setdefault(json.dumps(spec, sort_keys=True), spec)

    collect()
    return list(drawn.values())


def _run_worker(processes: int, cases: Path, out: Path) -> dict[str, list[dict[str, Any]]]:
    """Run the worker in ``processes`` fresh processes; each library's observations, rank by rank."""
    worker = [
        str(WORKER),
        "--lib",
        "accelerate",
        "--lib",
        "accelerando",
        "--cases",
        str(cases),
        "--out",
        str(out),
    ]
    if processes == 1:
        command = [sys.executable, *worker]
    else:
        command = [sys.executable, "-m", "accelerando", "launch", "--num_processes", str(processes), *worker]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"worker x{processes} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return {
        lib: [json.loads((out / f"rank{rank}-{lib}.json").read_text()) for rank in range(processes)]
        for lib in ("accelerando", "accelerate")
    }


def _bool_kept(mine: Any, theirs: Any) -> bool:
    """Whether ``mine`` equals ``theirs`` but for bool tensors the reference returned as int64 with
    the same values: its padding adds ``pad_index`` to a new tensor, which promotes bool (only on
    the processes that pad, so their dtypes then differ); accelerando keeps the dtype.
    """
    if (
        isinstance(mine, dict)
        and mine.get("tensor") == "torch.bool"
        and theirs.get("tensor") == "torch.int64"
    ):
        return (
            mine["shape"] == theirs["shape"]
            and json.loads(json.dumps(mine["v"]).replace("true", "1").replace("false", "0")) == theirs["v"]
        )
    if isinstance(mine, dict) and isinstance(theirs, dict) and mine.keys() == theirs.keys():
        return all(mine[k] == theirs[k] or _bool_kept(mine[k], theirs[k]) for k in mine)
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        return all(a == b or _bool_kept(a, b) for a, b in zip(mine, theirs, strict=True))
    return False


def _compare(ours: dict[str, Any], reference: dict[str, Any], cases: list[Any]) -> tuple[list[str], int]:
    """The observations that differ (described), and how many were accepted where the reference raised."""
    assert ours.keys() == reference.keys()
    problems, accepted = [], 0
    for key in sorted(reference):
        mine, theirs = ours[key], reference[key]
        if mine == theirs:
            continue
        op, raised = key.split("|")[1], theirs.get("raises") if isinstance(theirs, dict) else None
        if raised and "raises" not in mine and (op, raised) in ACCEPTED_WHERE_REFERENCE_RAISES:
            accepted += 1
            continue
        if op.startswith("pad_") and _bool_kept(mine, theirs):
            accepted += 1
            continue
        case = cases[int(key.split("|")[2])] if key.count("|") == 2 else None
        problems.append(f"{key}\n  case: {json.dumps(case)}\n  ours:      {mine}\n  reference: {theirs}")
    return problems, accepted


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The fixed cases and the drawn ones, written where the workers read them."""
    every = FIXED_CASES + drawn_cases(40)
    path = tmp_path_factory.mktemp("collectives") / "cases.json"
    path.write_text(json.dumps(every))
    return path, every


@pytest.mark.parametrize("processes", [1, 2])
def test_collectives_return_what_the_reference_returns(
    processes: int, cases: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    path, every = cases
    seen = _run_worker(processes, path, tmp_path)
    for rank, (mine, theirs) in enumerate(zip(seen["accelerando"], seen["accelerate"], strict=True)):
        problems, accepted = _compare(mine, theirs, every)
        print(f"rank {rank}/{processes}: {len(theirs)} observations of {len(every)} cases, "
              f"{len(theirs) - len(problems) - accepted} equal, {accepted} accepted where the reference raises")  # fmt: skip
        assert not problems, f"{len(problems)} differ from the reference:\n" + "\n".join(problems[:15])


def test_a_zero_dim_count_on_the_last_uneven_batch_comes_back_whole(fresh_state: None) -> None:
    """trl's ``gather_for_metrics(outputs.num_valid_tokens).sum()`` on the last, short batch."""
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(5)), batch_size=2))
    counts, remainders = [], []
    for batch in loader:
        remainders.append(accelerator.gradient_state.remainder)
        count = torch.tensor(len(batch))
        gathered = accelerator.gather_for_metrics(count)
        assert gathered is count
        mixed = accelerator.gather_for_metrics({"n": count, "rows": batch})
        assert mixed["n"] is count and mixed["rows"] is batch  # a 0-d tensor keeps the rest whole too
        counts.append(int(gathered.sum()))
    assert remainders[-1] == 1 and counts == [2, 2, 1]


def _pad_bool_per_rank() -> tuple[str, list[list[bool]]]:
    from accelerando import Accelerator as RankAccelerator

    accelerator = RankAccelerator(cpu=True)
    mask = torch.ones(accelerator.process_index + 1, 2, dtype=torch.bool)
    padded = accelerator.pad_across_processes(mask)
    gathered = accelerator.gather(padded)  # equal dtypes on every process: the gather works
    return str(padded.dtype), gathered.tolist()


def test_padding_keeps_a_bool_tensor_bool() -> None:
    """Deliberate difference ``pad-bool-dtype`` (tests/parity/deliberate_differences.txt)."""
    first, second = run_distributed_preloaded(_pad_bool_per_rank, 2)
    assert first[0] == second[0] == "torch.bool"
    assert first[1] == second[1] == [[True, True], [False, False], [True, True], [True, True]]
