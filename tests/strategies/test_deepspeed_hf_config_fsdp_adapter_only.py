"""save_fsdp_model / load_fsdp_model with adapter_only=True on a model without adapters (transformers' call).

transformers' Trainer always passes ``adapter_only=True`` when the function accepts it; for a model
that has no PEFT adapters the whole model is saved and loaded (strictly), as the reference does.
One process, a gloo group of size 1 (the full state dict is gathered through torch.distributed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from accelerando.utils.fsdp_utils import load_fsdp_model, save_fsdp_model


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this interpreter")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_adapter_only_on_a_plain_model_saves_and_loads_it_whole(
    one_process_group: None, tmp_path: Path
) -> None:
    plugin = SimpleNamespace(state_dict_type="FULL_STATE_DICT")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    path = save_fsdp_model(plugin, None, model, str(tmp_path / "ckpt"), adapter_only=True)
    saved = torch.load(path, weights_only=True)
    assert set(saved) == set(model.state_dict())
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    load_fsdp_model(plugin, None, other, str(tmp_path / "ckpt"), adapter_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, other.state_dict()[name]), name
