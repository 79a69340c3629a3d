"""TrackingManager and the tracker registry: specs, errors, custom trackers, config conversion."""

from __future__ import annotations

import dataclasses
import enum
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando import tracking
from accelerando.backends.trackers.base import flatten_config, sanitize_config
from accelerando.core.enums import LoggerType
from accelerando.tracking import GeneralTracker, TrackingManager, filter_trackers, on_main_process


class RecordingTracker(GeneralTracker):
    """A custom tracker in the reference's documented style."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name: str = "run", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.kwargs = kwargs
        self.calls: list[tuple[str, Any]] = []

    def start(self) -> None:
        self.calls.append(("start", self.run_name))

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.calls.append(("config", values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", values, step, kwargs))

    def finish(self) -> None:
        self.calls.append(("finish",))


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Opt:
    lr: float = 0.1


def test_custom_instance_and_class_are_driven_through_the_lifecycle() -> None:
    instance = RecordingTracker("mine")
    manager = TrackingManager([instance, RecordingTracker])
    # Same name twice: the first (the instance) wins.
    manager.init("proj", config={"lr": 1e-3}, init_kwargs={"recording": {"extra": 1}})
    assert manager.trackers == [instance]
    manager.log({"loss": torch.tensor(0.5), "n": 3}, step=7, log_kwargs={"recording": {"commit": True}})
    manager.log_checkpoint(7, Path("/tmp/ckpt"), 1234)
    manager.finish()
    assert instance.calls[0] == ("start", "mine")
    assert instance.calls[1] == ("config", {"lr": 1e-3})
    assert instance.calls[2] == ("log", {"loss": 0.5, "n": 3}, 7, {"commit": True})
    assert instance.calls[3] == ("log", {"accelerando/checkpoint_size_bytes": 1234}, 7, {})
    assert instance.calls[-1] == ("finish",)
    assert manager.get_tracker("recording") is instance
    assert manager.get_tracker("recording", unwrap=True) is None


def test_custom_class_gets_project_name_and_init_kwargs() -> None:
    manager = TrackingManager(RecordingTracker)
    manager.init("proj", init_kwargs={"recording": {"mode": "x"}})
    (tracker,) = manager.trackers
    assert tracker.run_name == "proj" and tracker.kwargs == {"mode": "x"}


def test_unknown_name_and_bad_types_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="Unknown tracker 'tensorbord'"):
        TrackingManager("tensorbord")
    with pytest.raises(TypeError, match="log_with"):
        TrackingManager([3])
    with pytest.raises(TypeError, match="init_kwargs"):
        TrackingManager(RecordingTracker).init("p", init_kwargs={"recording": 1})
    manager = TrackingManager(RecordingTracker)
    manager.init("p")
    with pytest.raises(ValueError, match="reduce"):
        manager.log({"a": 1}, reduce="median")
    with pytest.raises(TypeError, match="dict"):
        manager.log([1])
    with pytest.raises(ValueError, match="No tracker named 'wandb'"):
        manager.get_tracker("wandb")


def test_missing_library_names_the_pip_package(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = tracking._LIBRARIES["swanlab"]
    monkeypatch.setitem(
        tracking._LIBRARIES, "swanlab", dataclasses.replace(backend, is_available=lambda: False)
    )
    with pytest.raises(ImportError, match="pip install swanlab"):
        TrackingManager(LoggerType.SWANLAB)


def test_file_tracker_without_directory_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = tracking._LIBRARIES["tensorboard"]
    monkeypatch.setitem(
        tracking._LIBRARIES, "tensorboard", dataclasses.replace(backend, is_available=lambda: True)
    )
    with pytest.raises(ValueError, match="project_dir"):
        TrackingManager("tensorboard", logging_dir=None)


def test_all_selects_installed_backends_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, backend in list(tracking._LIBRARIES.items()):
        keep = name in ("tensorboard", "mlflow")
        monkeypatch.setitem(
            tracking._LIBRARIES, name, dataclasses.replace(backend, is_available=lambda k=keep: k)
        )
    chosen = filter_trackers(["all", RecordingTracker], "/tmp/logs")
    assert [c.name for c in chosen] == ["recording", "tensorboard", "mlflow"]
    # without a logging directory, "all" skips file-based trackers instead of failing
    assert [c.name for c in filter_trackers("all", None)] == ["mlflow"]
    assert filter_trackers(None) == []


def test_no_trackers_get_tracker_returns_blank() -> None:
    manager = TrackingManager(None)
    manager.init("p", config={"a": 1})
    manager.log({"a": 1}, step=1)
    blank = manager.get_tracker("anything")
    assert isinstance(blank, GeneralTracker) and blank.tracker is None


def test_incomplete_custom_tracker_is_rejected() -> None:
    class Broken(GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="name"):
        Broken()


def test_sanitize_and_flatten_config() -> None:
    config = {
        "t": torch.tensor(2.5),
        "vec": torch.tensor([1, 2]),
        "color": Color.RED,
        "path": Path("/x"),
        "opt": Opt(),
        "nested": {"a": 1, "b": [torch.tensor(1.0), None]},
        "nan": float("nan"),
        "obj": object,
    }
    clean = sanitize_config(config)
    assert clean["t"] == 2.5 and clean["vec"] == [1, 2] and clean["color"] == "red"
    assert clean["path"] == "/x" and clean["opt"] == {"lr": 0.1} and clean["nan"] == "nan"
    assert clean["nested"] == {"a": 1, "b": [1.0, None]} and clean["obj"] == str(object)
    flat = flatten_config(config)
    assert flat["nested/a"] == 1 and flat["opt/lr"] == 0.1 and flat["nested/b"] == "[1.0, None]"
    with pytest.raises(TypeError, match="dict"):
        sanitize_config([1])


def test_non_main_rank_creates_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    manager = TrackingManager(RecordingTracker)
    manager.init("proj", config={"a": 1})
    manager.log({"a": 1})
    manager.finish()
    assert manager.trackers[0].calls == []


def test_importing_tracking_loads_no_tracker_library() -> None:
    code = (
        "import sys, accelerando.tracking, accelerando.logging, accelerando.backends.monitoring, accelerando.backends.monitoring.profiling;"
        "bad=[m for m in ('wandb','mlflow','tensorboard','aim','comet_ml','clearml','dvclive','neptune',"
        "'swanlab','trackio','matplotlib') if m in sys.modules]; print(bad); assert not bad"
    )
    # (torch itself imports tqdm and pynvml when installed, so they are not checked here.)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
