"""Neptune tracker in debug mode (no server): fetch the values back from the run (slow import)."""

from __future__ import annotations

import pytest

from accelerando.tracking import TrackingManager

pytest.importorskip("neptune", reason="neptune is not installed (pip install neptune)")


@pytest.mark.slow
def test_debug_run_parameters_and_series() -> None:
    manager = TrackingManager("neptune")
    manager.init(
        "proj", {"lr": 0.1, "n": {"a": [1, 2]}}, {"neptune": {"mode": "debug", "project": "ws/proj"}}
    )
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    run = manager.get_tracker("neptune", unwrap=True)
    assert run["parameters"].fetch() == {"lr": 0.1, "n": {"a": "[1, 2]"}}
    values = run["loss"].fetch_values()
    assert list(values["step"]) == [0, 1, 2] and list(values["value"]) == [1.0, 0.5, pytest.approx(1 / 3)]
    manager.finish()
