"""load_state(load_kwargs=...) forwards torch.load's options (mmap, map_location, encoding...)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

import accelerando.checkpointing.files as F
from accelerando import Accelerator
from accelerando.checkpointing.state_io import torch_load_options

pytestmark = pytest.mark.usefixtures("fresh_state")


@pytest.fixture
def saved(tmp_path) -> tuple[Accelerator, str, list[dict[str, Any]]]:
    accelerator = Accelerator(project_dir=str(tmp_path))
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    return accelerator, folder, []


def _spy(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    real = torch.load

    def recording(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append({"file": os.path.basename(str(path)), **kwargs})
        return real(path, *args, **kwargs)

    monkeypatch.setattr(F.torch, "load", recording)


@pytest.mark.filterwarnings("ignore:pickle_load_args")
def test_mmap_and_map_location_reach_every_torch_load(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator, folder, calls = saved
    _spy(monkeypatch, calls)
    accelerator.load_state(folder)
    optimizer_call = next(c for c in calls if c["file"].startswith("optimizer"))
    assert optimizer_call["mmap"] is False and optimizer_call["weights_only"] is True
    calls.clear()
    accelerator.load_state(folder, load_kwargs={"mmap": True, "map_location": "cpu", "encoding": "utf-8"})
    assert calls, "no torch.load call recorded"
    for call in calls:
        assert call["mmap"] is True and call["encoding"] == "utf-8" and call["weights_only"] is True, call
    optimizer_call = next(c for c in calls if c["file"].startswith("optimizer"))
    assert optimizer_call["map_location"] == "cpu"


def test_conflicting_and_unknown_options_are_refused(saved) -> None:
    accelerator, folder, _ = saved
    with pytest.raises(ValueError, match="map_location"):
        accelerator.load_state(folder, map_location="cpu", load_kwargs={"map_location": "meta"})
    with pytest.raises(TypeError, match="not torch.load options"):
        accelerator.load_state(folder, load_kwargs={"strict": False})
    assert torch_load_options({"map_location": "cpu", "mmap": True, "weights_only": True}) == (
        "cpu",
        {"mmap": True},
    )
    assert torch_load_options(None, "cuda") == ("cuda", {})
