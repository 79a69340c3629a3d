"""TorchTensorParallelPlugin: tensor parallelism through DTensor (configuration only for now)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelerando.plugins.kwargs import KwargsHandler

__all__ = ["TorchTensorParallelPlugin"]


@dataclass
class TorchTensorParallelPlugin(KwargsHandler):
    """Tensor-parallel degree for models that declare a TP plan (transformers ``tp_plan``).

    Prefer ``ParallelismConfig(tp_size=...)``; this plugin is kept for scripts that pass it.

    Raises:
        ValueError: ``tp_size`` below 1.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"tp_size must be an integer >= 1, got {self.tp_size!r}")
