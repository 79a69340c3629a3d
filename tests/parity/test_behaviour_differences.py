"""Behaviour that differs from the reference on purpose is listed, shown by a test, and on the migration page.

The ``behaviour:`` lines of ``deliberate_differences.txt`` name each difference, its reason and the test
that shows it. Each must name a test that exists, and ``docs/migration.md`` must have the item (by its
name, in backquotes) with the line a user writes to get the reference's behaviour.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parents[1]
DIFFERENCES = HERE / "deliberate_differences.txt"
MIGRATION = PROJECT_ROOT / "docs" / "migration.md"


def _behaviours() -> list[tuple[str, str, str]]:
    rows = []
    for line in DIFFERENCES.read_text(encoding="utf-8").splitlines():
        if line.startswith("behaviour:"):
            parts = [part.strip() for part in line.split(" | ")]
            assert len(parts) == 3, f"behaviour line needs `behaviour:<name> | reason | path::test`: {line!r}"
            rows.append((parts[0].removeprefix("behaviour:"), parts[1], parts[2]))
    return rows


def test_behaviour_differences_are_listed() -> None:
    names = [name for name, _, _ in _behaviours()]
    assert {"exact-resume", "cpu-num-processes", "torchrun-cpu"} <= set(names)
    assert len(names) == len(set(names)), names


def test_each_behaviour_difference_names_a_test_that_exists() -> None:
    for name, reason, test in _behaviours():
        assert reason, name
        path, _, function = test.partition("::")
        source = PROJECT_ROOT / path
        assert source.is_file(), f"{name}: {path} does not exist"
        assert re.search(rf"^def {re.escape(function)}\(", source.read_text(encoding="utf-8"), re.M), (
            f"{name}: no test {function} in {path}"
        )


def test_each_behaviour_difference_is_on_the_migration_page() -> None:
    page = MIGRATION.read_text(encoding="utf-8")
    section = page.split("## Deliberate differences", 1)[1]
    for name, _, _ in _behaviours():
        assert f"`{name}`" in section, f"docs/migration.md's Deliberate differences lack `{name}`"
