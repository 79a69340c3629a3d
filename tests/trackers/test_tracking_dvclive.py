"""DVCLive tracker end to end: read its metrics, params and plot files back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from accelerando.tracking import TrackingManager

pytest.importorskip("dvclive", reason="dvclive is not installed (pip install dvclive)")


def test_metrics_params_and_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    manager = TrackingManager("dvclive", logging_dir=tmp_path)
    manager.init(
        "proj", config={"lr": 0.5, "opt": {"name": "sgd"}}, init_kwargs={"dvclive": {"save_dvc_exp": False}}
    )
    for step in (0, 5, 10):
        manager.log({"loss": 10.0 - step, "tag": f"at-{step}", "skipped": {"a": 1}}, step=step)
    manager.finish()

    out = tmp_path / "dvclive"
    assert yaml.safe_load((out / "params.yaml").read_text()) == {"lr": 0.5, "opt": {"name": "sgd"}}
    assert json.loads((out / "metrics.json").read_text())["loss"] == 0.0
    rows = (out / "plots" / "metrics" / "loss.tsv").read_text().split()
    assert rows[:2] == ["step", "loss"]
    assert [(int(rows[i]), float(rows[i + 1])) for i in range(2, len(rows), 2)] == [
        (0, 10.0),
        (5, 5.0),
        (10, 0.0),
    ]
    # strings are DVCLive metrics too (as in the reference); other values are skipped
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tag"] == "at-10" and "skipped" not in metrics
