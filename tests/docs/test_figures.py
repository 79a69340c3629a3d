"""The documentation figures are produced by docs/scripts/make_figures.py, not drawn by hand."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "scripts" / "make_figures.py"


def _load() -> Any:
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("_make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _is_png(path: pathlib.Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_device_map_and_launch_figures(tmp_path: pathlib.Path) -> None:
    figures = _load()
    assert _is_png(figures.device_map_figure(tmp_path))
    assert _is_png(figures.launch_diagram(tmp_path, machines=3, per_machine=2))


def test_committed_figures_are_referenced() -> None:
    pages = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    for name in ("memory_timeline.png", "device_map.png", "launch_processes.png"):
        assert _is_png(ROOT / "docs" / "img" / name), name
        assert f"img/{name}" in pages, f"no page shows {name}"


@pytest.mark.slow
def test_make_figures_script_writes_all_three(tmp_path: pathlib.Path, fresh_state: None) -> None:
    written = _load().main(["--out", str(tmp_path)])
    assert sorted(p.name for p in written) == [
        "device_map.png",
        "launch_processes.png",
        "memory_timeline.png",
    ]
    assert all(_is_png(p) for p in written)
