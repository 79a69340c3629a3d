"""TensorBoard tracker end to end: write through TrackingManager, read the event files back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accelerando.tracking import TensorBoardTracker, TrackingManager

pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")


def test_scalars_text_hparams_and_images_round_trip(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    manager = TrackingManager("tensorboard", logging_dir=tmp_path)
    config = {"lr": 1e-3, "layers": [1, 2], "device": torch.device("cpu"), "nested": {"depth": 2}}
    manager.init("proj", config=config)
    for step in range(4):
        manager.log({"loss": torch.tensor(1.0 / (step + 1)), "note": f"step {step}"}, step=step)
    manager.log({"group": {"a": 1.0, "b": 2.0}}, step=4)
    manager.log_images({"img": torch.rand(2, 3, 4, 4)}, step=4)
    manager.log_checkpoint(4, tmp_path / "ckpt", 2048)
    tracker = manager.get_tracker("tensorboard")
    assert isinstance(tracker, TensorBoardTracker)
    assert manager.get_tracker("tensorboard", unwrap=True) is tracker.tracker
    manager.finish()

    run_dir = tmp_path / "proj"
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3]
    assert [round(e.value, 4) for e in loss] == [1.0, 0.5, 0.3333, 0.25]
    assert [e.step for e in events.Scalars("accelerando/checkpoint_size_bytes")] == [4]
    assert events.Scalars("accelerando/checkpoint_size_bytes")[0].value == 2048
    tags = events.Tags()
    assert "note/text_summary" in tags["tensors"]
    # add_images tiles the batch of two 4x4 images into one 8x4 picture
    assert [(i.step, i.width, i.height) for i in events.Images("img")] == [(4, 8, 4)]
    hparams = (run_dir / "hparams.yml").read_text()
    assert "lr: 0.001" in hparams and "nested/depth: 2" in hparams and "device: cpu" in hparams
    # grouped scalars are written by add_scalars into sub-runs
    assert any(p.is_dir() and p.name.startswith("group") for p in run_dir.iterdir())
