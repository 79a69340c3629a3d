"""Tracker media and artifacts written by each library itself (offline), and tracker registration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accelerando.tracking import (
    GeneralTracker,
    TrackingManager,
    get_available_trackers,
    register_tracker_class,
)


def test_register_tracker_class_by_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerando.tracking as tracking

    # Registration is process-wide: work on copies so that log_with="all" elsewhere is unaffected.
    monkeypatch.setattr(tracking, "_LIBRARIES", dict(tracking._LIBRARIES))
    monkeypatch.setattr(tracking, "LOGGER_TYPE_TO_CLASS", dict(tracking.LOGGER_TYPE_TO_CLASS))

    class Recorder(GeneralTracker):
        name = "e1_recorder"
        requires_logging_directory = False

        def __init__(self, run_name: str, **kwargs: Any) -> None:
            super().__init__()
            self.logged: list[dict[str, Any]] = []

        @property
        def tracker(self) -> Any:
            return self.logged

        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.logged.append(values)

    assert register_tracker_class(tracker_class=Recorder) is Recorder
    assert "e1_recorder" in get_available_trackers()
    manager = TrackingManager("e1_recorder")
    manager.init("proj")
    manager.log({"x": 1})
    assert manager.get_tracker("e1_recorder", unwrap=True) == [{"x": 1}]
    with pytest.raises(ValueError, match="subclass of `GeneralTracker`"):
        register_tracker_class(tracker_class=object)  # type: ignore[arg-type]


def test_mlflow_log_artifacts_and_json_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    folder = tmp_path / "outputs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "sub" / "b.txt").write_text("b")
    manager = TrackingManager("mlflow", logging_dir=uri)
    manager.init("exp", init_kwargs={"mlflow": {"tags": '{"team": "e1"}'}})
    tracker = manager.get_tracker("mlflow")
    tracker.log_artifacts(str(folder), artifact_path="outs")
    run_id = tracker.tracker.info.run_id
    manager.finish()
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).data.tags["team"] == "e1"
    top = {item.path for item in client.list_artifacts(run_id, "outs")}
    assert top == {"outs/a.txt", "outs/sub"}
    assert [item.path for item in client.list_artifacts(run_id, "outs/sub")] == ["outs/sub/b.txt"]
    from accelerando.backends.trackers.mlflow import MLflowTracker

    with pytest.raises(ValueError, match="JSON object"):
        MLflowTracker(tags="[1, 2]")


def test_swanlab_log_images_offline(tmp_path: Path) -> None:
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install swanlab)")
    manager = TrackingManager("swanlab")
    manager.init("proj", {"lr": 0.1}, {"swanlab": {"mode": "offline", "logdir": str(tmp_path)}})
    images = [np.zeros((4, 4, 3), dtype=np.uint8), np.full((4, 4, 3), 255, dtype=np.uint8)]
    manager.get_tracker("swanlab").log_images({"samples": images}, step=1)
    manager.finish()
    written = sorted(tmp_path.rglob("media/image/*.png"))
    assert len(written) == 2
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in written)


@pytest.mark.slow
def test_clearml_log_images_and_table_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("clearml", reason="clearml is not installed (pip install clearml)")
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path))
    from clearml import Task
    from clearml.backend_interface.task.task import Task as BackendTask

    # ClearML's background repository scan runs git and asks PyPI for updates: nothing to do with
    # what the tracker writes, and it can hang without a network.
    monkeypatch.setattr(BackendTask, "_update_repository", lambda self: None)
    Task.set_offline(True)
    manager = TrackingManager("clearml")
    options = {
        "task_name": "media",
        "auto_connect_frameworks": False,
        "auto_resource_monitoring": False,
        "auto_connect_arg_parser": False,
        "auto_connect_streams": False,
    }
    manager.init("proj", init_kwargs={"clearml": options})
    tracker = manager.get_tracker("clearml")
    tracker.log_images({"eval/sample": np.zeros((4, 4, 3), dtype=np.uint8)}, step=2)
    tracker.log_table("scores", columns=["name", "score"], data=[["a", 1], ["b", 2]], step=2)
    with pytest.raises(ValueError, match="dataframe"):
        tracker.log_table("empty")
    folder = Path(tracker.tracker.get_offline_mode_folder())
    manager.finish()
    events = [
        event for line in (folder / "metrics.jsonl").read_text().splitlines() for event in json.loads(line)
    ]
    images = [e for e in events if e.get("type") == "training_debug_image"]
    assert [(e["metric"], e["variant"], e["iter"]) for e in images] == [("eval", "sample", 2)]
    tables = [e for e in events if e.get("type") == "plot" and e.get("metric") == "scores"]
    assert len(tables) == 1 and tables[0]["iter"] == 2
    plot = json.loads(tables[0]["plot_str"])
    assert plot["data"][0]["cells"]["values"] == [["a", "b"], [1, 2]]


def test_register_tracker_class_refusals_and_overwrite_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerando.tracking as tracking

    monkeypatch.setattr(tracking, "_LIBRARIES", dict(tracking._LIBRARIES))
    monkeypatch.setattr(tracking, "LOGGER_TYPE_TO_CLASS", dict(tracking.LOGGER_TYPE_TO_CLASS))

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    class NoFlag(GeneralTracker):
        name = "e1_no_flag"

    with pytest.raises(ValueError, match="subclass of `GeneralTracker`"):
        register_tracker_class(dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty `name`"):
        register_tracker_class(Nameless)
    with pytest.raises(ValueError, match="requires_logging_directory"):
        register_tracker_class(NoFlag)

    class Shadow(GeneralTracker):
        name = "tensorboard"
        requires_logging_directory = False

    with pytest.warns(UserWarning, match="'tensorboard' is already registered"):
        register_tracker_class(Shadow)
    assert tracking.LOGGER_TYPE_TO_CLASS["tensorboard"] is Shadow
    # the table is what names resolve through: restoring it undoes the registration
    tracking.LOGGER_TYPE_TO_CLASS["tensorboard"] = tracking.TensorBoardTracker
    with pytest.raises(ValueError, match="Logging with `tensorboard` requires a `logging_dir`"):
        TrackingManager("tensorboard", logging_dir=None)
