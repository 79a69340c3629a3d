"""Keyword-argument handlers: small dataclasses that customise one object the Accelerator creates.

Pass instances in ``Accelerator(kwargs_handlers=[...])``. Each handler only reports the fields the
user changed (``to_kwargs``), so library defaults stay in one place: the object's own constructor.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from typing_extensions import override

from accelerando.common.imports import is_torchao_available
from accelerando.enums import DDPCommunicationHookType
from accelerando.settings import environment_hidden, environment_value, fill_unset

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DistributedDataParallelKwargs",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "MSAMPRecipeKwargs",
    "ProfileKwargs",
    "TERecipeKwargs",
]


class KwargsHandler:
    """Base class of the handlers: ``to_kwargs()`` returns the fields that differ from the defaults."""

    def to_dict(self) -> dict[str, Any]:
        """All fields as a dict (deep-copied)."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields whose value differs from the default.

        The default is the handler built with no argument and no environment: a value a field took
        from an ``ACCELERATE_*`` variable (or a launcher's setting) counts as changed, like one given
        in code.
        """
        with environment_hidden():
            default = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


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

    def register_comm_hook(self, model: Any) -> None:
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
        state: Any = None
        if hook_name in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
            wrapper = DDPCommunicationHookType(self.comm_wrapper)
            if wrapper is DDPCommunicationHookType.FP16:
                hook = default_hooks.fp16_wrapper(hook)
            elif wrapper is DDPCommunicationHookType.BF16:
                hook = default_hooks.bf16_wrapper(hook)
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

    def build(self) -> Any:
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


# ------------------------------------------------------------------------------ FP8 recipes
_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGOS = ("max", "most_recent")
_OPT_LEVELS = ("O1", "O2")
_FP8_BACKENDS = ("AO", "TE", "MSAMP")


def _fill_fp8_from_settings(handler: Any) -> None:
    """Fill the handler's unset fields from the fp8_* settings (launcher flags, config, environment)."""
    fill_unset(handler, "fp8", prefix="fp8_", rename={"fp8_format": "fp8_format"})
    if getattr(handler, "use_mxfp8_block_scaling", False) is None:
        handler.use_mxfp8_block_scaling = environment_value("fp8_use_mxfp8_block_scaling")


def _wrong_type(handler: Any, name: str, expected: str, example: str) -> TypeError:
    value = getattr(handler, name)
    return TypeError(
        f"{type(handler).__name__}.{name} must be {expected}, got {type(value).__name__} ({value!r}); "
        f"pass e.g. {name}={example}"
    )


def _check_bool(handler: Any, name: str, default: bool) -> None:
    if getattr(handler, name) is None:
        setattr(handler, name, default)
    elif not isinstance(getattr(handler, name), bool):
        raise _wrong_type(handler, name, "a bool", str(default))


def _check_int(handler: Any, name: str, default: int, minimum: int) -> None:
    value = getattr(handler, name)
    if value is None:
        setattr(handler, name, default)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(handler, name, "an int", str(default))
    if value < minimum:
        raise ValueError(f"{type(handler).__name__}.{name} must be >= {minimum}, got {value}")


def _check_choice(handler: Any, name: str, default: str, choices: tuple[str, ...], upper: bool) -> None:
    value = getattr(handler, name)
    if value is None:
        value = default
    if not isinstance(value, str):
        raise _wrong_type(handler, name, f"one of {choices}", repr(default))
    value = value.upper() if upper else value.lower()
    if value not in choices:
        raise ValueError(
            f"{type(handler).__name__}.{name}={getattr(handler, name)!r} is not one of {choices}"
        )
    setattr(handler, name, value)


def _check_override(handler: Any) -> None:
    value = handler.override_linear_precision
    if value is None:
        value = (False, False, False)
    if isinstance(value, str):  # the launcher's spelling: "false,false,true"
        words = [w.strip().lower() for w in value.split(",")]
        if len(words) != 3 or any(w not in ("true", "false", "1", "0", "yes", "no") for w in words):
            raise ValueError(
                f"override_linear_precision={value!r} must be three comma-separated booleans "
                "(fprop, dgrad, wgrad), e.g. 'false,false,true'"
            )
        value = tuple(w in ("true", "1", "yes") for w in words)
    if not isinstance(value, (tuple, list)) or len(value) != 3 or not all(isinstance(v, bool) for v in value):
        raise _wrong_type(
            handler, "override_linear_precision", "a tuple of three bools", "(False, False, False)"
        )
    handler.override_linear_precision = tuple(value)


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP FP8 options (needs a CUDA GPU and the ``msamp`` package).

    Unset fields come from the fp8 settings (``--fp8_opt_level``, ``fp8_config.opt_level``,
    ``ACCELERATE_FP8_OPT_LEVEL``), else the defaults.

    Args:
        opt_level: "O1" (FP8 weights and gradients) or "O2" (also FP8 optimizer states; default).

    Raises:
        TypeError / ValueError: a value of the wrong type, or not "O1"/"O2".
    """

    opt_level: Literal["O1", "O2"] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_choice(self, "opt_level", "O2", _OPT_LEVELS, upper=True)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """Transformer Engine FP8 recipe (needs a CUDA GPU with FP8 support and ``transformer_engine``).

    Unset fields come from the fp8 settings (``--fp8_*`` flags, the config's ``fp8_config`` block,
    ``ACCELERATE_FP8_*`` / ``ACCELERANDO_FP8_*`` variables), else the defaults shown.

    Args:
        use_autocast_during_eval: keep FP8 autocast in eval mode (False).
        margin: margin of the scaling factor (0). interval: steps between scale updates (1).
        fp8_format: "HYBRID" (E4M3 forward, E5M2 backward; default), "E4M3" or "E5M2".
        amax_history_len: length of the amax history (1024).
        amax_compute_algo: "most_recent" (default) or "max".
        override_linear_precision: run (fprop, dgrad, wgrad) in higher precision ((False,) * 3).
        use_mxfp8_block_scaling: use the MXFP8 block-scaling recipe (Blackwell GPUs; False).

    Raises:
        TypeError: a field of the wrong type (the message shows a correct value).
        ValueError: a value outside the allowed choices.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: Literal["HYBRID", "E4M3", "E5M2"] = None  # type: ignore[assignment]
    amax_history_len: int | None = None
    amax_compute_algo: Literal["max", "most_recent"] = None  # type: ignore[assignment]
    override_linear_precision: tuple[bool, bool, bool] = None  # type: ignore[assignment]
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_bool(self, "use_autocast_during_eval", False)
        _check_int(self, "margin", 0, 0)
        _check_int(self, "interval", 1, 1)
        _check_choice(self, "fp8_format", "HYBRID", _FP8_FORMATS, upper=True)
        _check_int(self, "amax_history_len", 1024, 1)
        _check_choice(self, "amax_compute_algo", "most_recent", _AMAX_ALGOS, upper=False)
        _check_override(self)
        _check_bool(self, "use_mxfp8_block_scaling", False)


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated: one recipe for Transformer Engine (``backend="TE"``) or MS-AMP (``backend="MSAMP"``).

    Use :class:`TERecipeKwargs` or :class:`MSAMPRecipeKwargs` (torchao: :class:`AORecipeKwargs`).
    Without ``backend``, the ``fp8_backend`` setting or the automatic choice decides.

    Raises:
        ValueError: an unknown backend, or "AO" (which has its own recipe, AORecipeKwargs).
        TypeError: a field of the wrong type.
    """

    backend: Literal["MSAMP", "TE"] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        import warnings

        warnings.warn(
            "FP8RecipeKwargs is deprecated; use TERecipeKwargs (Transformer Engine), MSAMPRecipeKwargs "
            "(MS-AMP) or AORecipeKwargs (torchao) instead",
            FutureWarning,
            stacklevel=3,
        )
        explicit = self.backend
        TERecipeKwargs.__post_init__(self)
        _check_choice(self, "opt_level", "O2", _OPT_LEVELS, upper=True)
        if explicit is None and str(self.backend).upper() == "AO":
            self.backend = None  # type: ignore[assignment]  # fp8_backend=ao is for AORecipeKwargs
        if self.backend is not None:
            if not isinstance(self.backend, str) or self.backend.upper() not in _FP8_BACKENDS:
                raise ValueError(
                    f"unknown FP8 backend {self.backend!r} in FP8RecipeKwargs; choose 'TE' (Transformer Engine) "
                    "or 'MSAMP' (MS-AMP), or use AORecipeKwargs for torchao"
                )
            self.backend = self.backend.upper()  # type: ignore[assignment]
            if self.backend == "AO":
                raise ValueError("FP8RecipeKwargs does not configure torchao; pass AORecipeKwargs() instead")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao FP8 training options (``Float8Linear`` layers; runs on CPU in emulation, natively on
    GPUs with FP8 support).

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; built from the two flags below when None.
        module_filter_func: ``(module, fqn) -> bool`` choosing the Linear layers to convert; None keeps
            the first and last Linear layers and those with a dimension not divisible by 16 in high
            precision.
        pad_inner_dim: pad matmul inner dimensions to multiples of 16 (True; ignored with ``config``).
        enable_fsdp_float8_all_gather: FSDP2 all-gathers weights in float8 (True; ignored with ``config``).

    Unset flags come from the fp8 settings (``--fp8_pad_inner_dim``, ``fp8_config.pad_inner_dim``,
    ``ACCELERATE_FP8_PAD_INNER_DIM``...).

    Raises:
        TypeError: ``config`` is not a Float8LinearConfig, the filter is not callable, or a flag is not a bool.
    """

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_bool(self, "pad_inner_dim", True)
        _check_bool(self, "enable_fsdp_float8_all_gather", True)
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise _wrong_type(
                self, "module_filter_func", "a callable (module, fqn) -> bool", "filter_linear_layers"
            )
        if self.config is not None:
            if type(self.config).__name__ != "Float8LinearConfig":
                raise _wrong_type(
                    self,
                    "config",
                    "a torchao.float8.Float8LinearConfig",
                    "Float8LinearConfig(pad_inner_dim=True)",
                )
            return

        if is_torchao_available():
            from torchao.float8 import Float8LinearConfig

            self.config = Float8LinearConfig(
                pad_inner_dim=self.pad_inner_dim,
                enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather,
            )


def handler_fields(handler: KwargsHandler) -> tuple[str, ...]:
    """Names of a handler's dataclass fields."""
    return tuple(f.name for f in dataclasses.fields(handler))  # type: ignore[arg-type]
