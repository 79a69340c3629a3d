"""TorchDynamoPlugin: compile the prepared model with ``torch.compile``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelerando.enums import DynamoBackend
from accelerando.plugins.kwargs import KwargsHandler

__all__ = ["TorchDynamoPlugin"]


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """torch.compile options.

    Args:
        backend: a ``DynamoBackend`` name ("no" disables compilation).
        mode: "default", "reduce-overhead", "max-autotune" or "max-autotune-no-cudagraphs".
        fullgraph: refuse graph breaks. dynamic: dynamic shapes. options: backend options.
        disable: compile nothing. use_regional_compilation: compile repeated blocks one by one.

    Raises:
        ValueError: an unknown backend or mode.
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, Any] = field(default_factory=dict)
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is not None:
            name = str(self.backend).upper()
            if name not in DynamoBackend.list():
                raise ValueError(
                    f"unknown dynamo backend {self.backend!r}; choose from {DynamoBackend.list()}"
                )
            self.backend = DynamoBackend(name)
        modes = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.mode not in modes:
            raise ValueError(f"unknown torch.compile mode {self.mode!r}; choose from {modes[1:]}")

    @property
    def enabled(self) -> bool:
        """Whether compilation should happen."""
        return not self.disable and self.backend not in (None, DynamoBackend.NO)

    def compile_kwargs(self) -> dict[str, Any]:
        """Arguments for ``torch.compile``."""
        kwargs: dict[str, Any] = {"backend": str(self.backend).lower()}
        for key in ("mode", "fullgraph", "dynamic"):
            value = getattr(self, key)
            if value is not None:
                kwargs[key] = value
        if self.options:
            kwargs["options"] = self.options
        return kwargs
