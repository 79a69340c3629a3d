"""The Accelerator's tracking methods end to end (they delegate to TrackingManager)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")


def test_accelerator_logs_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from accelerando import Accelerator

    accelerator = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("proj", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": torch.tensor(float(step))}, step=step)
    assert [t.name for t in accelerator.trackers] == ["tensorboard"]
    assert accelerator.get_tracker("tensorboard", unwrap=True) is not None
    accelerator.end_training()
    (run_dir,) = [p for p in tmp_path.rglob("proj") if p.is_dir()]
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_unknown_tracker_fails_at_construction() -> None:
    from accelerando import Accelerator

    with pytest.raises(ValueError, match="Unknown tracker"):
        Accelerator(log_with="tensorbord")
