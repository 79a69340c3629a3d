"""load_state(load_kwargs=...) forwards torch.load's options (mmap, map_location, encoding...)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.serialization as serialization
from torch import _weights_only_unpickler, nn

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
    """Record every archive torch deserializes: through ``torch.load`` (bytes copied out) or in place."""
    real = serialization._load

    @functools.wraps(real)
    def recording(zip_file: Any, map_location: Any, pickle_module: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(
            {
                "map_location": map_location,
                "weights_only": pickle_module is _weights_only_unpickler,
                "in_place": kwargs.get("overall_storage") is not None,  # tensors are views of the read bytes
                "encoding": kwargs.get("encoding"),
            }
        )
        return real(zip_file, map_location, pickle_module, *args, **kwargs)

    monkeypatch.setattr(serialization, "_load", recording)


@pytest.mark.filterwarnings("ignore:pickle_load_args")
def test_mmap_and_map_location_reach_every_torch_load(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator, folder, calls = saved
    _spy(monkeypatch, calls)
    accelerator.load_state(folder)
    # optimizer.bin (map_location "cpu") and random_states_0.pkl: small files are copied out of the bytes read
    assert len(calls) == 2 and any(c["map_location"] == "cpu" for c in calls), calls
    assert all(c["weights_only"] and not c["in_place"] for c in calls), calls
    calls.clear()
    accelerator.load_state(folder, load_kwargs={"mmap": True, "map_location": "cpu", "encoding": "utf-8"})
    assert len(calls) == 2, calls
    for call in calls:
        # mmap=True: every file's tensors are views of its (private, copy-on-write) memory map
        assert call["in_place"] and call["encoding"] == "utf-8" and call["weights_only"], call
    assert any(c["map_location"] == "cpu" for c in calls), calls  # the optimizer's


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
