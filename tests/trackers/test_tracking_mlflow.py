"""MLflow tracker end to end against a local sqlite store, read back with MlflowClient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accelerando.tracking import TrackingManager

pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")


def _round_trip(logging_dir: str, tracking_uri: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    manager = TrackingManager("mlflow", logging_dir=logging_dir)
    manager.init(
        "exp",
        config={"lr": 0.01, "opt": {"name": "adam", "betas": (0.9, 0.99)}, "t": torch.tensor(3)},
        init_kwargs={"mlflow": {"run_name": "first", "tags": {"team": "obs"}}},
    )
    for step in range(3):
        manager.log({"loss": torch.tensor(2.0 - step), "label": "skipped"}, step=step)
    manager.log_checkpoint(3, tmp_path / "ckpt_3", 4096)
    run_id = manager.get_tracker("mlflow", unwrap=True).info.run_id
    manager.finish()

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "first" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "opt/name": "adam", "opt/betas": "[0.9, 0.99]", "t": "3"}
    assert run.data.tags["team"] == "obs" and run.data.tags["last_checkpoint"].endswith("ckpt_3")
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 2.0), (1, 1.0), (2, 0.0)]
    assert "label" not in run.data.metrics
    assert client.get_metric_history(run_id, "accelerando/checkpoint_size_bytes")[0].value == 4096
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_file_store_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Recent MLflow refuses new file stores unless asked; the file store is the fast one to create.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    _round_trip(uri, uri, tmp_path)


@pytest.mark.slow
def test_plain_folder_becomes_sqlite_store(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy", reason="the sqlite store needs SQLAlchemy (pip install mlflow)")
    _round_trip(str(tmp_path), f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)


def test_all_logs_to_both_installed_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """log_with="all" with exactly TensorBoard and MLflow installed: both runs get the values."""
    import dataclasses

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from accelerando import tracking

    for name, backend in list(tracking._LIBRARIES.items()):
        keep = name in ("tensorboard", "mlflow")  # the other libraries may be installed here too
        monkeypatch.setitem(
            tracking._LIBRARIES, name, dataclasses.replace(backend, is_available=lambda k=keep: k)
        )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    manager = TrackingManager("all", logging_dir=tmp_path / "logs")
    manager.init("exp", config={"lr": 0.5}, init_kwargs={"mlflow": {"logging_dir": uri}})
    assert sorted(t.name for t in manager.trackers) == ["mlflow", "tensorboard"]
    for step in range(3):
        manager.log({"loss": float(3 - step)}, step=step)
    run_id = manager.get_tracker("mlflow", unwrap=True).info.run_id
    manager.finish()

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    events = EventAccumulator(str(tmp_path / "logs" / "exp"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 3.0), (1, 2.0), (2, 1.0)]


def test_reference_contract_env_active_run_long_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLFLOW_* variables win over arguments; ``active_run`` is the run; a tracking URI the user set is
    kept when logging_dir is a folder; too long params are dropped without touching the caller's dict."""
    import mlflow

    from accelerando.tracking import MLflowTracker

    for value, expected in (("off", False), ("Yes", True)):
        monkeypatch.setenv("MLFLOW_NESTED_RUN", value)
        assert MLflowTracker(nested_run=not expected).nested_run is expected
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "maybe")
    with pytest.raises(ValueError, match="MLFLOW_NESTED_RUN"):
        MLflowTracker()
    monkeypatch.delenv("MLFLOW_NESTED_RUN")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "env"}')
    tracker = MLflowTracker(experiment_name="from_arg", tags={"team": "arg"}, logging_dir=tmp_path / "folder")
    assert tracker.experiment_name == "from_env" and tracker.tags == {"team": "env"}
    assert tracker.active_run is None

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)
    try:
        tracker.start()
        assert tracker.tracker is tracker.active_run and mlflow.get_tracking_uri() == uri
        values = {"lr": 0.1, "long": "x" * 7000}
        tracker.store_init_configuration(values)
        assert values == {"lr": 0.1, "long": "x" * 7000}
        run_id = tracker.active_run.info.run_id
        tracker.finish()
        tracker.finish()  # a second finish ends nothing
        params = mlflow.get_run(run_id).data.params
        assert params == {"lr": "0.1"}
        assert mlflow.get_experiment(mlflow.get_run(run_id).info.experiment_id).name == "from_env"
    finally:
        mlflow.set_tracking_uri(None)  # back to unset (the default store)
