"""A model with tied weights round-trips through save_state(safe_serialization=True): safetensors keeps
one name per memory, and loading fills the tied names back in; a genuinely missing key still fails."""

from __future__ import annotations

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing.state_io import _with_tied_aliases

pytestmark = pytest.mark.usefixtures("fresh_state")


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 4)
        self.linear2 = torch.nn.Linear(4, 2)
        self.linear2.weight = self.linear1.weight
        self.linear2.bias = self.linear1.bias


@pytest.mark.parametrize("safe", [True, False])
def test_tied_model_round_trips(tmp_path, safe: bool) -> None:
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(Tied(), torch.optim.SGD(Tied().parameters(), lr=0.1))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.save_state(str(tmp_path / "ckpt"), safe_serialization=safe)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    assert model.linear2.weight is model.linear1.weight


def test_only_tied_names_are_filled() -> None:
    model = Tied()
    state = {"linear1.weight": torch.ones(4, 2), "linear1.bias": torch.ones(4)}
    filled = _with_tied_aliases(model, state)
    assert set(filled) == {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}
    untied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    partial = {"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2)}
    assert _with_tied_aliases(untied, partial) == partial  # nothing invented for untied weights
    with pytest.raises(RuntimeError, match="Missing key"):
        untied.load_state_dict(_with_tied_aliases(untied, partial))
