"""The side-by-side harness prints figures a reader can check: each ratio is the ratio of the medians on its row."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import given
from hypothesis import strategies as st

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_reference.py"


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_reference_under_test", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


HARNESS_MODULE = _harness()
seconds = st.lists(st.floats(min_value=0.001, max_value=100.0), min_size=1, max_size=9)


@given(acc=seconds, ref=seconds, raw=seconds)
def test_ratio_columns_are_ratios_of_the_printed_medians(
    acc: list[float], ref: list[float], raw: list[float]
) -> None:
    row = HARNESS_MODULE.Row("figure", samples={"acc": acc, "ref": ref, "raw": raw})
    assert row.of_medians("raw") == statistics.median(acc) / statistics.median(raw)
    assert row.of_medians("ref") == statistics.median(acc) / statistics.median(ref)
    cells = HARNESS_MODULE.table([row]).splitlines()[-1].split(" | ")
    printed_acc, printed_raw, printed_ratio = float(cells[1]), float(cells[3]), float(cells[4])
    assert printed_acc == round(statistics.median(acc), 3)
    assert printed_raw == round(statistics.median(raw), 3)
    assert printed_ratio == round(statistics.median(acc) / statistics.median(raw), 3)


def test_spread_is_the_per_round_ratio_and_a_crossing_spread_is_marked() -> None:
    goal = HARNESS_MODULE.Goal("acc/raw", 1.05)
    row = HARNESS_MODULE.Row(
        "figure", goal, samples={"acc": [1.0, 1.2, 1.0], "ref": [], "raw": [1.0, 1.0, 1.0]}
    )
    assert row.per_round("raw") == [1.0, 1.2, 1.0]
    assert row.verdict() == "acc/raw <= 1.05: met (spread crosses the goal)"
    line = HARNESS_MODULE.table([row]).splitlines()[-1]
    assert "| 1.000 | 1.000-1.200 |" in line


def test_launch_rows_report_seconds_over_raw() -> None:
    goal = HARNESS_MODULE.Goal("acc/raw", 0.15, seconds=True)
    row = HARNESS_MODULE.Row(
        "launch", goal, difference=True, samples={"acc": [0.3, 0.5], "ref": [4.0, 4.0], "raw": [0.1, 0.1]}
    )
    assert row.of_medians("raw") == statistics.median([0.3, 0.5]) - 0.1
    assert row.verdict() == "acc/raw <= +0.15 s: MISSED"
    assert "+0.300 s" in HARNESS_MODULE.table([row])


def test_a_row_without_samples_says_not_measured() -> None:
    row = HARNESS_MODULE.Row("figure", HARNESS_MODULE.Goal("acc/ref", 2.0))
    assert row.verdict() == "acc/ref <= 2: not measured"
    assert HARNESS_MODULE.table([row]).splitlines()[-1].startswith("| figure | - | - | - | - |")


def test_ddp_rows_measure_more_epochs_unless_told() -> None:
    default, told, quick = (HARNESS_MODULE.parse_args(argv) for argv in ([], ["--reps", "7"], ["--quick"]))
    assert HARNESS_MODULE.child_epochs(default, 2) == HARNESS_MODULE.DDP_REPS > HARNESS_MODULE.REPS
    assert HARNESS_MODULE.child_epochs(default, 1) == HARNESS_MODULE.REPS
    assert HARNESS_MODULE.child_epochs(told, 2) == HARNESS_MODULE.child_epochs(told, 1) == 7
    assert HARNESS_MODULE.child_epochs(quick, 2) == 5
