"""Strategies: how models are wrapped and processes cooperate. One line per backend in STRATEGIES.

A strategy module is imported only when the connector picks it, so unused backends (and their
libraries) never load. Importing this package itself loads neither torch nor any backend: the
launcher and ``accelerando config`` read :data:`DISTRIBUTED_KINDS` from here to know the backends
without string comparisons of their own (``Strategy`` and the prepare records load on first use).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from accelerando.backends.strategies.base import Prepared, PrepareRequest, Strategy

__all__ = [
    "DISTRIBUTED_KINDS",
    "STRATEGIES",
    "DistributedKind",
    "PrepareRequest",
    "Prepared",
    "Strategy",
    "distributed_kind",
    "requested_backends",
    "strategy_class",
]

STRATEGIES: dict[str, str] = {
    "single": "accelerando.backends.strategies.base:SingleDeviceStrategy",
    "ddp": "accelerando.backends.strategies.ddp:DDPStrategy",
    "fsdp": "accelerando.backends.strategies.fsdp:FSDPStrategy",
    "deepspeed": "accelerando.backends.strategies.deepspeed:DeepSpeedStrategy",
    "megatron": "accelerando.backends.strategies.megatron:MegatronStrategy",
    "composable": "accelerando.backends.strategies.composable:ComposableStrategy",
    "pipeline": "accelerando.backends.strategies.pipeline:PipelineStrategy",
    "fault_tolerant": "accelerando.backends.strategies.fault_tolerance:FaultTolerantStrategy",
}


@dataclass(frozen=True, slots=True)
class DistributedKind:
    """One ``distributed_type`` value as the launcher and ``accelerando config`` see it.

    Attributes:
        distributed_type: the value written in config files and settings (a ``DistributedType`` value).
        strategy: the key of :data:`STRATEGIES` that runs it.
        label: the answer ``accelerando config`` offers for it; None = not offered.
        one_process: a one-process kind (several processes make it meaningless).
        forces_cpu: choosing it means training on CPUs.
        requires_gpu: the launcher refuses it on a machine without a visible GPU.
        offered_without_gpu: ``accelerando config`` offers it on a machine without GPUs.
        switch: the boolean setting that selects this backend (``use_fsdp``), or None.
        settings_group: the settings group holding the backend's own options, or None.
        auto_settings: (setting, description) of the backend's settings that may be "auto", decided at
            ``prepare`` from the model and the devices.
        multinode_runner: module of the backend's own multi-machine runner (it starts every host
            itself), or None.
    """

    distributed_type: str
    strategy: str
    label: str | None = None
    one_process: bool = False
    forces_cpu: bool = False
    requires_gpu: bool = False
    offered_without_gpu: bool = False
    switch: str | None = None
    settings_group: str | None = None
    auto_settings: tuple[tuple[str, str], ...] = ()
    multinode_runner: str | None = None


# In the order ``accelerando config`` offers them.
DISTRIBUTED_KINDS: tuple[DistributedKind, ...] = (
    DistributedKind("NO", "single", "This machine, one process", one_process=True, offered_without_gpu=True),
    DistributedKind("MULTI_CPU", "ddp", "multi-CPU", forces_cpu=True, offered_without_gpu=True),
    DistributedKind("MULTI_GPU", "ddp", "multi-GPU", requires_gpu=True),
    DistributedKind(
        "FSDP",
        "fsdp",
        "FSDP (fully sharded data parallel)",
        switch="use_fsdp",
        settings_group="fsdp",
        auto_settings=(("fsdp_sharding_strategy", "FSDP sharding strategy"),),
    ),
    DistributedKind(
        "DEEPSPEED",
        "deepspeed",
        "DeepSpeed",
        switch="use_deepspeed",
        settings_group="deepspeed",
        auto_settings=(
            ("zero_stage", "ZeRO stage"),
            ("offload_optimizer_device", "DeepSpeed optimizer offload"),
            ("offload_param_device", "DeepSpeed parameter offload"),
        ),
        multinode_runner="deepspeed.launcher.runner",
    ),
    DistributedKind("MEGATRON_LM", "megatron", switch="use_megatron_lm", settings_group="megatron"),
)


if TYPE_CHECKING:

    class SettingsView(Protocol):
        """What :func:`requested_backends` reads: setting values by name (a mapping or a ``Settings``)."""

        def __getitem__(self, key: str, /) -> object:
            """The value of the setting ``key``."""
            ...


def distributed_kind(distributed_type: object) -> DistributedKind | None:
    """The :class:`DistributedKind` of a ``distributed_type`` value (str or enum); None when unset/unknown."""
    if distributed_type is None:
        return None
    value = str(getattr(distributed_type, "value", distributed_type))
    return next((k for k in DISTRIBUTED_KINDS if k.distributed_type == value), None)


def requested_backends(values: SettingsView) -> list[DistributedKind]:
    """The backends whose switch (``use_fsdp``, ``use_deepspeed``, ...) is set in ``values``.

    Args:
        values: setting name -> value (a ``Settings`` object works: it is read with ``[]``).

    Returns:
        The selected kinds, in :data:`DISTRIBUTED_KINDS` order.
    """
    return [k for k in DISTRIBUTED_KINDS if k.switch is not None and values[k.switch]]


def strategy_class(name: str) -> type[Strategy]:
    """Import and return the strategy class registered as ``name``.

    Raises:
        ValueError: no strategy of that name.
        NotImplementedError: the strategy is registered but its module is not available yet.
    """
    target = STRATEGIES.get(name)
    if target is None:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise NotImplementedError(
                f"the {name!r} strategy is not available in this version of accelerando"
            ) from exc
        raise
    return getattr(module, attr)


_LAZY = {"Strategy", "PrepareRequest", "Prepared"}


def __getattr__(name: str) -> type:
    # The base module imports torch; the launcher and the CLI read the tables above without it.
    if name in _LAZY:
        from accelerando.backends.strategies import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
