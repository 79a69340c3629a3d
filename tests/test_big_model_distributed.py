"""broadcast_from_rank0: only rank 0 reads the checkpoint; every rank ends with the same weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accelerando.big_modeling import init_empty_weights
from accelerando.utils.modeling import load_checkpoint_in_model

test_utils = pytest.importorskip("accelerando.test_utils.distributed")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def _load_on_rank(folder: str) -> list[list[float]]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    # Only rank 0 is given the real path: the others must receive everything by broadcast.
    checkpoint = folder if dist.get_rank() == 0 else f"{folder}/does-not-exist"
    with init_empty_weights():
        model = _model()
    missing, unexpected = load_checkpoint_in_model(model, checkpoint, broadcast_from_rank0=True)
    assert missing == [] and unexpected == []
    return [p.detach().flatten().tolist() for p in model.parameters()]


def test_broadcast_from_rank0(tmp_path):
    torch.manual_seed(0)
    reference = _model()
    save_file(reference.state_dict(), tmp_path / "model.safetensors")
    results = test_utils.run_distributed(_load_on_rank, 2, str(tmp_path))
    expected = [p.detach().flatten().tolist() for p in reference.parameters()]
    assert results[0] == expected and results[1] == expected
