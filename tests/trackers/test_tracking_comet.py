"""Comet tracker as an offline experiment: read the messages from its archive (slow: comet_ml imports slowly)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager

pytest.importorskip("comet_ml", reason="comet_ml is not installed (pip install comet_ml)")


@pytest.mark.slow
def test_offline_experiment_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import comet_ml

    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    config = comet_ml.ExperimentConfig(
        log_code=False, log_env_details=False, log_git_metadata=False, auto_output_logging=False
    )
    manager = TrackingManager("comet_ml")
    manager.init("proj", {"lr": 0.1}, {"comet_ml": {"online": False, "experiment_config": config}})
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1), "note": "text"}, step=step)
    manager.finish()

    (archive,) = tmp_path.glob("*.zip")
    with zipfile.ZipFile(archive) as zf:
        messages = [json.loads(line) for line in zf.read("messages.json").decode().splitlines()]
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    losses = [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "loss"]
    assert losses == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
    }
    assert params["lr"] == 0.1
    assert any(m["type"] == "log_other" and m["payload"]["key"] == "note" for m in messages)
