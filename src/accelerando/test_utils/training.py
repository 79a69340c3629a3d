"""A tiny regression problem for tests: ``y = a * x + b`` with noise."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["RegressionDataset", "RegressionModel", "RegressionModel4XPU"]


class RegressionDataset(torch.utils.data.Dataset):
    """Synthetic samples ``{"x": x, "y": a * x + b + noise}`` drawn from a seeded generator.

    Args:
        a: slope. b: intercept. length: number of samples. seed: generator seed (None = random).
    """

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.float32]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(nn.Module):
    """``y = a * x + b`` with scalar parameters ``a`` and ``b``.

    Args:
        a: initial slope. b: initial intercept. double_output: return the prediction twice (tests
            outputs made of several tensors).
    """

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.first_batch = True
        self.double_output = double_output

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Return ``a * x + b`` (twice when ``double_output``)."""
        out = x * self.a + self.b
        return (out, out) if self.double_output else out


class RegressionModel4XPU(RegressionModel):
    """Same model with 2-element parameters (some devices dislike 0-d parameters)."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__(a, b, double_output)
        self.a = nn.Parameter(torch.tensor([float(a), float(a)]))
        self.b = nn.Parameter(torch.tensor([float(b), float(b)]))

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = x * self.a[0] + self.b[0]
        return (out, out) if self.double_output else out
