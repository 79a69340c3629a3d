"""ClearML tracker in offline mode: read the session's metrics and task files (slow: clearml imports slowly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager

pytest.importorskip("clearml", reason="clearml is not installed (pip install clearml)")


@pytest.mark.slow
def test_offline_session_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path))
    from clearml import Task
    from clearml.backend_interface.task.task import Task as BackendTask

    # ClearML's background repository scan runs git/hg and checks PyPI for updates; with no network
    # and under pytest it can hang, and it has nothing to do with what the tracker writes.
    monkeypatch.setattr(BackendTask, "_update_repository", lambda self: None)
    Task.set_offline(True)
    manager = TrackingManager("clearml")
    options = {
        "task_name": "t1",
        "auto_connect_frameworks": False,
        "auto_resource_monitoring": False,
        "auto_connect_arg_parser": False,
        "auto_connect_streams": False,
    }
    manager.init("proj", {"lr": 0.1}, {"clearml": options})
    for step in range(3):
        manager.log({"train/loss": 1.0 / (step + 1)}, step=step)
    manager.log({"final": 7.0})
    folder = Path(manager.get_tracker("clearml", unwrap=True).get_offline_mode_folder())
    manager.finish()

    events = json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])
    scalars = [(e["metric"], e["variant"], e["iter"], e["value"]) for e in events]
    assert scalars[:3] == [
        ("train", "loss", 0, 1.0),
        ("train", "loss", 1, 0.5),
        ("train", "loss", 2, pytest.approx(1 / 3)),
    ]
    assert scalars[3][:2] == ("Summary", "final") and scalars[3][3] == 7.0
    task = json.loads((folder / "task.json").read_text())
    assert task["name"] == "t1" and "lr = 0.1" in json.dumps(task["configuration"])
