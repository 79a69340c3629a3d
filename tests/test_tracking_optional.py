"""SwanLab and Trackio trackers, exercised offline when their libraries are installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager


@pytest.mark.slow
def test_swanlab_offline(tmp_path: Path) -> None:
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install swanlab)")
    manager = TrackingManager("swanlab")
    manager.init("proj", {"lr": 0.1}, {"swanlab": {"mode": "offline", "logdir": str(tmp_path)}})
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    manager.finish()
    assert any(tmp_path.rglob("*"))


@pytest.mark.slow
def test_trackio_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    manager = TrackingManager("trackio")
    manager.init("proj", {"lr": 0.1})
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    manager.finish()
    assert any(tmp_path.rglob("*"))
