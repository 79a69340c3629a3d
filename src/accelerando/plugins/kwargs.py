"""Keyword-argument handlers: small dataclasses that customise one object the Accelerator creates.

Pass instances in ``Accelerator(kwargs_handlers=[...])``. Each handler only reports the fields the
user changed (``to_kwargs``), so library defaults stay in one place: the object's own constructor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

from accelerando.core._lazy import lazy_getattr
from accelerando.core.enums_on_demand import DDPCommunicationHookType
from accelerando.plugins.kwargs_handler import KwargsHandler

if TYPE_CHECKING:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    from torch.nn.parallel import DistributedDataParallel

# Defined in accelerando.plugins.fp8_recipes, loaded the first time one is read from here (below).
_FP8_RECIPES = ("AORecipeKwargs", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "TERecipeKwargs")

__all__ = [
    "AutocastKwargs",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProfileKwargs",
    *_FP8_RECIPES,
]


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` in mixed precision.

    Args:
        enabled: turn autocast on (False disables it inside ``accelerator.autocast(...)``).
        cache_enabled: let autocast cache casted weights.
    """

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options forwarded to ``torch.nn.parallel.DistributedDataParallel``, plus a communication hook.

    Args:
        dim, broadcast_buffers, bucket_cap_mb, find_unused_parameters, check_reduction,
            gradient_as_bucket_view, static_graph: DDP's own arguments (same defaults).
        comm_hook: compress gradients during all-reduce (fp16, bf16, power_sgd, batched_power_sgd).
        comm_wrapper: wrap the hook to compress (fp16 / bf16) around PowerSGD.
        comm_state_option: options for the PowerSGD state.
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: Literal[
        DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16
    ] = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def to_dict(
        self, ignore_keys: tuple[str, ...] | list[str] = ("comm_hook", "comm_wrapper", "comm_state_option")
    ) -> dict[str, Any]:
        """The fields as a dict (deep-copied) without ``ignore_keys`` (by default the hook fields).

        What remains are the arguments of ``DistributedDataParallel`` itself.
        """
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def ddp_kwargs(self) -> dict[str, Any]:
        """The changed fields that DDP's constructor accepts (the hook fields removed)."""
        kwargs = self.to_kwargs()
        for key in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(key, None)
        return kwargs

    def register_comm_hook(self, model: DistributedDataParallel) -> None:
        """Install the configured communication hook on a DDP-wrapped ``model``.

        Raises:
            ValueError: an unknown hook name.
        """
        hook_name = DDPCommunicationHookType(self.comm_hook)
        if hook_name is DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks: dict[DDPCommunicationHookType, Callable] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        hook = hooks[hook_name]
        state: PowerSGDState | None = None
        if hook_name in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
            wrapper = DDPCommunicationHookType(self.comm_wrapper)
            if wrapper is DDPCommunicationHookType.FP16:
                hook = default_hooks.fp16_compress_wrapper(hook)
            elif wrapper is DDPCommunicationHookType.BF16:
                hook = default_hooks.bf16_compress_wrapper(hook)
        model.register_comm_hook(state, hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options of the fp16 loss scaler (``torch.amp.GradScaler``).

    Dynamic scaling is the default: the scale halves on overflow (that step is skipped) and doubles
    after ``growth_interval`` clean steps. ``static_scale=True`` keeps ``init_scale`` fixed for the
    whole run (steps with inf/nan gradients are still skipped).
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True
    static_scale: bool = False

    def scaler_kwargs(self) -> dict[str, Any]:
        """The changed fields that ``torch.amp.GradScaler`` accepts."""
        kwargs = self.to_kwargs()
        kwargs.pop("static_scale", None)
        return kwargs


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options of ``torch.distributed.init_process_group``: backend name and timeout."""

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    @override
    def to_kwargs(self) -> dict[str, Any]:
        kwargs = super().to_kwargs()
        # "nccl" is the dataclass default for compatibility; it only counts when chosen explicitly.
        kwargs.pop("init_method", None)
        return kwargs


@dataclass
class ProfileKwargs(KwargsHandler):
    """Options for ``Accelerator.profile()`` (``torch.profiler.profile``).

    Args:
        activities: ``["cpu", "cuda", "xpu", ...]`` (None = CPU plus the accelerator in use).
        schedule_option: keys of ``torch.profiler.schedule`` (wait, warmup, active, repeat, skip_first).
        on_trace_ready: callable receiving the profiler when a trace is ready.
        record_shapes, profile_memory, with_stack, with_flops, with_modules: torch.profiler flags.
        output_trace_dir: folder where a Chrome trace per process is written on exit.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> torch.profiler.profile:
        """Create the ``torch.profiler.profile`` object these options describe.

        Raises:
            ValueError: an unknown activity name.
        """
        import torch

        mapping = {
            "cpu": torch.profiler.ProfilerActivity.CPU,
            "cuda": torch.profiler.ProfilerActivity.CUDA,
        }
        for name in ("XPU", "MTIA", "HPU"):
            if hasattr(torch.profiler.ProfilerActivity, name):
                mapping[name.lower()] = getattr(torch.profiler.ProfilerActivity, name)
        activities = None
        if self.activities is not None:
            unknown = [a for a in self.activities if a not in mapping]
            if unknown:
                raise ValueError(f"unknown profiler activities {unknown}; choose from {sorted(mapping)}")
            activities = [mapping[a] for a in self.activities]
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


def handler_fields(handler: KwargsHandler) -> tuple[str, ...]:
    """Names of a handler's dataclass fields."""
    return tuple(f.name for f in dataclasses.fields(handler))  # type: ignore[arg-type]


# The FP8 recipes load on first use (their module builds four dataclasses that an Accelerator without
# fp8 never needs: benchmarks/bench_first_accelerator.py); their names stay importable from here.
# accelerando's own code imports them from accelerando.plugins.fp8_recipes (importing them here for type
# checkers would be a cycle between the two modules).
__getattr__ = lazy_getattr(
    __name__, dict.fromkeys(_FP8_RECIPES, "accelerando.plugins.fp8_recipes"), globals()
)
