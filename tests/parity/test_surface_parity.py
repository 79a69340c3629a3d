"""The reference's public surface is ours: names, parameters and constant values at the same paths.

Runs the shared parity checker (``../shared/parity/surface_check.py`` beside the project root) and
fails on every gap that is not one of the deliberate differences listed, with a reason, in
``deliberate_differences.txt``.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECKER = PROJECT_ROOT.parent / "shared" / "parity" / "surface_check.py"
DIFFERENCES = Path(__file__).with_name("deliberate_differences.txt")


def _deliberate_patterns() -> list[tuple[str, str]]:
    patterns = []
    for line in DIFFERENCES.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pattern, _, reason = line.partition(" | ")
        assert reason.strip(), f"deliberate difference without a reason: {line!r}"
        patterns.append((pattern.strip(), reason.strip()))
    return patterns


def _gaps() -> list[str]:
    result = subprocess.run(
        [sys.executable, str(CHECKER)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600
    )
    lines = result.stdout.splitlines()
    gaps = []
    for line in lines:
        if not line.strip():
            break  # the per-module summary follows the first blank line
        gaps.append(line)
    return gaps


@pytest.mark.skipif(not CHECKER.exists(), reason=f"the shared parity checker is not at {CHECKER}")
def test_every_reference_surface_item_exists_or_is_a_listed_deliberate_difference() -> None:
    patterns = _deliberate_patterns()
    gaps = _gaps()
    used: set[str] = set()
    unexplained = []
    for gap in gaps:
        subject = gap.split(": ", 1)[0]
        matched = [p for p, _ in patterns if fnmatch.fnmatchcase(subject, p)]
        if matched:
            used.update(matched)
        else:
            unexplained.append(gap)
    assert not unexplained, f"{len(unexplained)} surface gaps:\n" + "\n".join(unexplained)
    stale = [p for p, _ in patterns if p not in used]
    assert not stale, f"deliberate differences that match no gap any more (remove them): {stale}"
