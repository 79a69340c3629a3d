"""Aim tracker against a local repository (slow: aim imports slowly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager

pytest.importorskip("aim", reason="aim is not installed (pip install aim)")


@pytest.mark.slow
def test_run_is_written_to_the_repository(tmp_path: Path) -> None:
    manager = TrackingManager("aim", logging_dir=tmp_path)
    manager.init("proj", {"lr": 0.1, "nested": {"a": 1}})
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1), "skipped": "text"}, step=step)
    run = manager.get_tracker("aim", unwrap=True)
    # read back through the live run (aim 3.29's offline Repo queries do not list fresh runs here)
    assert run["hparams"] == {"lr": 0.1, "nested": {"a": 1}}
    assert run.experiment == "proj" and run.name == "proj"
    (loss,) = [m for m in run.metrics() if m.name == "loss"]
    assert loss.values.values_list() == [1.0, 0.5, pytest.approx(1 / 3)]
    run_hash = run.hash
    manager.finish()
    assert (tmp_path / ".aim" / "meta" / "chunks" / run_hash).is_dir()
    assert (tmp_path / ".aim" / "seqs" / "chunks" / run_hash).is_dir()
