"""The reference's public surface is ours: names, parameters and constant values at the same paths.

The reference's surface is listed in ``reference-surface.txt`` and checked by ``surface.py``, both
beside this file, so the guarantee holds in any clone of the repository. The test fails on every gap
that is not one of the deliberate differences listed, with a reason, in ``deliberate_differences.txt``,
and on a listed difference that no longer matches a gap.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parents[1]
CHECKER = HERE / "surface.py"
SURFACE = HERE / "reference-surface.txt"
DIFFERENCES = HERE / "deliberate_differences.txt"


def _load_checker() -> ModuleType:
    """``surface.py`` as a module (tests/parity is not a package)."""
    spec = importlib.util.spec_from_file_location("accelerando_parity_surface", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


surface = _load_checker()


def _deliberate_patterns() -> list[tuple[str, str]]:
    patterns = []
    for line in DIFFERENCES.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith(("#", "behaviour:")):
            continue  # behaviour lines are checked by test_behaviour_differences.py
        pattern, _, reason = line.partition(" | ")
        assert reason.strip(), f"deliberate difference without a reason: {line!r}"
        patterns.append((pattern.strip(), reason.strip()))
    return patterns


def _gaps() -> list[str]:
    """The checker's gaps, from a fresh interpreter with no launcher or cache variables set."""
    drop = ("ACCELERATE", "ACCELERANDO", "FSDP_", "HF_HOME", "XDG_CACHE_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    result = subprocess.run(
        [sys.executable, str(CHECKER)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_the_reference_surface_is_in_the_repository() -> None:
    assert SURFACE.read_text(encoding="utf-8").startswith("# Public surface of the reference")
    modules = surface.parse_surface(SURFACE.read_text(encoding="utf-8"))
    assert "accelerate" in modules and "accelerate.utils" in modules
    assert surface.surface_size() > 1500  # the whole listing, not a stub


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


# ------------------------------------------------------------------ the checker itself
LISTING = """\
# header
## accelerate.demo
class Thing(a: int = 1, b=2) -> None
    run(self, x, *, y=3)
    size  [property]
    flag = True
helper(p, q: 'dict[str, int]' = {}, *args, **kwargs) -> int
LIMIT = 5
NAME = 'x'

## accelerate.gone  (not importable here: ModuleNotFoundError)
lost(a)
"""


def test_the_listing_is_parsed_into_modules_items_and_members() -> None:
    modules = surface.parse_surface(LISTING)
    assert list(modules) == ["accelerate.demo"]  # the module marked not importable is left out
    thing, helper, limit, name = modules["accelerate.demo"]
    assert (thing.kind, thing.name, thing.members) == (
        "class",
        "Thing",
        ["run(self, x, *, y=3)", "size  [property]", "flag = True"],
    )
    assert surface.parameter_names(thing.text) == ["a", "b"]
    assert (helper.kind, surface.parameter_names(helper.text)) == ("func", ["p", "q"])
    assert (limit.kind, limit.text, name.text) == ("const", "5", "'x'")


def test_gaps_name_what_is_missing_or_different(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    class Thing:
        flag = True

        def __init__(self, a: int = 1) -> None: ...

        def run(self, x: int) -> None: ...

    demo = types.ModuleType("ours.demo")
    demo.Thing = Thing  # type: ignore[attr-defined]
    demo.helper = lambda p, **kw: 0  # type: ignore[attr-defined]
    demo.LIMIT = 6  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ours.demo", demo)
    items = surface.parse_surface(LISTING)["accelerate.demo"]
    assert surface.module_gaps("accelerate.demo", items, package="ours") == [
        "ours.demo.Thing(): no parameter b",
        "ours.demo.Thing.run: no parameter y",
        "ours.demo.Thing.size: missing",
        "ours.demo.LIMIT: value 6, reference 5",
        "ours.demo.NAME: missing",
    ]
    assert surface.module_gaps("accelerate.absent", items, package="ours")[0].startswith(
        "ours.absent: module not importable"
    )


def test_paths_under_the_recording_home_are_compared_under_this_home() -> None:
    here = os.path.expanduser("~/.cache/huggingface")
    assert surface._constant_gap(here, repr(f"{surface.RECORDED_HOME}/.cache/huggingface")) is None
    assert (
        surface._constant_gap("/elsewhere", repr(f"{surface.RECORDED_HOME}/.cache/huggingface")) is not None
    )
