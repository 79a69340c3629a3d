"""SwanLab and Trackio trackers, read back from their own files when their libraries are installed.

They are not in the test extra: installing them downgrades protobuf and pillow, which TensorBoard
and W&B need. Run them in an environment of their own:
``pip install -e . pytest swanlab trackio && python -m pytest -q tests/test_tracking_optional.py``.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager

_WHY = "not installed here: it conflicts with the protobuf/pillow versions TensorBoard and W&B need"


def test_swanlab_offline_run_files(tmp_path: Path) -> None:
    pytest.importorskip("swanlab", reason=f"swanlab {_WHY}")
    import yaml

    manager = TrackingManager("swanlab")
    manager.init("proj", {"lr": 0.1}, {"swanlab": {"mode": "offline", "logdir": str(tmp_path)}})
    values = [1.0 / (step + 1) for step in range(3)]
    for step, value in enumerate(values):
        manager.log({"loss": value}, step=step)
    manager.finish()
    (config,) = tmp_path.rglob("config.yaml")
    assert yaml.safe_load(config.read_text())["lr"]["value"] == 0.1
    (record,) = tmp_path.rglob("*.swanlab")
    data = record.read_bytes()
    assert b"loss" in data
    for value in values:  # each logged scalar is stored as a little-endian double in the run record
        assert struct.pack("<d", value) in data


def test_trackio_local_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # trackio reads TRACKIO_DIR when it is imported: set it before the first import.
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    pytest.importorskip("trackio", reason=f"trackio {_WHY}")
    manager = TrackingManager("trackio")
    manager.init("proj", {"lr": 0.1})
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    manager.finish()
    (database,) = tmp_path.glob("proj.db")
    rows = sqlite3.connect(database).execute("select step, metrics from metrics order by step").fetchall()
    assert [(step, json.loads(metrics)["loss"]) for step, metrics in rows] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    (config,) = sqlite3.connect(database).execute("select config from configs").fetchone()
    assert json.loads(config)["lr"] == 0.1
