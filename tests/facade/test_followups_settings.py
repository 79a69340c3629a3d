"""Reference variables read at process start or by helpers: each one changes behaviour."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class _WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2))


# ------------------------------------------------------------------------------ init_include_buffers
def test_init_include_buffers_setting_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.big_modeling import init_empty_weights

    monkeypatch.delenv("ACCELERATE_INIT_INCLUDE_BUFFERS", raising=False)
    with init_empty_weights():
        model = _WithBuffer()
    assert model.linear.weight.is_meta and not model.scale.is_meta
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        model = _WithBuffer()
    assert model.linear.weight.is_meta and model.scale.is_meta
    with init_empty_weights(include_buffers=False):  # an explicit argument wins
        model = _WithBuffer()
    assert not model.scale.is_meta
