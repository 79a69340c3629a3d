"""Models and helpers shared by the tensor- and pipeline-parallel tests (imported by their workers too)."""

from __future__ import annotations

import torch

from suite_support import fresh_accelerator as fresh_accelerator  # re-exported for the workers
from suite_support import tiny_llama as tiny_llama

VOCAB = 128


def sgd_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum: linear in the gradients, so rounding in the split matmuls stays at rounding size.

    (Adam divides by tiny second moments and turns rounding noise into 1e-4 steps.) ``foreach=True``:
    its kernels take mixed DTensor / plain parameter lists only through the strategy.
    """
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)


class Stack(torch.nn.Module):
    """Four Linear/GELU blocks and a head: the model the pipeline cuts."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(4)]
        )
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
