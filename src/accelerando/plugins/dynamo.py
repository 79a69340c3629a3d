"""TorchDynamoPlugin: compile the prepared model with ``torch.compile``, whole or one block at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelerando.core.enums import DistributedType, DynamoBackend
from accelerando.core.settings import fill_unset
from accelerando.plugins.kwargs_handler import KwargsHandler

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from accelerando.common.compilation import CompileKwargs

# Backends whose wrapped model must be compiled in place: DeepSpeed's engine holds the model, FSDP2
# holds the shards (DTensor parameters); other models get a compiled copy.
_IN_PLACE_REGIONS = {DistributedType.DEEPSPEED: "engine", DistributedType.FSDP: "shards"}


def _as_distributed_type(value: object) -> DistributedType | None:
    try:
        return DistributedType(str(getattr(value, "value", value) or "").upper())
    except ValueError:
        return None


__all__ = ["TorchDynamoPlugin"]


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """torch.compile options.

    Fields left unset come from the dynamo settings (``--dynamo_*`` flags, the config's
    ``dynamo_config`` block, ``ACCELERATE_DYNAMO_*`` / ``ACCELERANDO_DYNAMO_*`` variables).

    Args:
        backend: a ``DynamoBackend`` name ("no" disables compilation).
        mode: "default", "reduce-overhead", "max-autotune" or "max-autotune-no-cudagraphs".
        fullgraph: refuse graph breaks. dynamic: dynamic shapes. options: backend options.
        disable: compile nothing.
        use_regional_compilation: compile each repeated block (transformer layer) once, through
            ``accelerando.common.compilation.compile_regions``, instead of the whole model: much shorter
            compile time, same outputs.

    Raises:
        ValueError: an unknown backend or mode.
        TypeError: ``use_regional_compilation`` that is not a bool.
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, str | int | bool | Callable[..., object]] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:

        fill_unset(
            self,
            "dynamo",
            prefix="dynamo_",
            rename={"dynamo_use_fullgraph": "fullgraph", "dynamo_use_dynamic": "dynamic"},
        )
        if self.use_regional_compilation is not None and not isinstance(self.use_regional_compilation, bool):
            raise TypeError(
                "TorchDynamoPlugin.use_regional_compilation must be a bool, got "
                f"{type(self.use_regional_compilation).__name__}; pass use_regional_compilation=True"
            )
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

    def compile_kwargs(self) -> CompileKwargs:
        """Arguments for ``torch.compile``."""
        kwargs: CompileKwargs = {"backend": str(self.backend).lower()}
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.fullgraph is not None:
            kwargs["fullgraph"] = self.fullgraph
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        if self.options:
            kwargs["options"] = self.options
        return kwargs

    def to_dict(self) -> dict[str, object]:
        """All fields as a dict, the backend as ``torch.compile`` spells it (``"inductor"``)."""
        out = super().to_dict()
        if out.get("backend") is not None:
            out["backend"] = str(getattr(out["backend"], "value", out["backend"])).lower()
        return out

    def to_kwargs(self) -> dict[str, object]:
        """The changed fields that ``torch.compile`` accepts (``use_regional_compilation`` removed)."""
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def compile(self, model: torch.nn.Module, distributed_type: object = None) -> torch.nn.Module:
        """Compile a prepared ``model`` as these options say (returned as is when disabled or compiled).

        With ``use_regional_compilation`` each repeated block is compiled once
        (``compile_regions``; in place under DeepSpeed and FSDP2, whose hooks sit on the module
        objects); otherwise the whole model goes through ``torch.compile``.

        Args:
            model: the model after the strategy's wrap.
            distributed_type: the Accelerator's ``DistributedType`` (chooses the in-place variants).

        Returns:
            The module to train with.
        """
        import torch

        from accelerando.common import compilation
        from accelerando.common.other import model_has_dtensor
        from accelerando.common.unwrap import is_compiled_module

        if not self.enabled or is_compiled_module(model) or compilation.has_compiled_regions(model):
            return model
        kwargs = self.compile_kwargs()
        if not self.use_regional_compilation:
            compiled = torch.compile(model, **kwargs)
            assert isinstance(compiled, torch.nn.Module)  # a compiled module is an OptimizedModule
            return compiled
        kind = _as_distributed_type(distributed_type)
        in_place = _IN_PLACE_REGIONS.get(kind) if kind is not None else None
        if in_place == "engine":
            compilation.compile_regions_deepspeed(model, **kwargs)
            return model
        if in_place == "shards" and model_has_dtensor(model):
            return compilation.compile_regions_fsdp2(model, **kwargs)
        return compilation.compile_regions(model, **kwargs)
